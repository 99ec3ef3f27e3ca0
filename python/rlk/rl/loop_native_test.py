"""The RL loop on the native route (fast): reward rises, the drift is reported, faults abort,
the strict verdict fails on a route whose ratios are not 1, and the command line works."""

import json
import os

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.rl import checks, loop, sync
from rlk.rl.__main__ import main


def test_reward_rises_in_a_few_steps():
    arm = loop.run_arm(loop.LoopConfig(route="native", steps=12))
    s = arm["summary"]
    rewards = [r["reward_mean"] for r in arm["steps"]]
    assert s["reward_gain"] > 0.3, rewards
    assert max(rewards[-3:]) > rewards[0] + 0.3, rewards
    # Every step's weights were synced and verified, and they changed while the reward moved.
    digests = [arm["initial_sync"]["sha256_rollout"]] + [r["sync"]["sha256_rollout"] for r in arm["steps"]]
    assert all(r["sync"]["match"] for r in arm["steps"]) and len(set(digests)) > 1 and s["syncs_verified"] == 13
    assert [r["generation"] for r in arm["steps"]] == list(range(1, 13))


def test_drift_is_reported_and_fails_the_strict_verdict():
    # The probe's engine holds one changed weight after its verified sync: drift on any machine
    # (the native route's own drift depends on the CPU's bf16 GEMMs: none on oneDNN/AMX).
    arm = checks.discrimination_probe(**checks.GATE_LOOP)
    s = arm["summary"]
    assert s["steps"] == 1 and s["logp_mismatch"] > 0 and s["ratio_not_one"] > 0 and s["abs_dev_max"] > 0
    for r in arm["steps"]:
        assert set(r["abs_dev"]) == {"min", "mean", "p01", "p50", "p99", "max"}
        assert r["ratio_min"] <= 1.0 <= r["ratio_max"] and r["old_logp"].startswith("rollout")
    bad = loop.strict_failures(arm)
    assert bad and "ratio_not_one" in bad[0]
    # The gate's verdict on a report whose "strict" arm drifts (the probe's arm under that name).
    verdict = checks.evaluate({"arms": {"strict": arm, "native": arm}, "failures": bad}, arm)
    assert not verdict.passed and "ratio_not_one" in verdict.detail


def test_gate_verdict_needs_the_probe_to_see_the_changed_weight_not_native_drift():
    native = loop.run_arm(loop.LoopConfig(route="native", steps=1))
    # Summaries without drift: a strict arm's, or a native route on a CPU whose kernels agree.
    exact = dict(native, summary=dict(native["summary"], ratio_not_one=0, logp_mismatch=0))
    report = {"arms": {"strict": exact, "native": exact}, "failures": []}
    probe = checks.discrimination_probe(**checks.GATE_LOOP)
    ok = checks.evaluate(report, probe)
    assert ok.passed and "native kernels agree bit for bit" in ok.detail  # native drift is not required ...
    blind = dict(probe, summary=dict(probe["summary"], ratio_not_one=0))
    for bad_probe, why in ((blind, "not discriminating"), (None, "probe did not run")):
        verdict = checks.evaluate(report, bad_probe)
        assert not verdict.passed and why in verdict.detail  # ... a probe that sees nothing fails the gate


def test_corrupted_sync_aborts_the_loop():
    def flip(src, dst):
        sync.copy_transport(src, dst)
        dst["lm_head.weight"].view(torch.int16)[7, 3] ^= 4

    with pytest.raises(sync.WeightSyncError, match="lm_head.weight"):
        loop.run_arm(loop.LoopConfig(route="native", steps=1), hooks=loop.Hooks(transport=flip))


def test_bad_config_is_refused():
    for bad in (dict(route="fast"), dict(group_size=1), dict(steps=0), dict(model="qwen3-9b"), dict(model="tiny", layers=1), dict(lr=-1.0),
                dict(clip_eps=1.5), dict(target=999)):
        with pytest.raises(UnsupportedConfigError):
            loop.run_arm(loop.LoopConfig(**{"route": "native", **bad}))


def test_trainer_token_loss_default_equals_the_model_default():
    # The actor's per-token loss hook: -logp * mask through token_loss gives the model's own gradients.
    from rlk.models.qwen3 import Qwen3, trained_tiny_weights
    from rlk.replay import trainer

    cfg, w = trained_tiny_weights()
    m = Qwen3(cfg, w, "native")
    pk = trainer.pack([list(b"def "), list(b"class ")], [list(b"abc"), list(b"de")])
    mask = pk.loss_mask.float()
    lp0, g0 = m.trainer_logp(pk.ids, pk.cu_seqlens, pk.targets, actor=True, loss_mask=pk.loss_mask)
    lp1, g1 = m.trainer_logp(pk.ids, pk.cu_seqlens, pk.targets, actor=True,
                             token_loss=lambda lp, lo, hi: -(lp * mask[lo:hi]))
    assert torch.equal(lp0, lp1) and all(torch.equal(g0[k], g1[k]) for k in g0)
    with pytest.raises(UnsupportedConfigError, match="actor=True"):
        m.trainer_logp(pk.ids, pk.cu_seqlens, pk.targets, token_loss=lambda lp, lo, hi: lp)


def test_command_line_writes_the_reports(tmp_path, capsys):
    out = tmp_path / "rl"
    assert main(["--route", "native", "--steps", "2", "--out", str(out)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [r["step"] for r in lines] == [0, 1] and all(r["route"] == "native" for r in lines)
    rep = json.load(open(out / "rl_loop_cpu.json"))
    assert [r["step"] for r in rep["arms"]["native"]["steps"]] == [0, 1] and rep["provenance"].get("fingerprint")
    assert len(open(out / "steps.jsonl").read().splitlines()) == 2
    assert os.path.getsize(out / "rl_loop_cpu.png") > 10_000
    with pytest.raises(SystemExit):
        main(["--route", "native", "--target", "ab", "--out", str(out)])
    with pytest.raises(SystemExit):
        main(["--route", "native", "--group-size", "1", "--out", str(out)])


def test_engine_memory_option():
    import pytest as _pytest

    from rlk.rl.__main__ import _parser, engine_kwargs

    p = _parser()
    a = p.parse_args(["--engine", "vllm", "--engine-memory", "0.35", "--out", "x"])
    assert engine_kwargs(a, p) == {"gpu_memory_utilization": 0.35}
    assert engine_kwargs(p.parse_args(["--out", "x"]), p) == {}
    for bad in (["--engine-memory", "0.3"], ["--engine", "vllm", "--engine-memory", "1.5"],
                ["--engine", "vllm", "--engine-memory", "0"]):
        with _pytest.raises(SystemExit):
            engine_kwargs(p.parse_args(bad + ["--out", "x"]), p)


def test_engine_transport_option():
    import pytest as _pytest

    from rlk.rl.__main__ import _parser, engine_kwargs

    p = _parser()
    for route in ("strict", "native"):
        a = p.parse_args(["--engine", "vllm", "--engine-transport", "inproc", "--route", route, "--out", "x"])
        assert engine_kwargs(a, p) == {"transport": "inproc"}
    a = p.parse_args(["--engine", "vllm", "--engine-transport", "file", "--engine-memory", "0.2", "--out", "x"])
    assert engine_kwargs(a, p) == {"transport": "file", "gpu_memory_utilization": 0.2}
    # Refused: without vLLM, both routes in one process in process, an unknown transport.
    for bad in (["--engine-transport", "file"], ["--engine", "vllm", "--engine-transport", "inproc"],
                ["--engine", "vllm", "--engine-transport", "inproc", "--route", "both"]):
        with _pytest.raises(SystemExit):
            engine_kwargs(p.parse_args(bad + ["--out", "x"]), p)
    with _pytest.raises(SystemExit):
        p.parse_args(["--engine", "vllm", "--engine-transport", "ipc", "--out", "x"])


def test_optimizer_offload_option(tmp_path):
    from rlk.rl.__main__ import _offload, _parser

    p = _parser()
    got = {" ".join(a): _offload(p.parse_args(a + ["--out", "x"]).optimizer_offload)
           for a in ([], ["--optimizer-offload"], ["--optimizer-offload", "0.85"], ["--optimizer-offload", "1"],
                     ["--optimizer-offload", "0"])}
    assert got == {"": False, "--optimizer-offload": True, "--optimizer-offload 0.85": 0.85,
                   "--optimizer-offload 1": True, "--optimizer-offload 0": False}
    assert all(type(v) is bool for k, v in got.items() if k != "--optimizer-offload 0.85")
    # A fraction is megatron's offload; the rlk trainer's is all or none. Refused before any work.
    for bad in (["--optimizer-offload", "0.5"], ["--optimizer-offload", "-1"],
                ["--trainer", "megatron", "--optimizer-offload", "1.5"],
                ["--trainer", "megatron", "--optimizer-offload", "-0.2"]):
        with pytest.raises(SystemExit):
            main(["--route", "native", "--steps", "1", "--out", str(tmp_path / "x")] + bad)
    assert not (tmp_path / "x").exists()
