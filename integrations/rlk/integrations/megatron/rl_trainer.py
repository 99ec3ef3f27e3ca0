"""The RL loop's megatron-core actor (``python -m rlk.rl --trainer megatron``): the adapter that
gives :func:`rlk.rl.loop.run_arm` megatron's GPTModel in place of the loop's own trainer, on rlk's
strict spec (strict route) or megatron's local spec (native route)."""

from __future__ import annotations

import dataclasses

import torch

from rlk.errors import UnsupportedConfigError
from rlk.integrations.megatron.actor import MegatronActor
from rlk.integrations.megatron.offload import optimizer_placement


class RLTrainer:
    """The RL loop's actor (``rlk.rl.loop.run_arm(..., make_trainer=RLTrainer)``, ``python -m rlk.rl
    --trainer megatron``): megatron-core's GPTModel with the same packed batch and GRPO loss as the
    loop's own ``Trainer`` (``rlk.rl.loop.actor_batch``), megatron's forward/backward and Adam
    (the loop's lr and betas, eps 1e-8), weights handed to the sync in rlk's fused layout (exact
    copies; megatron's interleaved QKV rows reordered to ``[Q|K|V]``).

    ``lc.optimizer_offload`` (True or a fraction): megatron's CPU offload of the fp32 main
    parameters and Adam moments, on both routes (:mod:`rlk.integrations.megatron.offload`).
    ``lc.recompute`` (None, ``full``, ``selective``): megatron's activation recompute, both routes.

    Route ``strict``: :class:`MegatronActor` (rlk's spec). Route ``native``: megatron's local spec
    with torch's varlen attention and cuBLAS (:class:`rlk.integrations.megatron.native.NativeActor`
    with ``VarlenCoreAttention``, the production benchmark's native trainer), what a megatron user
    trains with.

    Args as ``rlk.rl.loop.Trainer``: cfg, fused weights, route, the LoopConfig.
    """

    def __init__(self, cfg, fused: dict[str, torch.Tensor], route: str, lc):
        from rlk.models.qwen3.layouts import fused_to_hf

        if route not in ("strict", "native"):
            raise UnsupportedConfigError(f"the megatron actor: route {route!r} (strict: rlk's spec; native: "
                                         "megatron's local spec)")
        if torch.device(lc.device).type != "cpu" and not torch.cuda.is_available():
            raise UnsupportedConfigError(f"device {lc.device!r} without CUDA")
        self.cfg, self.route, self.recompute = cfg, route, lc.recompute
        self.clip_eps = lc.clip_eps
        hf = fused_to_hf(cfg, fused)
        if route == "strict":
            self.actor_ = MegatronActor(cfg, hf, lr=lc.lr, betas=tuple(lc.betas), eps=1e-8, device=lc.device,
                                        optimizer_offload=lc.optimizer_offload, recompute=lc.recompute)
        else:
            from rlk.integrations.megatron.native import NativeActor
            from rlk.integrations.megatron.varlen_attention import VarlenCoreAttention

            self.actor_ = NativeActor(cfg, hf, device=lc.device, core_attention=VarlenCoreAttention, lr=lc.lr,
                                      betas=tuple(lc.betas), optimizer_offload=lc.optimizer_offload,
                                      recompute=lc.recompute)
        self._gpt = self.actor_.model
        self.generation = 0

    def describe(self) -> dict:
        """The actor in the loop's report."""
        from rlk.integrations.megatron import version

        spec = "rlk's strict spec" if self.route == "strict" else "local spec, torch varlen attention, cuBLAS"
        place = optimizer_placement(self.actor_.optimizer)
        return {"name": f"megatron-core {version() or '(version unknown)'} GPTModel ({spec})", "trainer": "megatron",
                "route": self.route, "optimizer_offload": place.get("offload_fraction"), "recompute": self.recompute,
                "optimizer": place.get("inner")}

    @property
    def device(self) -> torch.device:
        """Where megatron holds the parameters (the batch goes there)."""
        return next(self._gpt.parameters()).device

    @property
    def w(self) -> dict[str, torch.Tensor]:
        """The bf16 weights in rlk's fused layout (copies made at each read: the sync fingerprints
        and copies them)."""
        from rlk.models.qwen3.layouts import megatron_to_fused

        return megatron_to_fused(self.cfg, {k: p.detach() for k, p in self._gpt.named_parameters()})

    def actor(self, prompts, responses, old_logp, adv):
        """Forward + backward of the clipped loss (one micro-batch); returns (logp per sequence,
        None: the gradients live in megatron's main_grad buffers, loss)."""
        from rlk.kernels.common import host_validated
        from rlk.replay import trainer
        from rlk.rl.loop import actor_batch

        dev = self.device
        pk, fn = actor_batch(self.cfg.vocab_size, prompts, responses, old_logp, adv, self.clip_eps, dev)
        # The packed rows on the parameters' device; host_cu keeps the boundaries on the host.
        pk = dataclasses.replace(pk, ids=pk.ids.to(dev), cu_seqlens=pk.cu_seqlens.to(dev),
                                 targets=pk.targets.to(dev), loss_mask=pk.loss_mask.to(dev))
        with host_validated():
            if self.route == "strict":
                (lp,) = self.actor_.forward_backward([(pk, fn)])
            else:
                (lp,) = self.actor_.forward_backward_packed([(pk, fn)])
        with torch.no_grad():
            loss = float(fn(lp, 0, pk.ids.shape[0]).sum())
        return trainer.response_logp(pk, lp, len(prompts)), None, loss

    def apply(self, grads) -> float:
        """megatron's optimizer step on the main_grads of the last :meth:`actor`; returns megatron's
        gradient 2-norm."""
        if grads is not None:
            raise UnsupportedConfigError("RLTrainer.apply steps on megatron's main_grad buffers; pass None")
        out = self.actor_.step()
        self.generation += 1
        return out["grad_norm"]
