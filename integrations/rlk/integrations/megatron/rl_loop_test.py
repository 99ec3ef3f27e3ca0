"""The RL loop (``rlk.rl.loop``) with the megatron-core actor (``rl_trainer.RLTrainer``) on the CPU:
every importance ratio exactly 1.0 and every weight sync verified, also at the step after
megatron's Adam update (the engine then runs the weights megatron's optimizer wrote); an engine
weight changed after a verified sync makes the ratios differ from 1 (the check can fail). The
native route trains megatron's local spec (its logp the same model's, not bitwise); on both
routes the packed batch reaches megatron on the parameters' device.

megatron-core 0.19.2 is required (``CI`` set: the tests fail when it is missing).
"""

import pytest

from rlk.errors import UnsupportedConfigError
from rlk.integrations.megatron.testing import require_megatron
from rlk.rl import loop, report

# As rlk.rl's loop_test: 1 prompt x 4 samples x 3 tokens.
SMALL = dict(prompts_per_step=1, group_size=4, response_len=3, trainer="megatron")


@pytest.fixture(scope="module")
def trainer_cls():
    require_megatron()
    from rlk.integrations.megatron.rl_trainer import RLTrainer

    return RLTrainer


def test_megatron_actor_ratios_exactly_one(trainer_cls):
    arm = loop.run_arm(loop.LoopConfig(route="strict", steps=2, **SMALL), make_trainer=trainer_cls)
    assert loop.strict_failures(arm) == []
    for r in arm["steps"]:
        assert r["tokens"] == 12 and r["ratio_not_one"] == 0 and r["logp_mismatch"] == 0, r
        assert r["sync"]["match"] and r["sync"]["sha256_trainer"] == r["sync"]["sha256_rollout"]
    digests = [arm["initial_sync"]["sha256_rollout"]] + [r["sync"]["sha256_rollout"] for r in arm["steps"]]
    assert arm["steps"][0]["grad_norm"] > 0 and digests[1] != digests[0]  # megatron's step moved the weights
    assert arm["config"]["trainer"] == "megatron" and "strict spec" in arm["actor"]["name"]
    import importlib.metadata

    assert arm["actor"]["name"].startswith(f"megatron-core {importlib.metadata.version('megatron-core')} GPTModel")
    # The plot names each arm's actor.
    title = report.plot_title(loop.LoopConfig.from_dict(arm["config"]),
                              actor=report.arm_names({"strict": arm}, "actor"))
    assert "actor: strict: megatron-core" in title and "(rlk's strict spec)" in title


@pytest.mark.parametrize("route", ["strict", "native"])
def test_optimizer_offload_runs_megatrons_hybrid_optimizer_in_the_loop(trainer_cls, route):
    """``optimizer_offload=0.5``: megatron's HybridDeviceOptimizer keeps half the parameters' fp32
    state on the host, on both routes. On the CPU its update is bitwise the one without offload
    (rlk.integrations.megatron.offload), so the engine receives the same weights at every sync, and
    the strict arm's ratios stay exactly 1."""
    base = loop.run_arm(loop.LoopConfig(route=route, steps=2, **SMALL), make_trainer=trainer_cls)
    off = loop.run_arm(loop.LoopConfig(route=route, steps=2, optimizer_offload=0.5, **SMALL), make_trainer=trainer_cls)
    assert off["actor"]["optimizer_offload"] == 0.5 and off["actor"]["optimizer"] == "megatron HybridDeviceOptimizer"
    assert base["actor"]["optimizer_offload"] == 0.0
    assert off["config"]["optimizer_offload"] == 0.5
    digests = [[r["sync"]["sha256_rollout"] for r in a["steps"]] for a in (base, off)]
    assert digests[0] == digests[1] and digests[0][0] != off["initial_sync"]["sha256_rollout"]
    if route == "strict":
        assert loop.strict_failures(off) == []


@pytest.mark.parametrize("route", ["strict", "native"])
def test_recompute_runs_megatrons_activation_recompute_in_the_loop(trainer_cls, route):
    """``recompute="full"``: megatron recomputes every layer's activations in the backward (its
    TransformerConfig says so, the actor record names it) and the gradients are bitwise those
    without recompute, so the engine receives the same weights at every sync."""
    made = []

    def make(*args):
        made.append(trainer_cls(*args))
        return made[-1]

    base = loop.run_arm(loop.LoopConfig(route=route, steps=2, **SMALL), make_trainer=trainer_cls)
    rc = loop.run_arm(loop.LoopConfig(route=route, steps=2, recompute="full", **SMALL), make_trainer=make)
    tc = made[0]._gpt.config
    assert (tc.recompute_granularity, tc.recompute_method, tc.recompute_num_layers) == ("full", "uniform", 1)
    assert rc["actor"]["recompute"] == "full" and base["actor"]["recompute"] is None
    assert rc["config"]["recompute"] == "full"
    digests = [[r["sync"]["sha256_rollout"] for r in a["steps"]] for a in (base, rc)]
    assert digests[0] == digests[1] and digests[0][0] != rc["initial_sync"]["sha256_rollout"]
    if route == "strict":
        assert loop.strict_failures(rc) == []


def test_recompute_is_refused_for_the_rlk_trainer_and_unknown_modes():
    loop.LoopConfig(recompute="selective", **SMALL).check()
    with pytest.raises(UnsupportedConfigError, match="megatron actor's"):
        loop.LoopConfig(recompute="full", **dict(SMALL, trainer="rlk")).check()
    with pytest.raises(UnsupportedConfigError, match="one of"):
        loop.LoopConfig(recompute="layers", **SMALL).check()


def test_engine_weight_changed_after_sync_is_caught(trainer_cls):
    def perturb(generation, engine):
        if generation == 0:
            w = engine.w["model.norm.weight"]
            w[0] = w[0] * 1.5 + 0.25

    arm = loop.run_arm(loop.LoopConfig(route="strict", steps=1, **SMALL), hooks=loop.Hooks(after_sync=perturb),
                       make_trainer=trainer_cls)
    assert arm["steps"][0]["ratio_not_one"] > 0
    assert "ratio_not_one" in loop.strict_failures(arm)[0]


def test_trainer_and_factory_must_agree(trainer_cls):
    from rlk.models.qwen3.layouts import hf_to_fused

    with pytest.raises(UnsupportedConfigError, match="needs its factory"):
        loop.run_arm(loop.LoopConfig(route="strict", steps=1, **SMALL))
    lc = loop.LoopConfig(route="strict", steps=1, **SMALL)
    cfg, hf = lc.weights()
    with pytest.raises(UnsupportedConfigError, match="route 'other'"):
        trainer_cls(cfg, hf_to_fused(cfg, hf), "other", lc)


def test_native_arm_trains_megatron_local_spec(trainer_cls):
    """The native route's actor is megatron's local spec (torch varlen attention, cuBLAS on a GPU):
    its logp of the rollout's tokens is the same model's (ratios near 1, not bitwise: the native
    engine is rlk's torch route), megatron's Adam moves the weights and every sync is verified."""
    arm = loop.run_arm(loop.LoopConfig(route="native", steps=2, **SMALL), make_trainer=trainer_cls)
    assert arm["actor"]["route"] == "native" and "local spec" in arm["actor"]["name"], arm["actor"]
    assert "native: megatron-core" in report.arm_names({"native": arm}, "actor")
    assert "strict spec" not in arm["actor"]["name"]
    for r in arm["steps"]:
        assert r["sync"]["match"] and r["tokens"] == 12, r
        # The same model in other kernels: bf16 rounding apart (about 3e-2 mean here; the largest
        # of the 12 tokens 0.15-0.21 depending on the host CPU's bf16 matmul), far from a wrong
        # model's (RoPE base 10^4 instead of the config's 10^6: mean about 0.4).
        assert r["abs_dev"]["mean"] < 0.06 and r["abs_dev"]["max"] < 0.5, r["abs_dev"]
    digests = [arm["initial_sync"]["sha256_rollout"]] + [r["sync"]["sha256_rollout"] for r in arm["steps"]]
    assert arm["steps"][0]["grad_norm"] > 0 and digests[1] != digests[0]


@pytest.mark.parametrize("route,method", [("strict", "forward_backward"), ("native", "forward_backward_packed")])
def test_actor_batch_goes_to_the_parameters_device(trainer_cls, monkeypatch, route, method):
    """megatron's forward gets the packed rows on the device of the parameters (on a GPU the loop
    builds them on the host), on both routes: a stand-in device ("meta") shows where they went."""
    import torch

    from rlk.models.qwen3.layouts import hf_to_fused

    lc = loop.LoopConfig(route=route, steps=1, **SMALL)
    cfg, hf = lc.weights()
    t = trainer_cls(cfg, hf_to_fused(cfg, hf), route, lc)
    monkeypatch.setattr(trainer_cls, "device", property(lambda self: torch.device("meta")))
    seen = {}

    class Stop(Exception):
        pass

    def capture(batches):
        seen["pk"] = batches[0][0]
        raise Stop

    monkeypatch.setattr(t.actor_, method, capture)
    with pytest.raises(Stop):
        t.actor([[1, 2, 3]], [[4, 5]], [torch.zeros(2)], torch.ones(1))
    pk = seen["pk"]
    assert {x.device.type for x in (pk.ids, pk.cu_seqlens, pk.targets, pk.loss_mask)} == {"meta"}
    assert pk.host_cu == [0, 5]

