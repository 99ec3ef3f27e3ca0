"""Autograd and ``torch.library`` registration of ``logp.v2`` (fused LM head + selected-token
log-prob). Kernels: ``rlk.kernels.linear_logp``.

Ops: ``rlk::linear_logp_fwd`` and ``rlk::linear_logp_bwd`` (custom ops with fake kernels, so they
trace under torch.compile); autograd is registered on the forward op and recomputes logits from
the saved lse (no stored logits). When no input requires grad, nothing is saved (the
reference-scoring path).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from rlk.kernels.linear_logp import config as _cfg
from rlk.kernels.linear_logp import launch as _launch
from rlk.kernels.linear_logp.launch import SegmentStats, merge_segment_stats, segment_stats
from rlk.ops._dispatch import direct

CONTRACT_ID = _cfg.CONTRACT_ID

__all__ = ["LogpOutput", "linear_logp", "segment_stats", "merge_segment_stats", "SegmentStats",
           "CONTRACT_ID"]


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
    align, seg_v = _cfg.DEFAULT_SEGMENTATION if segmentation is None else tuple(segmentation)
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
