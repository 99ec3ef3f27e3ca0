"""Autograd and ``torch.library`` registration of strict attention (contract ``attn.v2``).

``rlk::attn_varlen_fwd`` / ``rlk::attn_varlen_bwd`` wrap the Triton launchers of
``rlk.kernels.attention.launch``; ``varlen_attention`` is the differentiable entry point used by
the trainer (the rollout side calls ``launch.paged`` / ``launch.write_kv`` directly).
"""

from __future__ import annotations

import torch

from rlk.kernels.attention import launch
from rlk.kernels.dispatch import direct

CONTRACT_ID = "attn.v2"


@torch.library.custom_op("rlk::attn_varlen_fwd", mutates_args=())
def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
         max_seqlen: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return launch.prefill(q, k, v, cu_seqlens, max_seqlen, scale)


@_fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens, max_seqlen, scale):
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


@torch.library.custom_op("rlk::attn_varlen_bwd", mutates_args=())
def _bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
         lse: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
         scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch.backward(do.contiguous(), q, k, v, out, lse, cu_seqlens, max_seqlen, scale)


@_bwd.register_fake
def _bwd_fake(do, q, k, v, out, lse, cu_seqlens, max_seqlen, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, max_seqlen, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens)
    ctx.max_seqlen, ctx.scale = max_seqlen, scale


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens = ctx.saved_tensors
    # dlse is not propagated: varlen_attention exposes only `out` to autograd.
    dq, dk, dv = _bwd(dout, q, k, v, out, lse, cu_seqlens, ctx.max_seqlen, ctx.scale)
    return dq, dk, dv, None, None, None


_fwd.register_autograd(_backward, setup_context=_setup_context)


def varlen_attention(q, k, v, cu_seqlens, max_seqlen: int, scale: float) -> torch.Tensor:
    """Packed causal varlen attention with a deterministic backward.

    Args: q [T, Hq, D], k/v [T, Hk, D] bf16; cu_seqlens [B+1] int32; max_seqlen int; scale float.
    Returns: out [T, Hq, D] bf16.
    Determinism: contract ``attn.v2``: forward rows byte-identical to the paged (rollout) kernels
    for any batch composition; backward bitwise run to run (no atomics, fixed loop order).
    """
    if direct(q, k, v, cu_seqlens):
        return launch.prefill(q, k, v, cu_seqlens, int(max_seqlen), float(scale))[0]
    out, _ = _fwd(q, k, v, cu_seqlens, int(max_seqlen), float(scale))
    return out


def varlen_attention_with_lse(q, k, v, cu_seqlens, max_seqlen: int, scale: float):
    """Like :func:`varlen_attention` but also returns lse [T, Hq] fp32 (no gradient through it)."""
    if direct(q, k, v, cu_seqlens):
        return launch.prefill(q, k, v, cu_seqlens, int(max_seqlen), float(scale))
    return _fwd(q, k, v, cu_seqlens, int(max_seqlen), float(scale))
