"""Distribution health and discrimination in the gate's replay checks.

* the health rule names the statistic it fails on;
* a degenerate fixture (the tied recipe ``plain.v0``: every sampled logp exactly 0.0) is
  rejected by the L1, L2 and L4 replay checks, with the statistic named;
* a fixture recorded with ``calibrated.v1`` (the gate's own workload) is healthy and records
  the recipe and its statistics;
* L4 fails as "not discriminating" when the native route is made to equal the strict route.
"""

import copy
import json
import os

import pytest

from rlk.gate.registry import GateContext, checks_for
from rlk.models.qwen3.config import CONFIG_DIR
from rlk.replay import checks, fixture, harness, health, rollout


def _stats(**kw):
    s = {"rows": 100, "nonfinite": 0, "entropy_mean": 2.0, "frac_logp_zero": 0.0}
    s.update(kw)
    return s


@pytest.mark.parametrize("kw,needle", [
    (dict(entropy_mean=0.05), "entropy_mean=0.05 nats < 0.1"),
    (dict(entropy_mean=4.5), "entropy_mean=4.5 nats > 0.8 ln V"),
    (dict(frac_logp_zero=0.02), "frac_logp_zero=0.02 > 0.01"),
    (dict(nonfinite=3), "nonfinite=3"),
    (dict(entropy_mean=float("nan")), "entropy_mean=nan"),
    (dict(rows=0), "0 sampled tokens"),
])
def test_rule_names_the_statistic(kw, needle):
    assert health.failures(_stats(), 256) == []
    got = health.failures(_stats(**kw), 256)
    assert any(needle in f for f in got), got


def test_missing_statistics_fail_closed():
    assert health.failures(None, 256) and health.failures({}, 256)


def test_discrimination_rule():
    diff = {"compared_elements": 10, "mismatch_count": 3}
    same = {"compared_elements": 10, "mismatch_count": 0}
    assert checks.discrimination_failures(diff, diff) == []
    assert checks.discrimination_failures(same, diff) == [
        "not discriminating: native trainer vs native rollout equal over 10 elements"]
    assert checks.discrimination_failures(diff, same) == [
        "not discriminating: native trainer vs strict trainer equal over 10 elements"]
    assert len(checks.discrimination_failures(None, {"compared_elements": 0, "mismatch_count": 0})) == 2


def _tied_tiny(tmp_path) -> str:
    with open(os.path.join(CONFIG_DIR, "tiny.json")) as f:
        d = json.load(f)
    d["tie_word_embeddings"] = True
    path = str(tmp_path / "tiny-tied.json")
    with open(path, "w") as f:
        json.dump(d, f)
    return path


def _record(spec, n=8, route="native"):
    reqs = harness.make_requests(n, (3, 20), (2, 12), spec.cfg().vocab_size, seed=0, arrival_spread=6)
    return harness.record(spec, reqs, rollout.RolloutConfig(), route=route)


def _gate_checks():
    import rlk.replay.checks  # noqa: F401  (registers)

    return {c.name: c for c in checks_for("cpu") if c.name.startswith("replay.")}


def test_gate_rejects_degenerate_fixture(tmp_path, monkeypatch):
    spec = harness.ModelSpec(config=_tied_tiny(tmp_path), recipe="plain.v0")
    fx, res = _record(spec)
    st = fx.meta["distribution"]
    assert st["frac_logp_zero"] > 0.9 and st["entropy_mean"] < 0.1, st
    assert fx.meta["weights"]["calibration"]["recipe"] == "plain.v0"
    # The statistics survive a save / load, and the loaded fixture is rejected the same way.
    fixture.save(fx, str(tmp_path / "fx"))
    fx = fixture.load(str(tmp_path / "fx"))
    for weights in ("random", "trained"):
        monkeypatch.setitem(checks._FIXTURES, ("cpu", weights), (fx, res, checks._params("cpu")))
    ctx = GateContext("cpu", str(tmp_path / "gate"), progress=lambda s: None)
    got = _gate_checks()
    assert set(got) == {"replay.engine", "replay.engine_trained", "replay.repeat", "replay.shape_invariance"}
    for name, c in got.items():
        r = c.fn(ctx)
        assert not r.passed, name
        assert "degenerate fixture" in r.detail and "entropy_mean=" in r.detail and "frac_logp_zero=" in r.detail, \
            (name, r.detail)


def test_calibrated_gate_workload_is_healthy(tmp_path):
    """The cpu gate's workload and model (native route here, for time): healthy, recipe recorded."""
    p = checks._params("cpu")
    spec = harness.ModelSpec(config=p["config"], seed=0, device=p["device"])
    reqs = harness.make_requests(p["sequences"], p["prompt_range"], p["response_range"], spec.cfg().vocab_size,
                                 seed=0, arrival_spread=p["arrival_spread"])
    fx, _ = harness.record(spec, reqs, rollout.RolloutConfig(block_size=p["block_size"], max_batch=p["max_batch"],
                                                             chunk_size=p["chunk_size"]), route="native")
    assert health.fixture_failures(fx) == [], fx.meta["distribution"]
    cal = fx.meta["weights"]["calibration"]
    assert cal["recipe"] == "calibrated.v1" and cal["stats"] == fx.meta["distribution"]
    assert fx.meta["provenance"]["extra"]["weights_recipe"] == "calibrated.v1"
    # A fixture recorded before recipes existed (no "recipe" in its spec) replays plain.v0.
    old = copy.deepcopy(fx)
    del old.meta["model"]["spec"]["recipe"]
    assert harness.spec_of(old).recipe == "plain.v0" and harness.spec_of(fx).recipe == "calibrated.v1"


def test_l4_fails_when_native_equals_strict(tmp_path, monkeypatch):
    """Strict fixture (one layer, eight short sequences in few steps: the interpreter is slow);
    the native route's check is replaced by the strict one's figures, so native equals strict
    everywhere and discrimination is the only thing L4 can fail on."""
    spec = harness.ModelSpec(num_layers=1)
    reqs = harness.make_requests(8, (2, 4), (1, 2), 256, seed=0, arrival_spread=0)
    fx, res = harness.record(spec, reqs, rollout.RolloutConfig(max_batch=8, chunk_size=4), route="strict")
    assert health.fixture_failures(fx) == [], fx.meta["distribution"]
    real_check = harness.check
    reports = {}

    def check(fx_, route="strict", **kw):
        if route == "native":
            return dict(reports["strict"], route="native")
        reports[route] = real_check(fx_, route, **kw)
        return reports[route]

    monkeypatch.setattr(harness, "check", check)
    monkeypatch.setitem(checks._FIXTURES, ("cpu", "random"), (fx, res, checks._params("cpu")))
    r = _gate_checks()["replay.engine"].fn(GateContext("cpu", str(tmp_path), progress=lambda s: None))
    n = r.metrics["native"]
    assert n["mismatch_count"] == 0 and n["vs_strict"]["mismatch_count"] == 0 and n["compared_elements"] > 0
    assert not r.passed
    assert r.detail == (f"not discriminating: native trainer vs native rollout equal over {n['compared_elements']} "
                        f"elements; not discriminating: native trainer vs strict trainer equal over "
                        f"{n['compared_elements']} elements"), r.detail


def test_h200_l4_requires_health_and_discrimination(tmp_path, monkeypatch):
    """The h200 branch of L4 on a summary as rlk.replay.h200.run writes it (no GPU needed)."""
    from rlk.replay import h200

    exact = {"compared_elements": 50, "mismatch_count": 0, "max_abs_diff": 0.0, "torch_equal": True}
    good = dict(exact, model={"vocab_size": 151936}, distribution=_stats(),
                native=dict(exact, mismatch_count=40, vs_strict=dict(exact, mismatch_count=45)))
    l4 = _gate_checks()["replay.engine"].fn
    ctx = GateContext("h200", str(tmp_path), progress=lambda s: None)
    monkeypatch.setattr(h200, "run", lambda *a, **k: good)
    assert l4(ctx).passed
    bad = dict(good, distribution=_stats(frac_logp_zero=1.0), native=dict(exact, vs_strict=exact))
    monkeypatch.setattr(h200, "run", lambda *a, **k: bad)
    r = l4(ctx)
    assert not r.passed and "frac_logp_zero=1 > 0.01" in r.detail
    assert "not discriminating: native trainer vs native rollout" in r.detail
    assert "not discriminating: native trainer vs strict trainer" in r.detail
