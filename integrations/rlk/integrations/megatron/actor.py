"""megatron-core actor on rlk's strict spec: forward + backward + optimizer step through
megatron's own training machinery.

One :class:`MegatronActor` holds

* the strict ``GPTModel`` (:func:`rlk.integrations.megatron.spec.build_gpt_model`, bf16
  parameters, TP=1) wrapped in megatron's ``DistributedDataParallel`` with
  ``grad_reduce_in_fp32=True``: every parameter gets an fp32 ``main_grad`` in DDP's contiguous
  grad buffer; backward hooks add the bf16 ``.grad`` of each parameter into it (exact: fp32
  holds every bf16 value, and the buffer starts at +0.0);
* megatron's optimizer from ``get_megatron_optimizer`` (``OptimizerConfig(optimizer="adam",
  bf16=True)``: fp32 main parameters, the ``DistributedOptimizer`` by default or the plain
  ``Float16OptimizerWithFloat16Params``); without TransformerEngine or Apex megatron's Adam is
  ``torch.optim.AdamW`` (``weight_decay=0`` here: the decay factor is exactly 1);
* the LM head through :func:`rlk.integrations.megatron.logp.loss_output_processor`: rlk's fused
  logp + per-token loss path accumulates d_weight straight into ``output_layer.weight.main_grad``
  (megatron's gradient-accumulation-fusion convention; the weight gets no ``.grad``).

A step is megatron's ``train_step`` order: ``zero_grad_buffer`` + ``optimizer.zero_grad``, the
no-pipelining schedule (``forward_backward_no_pipelining``: one forward and backward per
micro-batch, then ``finalize_model_grads``: DDP's ``finish_grad_sync``), ``optimizer.step()``.
Loss normalization lives in the per-token loss (``rlk.rl.grpo``'s ``n_tokens``, as rlk's own
trainer): the schedule runs with ``calculate_per_token_loss=True`` (no division by micro-batch
count) and the gradients are not rescaled by a token count afterwards, so the backward's
grad_out is exactly 1 and micro-batches add up in order.

**CPU.** megatron's DDP, schedule and optimizers run on a machine without CUDA through
:func:`rlk.integrations.megatron.host_emulation.cuda_names_on_cpu` (never used when CUDA is
available); optimizer offload: :mod:`rlk.integrations.megatron.offload`.

Activation recompute (``recompute="full"``: every layer, megatron's uniform method, one layer
per checkpoint; ``"selective"``: the core attention) re-runs the same rlk modules in backward:
the gradients are bitwise those without recompute (actor_test).

Not covered: TP > 1 (the fused LM head + loss path is single-shard), ``overlap_grad_reduce``
(its bucket readiness needs a ``.grad`` on every parameter; the fused LM head gives none), and
the forward dispatch audit (``audit.forward_audit``): the per-token loss runs inside the
model call (the output processor), and its torch arithmetic is the caller's, which the audit
would flag; the forward without the loss is audited by ``megatron_test`` on the same spec. With
``optimizer_offload``: only the distributed optimizer (megatron's precision-aware path, which
keeps no fp32 main parameter on the device, requires it).
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from rlk.errors import UnsupportedConfigError
from rlk.integrations.megatron.host_emulation import cuda_names_on_cpu
from rlk.integrations.megatron.offload import _configure_offload, check_offload, checked_step, optimizer_placement

# TransformerConfig fields of each recompute choice.
_RECOMPUTE = {None: {}, "full": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
              "selective": dict(recompute_granularity="selective", recompute_modules=["core_attn"])}


def training_wrappers(module: torch.nn.Module, config, *, lr: float, betas: tuple[float, float], eps: float,
                      distributed_optimizer: bool = True, optimizer: bool = True,
                      optimizer_offload: Union[bool, float] = False):
    """megatron's ``DistributedDataParallel`` (``grad_reduce_in_fp32``: fp32 ``main_grad``
    buffers) around ``module`` and its Adam optimizer (bf16 params, fp32 main parameters,
    ``weight_decay=0``, no clipping), as :class:`MegatronActor` uses them; also sets
    ``config.finalize_model_grads_func`` to finalize without a token-count rescale (the per-token
    loss is already normalized). Returns ``(ddp_config, opt_config, ddp, optimizer)``.

    ``optimizer=False``: DDP and its ``main_grad`` buffers only; ``opt_config`` and ``optimizer``
    are None (no fp32 main parameters or Adam states: 12 of the 18 bytes per parameter, which
    is what keeps a full-depth 8B model's forward + backward on one GPU).

    ``optimizer_offload`` (True = 1.0, or a fraction of the parameters, in their order): megatron's
    own CPU offload, ``OptimizerConfig(optimizer_cpu_offload=True, optimizer_offload_fraction=f,
    use_precision_aware_optimizer=True)`` with the distributed optimizer. megatron then builds a
    ``HybridDeviceOptimizer`` over the bf16 parameter shards: for an offloaded parameter it keeps
    an fp32 main parameter (the exact widening of the bf16 one), both Adam moments and a copy of
    the fp32 gradient on the host (16 bytes per parameter), copies ``main_grad`` there at each
    step, runs torch's AdamW on the host and writes the result back rounded to bf16 (round to
    nearest even, as the device copy does); the rest keep fp32 main parameters and moments on the
    device (12 bytes per parameter) and torch's AdamW there. The device holds no fp32 main
    parameter of an offloaded tensor: 6 bytes per parameter (bf16 + fp32 ``main_grad``).
    Choices made here: ``pin_cpu_grads=False`` (torch's page-locked allocator rounds each block
    up to a power of two, e.g. 4 GiB for an LM head's 2.3 GiB fp32 gradient), no D2H/H2D overlap
    streams, and torch's AdamW kernel choice (``_HOST_ADAM_FUSED``)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    fraction = check_offload(optimizer_offload, optimizer=optimizer, distributed_optimizer=distributed_optimizer)
    # Without an optimizer, plain DDP: the distributed optimizer's bf16 parameter buffer has no use.
    distributed_optimizer = distributed_optimizer and optimizer
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=distributed_optimizer)
    offload = dict(optimizer_cpu_offload=True, optimizer_offload_fraction=fraction, use_precision_aware_optimizer=True,
                   overlap_cpu_optimizer_d2h_h2d=False, pin_cpu_grads=False) if fraction > 0 else {}
    opt_config = OptimizerConfig(
        optimizer="adam", lr=float(lr), min_lr=float(lr), weight_decay=0.0, adam_beta1=float(betas[0]),
        adam_beta2=float(betas[1]), adam_eps=float(eps), bf16=True, params_dtype=torch.bfloat16,
        use_distributed_optimizer=distributed_optimizer, clip_grad=0.0, **offload)
    with cuda_names_on_cpu():
        ddp = DistributedDataParallel(config, ddp_config, module=module)
    opt = None
    if optimizer:
        with cuda_names_on_cpu(placement=True):
            opt = get_megatron_optimizer(opt_config, [ddp])
        if fraction > 0:
            _configure_offload(opt, fraction)
    config.finalize_model_grads_func = (
        lambda chunks, num_tokens=None, **kw: finalize_model_grads(chunks, None, **kw))
    return ddp_config, (opt_config if optimizer else None), ddp, opt


class MegatronActor:
    """The strict megatron-core actor (module docstring).

    Args:
      cfg: the Qwen3 config; hf: Hugging Face tensors (bf16) loaded exactly.
      lr, betas, eps: megatron's Adam (OptimizerConfig ``adam_beta1/2``, ``adam_eps``).
      distributed_optimizer: megatron's ``DistributedOptimizer`` (True) or the plain
        ``Float16OptimizerWithFloat16Params`` (False); both keep fp32 main parameters.
      recompute: None, ``"full"`` or ``"selective"`` activation recompute (module docstring).
      optimizer: False builds no optimizer (DDP ``main_grad`` buffers only; :meth:`step` refuses).
      optimizer_offload: megatron's CPU offload of the fp32 main parameters and Adam moments
        (True = all; a float: that fraction of the parameters); :func:`training_wrappers`.
      device: ``"cuda"``: parameters allocated on the GPU without an init, then loaded; None or
        ``"cpu"``: built on the host (megatron's DDP moves them to its buffers' device).
    """

    def __init__(self, cfg, hf: dict[str, torch.Tensor], *, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, distributed_optimizer: bool = True,
                 recompute: Optional[str] = None, device: Optional[str] = None, optimizer: bool = True,
                 optimizer_offload: Union[bool, float] = False):
        from megatron.core import parallel_state as ps

        from rlk.integrations.megatron import spec, weights

        self.cfg = cfg
        # Refused before anything is built.
        self.optimizer_offload = check_offload(optimizer_offload, optimizer=optimizer,
                                               distributed_optimizer=distributed_optimizer)
        spec.init_parallel(1)
        if ps.get_data_parallel_world_size() != 1:
            raise UnsupportedConfigError("MegatronActor: data parallel size must be 1 (one process at TP=1)")
        rc = _RECOMPUTE.get(recompute)
        if rc is None:
            raise UnsupportedConfigError(f"MegatronActor: recompute={recompute!r} (covered: {sorted(map(str, _RECOMPUTE))})")
        on_gpu = device is not None and torch.device(device).type == "cuda"
        if on_gpu:  # parameters allocated on the GPU without an init, then loaded (as replay.build_megatron)
            from megatron.core import tensor_parallel

            tensor_parallel.model_parallel_cuda_manual_seed(0)
            rc = dict(rc, use_cpu_initialization=False, perform_initialization=False)
        model = spec.build_gpt_model(cfg, 1, calculate_per_token_loss=True, **rc)
        if on_gpu:
            model = model.to(torch.device(device))
        weights.load_into(model, weights.hf_to_megatron(cfg, hf, 1, 0))
        self.model = model
        self.ddp_config, self.opt_config, self.ddp, self.optimizer = training_wrappers(
            model, model.config, lr=lr, betas=betas, eps=eps, distributed_optimizer=distributed_optimizer,
            optimizer=optimizer, optimizer_offload=optimizer_offload)
        self.steps = 0

    # ---- one training step ---------------------------------------------------------------------
    def forward_backward(self, batches: list[tuple[object, Callable]]) -> list[torch.Tensor]:
        """Zeroes the grad buffers, then megatron's no-pipelining schedule over ``batches`` (one
        micro-batch each: a :class:`rlk.replay.trainer.Packed` and its ``token_loss(logp_rows, lo,
        hi)``); returns each micro-batch's logp ``[T]`` fp32 (detached). Afterwards every
        parameter's ``main_grad`` holds the summed gradients (micro-batches in order)."""
        from megatron.core.packed_seq_params import PackedSeqParams
        from megatron.core.pipeline_parallel.schedules import forward_backward_no_pipelining

        from rlk.integrations.megatron.logp import loss_output_processor

        if not batches:
            raise UnsupportedConfigError("forward_backward: no micro-batches")
        logps: list[torch.Tensor] = []
        it = iter(batches)

        def forward_step(data_iterator, model):
            pk, token_loss = next(data_iterator)
            cu = pk.cu_seqlens.to(torch.int32)
            host_cu = pk.host_cu if pk.host_cu is not None else cu.tolist()
            ms = max(b - a for a, b in zip(host_cu, host_cu[1:]))
            psp = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=ms,
                                  max_seqlen_kv=ms)
            T = pk.ids.shape[0]
            loss, logp = model(pk.ids.view(1, T), None, None, labels=pk.targets.view(1, T),
                               packed_seq_params=psp, output_processor=loss_output_processor,
                               output_processor_context={"token_loss": token_loss, "vocab_size": self.cfg.vocab_size})
            logps.append(logp.view(T))

            def loss_func(out):
                # (loss, token count, logged value): calculate_per_token_loss keeps the loss as is.
                return out, torch.tensor(T, dtype=torch.int), {"loss": out.detach()}

            return loss, loss_func

        self.ddp.train()
        with cuda_names_on_cpu():
            self.ddp.zero_grad_buffer()
            if self.optimizer is not None:
                self.optimizer.zero_grad()
            self.last_losses = forward_backward_no_pipelining(
                forward_step_func=forward_step, data_iterator=it, model=[self.ddp], num_microbatches=len(batches),
                seq_length=0, micro_batch_size=1, forward_only=False)
        return logps

    def step(self) -> dict:
        """megatron's optimizer step (fp32 main parameters updated, copied back to bf16)."""
        out = checked_step(self.optimizer, "MegatronActor")
        self.steps += 1
        return out

    # ---- state --------------------------------------------------------------------------------
    def optimizer_placement(self) -> dict:
        """Where the optimizer's fp32 main parameters and Adam moments live (:func:`optimizer_placement`)."""
        return optimizer_placement(self.optimizer)

    def main_grads(self) -> dict[str, torch.Tensor]:
        """Every parameter's fp32 ``main_grad`` (clones), by megatron name."""
        return {k: p.main_grad.detach().clone() for k, p in self.model.named_parameters()}

    def weights(self) -> dict[str, torch.Tensor]:
        """Every bf16 parameter (clones), by megatron name."""
        from rlk.integrations.megatron import weights

        return weights.state_of(self.model)

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """The bf16 parameters as Hugging Face tensors (exact copies)."""
        from rlk.integrations.megatron import weights

        return weights.megatron_to_hf(self.cfg, [self.weights()])


def actor_step(actor: MegatronActor, batches, optimizer_step: bool = True) -> tuple[list[torch.Tensor], dict]:
    """Forward + backward over ``batches`` and (optionally) one optimizer step; returns the
    micro-batches' logp and ``{"main_grads": ..., "grad_norm": ...}`` (main_grads before the step)."""
    logps = actor.forward_backward(batches)
    out: dict[str, object] = {"main_grads": actor.main_grads(), "grad_norm": None}
    if optimizer_step:
        out.update(actor.step())
    return logps, out
