"""Autograd and ``torch.library`` registration of ``logp.v2`` (fused LM head + selected-token
log-prob). Kernels: ``rlk.kernels.linear_logp``.

Ops: ``rlk::linear_logp_fwd`` and ``rlk::linear_logp_bwd`` (custom ops with fake kernels, so they
trace under torch.compile); autograd is registered on the forward op and recomputes logits from
the saved lse (no stored logits). When no input requires grad, nothing is saved (the
reference-scoring path). :func:`linear_logp_loss` is the fused logp + per-token loss path (its
gradients formed during the forward: 3 GEMM-equivalents instead of 4; an autograd.Function, not a
custom op, since it calls a Python loss).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import torch

from rlk.errors import UnsupportedConfigError
from rlk.kernels.linear_logp import contract as _contract
from rlk.kernels.linear_logp import launch as _launch
from rlk.kernels.linear_logp.fused import linear_logp_fused_loss, scale_by_
from rlk.kernels.linear_logp.launch import SegmentStats, merge_segment_stats, segment_stats
from rlk.kernels.dispatch import direct

CONTRACT_ID = _contract.CONTRACT_ID

__all__ = ["LogpOutput", "linear_logp", "linear_logp_loss", "segment_stats", "merge_segment_stats",
           "SegmentStats", "CONTRACT_ID"]


class LogpOutput(NamedTuple):
    logp: torch.Tensor
    lse: torch.Tensor
    entropy: Optional[torch.Tensor]
    logits: Optional[torch.Tensor]


def _empty(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,), dtype=torch.float32)


@torch.library.custom_op("rlk::linear_logp_fwd", mutates_args=())
def _fwd_op(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_start: int,
            vocab_real: int, temperature: float, return_entropy: bool, return_logits: bool,
            align: int, seg_v: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    logp, lse, ent, logits = _launch.linear_logp_fwd(
        hidden, weight, targets, vocab_start, vocab_real, temperature, return_entropy,
        return_logits, (align, seg_v), validate_targets=False)  # validated by linear_logp()
    return (logp, lse, ent if ent is not None else _empty(hidden),
            logits if logits is not None else _empty(hidden))


@_fwd_op.register_fake
def _(hidden, weight, targets, vocab_start, vocab_real, temperature, return_entropy, return_logits,
      align, seg_v):
    T = hidden.shape[0]
    f = hidden.new_empty((T,), dtype=torch.float32)
    return (f, torch.empty_like(f), torch.empty_like(f) if return_entropy else _empty(hidden),
            hidden.new_empty((T, weight.shape[0]), dtype=torch.float32) if return_logits else _empty(hidden))


@torch.library.custom_op("rlk::linear_logp_bwd", mutates_args=())
def _bwd_op(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
            entropy: Optional[torch.Tensor], dlogp: Optional[torch.Tensor], dlse: Optional[torch.Tensor],
            dentropy: Optional[torch.Tensor], vocab_start: int, vocab_real: int,
            temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch.linear_logp_bwd(hidden, weight, targets, lse, dlogp, vocab_start, vocab_real,
                                   temperature, dlse=dlse, entropy=entropy, dentropy=dentropy)


@_bwd_op.register_fake
def _(hidden, weight, targets, lse, entropy, dlogp, dlse, dentropy, vocab_start, vocab_real, temperature):
    return torch.empty_like(hidden), torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    hidden, weight, targets, vocab_start, vocab_real, temperature, return_entropy, *_ = inputs
    _, lse, ent, logits = output
    ctx.save_for_backward(hidden, weight, targets, lse, ent if return_entropy else None)
    ctx.args = (vocab_start, vocab_real, temperature)
    ctx.mark_non_differentiable(logits)


def _backward(ctx, dlogp, dlse, dent, _dlogits):
    hidden, weight, targets, lse, ent = ctx.saved_tensors
    if ent is None:
        dent = None
    dh, dw = _bwd_op(hidden, weight, targets, lse, ent,
                     None if dlogp is None else dlogp.contiguous().float(),
                     None if dlse is None else dlse.contiguous().float(),
                     None if dent is None else dent.contiguous().float(), *ctx.args)
    return (dh if ctx.needs_input_grad[0] else None, dw if ctx.needs_input_grad[1] else None,
            None, None, None, None, None, None, None, None)


torch.library.register_autograd("rlk::linear_logp_fwd", _backward, setup_context=_setup_context)


def linear_logp(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_start: int = 0,
                vocab_real: Optional[int] = None, temperature: float = 1.0, return_entropy: bool = False,
                return_logits: bool = False, *, segmentation: Optional[tuple[int, int]] = None) -> LogpOutput:
    """Selected-token log-prob through the LM head without materializing logits.

    Args:
      hidden: [T, H] bf16 (final-norm output). weight: [V_local, H] bf16, this rank's rows of the
        LM head (global columns [vocab_start, vocab_start + V_local)). targets: [T] int64 global
        token ids in [0, vocab_real). vocab_real: number of real (unpadded) tokens; default
        vocab_start + V_local. temperature: > 0; logits are x = (h @ w.T) * fp32(1/temperature).
      return_entropy: also entropy [T] fp32 (differentiable).
      return_logits: also logits [T, V_local] fp32 (the exact values the statistics use; padded
        columns -inf; not differentiable); logp/lse bytes do not change.
      segmentation: (ALIGN, SEG_V) from the contract's allowed list; default (18992, 256).

    Returns: LogpOutput(logp [T] fp32, lse [T] fp32, entropy [T] fp32 | None, logits | None).
    Single shard only: with tensor parallelism call :func:`segment_stats` on each rank, all_gather,
    then :func:`merge_segment_stats` in rank order (the collectives layer does that).
    Autograd: d(hidden), d(weight) recomputed from the saved lse (gradients of logp, lse, entropy).

    Determinism: logp.v2 — rows independent of T, bitwise run to run, logp/lse identical for every
    shard count that follows the segmentation rule (TP 1/2/4/8 for Qwen3's 151936 columns).
    """
    vocab_real = int(weight.shape[0] + vocab_start if vocab_real is None else vocab_real)
    align, seg_v = _contract.DEFAULT_SEGMENTATION if segmentation is None else tuple(segmentation)
    # Checks run eagerly (clear errors before any launch, also under autograd).
    _launch.check_inputs(hidden, weight, targets, int(vocab_start), vocab_real, align, seg_v)
    if direct(hidden, weight, targets):
        logp, lse, ent, logits = _launch.linear_logp_fwd(
            hidden, weight, targets, int(vocab_start), vocab_real, float(temperature), bool(return_entropy),
            bool(return_logits), (int(align), int(seg_v)), validate_targets=False)
        return LogpOutput(logp, lse, ent, logits)
    logp, lse, ent, logits = _fwd_op(hidden, weight, targets, int(vocab_start), vocab_real,
                                     float(temperature), bool(return_entropy), bool(return_logits),
                                     int(align), int(seg_v))
    return LogpOutput(logp, lse, ent if return_entropy else None, logits if return_logits else None)


class _LinearLogpLoss(torch.autograd.Function):
    """Forward: the fused path computes logp and, chunk by chunk, d_hidden / d_weight of
    L = sum_t loss_fn(logp)_t; backward: returns them times grad_out."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, loss_fn, vocab_start, vocab_real, temperature, segmentation,
                rows_per_chunk, main_grad):
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        losses = hidden.new_empty((hidden.shape[0],), dtype=torch.float32)

        def dlogp_fn(lp, lo, hi):
            with torch.enable_grad():
                x = lp.detach().requires_grad_(True)
                per_token = loss_fn(x, lo, hi)
                if not isinstance(per_token, torch.Tensor) or per_token.shape != (hi - lo,):
                    raise UnsupportedConfigError(
                        f"{CONTRACT_ID}: loss_fn(logp_chunk, {lo}, {hi}) must return per-token losses of "
                        f"shape ({hi - lo},), got {getattr(per_token, 'shape', type(per_token).__name__)}")
                losses[lo:hi] = per_token.detach()
                d = None
                if (need_h or need_w) and per_token.requires_grad:
                    # d(sum l)/dlogp_t = dl_t/dlogp_t: the ones seed is exact.
                    (d,) = torch.autograd.grad(per_token, x, torch.ones_like(per_token), allow_unused=True)
            return torch.zeros_like(lp) if d is None else d.float()

        logp, _, dh, dw = linear_logp_fused_loss(
            hidden, weight, targets, dlogp_fn, vocab_start, vocab_real, temperature, rows_per_chunk,
            segmentation=segmentation, need_d_hidden=need_h, need_d_weight=need_w,
            main_grad=main_grad if need_w else None)
        ctx.into_main_grad = main_grad is not None and need_w
        # Held as plain attributes (they are neither inputs nor outputs) and dropped in backward,
        # so the returned buffers have no other owner and AccumulateGrad adopts them as .grad
        # instead of copying them (a save_for_backward reference forces a copy: [V, H] bf16).
        ctx.grads = (dh, dw)
        ctx.mark_non_differentiable(logp)
        return losses.sum(), logp

    @staticmethod
    def backward(ctx, grad_loss, _grad_logp):
        if ctx.grads is None:
            raise RuntimeError("linear_logp_loss: backward ran twice (its gradients were handed over "
                               "the first time); call the loss again for a second backward")
        dh, dw = ctx.grads
        ctx.grads = None
        if ctx.into_main_grad:
            _require_unit_grad_out(grad_loss)
        return (_times(dh, grad_loss), _times(dw, grad_loss)) + (None,) * 8


def _require_unit_grad_out(grad_out: Optional[torch.Tensor]) -> None:
    """d_weight went into main_grad during the forward, unscaled, so the backward's grad_out must
    be exactly 1 (fold any loss scale into loss_fn). CPU: checked on the host; CUDA: a
    device-side assert (no host read, so no wait for the forward and graph capture still works)."""
    if grad_out is None:
        return
    one = grad_out.reshape(()) == 1
    if grad_out.device.type == "cuda":
        torch._assert_async(one, f"{CONTRACT_ID}: linear_logp_loss with main_grad needs grad_out == 1")
    elif not bool(one):
        raise UnsupportedConfigError(
            f"{CONTRACT_ID}: linear_logp_loss accumulated d_weight into main_grad during the forward, so "
            f"its backward needs grad_out == 1 (got {float(grad_out.reshape(()))}); put any loss scale "
            "(e.g. 1 / micro-batches) into loss_fn")


def _times(grad: Optional[torch.Tensor], grad_out: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """grad * grad_out, formed in place in ``grad`` (a buffer only this Function owns) by one
    launch that reads grad_out on the device (``fused.scale_by_``): no host read, so the host does
    not wait for the forward, and the same code runs under CUDA-graph capture. grad_out == 1 leaves
    grad's bytes untouched (bitwise the unfused gradients); other grad_out: fp32 product rounded
    once to grad's dtype (RNE), the bytes of ``(grad.float() * grad_out.float()).to(grad.dtype)``."""
    if grad is None or grad_out is None:
        return None
    if grad_out.requires_grad and torch.is_grad_enabled():
        # create_graph with a differentiable grad_out: the product must carry its grad_fn (same
        # bytes as the kernel; still no host read).
        return (grad.float() * grad_out.float()).to(grad.dtype)
    return scale_by_(grad, grad_out)


def linear_logp_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                     loss_fn: Callable[[torch.Tensor, int, int], torch.Tensor], vocab_start: int = 0,
                     vocab_real: Optional[int] = None, temperature: float = 1.0, *,
                     segmentation: Optional[tuple[int, int]] = None,
                     rows_per_chunk: Optional[int] = None,
                     main_grad: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss of selected-token log-probs through the LM head, fused: (loss scalar fp32, logp [T] fp32).

    L = sum over tokens of ``loss_fn(logp_chunk [Tc] fp32, lo, hi) -> per-token losses [Tc]`` (rows
    [lo, hi) of the batch; called once per row chunk, ascending). ``loss_fn`` is differentiated
    w.r.t. logp only (torch.autograd.grad per chunk); tensors it closes over (advantages, old logp)
    receive no gradient. Row t's loss must depend on row t only; elementwise torch ops on GPU give
    the same bytes whatever the chunk (on CPU, vectorized transcendental ops may differ in the last
    bit between a vector body and its scalar tail). The gradients of ``hidden`` [T, H] bf16 and
    ``weight`` [V_local, H] bf16 are formed during this call (3 GEMM-equivalents, vs 4 for
    ``linear_logp`` + backward) and held until ``loss.backward()``; ``logp`` is detached.

    Backward: grad_out * d_hidden / d_weight, bitwise the unfused path's gradients when grad_out
    == 1.0 (the usual ``loss.backward()``); other grad_out: fp32 product rounded once to bf16. The
    product is formed in place by a kernel that reads grad_out on the device (no host read, also
    under CUDA-graph capture; with grad_out == 1 it touches no element). Single shard only
    (vocab_start 0, weight holds every real column), no entropy; vocab-parallel or entropy losses
    use :func:`linear_logp`. Not traceable by torch.compile (Python loss inside). Args otherwise as
    :func:`linear_logp`; ``rows_per_chunk`` overrides the table's row chunk (tests).

    ``main_grad``: optional fp32 ``[V_local, H]`` contiguous tensor (megatron's gradient-
    accumulation fusion passes ``weight.main_grad``). d_weight is then accumulated into it during
    this call, through the same fp32 chain the bf16 d_weight comes from (no second accumulator,
    no rounding), and ``weight`` receives no ``.grad`` (its backward returns None); the backward's
    grad_out must be exactly 1 (UnsupportedConfigError on CPU, device assert on CUDA). Wrong
    dtype, shape, device or layout: UnsupportedConfigError before any launch.

    Determinism: logp.v2 — logp bytes equal ``linear_logp``'s; gradients equal the unfused path's
    for the same per-token dlogp (tested bitwise; on GPU by fused_test's GPU cases); bitwise run
    to run; with a zero ``main_grad`` its bf16 rounding is the bf16 d_weight bitwise, and two calls
    accumulate in call order (each element's fp32 chain continues over the second call's tokens).
    """
    if main_grad is not None:
        _launch.check_main_grad(main_grad, weight)
    return _LinearLogpLoss.apply(hidden, weight, targets, loss_fn, int(vocab_start),
                                 None if vocab_real is None else int(vocab_real), float(temperature),
                                 segmentation, rows_per_chunk, main_grad)
