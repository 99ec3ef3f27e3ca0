"""The megatron actor with ``optimizer_offload`` (megatron-core's ``HybridDeviceOptimizer``) on
the CPU: the tiny Qwen3, two GRPO steps, against the same actor without offload.

* the step runs through megatron's offload: a ``HybridDeviceOptimizer`` under the
  ``DistributedOptimizer`` holds every parameter's fp32 main copy and both Adam moments in host
  tensors (none is the device's: ``cuda_names_on_cpu`` tells them apart), the
  ``DistributedOptimizer`` keeps no fp32 main parameter, and each step copies every ``main_grad``
  to the host (megatron's own D2H copy, bitwise the gradient);
* gradients (both steps: the second one's run on the weights the first update wrote), the fp32
  main parameters, both moments and the bf16 weights after each step are bitwise those of the
  actor without offload, for all parameters offloaded and for half of them;
* megatron's own choice of host Adam (torch's fused CPU AdamW) differs in the last bits of the
  fp32 main parameters, which is why the actor turns it off (``offload._HOST_ADAM_FUSED``);
* invalid combinations are refused before anything is built.

What this does not show: on the CPU both actors' Adam is torch's single-tensor AdamW on CPU
tensors, so equality here covers megatron's offload path (its copies, casts, parameter groups
and state), not CPU arithmetic against a GPU's AdamW kernels. On a GPU the offloaded parameters'
fp32 main copies and ``exp_avg_sq`` do differ from the run without offload in the last bits
(measured; ``offload._HOST_ADAM_FUSED``'s comment).

megatron-core 0.19.2 is required (``CI`` set: the tests fail when it is missing).
"""

import pytest
import torch

from rlk.errors import ExactnessError, UnsupportedConfigError
from rlk.integrations.megatron.testing import require_megatron
from rlk.models.qwen3 import Qwen3Config
from rlk.testing import assert_bitwise_equal

TINY = Qwen3Config.named("tiny")
STEPS = 2


def _optimizer_state(actor) -> dict[str, dict[str, torch.Tensor]]:
    """Every parameter's fp32 main copy and Adam moments (clones), by megatron name, read from
    megatron's own optimizer objects: the ``DistributedOptimizer``'s fp32 shards without offload,
    the ``HybridDeviceOptimizer``'s copies with it."""
    from rlk.integrations.megatron.offload import hybrid_optimizer, inner_optimizers

    (dist,) = inner_optimizers(actor.optimizer)
    hdo = hybrid_optimizer(actor.optimizer)
    names = {id(p): k for k, p in actor.model.named_parameters()}
    out = {}
    for models, shards, mains in zip(dist.model_float16_groups, dist.shard_float16_groups,
                                     dist.shard_fp32_from_float16_groups):
        for p, shard, main in zip(models, shards, mains):
            if hdo is None:
                master, state = main, dist.optimizer.state[main]
            else:
                master = hdo.param_to_inner_param[shard]
                state = hdo.state[shard]
            out[names[id(p)]] = {"main": master.detach().clone(), "exp_avg": state["exp_avg"].clone(),
                                 "exp_avg_sq": state["exp_avg_sq"].clone()}
    return out


def _run(hf, pk, loss, offload, steps=STEPS):
    """Per step: logp, main_grads (after the backward), optimizer state and bf16 weights (after
    the step)."""
    from rlk.integrations.megatron.actor import MegatronActor, actor_step

    actor = MegatronActor(TINY, hf, lr=1e-2, optimizer_offload=offload)
    out = []
    for _ in range(steps):
        (logp,), r = actor_step(actor, [(pk, loss)])
        out.append(dict(logp=logp, grads=r["main_grads"], grad_norm=r["grad_norm"], state=_optimizer_state(actor),
                        weights=actor.weights()))
    return actor, out


@pytest.fixture(scope="module")
def runs():
    require_megatron()
    from rlk.integrations.megatron import harness
    from rlk.rl import grpo

    hf, pk = harness.fixture(TINY)
    old, _ = harness.reference_logp(TINY, hf, pk, actor=False)
    adv = torch.randn(pk.ids.shape[0], generator=torch.Generator().manual_seed(7))
    loss = grpo.token_loss_fn(old, adv, pk.loss_mask, 0.2, int(pk.loss_mask.sum()))  # GRPO's clipped loss
    plain, a = _run(hf, pk, loss, False)
    offloaded, b = _run(hf, pk, loss, True)
    return dict(hf=hf, pk=pk, loss=loss, plain=plain, offloaded=offloaded, a=a, b=b)


def _assert_all_equal(x: dict, y: dict, what: str) -> None:
    assert set(x) == set(y)
    for k in x:
        assert_bitwise_equal(x[k], y[k], f"{what}: {k}")


def _assert_same_run(a: list, b: list, what: str) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        assert_bitwise_equal(x["logp"], y["logp"], f"{what}, step {i}: logp")
        _assert_all_equal(x["grads"], y["grads"], f"{what}, step {i}: main_grad")
        assert x["grad_norm"] == y["grad_norm"], (what, i)
        for part in ("main", "exp_avg", "exp_avg_sq"):
            _assert_all_equal({k: v[part] for k, v in x["state"].items()},
                              {k: v[part] for k, v in y["state"].items()}, f"{what}, step {i}: {part}")
        _assert_all_equal(x["weights"], y["weights"], f"{what}, step {i}: bf16 weights")


def test_step_runs_through_megatrons_hybrid_device_optimizer(runs):
    from megatron.core.optimizer import DistributedOptimizer
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

    from rlk.integrations.megatron.host_emulation import _on_device
    from rlk.integrations.megatron.offload import hybrid_optimizer, inner_optimizers

    actor = runs["offloaded"]
    (dist,) = inner_optimizers(actor.optimizer)
    hdo = hybrid_optimizer(actor.optimizer)
    assert isinstance(dist, DistributedOptimizer) and isinstance(hdo, HybridDeviceOptimizer) and dist.optimizer is hdo
    assert hybrid_optimizer(runs["plain"].optimizer) is None
    # No fp32 main parameter on the device: the precision-aware path hands the bf16 shards over.
    assert all(m is None for g in dist.shard_fp32_from_float16_groups for m in g)
    shards = [p for g in hdo.param_groups for p in g["params"]]
    assert len(shards) == len(list(actor.model.parameters())) == len(hdo.gpu_params_map_cpu_copy)
    assert hdo.gpu_optimizer is None and all(type(o) is torch.optim.AdamW for o in hdo.cpu_optimizers)
    assert all(g["fused"] is None for o in hdo.sub_optimizers for g in o.param_groups)  # torch's default
    for shard in shards:
        # The bf16 shard is a view of DDP's device buffer; its main copy, moments and gradient copy
        # are host tensors of their own.
        master, state = hdo.gpu_params_map_cpu_copy[shard], hdo.state[shard]
        grad = hdo.cpu_copy_map_grad[master]
        assert _on_device(shard) and shard.dtype == torch.bfloat16
        for t in (master, state["exp_avg"], state["exp_avg_sq"], grad):
            assert t.dtype == torch.float32 and not _on_device(t)
            assert t.untyped_storage().data_ptr() != shard.untyped_storage().data_ptr()
        assert int(state["step"]) == STEPS
    # The host gradient copies hold the last backward's main_grads (megatron's D2H copy).
    for models, shs in zip(dist.model_float16_groups, dist.shard_float16_groups):
        for p, shard in zip(models, shs):
            grad = hdo.cpu_copy_map_grad[hdo.gpu_params_map_cpu_copy[shard]]
            assert_bitwise_equal(grad, p.main_grad.view(-1), "host gradient copy vs main_grad")
    where = actor.optimizer_placement()
    assert where["main_params"] == "host" and where["adam_states"] == "host" and where["device_state_bytes"] == 0
    n = sum(p.numel() for p in actor.model.parameters())
    assert where["host_state_bytes"] == 12 * n and where["host_grad_copy_bytes"] == 4 * n, (where, n)


def test_gradients_and_updates_equal_without_offload(runs):
    _assert_same_run(runs["a"], runs["b"], "offload vs not")
    w1, w2 = runs["b"][0]["weights"], runs["b"][1]["weights"]
    assert all(not torch.equal(w1[k], w2[k]) for k in w1), "the second step moves every tensor"


def test_half_offloaded_equals_too(runs):
    """offload 0.5: megatron keeps the later parameters' state on the device (torch's AdamW there,
    its default kernel as without offload), the earlier ones' on the host; the same bits as without
    offload."""
    from rlk.integrations.megatron.offload import hybrid_optimizer

    actor, c = _run(runs["hf"], runs["pk"], runs["loss"], 0.5)
    hdo = hybrid_optimizer(actor.optimizer)
    n = len([p for g in hdo.param_groups for p in g["params"]])
    assert 0 < len(hdo.gpu_params_map_cpu_copy) < n and hdo.gpu_optimizer is not None
    assert actor.optimizer_placement()["device_state_bytes"] > 0
    _assert_same_run(runs["a"], c, "offload 0.5 vs not")


def test_megatrons_fused_host_adam_changes_the_main_parameters(runs, monkeypatch):
    """megatron asks for torch's fused CPU AdamW; its update differs from the unfused one in the
    last bits of some fp32 main parameters, so this comparison catches a change of host Adam."""
    from rlk.integrations.megatron import offload as A

    monkeypatch.setattr(A, "_HOST_ADAM_FUSED", True)
    _, f = _run(runs["hf"], runs["pk"], runs["loss"], True, steps=1)
    with pytest.raises(ExactnessError):
        _assert_all_equal({k: v["main"] for k, v in runs["a"][0]["state"].items()},
                          {k: v["main"] for k, v in f[0]["state"].items()}, "fused host Adam: fp32 main params")


def test_invalid_combinations_are_refused():
    require_megatron()
    from rlk.integrations.megatron.actor import MegatronActor

    with pytest.raises(UnsupportedConfigError, match="distributed_optimizer=True"):
        MegatronActor(TINY, {}, optimizer_offload=True, distributed_optimizer=False)
    with pytest.raises(UnsupportedConfigError, match="needs an optimizer"):
        MegatronActor(TINY, {}, optimizer_offload=True, optimizer=False)
    with pytest.raises(UnsupportedConfigError, match="fraction"):
        MegatronActor(TINY, {}, optimizer_offload=1.5)
