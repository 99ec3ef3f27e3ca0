"""The strict RL loop under the Triton interpreter: every importance ratio exactly 1.0 at every
step (the rollout logp reused as the old logp), every weight sync verified; an engine weight
changed after a verified sync is caught by the ratio."""

import json

import torch

from rlk.models.qwen3 import trained_tiny_weights
from rlk.models.qwen3.layouts import hf_to_fused
from rlk.rl import loop, report, sync

# Small enough for CPU CI (about 10 s per strict step): 1 prompt x 4 samples x 3 tokens.
SMALL = dict(prompts_per_step=1, group_size=4, response_len=3)


def test_strict_steps_have_every_ratio_exactly_one(tmp_path):
    lc = loop.LoopConfig(route="strict", steps=2, **SMALL)
    rep = loop.run_and_report(lc, ["strict"], str(tmp_path))
    arm = rep["arms"]["strict"]
    assert rep["passed"] and rep["failures"] == [] and loop.strict_failures(arm) == []
    for r in arm["steps"]:
        assert r["tokens"] == 4 * 3
        assert r["ratio_not_one"] == 0 and r["logp_mismatch"] == 0, r
        assert r["ratio_min"] == r["ratio_max"] == 1.0 and r["abs_dev"]["max"] == 0.0
        assert r["sync"]["match"] and r["sync"]["sha256_trainer"] == r["sync"]["sha256_rollout"]
    # Steps ran with updated weights: once a gradient was nonzero, Adam moves the weights at every
    # later step (its moments), and each synced digest differs from the one before.
    digests = [arm["initial_sync"]["sha256_rollout"]] + [r["sync"]["sha256_rollout"] for r in arm["steps"]]
    assert any(r["grad_norm"] > 0 for r in arm["steps"])
    for i, r in enumerate(arm["steps"]):
        moved = any(s["grad_norm"] > 0 for s in arm["steps"][:i + 1])
        assert (digests[i + 1] != digests[i]) == moved, (i, [s["grad_norm"] for s in arm["steps"]])
    on_disk = json.load(open(rep["files"]["json"]))
    assert on_disk["passed"] and len(open(rep["files"]["jsonl"]).read().splitlines()) == 2
    # The record says which engine rolled out (here rlk's own executor) and the plot title names it.
    assert arm["engine"]["name"] == "rlk executor" and report.arm_names(rep["arms"], "engine") == "strict: rlk executor"
    assert arm["actor"] == {"name": "rlk trainer (rlk's strict kernels)", "trainer": "rlk", "route": "strict"}
    assert report.arm_names(rep["arms"], "actor") == "strict: rlk trainer (rlk's strict kernels)"
    assert report.arm_names({"strict": {}}, "actor") is None  # a report written before the record
    assert "rollout engine: strict: rlk executor" in report.plot_title(lc, report.arm_names(rep["arms"], "engine"))


def test_engine_weight_changed_after_sync_makes_ratios_not_one():
    seen = {}

    def perturb(generation, engine):
        # After the verified initial sync, one element of the engine's final-norm weight moves:
        # the trainer still holds the synced value, so every logp the rollout records differs.
        if generation == 0:
            w = engine.w["model.norm.weight"]
            w[0] = w[0] * 1.5 + 0.25
            seen["held"] = sync.fingerprint(engine.w)

    arm = loop.run_arm(loop.LoopConfig(route="strict", steps=1, **SMALL), hooks=loop.Hooks(after_sync=perturb))
    r = arm["steps"][0]
    assert seen["held"] != arm["initial_sync"]["sha256_trainer"]
    assert r["ratio_not_one"] > 0 and r["logp_mismatch"] >= r["ratio_not_one"]
    bad = loop.strict_failures(arm)
    assert bad and "ratio_not_one" in bad[0]


def test_strict_trainer_and_engine_hold_separate_weights():
    cfg, w = trained_tiny_weights()
    fused = hf_to_fused(cfg, w)
    lc = loop.LoopConfig(route="strict")
    t, e = loop.Trainer(cfg, fused, "strict", lc), loop.RolloutEngine(cfg, fused, "strict", lc)
    assert all(e.w[k].abs().sum() == 0 for k in e.w)  # the engine starts empty: the first sync loads it
    assert all(t.w[k].data_ptr() != e.w[k].data_ptr() != fused[k].data_ptr() for k in fused)
    assert all(torch.equal(t.w[k], fused[k]) for k in fused)
