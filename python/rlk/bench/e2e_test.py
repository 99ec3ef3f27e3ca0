import pytest

from rlk import provenance
from rlk.bench import e2e
from rlk.bench.workload import PHASES


def _arm(route, scale, mismatch=0, bw=4.2):
    steps = []
    for j in range(4):
        st = {f"{p}_s": scale * (1.0 + 0.01 * j) * (i + 1) for i, p in enumerate(PHASES)}
        st["step_s"] = sum(st[f"{p}_s"] for p in PHASES)
        st["step_reuse_s"] = st["step_s"] - st["old_logp_s"]
        st["warmup"] = j == 0
        st["step"] = j
        if route == "strict":
            st["equality"] = {"compared_elements": 100, "mismatch_count": mismatch, "max_abs_diff": 0.0,
                              "torch_equal": mismatch == 0}
        steps.append(st)
    prov = provenance.capability_record(route=route, load_contracts=False)
    return {"route": route, "spec": {"config": "qwen3-8b", "layers": 4, "sequences": 8},
            "tokens": {"response": 1000, "total": 3000}, "health": {"copy_tbps": bw}, "steps": steps,
            "provenance": prov}


def test_analyse_pairs_arms_and_reports_reuse_only_with_equality():
    arms = [(_arm("native", 1.0), _arm("strict", 0.8)) for _ in range(3)]
    rep, rows = e2e.analyse(arms)
    assert rep["ratio"] == pytest.approx(0.8)
    assert rep["ratio_ci95"][0] <= 0.8 <= rep["ratio_ci95"][1]
    assert rep["steps_compared"] == 9  # warm-up steps excluded
    assert rep["ratio_reuse"] < rep["ratio"] and rep["passed"]
    assert rep["provenance_differences"] == []
    assert len(rows) == 3 * 2 * 4


def test_reuse_refused_when_equality_fails_and_missed_target_reported():
    arms = [(_arm("native", 1.0), _arm("strict", 1.2, mismatch=1)) for _ in range(3)]
    rep, _ = e2e.analyse(arms)
    assert rep["ratio_reuse"] is None and "reuse_refused" in rep
    assert not rep["passed"]


def test_unhealthy_pair_is_rejected():
    arms = [(_arm("native", 1.0), _arm("strict", 0.8)) for _ in range(2)] + [(_arm("native", 1.0, bw=2.0),
                                                                              _arm("strict", 0.1))]
    rep, _ = e2e.analyse(arms)
    assert len(rep["pairs_rejected"]) == 1 and rep["steps_compared"] == 6
    assert rep["ratio"] == pytest.approx(0.8)


def test_l5_gate_passes_only_with_readbacks_route_only_and_target():
    from rlk.bench import checks

    good = [(_arm("native", 1.0), _arm("strict", 0.8)) for _ in range(3)]
    rep, _ = e2e.analyse(good)
    res = checks.evaluate(rep)
    assert res.passed and "0.800" in res.detail
    slow = [(_arm("native", 1.0), _arm("strict", 1.0)) for _ in range(3)]
    res = checks.evaluate(e2e.analyse(slow)[0])
    assert not res.passed and "upper bound" in res.detail
    bad = [(_arm("native", 1.0), _arm("strict", 0.8, mismatch=2)) for _ in range(3)]
    res = checks.evaluate(e2e.analyse(bad)[0])
    assert not res.passed and "!= rollout" in res.detail
    rep["provenance_differences"] = [{"field": "triton"}]
    assert not checks.evaluate(rep).passed


def test_executor_e2e_is_a_diagnostic_not_a_gate_check():
    from rlk.gate import registry
    from rlk.bench import checks  # noqa: F401 - would register

    c = registry.all_checks() if hasattr(registry, "all_checks") else None
    keys = {f"{k.level}:{k.name}" for k in (c or registry._CHECKS.values())}
    assert "L5:e2e.paired" not in keys
    assert "rlk.bench.checks" not in registry.CHECK_MODULES


def test_l5_check_gives_the_arms_a_device(monkeypatch, tmp_path):
    """The gate's L5 check passes device=None (the CLI default); run_e2e must resolve it before
    the arms build their models (it reached the arms as None on the H200: TypeError)."""
    from types import SimpleNamespace

    from rlk.bench import checks, e2e

    seen = []

    class Stop(Exception):
        pass

    def spawn(route, spec, steps, path):
        seen.append(spec["device"])
        raise Stop

    monkeypatch.setattr(e2e, "_spawn", spawn)
    with pytest.raises(Stop):
        checks.e2e_paired(SimpleNamespace(out_dir=str(tmp_path), progress=lambda *a: None))
    assert seen and seen[0] in ("cuda", "cpu")
