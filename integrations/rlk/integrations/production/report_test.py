"""The production benchmark's report on synthetic arm files (no engine runs): the per-pair
ratio, its median and bootstrap interval over pairs, p95, phases and tokens/s, both targets,
and an incomplete run reported as such. Each target is shown flipping on the input that should
flip it."""

import json

import pytest

from rlk.integrations.production import records, report_bench

PP_PHASES = {"old_logp": 2.0, "ref_logp": 2.0, "actor_fwd_bwd": 6.0}
RR_PHASES = {"ref_logp": 2.5, "actor_fwd_bwd": 7.0}


def _arm(arm, pair, gen_s, phases, mismatches=0, order=("pp", "rr")):
    rollout = {"workload": "W1", "generate_s": gen_s, "engine_start_s": 70.0, "vllm_version": "0.26.0",
               "vllm_arm": records.VLLM_ARM[arm], "bundle_sha256": "b" * 64, "versions": {"torch": "2.11.0"}}
    train = {"phases": {k: {"seconds": v, "peak_allocated_gib": 50.0 + v} for k, v in phases.items()},
             "layers": 36, "sequences": 64, "response_tokens": 1000, "packed_tokens": 3000, "micro_batches": 1,
             "micro_tokens": 16384, "recompute": "full", "model_load_s": 20.0, "trainer": f"{arm} trainer",
             "old_logp_source": "x", "checkpoint_sha256": "c" * 64, "reference_policy": "same checkpoint",
             "advantages": "seeded", "versions": {"megatron-core": "0.19.2", "torch": "2.11.0", "triton": "3.6.0"},
             "optimizer": {"skipped": "no --optimizer-step"}}
    if arm == "rr":
        train["logp_mismatches"] = mismatches
    return records.merge(arm, rollout, train, {"index": pair, "order": list(order)})


def _write(d, pp_gen, rr_gen, mismatches=None):
    """One pair per entry: P/P's and R/R's rollout seconds (trainer phases fixed)."""
    for i, (a, b) in enumerate(zip(pp_gen, rr_gen)):
        records.write_json(records.arm_path(str(d), i, "pp"), _arm("pp", i, a, PP_PHASES))
        m = mismatches[i] if mismatches else 0
        records.write_json(records.arm_path(str(d), i, "rr"), _arm("rr", i, b, RR_PHASES, m))


def test_ratio_targets_phases_and_files(tmp_path):
    # PP totals 10 + gen, RR 9.5 + gen: ratios (9.5 + r) / (10 + p).
    _write(tmp_path, [10, 10, 10, 10, 10], [4.0, 4.5, 5.0, 3.5, 4.2])
    out = tmp_path / "rep" / "e2e.json"
    rep = report_bench.write([str(tmp_path)], str(out))
    ratios = [(9.5 + r) / 20 for r in (4.0, 4.5, 5.0, 3.5, 4.2)]
    assert [x["ratio"] for x in rep["per_pair"]] == [round(r, 4) for r in ratios]
    assert rep["ratio"] == round(sorted(ratios)[2], 4)
    lo, hi = rep["ratio_ci95"]
    assert round(min(ratios), 4) <= lo <= rep["ratio"] <= hi <= round(max(ratios), 4)
    assert rep["pairs"] == 5 and rep["complete"] and "note" not in rep
    assert rep["targets"] == {"rr_pp_upper_ci_le_0.95": True, "rr_logp_mismatches_zero": True}
    pp, rr = rep["arms"]["pp"], rep["arms"]["rr"]
    assert list(pp["phases"]) == ["rollout_generate", "old_logp", "ref_logp", "actor_fwd_bwd"]
    assert list(rr["phases"]) == ["rollout_generate", "ref_logp", "actor_fwd_bwd"]  # R/R reuses the old logp
    assert pp["phases"]["actor_fwd_bwd"] == {"median_s": 6.0, "tokens": 3000, "tok_per_s": 500.0,
                                             "seconds": [6.0] * 5}
    assert rr["phases"]["rollout_generate"]["tok_per_s"] == round(1000 / 4.2, 1)
    assert pp["total_median_s"] == 20.0 and rr["total_p95_s"] == pytest.approx(9.5 + 4.9, abs=1e-9)
    assert rr["peak_allocated_gib"] == {"ref_logp": 52.5, "actor_fwd_bwd": 57.0}
    assert rep["spec"]["layers"] == 36 and rep["spec"]["sequences"] == 64
    assert rr["provenance"]["checkpoint_sha256"] == "c" * 64 and rr["provenance"]["vllm_arm"] == "rlk"
    assert json.loads(out.read_text())["ratio"] == rep["ratio"]
    md = (tmp_path / "rep" / "e2e.md").read_text()
    assert "RR / PP = " in md and "| actor_fwd_bwd | 6.000 | 500.0 | 7.000 |" in md
    assert (tmp_path / "rep" / "e2e.png").stat().st_size > 1000


def test_upper_end_of_the_interval_decides_not_the_median(tmp_path):
    # Median ratio 0.9 passes alone, but two pairs above 1 put the interval's upper end over 0.95.
    _write(tmp_path, [10] * 5, [6.5, 7.5, 8.5, 11.0, 12.0])
    rep = report_bench.summarize(*report_bench.load_pairs([str(tmp_path)]))
    assert rep["ratio"] == 0.9 and rep["ratio_ci95"][1] > 0.95
    assert rep["targets"]["rr_pp_upper_ci_le_0.95"] is False


def test_slower_rr_fails_the_ratio_target(tmp_path):
    _write(tmp_path, [10] * 5, [11.0] * 5)
    rep = report_bench.summarize(*report_bench.load_pairs([str(tmp_path)]))
    assert rep["ratio"] == 1.025 and rep["ratio_ci95"] == [1.025, 1.025]
    assert rep["targets"] == {"rr_pp_upper_ci_le_0.95": False, "rr_logp_mismatches_zero": True}


def test_one_rr_mismatch_flips_the_exactness_target(tmp_path):
    _write(tmp_path, [10] * 5, [4.0] * 5, mismatches=[0, 0, 1, 0, 0])
    rep = report_bench.summarize(*report_bench.load_pairs([str(tmp_path)]))
    assert rep["logp_mismatches"] == [0, 0, 1, 0, 0]
    assert rep["targets"] == {"rr_pp_upper_ci_le_0.95": True, "rr_logp_mismatches_zero": False}


def test_fewer_pairs_and_several_folders_are_reported_as_incomplete(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _write(a, [10, 10], [4.0, 4.0])
    _write(b, [10], [4.0])
    records.write_json(records.arm_path(str(b), 7, "pp"), _arm("pp", 7, 10, PP_PHASES))  # its rr never ran
    rep = report_bench.summarize(*report_bench.load_pairs([str(a), str(b)]))
    assert rep["pairs"] == 3 and rep["complete"] is False and "3 of the 5 pairs" in rep["note"]
    assert [(x["dir"], x["pair"]) for x in rep["per_pair"]] == [(str(a), 0), (str(a), 1), (str(b), 0)]
    assert rep["incomplete_pair_files"] == [records.arm_path(str(b), 7, "pp")]


def test_refuses_no_pairs_and_mixed_workloads(tmp_path):
    with pytest.raises(SystemExit, match="no complete pair"):
        report_bench.summarize(*report_bench.load_pairs([str(tmp_path)]))
    _write(tmp_path, [10, 10], [4.0, 4.0])
    rec = json.loads(open(records.arm_path(str(tmp_path), 1, "rr")).read())
    rec["spec"]["workload"] = "W2"
    records.write_json(records.arm_path(str(tmp_path), 1, "rr"), rec)
    with pytest.raises(SystemExit, match="differ in layers / sequences / workload"):
        report_bench.summarize(*report_bench.load_pairs([str(tmp_path)]))


def _set_train(d, i, arm, **fields):
    path = records.arm_path(str(d), i, arm)
    rec = json.loads(open(path).read())
    rec["train"].update(fields)
    records.write_json(path, rec)


def test_a_throttled_pair_is_rejected_and_left_out_of_the_ratio(tmp_path):
    _write(tmp_path, [10] * 5, [3.0, 4.0, 5.0, 6.0, 20.0])  # pair 4: RR slower than PP
    for i in range(5):
        for arm in ("pp", "rr"):
            _set_train(tmp_path, i, arm, health={"copy_tbps": 3.9, "sm_clock_mhz": 1980})
    kept_all = report_bench.summarize(*report_bench.load_pairs([str(tmp_path)]))
    assert kept_all["pairs"] == 5 and kept_all["rejected_pairs"] == [] and kept_all["arms"]["rr"]["health"][
        "sm_clock_mhz"] == [1980] * 5
    _set_train(tmp_path, 4, "rr", health={"copy_tbps": 3.9, "sm_clock_mhz": 1200})  # clocked down
    rep = report_bench.summarize(*report_bench.load_pairs([str(tmp_path)]))
    assert rep["pairs"] == 4 and [x["pair"] for x in rep["per_pair"]] == [0, 1, 2, 3]
    assert rep["rejected_pairs"][0]["pair"] == 4 and "SM clock 1200" in rep["rejected_pairs"][0]["reason"]
    assert kept_all["ratio"] == 0.725 and rep["ratio"] == 0.7 and rep["ratio_ci95"][1] < kept_all["ratio_ci95"][1]
    assert "rejected by the health envelope" in rep["note"]
    md = report_bench.markdown(rep, "cmd")
    assert '"sm_clock_mhz": [1980, 1980, 1980, 1980]' in md and "SM clock 1200" in md
    for i in range(4):
        _set_train(tmp_path, i, "pp", health={"copy_tbps": 2.0, "sm_clock_mhz": 1980})  # P/P bandwidth off
    with pytest.raises(SystemExit, match="every pair was rejected"):
        report_bench.summarize(*report_bench.load_pairs([str(tmp_path)]))


def test_pairs_of_one_arm_must_share_one_stack(tmp_path):
    _write(tmp_path, [10] * 3, [4.0] * 3)
    for i in range(3):
        _set_train(tmp_path, i, "rr", provenance={"fingerprint": "f" * 64})
    rep = report_bench.summarize(*report_bench.load_pairs([str(tmp_path)]))
    assert rep["arms"]["rr"]["provenance"]["fingerprint"] == "f" * 64
    _set_train(tmp_path, 2, "rr", provenance={"fingerprint": "e" * 64})  # another kernel source or table
    with pytest.raises(SystemExit, match="rr provenance"):
        report_bench.summarize(*report_bench.load_pairs([str(tmp_path)]))


def test_gate_l5_is_the_production_check_for_h200_only():
    from rlk.gate import registry
    from rlk.integrations.production import checks  # noqa: F401 - registers

    assert "rlk.integrations.production.checks" in registry.CHECK_MODULES
    found = [c for c in registry._CHECKS.values() if (c.level, c.name) == ("L5", "e2e.production")]
    assert len(found) == 1 and found[0].profiles == ("h200",)


def _prod_report(ratios, mism=None, pairs=None, lone=()):
    return {"pairs": len(ratios) if pairs is None else pairs, "ratio": sorted(ratios)[len(ratios) // 2],
            "ratio_ci95": [min(ratios), max(ratios)], "logp_mismatches": [0] * len(ratios) if mism is None else mism,
            "incomplete_pair_files": list(lone), "spec": {"layers": 36, "sequences": 64, "workload": "W1"}}


def test_gate_l5_evaluation_fails_on_each_broken_input():
    from rlk.integrations.production.checks import evaluate

    assert evaluate(_prod_report([0.80, 0.85]), 2).passed
    bad = {
        "slow": (_prod_report([0.80, 0.97]), 2, "upper bound"),
        "mismatch": (_prod_report([0.8], mism=[1]), 1, "mismatches"),
        "no readback": (_prod_report([0.8], mism=[None]), 1, "mismatches"),
        "too few pairs": (_prod_report([0.8]), 2, "1 of 2 pairs"),
        "one arm only": (_prod_report([0.8], lone=["pair1_rr.json"]), 1, "one arm only"),
    }
    for what, (rep, n, msg) in bad.items():
        res = evaluate(rep, n)
        assert not res.passed and msg in res.detail, (what, res.detail)


def test_gate_l5_without_the_engines_fails_and_says_how(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from rlk.integrations.production import checks

    monkeypatch.setattr(checks, "_missing_engines", lambda: ["vllm"])
    res = checks.e2e_production(SimpleNamespace(out_dir=str(tmp_path), progress=lambda *a: None))
    assert not res.passed and "vllm_bundle.sh env" in res.detail


def test_attribution_from_profiled_pairs(tmp_path):
    """Pairs run with --profile carry per-phase kernel categories; the report sums them over the
    phases per arm and gives R/R - P/P per category (rollout from vLLM's trace, trainer from
    torch.profiler: two record shapes)."""
    def trainer_att(gemm, attn, idle):
        return {"device_s": gemm + attn, "host_idle_s": idle, "wall_s": gemm + attn + idle, "launches": 10,
                "device_s_by_category": {"gemm": gemm, "attention": attn}}

    for i in range(2):
        pp, rr = _arm("pp", i, 10, PP_PHASES), _arm("rr", i, 10, RR_PHASES)
        pp["attribution"] = {"rollout_generate": {"gpu_busy_s": 5.0, "host_idle_s": 0.5, "device_s": {"gemm": 5.0}},
                             "old_logp": trainer_att(1.0, 0.5, 0.1), "ref_logp": trainer_att(1.0, 0.5, 0.1),
                             "actor_fwd_bwd": trainer_att(3.0, 2.0, 0.2)}
        rr["attribution"] = {"rollout_generate": {"gpu_busy_s": 6.0, "host_idle_s": 0.4, "device_s": {"gemm": 6.0}},
                             "ref_logp": trainer_att(1.2, 0.4, 0.1), "actor_fwd_bwd": trainer_att(2.5, 1.5, 0.2)}
        records.write_json(records.arm_path(str(tmp_path), i, "pp"), pp)
        records.write_json(records.arm_path(str(tmp_path), i, "rr"), rr)
    rep = report_bench.write([str(tmp_path)], str(tmp_path / "rep.json"))
    att = rep["attribution"]
    assert att["pairs_profiled"] == 2
    s = att["summed_over_phases_s"]
    assert s["gemm"] == {"pp": 10.0, "rr": 9.7, "rr_minus_pp": pytest.approx(-0.3, abs=1e-9)}
    assert s["attention"]["rr_minus_pp"] == pytest.approx(1.9 - 3.0, abs=1e-9)
    assert s["host idle"]["pp"] == pytest.approx(0.9) and s["host idle"]["rr"] == pytest.approx(0.7)
    assert "| gemm | 10.0000 | 9.7000 | -0.3000 |" in (tmp_path / "rep.md").read_text()
    # Without profiled pairs there is no attribution (and no invented one).
    d = tmp_path / "plain"
    d.mkdir()
    _write(d, [10], [9])
    assert "attribution" not in report_bench.write([str(d)], str(d / "r.json"))
