"""The GPU engine bench's host-side parts: workloads, arm environments, the bitwise comparison,
and the report's ratios and targets (synthetic arm files; no engine, no GPU)."""

import json

import pytest
import torch

from rlk.integrations.vllm import engine_bench, engine_compare_bench, engine_report_bench


def test_workloads_are_seeded_and_in_range():
    for name, w in engine_bench.WORKLOADS.items():
        p1, l1 = engine_bench.workload(name, 1000)
        p2, l2 = engine_bench.workload(name, 1000)
        assert (p1, l1) == (p2, l2) and len(p1) == len(l1) == w["n"]
        assert all(w["prompt"][0] <= len(p) <= w["prompt"][1] for p in p1)
        assert all(w["response"][0] <= r <= w["response"][1] for r in l1)
        assert max(len(p) + r for p, r in zip(p1, l1)) <= engine_bench.MAX_MODEL_LEN
        assert w["n"] <= engine_bench.MAX_NUM_SEQS


def test_only_the_rlk_arm_loads_rlk_and_its_environment(tmp_path):
    stock = engine_bench.arm_env("stock", str(tmp_path))
    bi = engine_bench.arm_env("batch_invariant", str(tmp_path))
    rlk = engine_bench.arm_env("rlk", str(tmp_path))
    assert stock["VLLM_PLUGINS"] == "" and "VLLM_BATCH_INVARIANT" not in stock
    assert bi["VLLM_PLUGINS"] == "" and bi["VLLM_BATCH_INVARIANT"] == "1"
    assert rlk["VLLM_PLUGINS"] == "rlk" and rlk["RLK_VLLM_COUNTERS_DIR"] == str(tmp_path)
    assert not any(k.startswith("RLK") or k == "CUBLAS_WORKSPACE_CONFIG" for k in stock)


def test_model_runner_of_the_strict_engine(monkeypatch):
    from rlk.errors import UnsupportedConfigError
    from rlk.integrations.vllm import plugin

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    monkeypatch.delenv(plugin.MODEL_RUNNER_ENV, raising=False)
    monkeypatch.setattr(plugin, "_cuda_available", lambda: False)
    assert plugin.worker_env()["VLLM_USE_V2_MODEL_RUNNER"] == "0"  # the CPU build refuses V2
    assert engine_bench.runner_suffix("rlk", False) == "" and engine_bench.runner_suffix("rlk", True) == "_mrv2"
    monkeypatch.setattr(plugin, "_cuda_available", lambda: True)
    assert plugin.worker_env()["VLLM_USE_V2_MODEL_RUNNER"] == "1"  # a GPU: Model Runner V2, stock's runner
    assert engine_bench.runner_suffix("rlk", True) == "" and engine_bench.runner_suffix("rlk", False) == "_mrv1"
    assert engine_bench.runner_suffix("stock", False) == ""  # the baselines run vLLM's own choice
    monkeypatch.setenv(plugin.MODEL_RUNNER_ENV, "v1")
    assert plugin.worker_env()["VLLM_USE_V2_MODEL_RUNNER"] == "0"  # forced: vLLM refuses, never falls back
    monkeypatch.setattr(plugin, "_cuda_available", lambda: False)
    monkeypatch.setenv(plugin.MODEL_RUNNER_ENV, "v2")
    assert plugin.worker_env()["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    monkeypatch.setenv(plugin.MODEL_RUNNER_ENV, "v3")
    with pytest.raises(UnsupportedConfigError, match="RLK_VLLM_MODEL_RUNNER='v3'"):
        plugin.worker_env()
    for arm, runner in (("stock", "v2"), ("rlk", "v9")):  # refused before any engine import
        with pytest.raises(SystemExit, match="--model-runner"):
            engine_bench.run_arm(arm, "/nonexistent", "/tmp/x.json", ["W0"], model_runner=runner)


def test_compare_logp_counts_bits_and_refuses_non_fp32_values():
    t = [torch.tensor([-0.5, -3.25, -7.0], dtype=torch.float32), torch.tensor([-1.0], dtype=torch.float32)]
    e = [x.double() for x in t]
    ok = engine_compare_bench.compare_logp(e, t)
    assert ok["mismatch_count"] == 0 and ok["compared_elements"] == 4 and ok["torch_equal"]
    bumped = t[0].clone()
    bumped.view(torch.int32)[1] += 1  # one ulp
    bad = engine_compare_bench.compare_logp([bumped.double(), e[1]], t)
    assert bad["mismatch_count"] == 1 and bad["first_mismatch"]["token"] == 1 and bad["max_abs_diff"] > 0
    with pytest.raises(AssertionError, match="not fp32"):
        engine_compare_bench.compare_logp([torch.tensor([-0.1], dtype=torch.float64)], [torch.tensor([-0.1])])


def _arm(tmp_path, arm, tok):
    rec = {"arm": arm, "vllm_version": "0.26.0", "workloads": {
        w: {"sequences": 2, "response_tokens": 10, "prompt_tokens": 20, "tok_per_s": v} for w, v in tok.items()},
        "provenance": {"extra": {"bundle_sha256": "b" * 64}}}
    with open(tmp_path / f"arm_{arm}.json", "w") as f:
        json.dump(rec, f)


def _cmp(tmp_path, rlk_mismatch):
    fig = lambda m: {"compared_elements": 10, "mismatch_count": m, "max_abs_diff": 0.0 if m == 0 else 1e-6,
                     "torch_equal": m == 0}
    res = {"trainers": ["rlk"], "arms": {"rlk": {"W0": {"rlk_trainer": fig(rlk_mismatch), "megatron": fig(0)}},
                                         "stock": {"W0": {"rlk_trainer": fig(9)}}}}
    with open(tmp_path / "compare.json", "w") as f:
        json.dump(res, f)


def test_report_ratios_and_targets(tmp_path):
    _arm(tmp_path, "stock", {"W0": 1000.0})
    _arm(tmp_path, "batch_invariant", {"W0": 500.0})
    _arm(tmp_path, "rlk", {"W0": 960.0})
    _cmp(tmp_path, 0)
    rep = engine_report_bench.write(str(tmp_path), str(tmp_path / "out" / "vllm_h200.json"))
    w = rep["workloads"]["W0"]
    assert w["stock"] == 1000.0 and w["rlk_vs_stock_tok_per_s"] == 0.96 and w["rlk_vs_batch_invariant_tok_per_s"] == 1.92
    assert rep["targets"] == {"rlk_ge_0.95x_stock": True, "rlk_faster_than_batch_invariant": True,
                              "rlk_bitwise_rlk_trainer": True, "rlk_bitwise_megatron": True}
    assert rep["bitwise"]["stock"]["W0"]["rlk_trainer"]["mismatch_count"] == 9
    md = (tmp_path / "out" / "vllm_h200.md").read_text()
    assert sum(line.startswith("| W0 | 2 | 10 | 1000.0 | 500.0 | 960.0 | 0.96 | 1.92 |") for line in md.splitlines()) == 1
    # Each arm's model runner, from its record (the helper _arm writes none: unknown).
    assert rep["engine"]["rlk"]["use_v2_model_runner"] is None
    assert "Model runner: batch_invariant unknown, rlk unknown, stock unknown." in md


def test_report_names_each_arms_model_runner(tmp_path):
    for arm, v2 in (("stock", True), ("rlk", False)):
        _arm(tmp_path, arm, {"W0": 1000.0})
        rec = json.loads((tmp_path / f"arm_{arm}.json").read_text())
        rec["use_v2_model_runner"] = v2
        (tmp_path / f"arm_{arm}.json").write_text(json.dumps(rec))
    _cmp(tmp_path, 0)
    rep = engine_report_bench.write(str(tmp_path), str(tmp_path / "out" / "vllm_h200.json"))
    assert rep["engine"]["rlk"]["use_v2_model_runner"] is False and rep["engine"]["stock"]["use_v2_model_runner"]
    assert "Model runner: rlk V1, stock V2." in (tmp_path / "out" / "vllm_h200.md").read_text()


def test_report_attribution_names_its_workload(tmp_path):
    _arm(tmp_path, "stock", {"W2": 1000.0})
    _arm(tmp_path, "rlk", {"W2": 900.0})
    _cmp(tmp_path, 0)
    rec = json.loads((tmp_path / "arm_rlk.json").read_text())
    rec["attribution"] = {"span_s": 2.0, "device_s": {"gemm": 1.5}, "what": "W2 prompts, 128 tokens each, profiled"}
    (tmp_path / "arm_rlk.json").write_text(json.dumps(rec))
    engine_report_bench.write(str(tmp_path), str(tmp_path / "out" / "vllm_h200.json"))
    md = (tmp_path / "out" / "vllm_h200.md").read_text()
    assert "Attribution (one profiled generate per arm: W2 prompts, 128 tokens each, profiled;" in md
    assert "| rlk | None | 2.0 | None | 1.5 |" in md


def test_report_targets_fail_on_slow_arm_or_one_mismatch(tmp_path):
    _arm(tmp_path, "stock", {"W0": 1000.0})
    _arm(tmp_path, "batch_invariant", {"W0": 990.0})
    _arm(tmp_path, "rlk", {"W0": 940.0})
    _cmp(tmp_path, 1)
    t = engine_report_bench.build(str(tmp_path))["targets"]
    assert t["rlk_ge_0.95x_stock"] is False and t["rlk_faster_than_batch_invariant"] is False
    assert t["rlk_bitwise_rlk_trainer"] is False


def test_attribution_classes_union_and_host_idle(tmp_path):
    import gzip

    from rlk.integrations.vllm import engine_profile_bench

    ev = [{"cat": "kernel", "name": "nvjet_tst_128x256", "ts": 0, "dur": 10},
          {"cat": "kernel", "name": "_paged_fwd_kernel", "ts": 5, "dur": 10},  # overlaps the first
          {"cat": "kernel", "name": "nvjet_small", "ts": 6, "dur": 2},  # inside the second
          {"cat": "kernel", "name": "rms_norm_kernel", "ts": 40, "dur": 5},
          {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 100}]
    a = engine_profile_bench.attribution(ev)
    assert a["kernels"] == 4 and a["span_s"] == 45e-6 and a["gpu_busy_s"] == 20e-6 and a["host_idle_s"] == 25e-6
    assert a["device_s"] == {"gemm": 12e-6, "attention": 10e-6, "norm": 5e-6}
    assert [(k["name"], k["class"], k["calls"], k["seconds"]) for k in a["top_kernels"]] == [
        ("nvjet_tst_128x256", "gemm", 1, 10e-6), ("_paged_fwd_kernel", "attention", 1, 10e-6),
        ("rms_norm_kernel", "norm", 1, 5e-6), ("nvjet_small", "gemm", 1, 2e-6)]
    three = engine_profile_bench.attribution(ev + [dict(ev[3], ts=50), dict(ev[3], ts=60)])
    assert three["top_kernels"][0] == {"name": "rms_norm_kernel", "class": "norm", "calls": 3, "seconds": 15e-6,
                                       "mean_us": 5.0}
    with gzip.open(tmp_path / "worker.pt.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": ev}, f)
    with open(tmp_path / "frontend.json", "w") as f:
        json.dump({"traceEvents": ev[4:]}, f)
    got = engine_profile_bench.attribution_from_dir(str(tmp_path))
    assert got["trace"] == "worker.pt.trace.json.gz" and got["kernels"] == 4


def test_kernel_classes_of_known_names():
    from rlk.integrations.vllm.engine_profile_bench import classify

    assert classify("flash_fwd_splitkv_kernel") == "attention" and classify("_linear_logp_fwd") == "logp"
    assert classify("sm90_xmma_gemm_bf16") == "gemm" and classify("fused_add_rms_norm_kernel") == "norm"
    assert classify("rotary_embedding_kernel") == "rope" and classify("act_and_mul_kernel") == "swiglu"
    assert classify("gumbel_sample_kernel") == "sampling" and classify("something_else") == "other"
    assert classify("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<...>>>") \
        == "attention"


def test_sampled_logp_stats():
    s = engine_compare_bench.sampled_logp_stats(torch.tensor([0.0, -1.0, -2.0, float("-inf")], dtype=torch.float64))
    assert s["n"] == 4 and s["non_finite"] == 1 and s["frac_logp_zero"] == 0.25 and s["mean"] == -1.0


def test_report_over_process_repetitions_takes_medians_and_checks_the_checkpoint(tmp_path):
    a, b, c = tmp_path / "r1", tmp_path / "r2", tmp_path / "r3"
    for d, rlk, stock in ((a, 900.0, 1000.0), (b, 980.0, 1000.0), (c, 1000.0, 1100.0)):
        d.mkdir()
        _arm(d, "stock", {"W0": stock})
        _arm(d, "rlk", {"W0": rlk})
        (d / "checkpoint.json").write_text(json.dumps({"sha256": "c" * 64}))
    _cmp(a, 0)
    rep = engine_report_bench.build([str(a), str(b), str(c)])
    w = rep["workloads"]["W0"]
    assert w["rlk"] == 980.0 and w["stock"] == 1000.0 and w["rlk_vs_stock_tok_per_s"] == 0.98
    assert w["per_process"]["rlk"] == [900.0, 980.0, 1000.0] and rep["targets"]["rlk_bitwise_rlk_trainer"]
    (c / "checkpoint.json").write_text(json.dumps({"sha256": "d" * 64}))
    with pytest.raises(ValueError, match="different checkpoints"):
        engine_report_bench.build([str(a), str(b), str(c)])


def test_report_takes_only_the_named_arms_of_a_filtered_folder(tmp_path):
    """``DIR:arm`` adds only that arm of an earlier folder (same checkpoint): its other arms stay
    out of the medians, the report names the folder with its filter, and a named arm the folder
    lacks, or a different checkpoint, is refused."""
    new, old = tmp_path / "new" / "arms", tmp_path / "old" / "arms"
    for d, rlk in ((new, 960.0), (old, 500.0)):
        d.mkdir(parents=True)
        _arm(d, "stock", {"W0": 1000.0})
        _arm(d, "rlk", {"W0": rlk})
        (d / "checkpoint.json").write_text(json.dumps({"sha256": "c" * 64}))
    _arm(old, "batch_invariant", {"W0": 400.0})
    _cmp(old, 0)  # the old folder's comparison scored its own rlk arm, which the filter leaves out
    rep = engine_report_bench.build([f"{old}:batch_invariant", str(new)])
    assert rep["bitwise"] == {} and rep["bitwise_from"] is None and "rlk_bitwise_rlk_trainer" not in rep["targets"]
    _cmp(new, 1)
    rep = engine_report_bench.build([f"{old}:batch_invariant", str(new)])
    assert rep["bitwise_from"] == "arms" and rep["targets"]["rlk_bitwise_rlk_trainer"] is False
    w = rep["workloads"]["W0"]
    assert w["per_process"] == {"stock": [1000.0], "rlk": [960.0], "batch_invariant": [400.0]}, w
    assert w["rlk_vs_batch_invariant_tok_per_s"] == 2.4 and rep["results_dirs"] == ["old/arms:batch_invariant", "arms"]
    with pytest.raises(ValueError, match="no arm_<arm>.json for"):
        engine_report_bench.build([str(new), f"{old}:eager"])
    colon = tmp_path / "at_12:30"  # a folder name with ':' is a folder
    colon.mkdir()
    _arm(colon, "stock", {"W0": 1000.0})
    assert engine_report_bench.split_entry(str(colon)) == (str(colon), None)
    (old / "checkpoint.json").write_text(json.dumps({"sha256": "d" * 64}))
    with pytest.raises(ValueError, match="different checkpoints"):
        engine_report_bench.build([str(new), f"{old}:batch_invariant"])


def test_prepare_reuses_a_checkpoint_of_the_same_identity_only(tmp_path, monkeypatch):
    from rlk.models.qwen3 import checkpoint

    d = str(tmp_path / "ckpt")
    a = engine_bench.prepare(d, "tiny", 0, recipe="calibrated.v1", device="cpu")
    assert a["meta"]["recipe"] == "calibrated.v1" and a["meta"]["calibration"]["recipe"] == "calibrated.v1"
    writes = []
    real = checkpoint.write_hf_dir
    monkeypatch.setattr(checkpoint, "write_hf_dir", lambda *x, **k: writes.append(1) or real(*x, **k))
    assert engine_bench.prepare(d, "tiny", 0, recipe="calibrated.v1", device="cpu") == a and writes == []
    b = engine_bench.prepare(d, "tiny", 1, recipe="calibrated.v1", device="cpu")
    assert writes == [1] and b["sha256"] != a["sha256"]


@pytest.mark.parametrize("kw,msg", [(dict(profile_workload="W9"), "--profile-workload"),
                                    (dict(profile_tokens=0), "--profile-tokens"),
                                    (dict(profile_prompt_len=0), "--profile-prompt-len")])
def test_a_bad_profile_request_stops_before_any_engine_starts(kw, msg, tmp_path):
    with pytest.raises(SystemExit, match=msg):
        engine_bench.run_arm("stock", str(tmp_path), str(tmp_path / "a.json"), ["W0"], profile=True, **kw)


def test_profile_requests_cut_prompts_and_set_lengths():
    prompts, lens = [[1, 2, 3, 4], [5, 6]], [7, 9]
    assert engine_bench.profile_requests(prompts, lens) == (prompts, lens, "prompts, its own response lengths, profiled")
    p, n, what = engine_bench.profile_requests(prompts, lens, tokens=5, prompt_len=3)
    assert p == [[1, 2, 3], [5, 6]] and n == [5, 5] and what == "prompts cut to 3 tokens, 5 tokens each, profiled"
    assert prompts == [[1, 2, 3, 4], [5, 6]]  # the workload's own lists are not changed


def test_report_engine_settings_come_from_the_first_folder_attribution_from_the_profiled_one(tmp_path):
    """Engine settings and provenance are the first folder's record of an arm; a later, profiled
    process lends only its attribution (its engine started warm, its timings are its own)."""
    first, prof = tmp_path / "first", tmp_path / "profiled"
    for d, start, att in ((first, 55.0, None), (prof, 20.0, {"span_s": 2.0, "device_s": {"gemm": 1.5}})):
        d.mkdir()
        for arm in ("stock", "rlk"):
            _arm(d, arm, {"W0": 1000.0})
            rec = json.loads((d / f"arm_{arm}.json").read_text())
            rec["engine_start_s"] = start
            if att:
                rec["attribution"] = att
            (d / f"arm_{arm}.json").write_text(json.dumps(rec))
    _cmp(first, 0)
    rep = engine_report_bench.build([str(first), str(prof)])
    assert rep["engine"]["rlk"]["engine_start_s"] == 55.0 and rep["engine"]["stock"]["engine_start_s"] == 55.0
    assert rep["attribution"]["rlk"]["device_s"] == {"gemm": 1.5}

