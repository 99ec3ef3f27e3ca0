"""The loop's options for large models, on the CPU: seeded weights of a named config, the
token-class task, Adam's state on the host (offload) and the device fingerprint."""

import dataclasses

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.models.qwen3.layouts import hf_to_fused
from rlk.rl import loop, sync
from rlk.rl.task import TokenClassTask

# Seeded calibrated weights of a named config (a recipe given: not its trained checkpoint), 1 layer.
SCALE = dict(model="tiny", recipe="calibrated.v1", layers=1, task_name="token_class", prompts_per_step=1, group_size=4,
             response_len=3, lr=1e-2)


def test_offloaded_adam_is_adam():
    """The host path runs torch's fused CPU Adam per tensor, the device path torch's default Adam
    over all tensors: two implementations of one update, equal to a few fp32 ulps (not bitwise:
    their operation orders differ), and a bad gradient moves nothing."""
    lc = loop.LoopConfig(**SCALE)
    cfg, hf = lc.weights()
    fused = hf_to_fused(cfg, hf)
    a = loop.Trainer(cfg, fused, "native", lc)
    b = loop.Trainer(cfg, fused, "native", dataclasses.replace(lc, optimizer_offload=True))
    g = torch.Generator().manual_seed(3)
    for _ in range(2):  # the second step uses the moments of the first
        grads = {k: (torch.randn(t.shape, generator=g) * 1e-2).to(torch.bfloat16) for k, t in a.w.items()}
        assert a.apply(grads) == b.apply(grads)
        for k in a.names:
            ma, mb = a.master[k].detach(), b.master[k].detach()
            torch.testing.assert_close(mb, ma, rtol=1e-6, atol=lc.lr * 1e-6)  # 1e-6 of a step
            moved = (a.w[k].float() - b.w[k].float()).abs() / a.w[k].float().abs().clamp_min(1e-30)
            assert float(moved.max()) <= 2 ** -7, k  # at most one bf16 ulp where rounding ties flip
    assert all(p.device.type == "cpu" for p in b.master.values())
    bad = dict(grads, **{"model.norm.weight": torch.full_like(grads["model.norm.weight"], float("nan"))})
    before = {k: t.clone() for k, t in b.w.items()}
    with pytest.raises(UnsupportedConfigError, match="NaN"):
        b.apply(bad)
    assert all(torch.equal(before[k], b.w[k]) for k in before)  # a bad gradient moves nothing


def test_strict_step_on_seeded_weights_with_offload_and_device_fingerprint(tmp_path):
    lc = loop.LoopConfig(route="strict", steps=1, optimizer_offload=True, fingerprint="device", **SCALE)
    rep = loop.run_and_report(lc, ["strict"], str(tmp_path), tag="scale")
    arm = rep["arms"]["strict"]
    assert rep["passed"], rep["failures"]
    r = arm["steps"][0]
    assert r["tokens"] == 4 * 3 and r["ratio_not_one"] == 0 and r["logp_mismatch"] == 0
    assert r["sync"]["fingerprint"] == "device" and r["sync"]["match"]
    assert arm["task"]["name"] == "token_class" and arm["model"]["layers"] == 1
    assert rep["files"]["json"].endswith("rl_loop_scale.json")
    assert 0.0 <= r["reward_mean"] <= 1.0


def test_token_class_reward_and_config_errors():
    t = TokenClassTask()
    assert t.reward([2, 4, 5, 7]) == 0.5 and TokenClassTask(modulus=3, residue=1).reward([1, 4, 5]) == 2 / 3
    t.check(151936)
    with pytest.raises(UnsupportedConfigError, match="modulus"):
        TokenClassTask(modulus=1).check(256)
    for bad in (dict(model="nope"), dict(model="tiny", layers=1), dict(task_name="x"), dict(fingerprint="md5"),
                dict(recipe="x"), dict(optimizer_offload=0.5), dict(trainer="megatron", optimizer_offload=1.5),
                dict(trainer="megatron", optimizer_offload=-0.25)):
        with pytest.raises(UnsupportedConfigError):
            loop.LoopConfig(**bad).check()
    assert loop.LoopConfig(device="cpu").fingerprint_kind() == "sha256"
    assert loop.LoopConfig(device="cuda").fingerprint_kind() == "device"
    assert sync.FINGERPRINTS == ("sha256", "device")


def test_sample_text_of_a_large_vocabulary():
    assert loop._sample_text(list(b"abc")) == "abc"
    assert loop._sample_text([300, 5] * 10).startswith("300 5 300") and loop._sample_text([300] * 20).endswith("...")
