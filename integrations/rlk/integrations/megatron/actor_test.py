"""The strict megatron-core actor (``actor.py``) on the CPU: megatron's DDP (fp32 ``main_grad``
buffers), no-pipelining schedule and ``DistributedOptimizer`` (Adam, fp32 main parameters) over
rlk's spec, on the tiny Qwen3, one gloo process, Triton interpreter.

* run to run: two fresh actors on the same weights and tokens give the same logp, the same fp32
  ``main_grad`` of every parameter and, after one Adam step, the same bf16 weights (bitwise);
* against rlk's own trainer (``Qwen3.trainer_logp``, strict route, same GRPO clipped loss): logp
  bitwise; every parameter but the LM head: ``main_grad`` == fp32(rlk's bf16 gradient), bitwise
  (megatron's fused QKV rows mapped to rlk's ``[Q|K|V]``); the LM head: ``main_grad`` is the
  unrounded fp32 chain (gradient-accumulation fusion), equal bitwise to rlk's op fed the same
  hidden states with a zero main_grad, and its bf16 rounding equals rlk's bf16 gradient;
* two micro-batches through megatron's schedule: every main_grad the in-order fp32 sum of rlk's
  per-micro-batch gradients; the LM head's the fused op's fp32 chain continued over both;
* activation recompute ("full" layers, "selective" core attention) re-runs the core attention in
  backward and changes no byte;
* each check fails on a broken input: a perturbed token (run to run and the Adam step), the
  native route (against rlk's trainer), a bf16 main_grad (refused).

megatron-core 0.19.2 is required (``CI`` set: the tests fail when it is missing).
"""

import pytest
import torch

from rlk.errors import ExactnessError, UnsupportedConfigError
from rlk.integrations.megatron.testing import require_megatron
from rlk.models.qwen3 import Qwen3Config
from rlk.testing import assert_bitwise_equal

TINY = Qwen3Config.named("tiny")
LM_HEAD = "output_layer.weight"


def _grpo_loss(pk, old_logp):
    """GRPO's clipped loss (rlk.rl.grpo) on the packed rows, old logp = the strict forward's."""
    from rlk.rl import grpo

    g = torch.Generator().manual_seed(7)
    adv = torch.randn(pk.ids.shape[0], generator=g)
    mask = pk.loss_mask
    return grpo.token_loss_fn(old_logp, adv, mask, 0.2, int(mask.sum()))


def _run(hf, pk, token_loss, recompute=None, distributed_optimizer=True):
    from rlk.integrations.megatron.actor import MegatronActor, actor_step

    actor = MegatronActor(TINY, hf, lr=1e-2, recompute=recompute, distributed_optimizer=distributed_optimizer)
    before = actor.weights()
    (logp,), out = actor_step(actor, [(pk, token_loss)])
    opts = getattr(actor.optimizer, "chained_optimizers", [actor.optimizer])
    return dict(logp=logp, grads=out["main_grads"], weights=actor.weights(), before=before,
                lm_head_grad=actor.model.output_layer.weight.grad, optimizers=[type(o).__name__ for o in opts])


@pytest.fixture(scope="module")
def runs():
    require_megatron()
    from rlk.integrations.megatron import harness

    hf, pk = harness.fixture(TINY)
    old, _ = harness.reference_logp(TINY, hf, pk, actor=False)
    loss = _grpo_loss(pk, old)
    a, b = _run(hf, pk, loss), _run(hf, pk, loss)
    bad_ids = pk.ids.clone()
    bad_ids[3] = (bad_ids[3] + 1) % TINY.vocab_size  # one prompt token of the first sequence
    import dataclasses

    perturbed = _run(hf, dataclasses.replace(pk, ids=bad_ids), loss)
    return dict(hf=hf, pk=pk, loss=loss, a=a, b=b, perturbed=perturbed)


def _assert_all_equal(x: dict, y: dict, what: str) -> None:
    assert set(x) == set(y)
    for k in x:
        assert_bitwise_equal(x[k], y[k], f"{what}: {k}")


def test_run_to_run_logp_grads_and_adam_step_bitwise(runs):
    a, b = runs["a"], runs["b"]
    assert_bitwise_equal(a["logp"], b["logp"], "logp")
    assert all(g.dtype == torch.float32 for g in a["grads"].values())
    _assert_all_equal(a["grads"], b["grads"], "main_grad run to run")
    _assert_all_equal(a["weights"], b["weights"], "bf16 weights after one Adam step, run to run")
    assert a["lm_head_grad"] is None  # gradient-accumulation fusion: only main_grad
    changed = [k for k in a["weights"] if not torch.equal(a["weights"][k], a["before"][k])]
    assert LM_HEAD in changed and "decoder.layers.0.self_attention.linear_qkv.weight" in changed, changed


def test_plain_mixed_precision_optimizer_same_step(runs):
    """megatron's Float16OptimizerWithFloat16Params (no distributed optimizer; it reads each
    parameter's main_grad) takes the DistributedOptimizer's step, bitwise, at one data-parallel rank."""
    r = _run(runs["hf"], runs["pk"], runs["loss"], distributed_optimizer=False)
    assert r["optimizers"] == ["Float16OptimizerWithFloat16Params"], r["optimizers"]
    assert runs["a"]["optimizers"] == ["DistributedOptimizer"], runs["a"]["optimizers"]
    _assert_all_equal(r["grads"], runs["a"]["grads"], "main_grad, Float16Optimizer run")
    _assert_all_equal(r["weights"], runs["a"]["weights"], "weights after the step, Float16Optimizer vs distributed")


def test_run_to_run_checks_fail_on_a_perturbed_token(runs):
    a, p = runs["a"], runs["perturbed"]
    with pytest.raises(ExactnessError):
        _assert_all_equal(a["grads"], p["grads"], "main_grad, one token changed")
    with pytest.raises(ExactnessError):
        _assert_all_equal(a["weights"], p["weights"], "weights after the step, one token changed")


def _rlk_trainer(hf, pk, token_loss, route="strict"):
    from rlk.models.qwen3 import Qwen3
    from rlk.models.qwen3.layouts import fused_to_megatron

    m = Qwen3(TINY, hf, route)
    probes = {}
    lp, g = m.trainer_logp(pk.ids, pk.cu_seqlens, pk.targets, actor=True, token_loss=token_loss, probes=probes,
                           host_cu=pk.host_cu)
    return lp, fused_to_megatron(TINY, g), probes["final"], m.w["lm_head.weight"]


@pytest.fixture(scope="module")
def strict_ref(runs):
    return _rlk_trainer(runs["hf"], runs["pk"], runs["loss"])


def test_gradients_equal_rlk_trainer(runs, strict_ref):
    from rlk.models.qwen3.routes import logp_segmentation
    from rlk.kernels.linear_logp.autograd import linear_logp_loss

    a, pk = runs["a"], runs["pk"]
    lp, ref, hidden, lm_head = strict_ref
    assert_bitwise_equal(a["logp"], lp, "logp vs rlk's trainer")
    assert set(a["grads"]) == set(ref)
    for k, g in a["grads"].items():
        assert bool(g.abs().sum() > 0), k
        if k != LM_HEAD:
            # DDP adds the bf16 .grad into a zero fp32 buffer: exact widening.
            assert_bitwise_equal(g, ref[k].float(), f"main_grad vs rlk trainer: {k}")
    # LM head: megatron keeps the unrounded fp32 chain; rlk's trainer rounds it once to bf16.
    g = a["grads"][LM_HEAD]
    assert_bitwise_equal(g.to(torch.bfloat16), ref[LM_HEAD], "bf16(LM-head main_grad) vs rlk's bf16 gradient")
    mg = torch.zeros_like(g)
    w = lm_head.detach().clone().requires_grad_(True)
    loss, _ = linear_logp_loss(hidden, w, pk.targets, runs["loss"], segmentation=logp_segmentation(TINY.vocab_size),
                               main_grad=mg)
    loss.backward()
    assert_bitwise_equal(g, mg, "LM-head main_grad vs rlk's op with a zero main_grad on rlk's hidden states")
    assert not torch.equal(g, ref[LM_HEAD].float())  # the fp32 chain is finer than its bf16 rounding


def test_adam_step_equals_rlk_loop_trainer(runs, strict_ref):
    """megatron's DistributedOptimizer step (AdamW, weight decay 0, fp32 main params) equals the
    RL loop's own Adam step (``rlk.rl.loop.Trainer.apply``: torch Adam on fp32 masters) fed the
    same fp32 gradients: megatron's main_grads. With rlk's bf16 LM-head gradient instead, the LM
    head's updated weights differ in a few elements (the rounding of its gradient)."""
    from rlk.models.qwen3.layouts import fused_to_megatron, hf_to_fused, megatron_to_fused
    from rlk.rl.loop import LoopConfig, Trainer

    a = runs["a"]

    def step(grads):
        tr = Trainer(TINY, hf_to_fused(TINY, runs["hf"]), "strict", LoopConfig(lr=1e-2, betas=(0.9, 0.999)))
        tr.apply(grads)
        return fused_to_megatron(TINY, tr.model.w)

    _assert_all_equal(a["weights"], step(megatron_to_fused(TINY, a["grads"])),
                      "megatron's Adam step vs rlk's on the same fp32 gradients")
    rounded = step(megatron_to_fused(TINY, strict_ref[1]))
    _assert_all_equal({k: v for k, v in a["weights"].items() if k != LM_HEAD},
                      {k: v for k, v in rounded.items() if k != LM_HEAD}, "rlk's bf16 gradients, not the LM head")


def test_two_micro_batches_accumulate_in_order(runs):
    """Two micro-batches through megatron's schedule (sequences 0-1, then 2): every main_grad is
    the fp32 sum, in order, of rlk's per-micro-batch gradients (DDP adds each bf16 .grad into the
    fp32 buffer); the LM head's is rlk's op called twice on one main_grad (its fp32 chain
    continued over the second micro-batch's tokens). The loss is normalized over the whole batch."""
    from rlk.integrations.megatron import harness
    from rlk.integrations.megatron.actor import MegatronActor
    from rlk.models.qwen3.routes import logp_segmentation
    from rlk.kernels.linear_logp.autograd import linear_logp_loss
    from rlk.replay import trainer
    from rlk.rl import grpo

    hf, pk = runs["hf"], runs["pk"]
    seqs = [(pk.ids[a:b].tolist(), p, r) for a, b, p, r in
            zip(pk.host_cu, pk.host_cu[1:], pk.prompt_lens, pk.response_lens)]
    parts = [[0, 1], [2]]
    n_tokens = int(pk.loss_mask.sum())
    batches, refs = [], []
    for idx in parts:
        mb = trainer.pack([seqs[i][0][:seqs[i][1]] for i in idx], [seqs[i][0][seqs[i][1]:] for i in idx])
        adv = torch.arange(mb.ids.shape[0], dtype=torch.float32) / 7 - 1
        old, _ = harness.reference_logp(TINY, hf, mb, actor=False)
        loss = grpo.token_loss_fn(old, adv, mb.loss_mask, 0.2, n_tokens)
        batches.append((mb, loss))
        refs.append(_rlk_trainer(hf, mb, loss))
    actor = MegatronActor(TINY, hf)
    logps = actor.forward_backward(batches)
    got = actor.main_grads()
    for (mb, _), lp, ref in zip(batches, logps, refs):
        assert_bitwise_equal(lp, ref[0], "micro-batch logp")
    for k, g in got.items():
        if k != LM_HEAD:
            assert_bitwise_equal(g, refs[0][1][k].float() + refs[1][1][k].float(), f"two micro-batches: {k}")
    mg = torch.zeros_like(got[LM_HEAD])
    for (mb, loss), ref in zip(batches, refs):
        w = ref[3].detach().clone().requires_grad_(True)
        out, _ = linear_logp_loss(ref[2], w, mb.targets, loss, segmentation=logp_segmentation(TINY.vocab_size),
                                  main_grad=mg)
        out.backward()
    assert_bitwise_equal(got[LM_HEAD], mg, "LM head: rlk's op twice, in micro-batch order")


def test_trainer_comparison_fails_on_the_native_route(runs):
    a = runs["a"]
    _, ref, _, _ = _rlk_trainer(runs["hf"], runs["pk"], runs["loss"], route="native")
    with pytest.raises(ExactnessError):
        for k, g in a["grads"].items():
            if k != LM_HEAD:
                assert_bitwise_equal(g, ref[k].float(), f"main_grad vs the native trainer: {k}")


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_recompute_same_bytes(runs, mode, monkeypatch):
    """megatron's activation recompute re-runs the core attention in backward (counted: 2 layers
    forward, 2 more in backward) and leaves logp, every main_grad and the step's weights bitwise."""
    from rlk.integrations.megatron import modules

    calls = []
    real = modules.RlkCoreAttention.forward

    def counted(self, *a, **k):
        calls.append(torch.is_grad_enabled())
        return real(self, *a, **k)

    monkeypatch.setattr(modules.RlkCoreAttention, "forward", counted)
    r = _run(runs["hf"], runs["pk"], runs["loss"], recompute=mode)
    # Checkpointed forwards run without grad; the recomputation in backward with grad.
    assert calls == [False] * TINY.num_hidden_layers + [True] * TINY.num_hidden_layers, calls
    a = runs["a"]
    assert_bitwise_equal(r["logp"], a["logp"], f"logp, recompute {mode}")
    _assert_all_equal(r["grads"], a["grads"], f"main_grad, recompute {mode}")
    _assert_all_equal(r["weights"], a["weights"], f"weights after the step, recompute {mode}")


def test_recompute_guard():
    from rlk.integrations.megatron import spec
    from rlk.integrations.megatron.actor import MegatronActor

    with pytest.raises(UnsupportedConfigError, match="recompute_modules"):
        spec.transformer_config(TINY, 1, recompute_granularity="selective", recompute_modules=["mlp"])
    with pytest.raises(UnsupportedConfigError, match="recompute="):
        MegatronActor(TINY, {}, recompute="block")


def test_bf16_main_grad_is_refused(runs):
    """DDP without grad_reduce_in_fp32 gives bf16 main_grads: the fused LM head refuses them."""
    from rlk.integrations.megatron.logp import loss_output_processor

    T, H = 8, TINY.hidden_size
    w = torch.nn.Parameter(torch.zeros(TINY.vocab_size, H, dtype=torch.bfloat16))
    w.main_grad = torch.zeros(TINY.vocab_size, H, dtype=torch.bfloat16)
    h = torch.zeros(T, 1, H, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(UnsupportedConfigError, match="main_grad must be fp32"):
        loss_output_processor(hidden_states=h, output_layer=None, output_weight=w,
                              labels=torch.zeros(1, T, dtype=torch.int64),
                              context={"token_loss": lambda lp, lo, hi: -lp, "vocab_size": TINY.vocab_size})
    with pytest.raises(UnsupportedConfigError, match="token_loss"):
        loss_output_processor(hidden_states=h, output_layer=None, output_weight=w,
                              labels=torch.zeros(1, T, dtype=torch.int64), context={})
