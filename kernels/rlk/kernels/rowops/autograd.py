"""Strict row ops with autograd, registered as ``torch.library`` custom ops (``rlk::*``).

The functions below are what the Qwen3 model and the engine adapters call (docs/API.md, "Row
ops"). Forward and backward run the Triton kernels of ``rlk.kernels.rowops``; inputs are checked
before any launch (``rlk.UnsupportedConfigError``); nothing falls back to a native kernel.
Custom ops keep the kernels opaque to ``torch.compile`` (fake implementations give shapes).
"""

from __future__ import annotations

from typing import Optional

import torch

from rlk.kernels.common import host_validated
from rlk.kernels.rowops import launch as L
from rlk.kernels.dispatch import direct

_lib = torch.library


# ------------------------------------------------------------------------------- custom ops
@_lib.custom_op("rlk::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return L._norm_fwd(x, weight, eps)[0]


@_lib.custom_op("rlk::add_rms_norm", mutates_args=())
def _add_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return L.add_rms_norm(x, residual, weight, eps)


@_lib.custom_op("rlk::rms_norm_backward", mutates_args=())
def _rms_norm_bwd_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float,
                     d_residual: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return L.rms_norm_backward(dy, x, weight, eps, d_residual)


@_lib.custom_op("rlk::apply_rope", mutates_args=())
def _rope_op(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             backward: bool) -> torch.Tensor:
    return L.apply_rope(x, positions, cos, sin, backward=backward)


@_lib.custom_op("rlk::swiglu", mutates_args=())
def _swiglu_op(gate_up: torch.Tensor) -> torch.Tensor:
    return L.swiglu(gate_up)


@_lib.custom_op("rlk::swiglu_backward", mutates_args=())
def _swiglu_bwd_op(dy: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    return L.swiglu_backward(dy, gate_up)


@_lib.custom_op("rlk::embedding", mutates_args=())
def _embedding_op(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return L.embedding(ids, weight)


@_lib.custom_op("rlk::embedding_backward", mutates_args=())
def _embedding_bwd_op(dy: torch.Tensor, ids: torch.Tensor, num_embeddings: int) -> torch.Tensor:
    return L.embedding_backward(dy, ids, num_embeddings)


# --------------------------------------------------------------------- fake (meta) kernels
@_rms_norm_op.register_fake
def _(x, weight, eps):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@_add_rms_norm_op.register_fake
def _(x, residual, weight, eps):
    return torch.empty_like(x), torch.empty_like(x)


@_rms_norm_bwd_op.register_fake
def _(dy, x, weight, eps, d_residual):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty_like(weight)


@_rope_op.register_fake
def _(x, positions, cos, sin, backward):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@_swiglu_op.register_fake
def _(gate_up):
    return gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))


@_swiglu_bwd_op.register_fake
def _(dy, gate_up):
    return torch.empty(gate_up.shape, dtype=gate_up.dtype, device=gate_up.device)


@_embedding_op.register_fake
def _(ids, weight):
    return weight.new_empty((ids.shape[0], weight.shape[1]))


@_embedding_bwd_op.register_fake
def _(dy, ids, num_embeddings):
    return dy.new_empty((num_embeddings, dy.shape[1]))


# -------------------------------------------------------------------------------- autograd
def _norm_setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _norm_backward(ctx, dy):
    x, weight = ctx.saved_tensors
    dx, dw = _rms_norm_bwd_op(dy, x, weight, ctx.eps, None)
    return dx, dw, None


def _add_norm_setup(ctx, inputs, output):
    _, _, weight, eps = inputs
    ctx.save_for_backward(output[1], weight)  # the norm's input is the rounded new residual
    ctx.eps = eps


def _add_norm_backward(ctx, d_normed, d_new_residual):
    s, weight = ctx.saved_tensors
    if d_normed is None:
        d_normed = torch.zeros_like(s)
    d, dw = _rms_norm_bwd_op(d_normed, s, weight, ctx.eps, d_new_residual)
    return d, d, dw, None


def _rope_setup(ctx, inputs, output):
    _, positions, cos, sin, backward = inputs
    ctx.save_for_backward(positions, cos, sin)
    ctx.backward = backward


def _rope_backward(ctx, dy):
    positions, cos, sin = ctx.saved_tensors
    # The forward already range-checked these positions (or its caller vouched for them under
    # host_validated); checking again would cost one device read per call, and the autograd
    # engine runs CUDA backward on its own thread, where the caller's host_validated() (a
    # thread-local) does not reach.
    with host_validated():
        return _rope_op(dy.contiguous(), positions, cos, sin, not ctx.backward), None, None, None, None


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _swiglu_backward(ctx, dy):
    (gate_up,) = ctx.saved_tensors
    return _swiglu_bwd_op(dy, gate_up)


def _embedding_setup(ctx, inputs, output):
    ids, weight = inputs
    ctx.save_for_backward(ids)
    ctx.num_embeddings = weight.shape[0]
    ctx.weight_dtype = weight.dtype


def _embedding_backward(ctx, dy):
    (ids,) = ctx.saved_tensors
    return None, _embedding_bwd_op(dy.to(ctx.weight_dtype), ids, ctx.num_embeddings)


_rms_norm_op.register_autograd(_norm_backward, setup_context=_norm_setup)
_add_rms_norm_op.register_autograd(_add_norm_backward, setup_context=_add_norm_setup)
_rope_op.register_autograd(_rope_backward, setup_context=_rope_setup)
_swiglu_op.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)
_embedding_op.register_autograd(_embedding_backward, setup_context=_embedding_setup)


# ---------------------------------------------------------------------------- public API
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each row: x [T, H] bf16 (fp32 accepted), weight [H] -> [T, H] in x's dtype.

    y = round(w * round(x * rstd)), rstd = 1 / sqrt_rn(mean(x^2) + eps) (Hugging Face order).
    Backward: dx strict per row; dw reduced over rows in a fixed order (no atomics).

    **Determinism:** ``rmsnorm.v1``; rows batch-invariant; run-to-run bitwise (fwd and bwd).
    """
    if direct(x, weight):
        return L._norm_fwd(x, weight, float(eps))[0]
    return _rms_norm_op(x, weight, float(eps))


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """Fused residual add + RMSNorm: x, residual [T, H] -> (normed [T, H], new_residual [T, H]).

    new_residual = round(x + residual); normed = rms_norm(new_residual): the bytes are those of
    the unfused pair, so an engine may use either form. Backward gives the same grads for x and
    residual (round(round(dx_norm) + d_new_residual)).

    **Determinism:** ``rmsnorm.v1``; rows batch-invariant; fused == unfused bitwise.
    """
    if direct(x, residual, weight):
        return L.add_rms_norm(x, residual, weight, float(eps))
    return _add_rms_norm_op(x, residual, weight, float(eps))


def qk_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-head RMSNorm over head_dim: x [T, nh, D] (strided T / nh allowed, e.g. a slice of
    the fused QKV output), weight [D] -> contiguous [T, nh, D]. Same bytes as ``rms_norm`` of
    x.reshape(T * nh, D).

    **Determinism:** ``rmsnorm.v1``; rows (token, head) batch-invariant; run-to-run bitwise.
    """
    if direct(x, weight):
        return L._norm_fwd(x, weight, float(eps))[0]
    return _rms_norm_op(x, weight, float(eps))


def rope_table(max_positions: int, head_dim: int, theta: float, device=None):
    """(cos, sin), each [max_positions, head_dim // 2] fp32: fp64 on the CPU
    (inv_freq = 1 / theta ** (arange(0, D, 2) / D), angle = pos * inv_freq), one cast to fp32.

    **Determinism:** ``rope.v1``; same bytes wherever the host's fp64 cos/sin agree (CPU libm).
    """
    return L.rope_table(max_positions, head_dim, theta, device)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half (NeoX / HF Qwen3) RoPE: x [T, nh, D] bf16, positions [T] int64 (any values
    in [0, max_pos): packed sequences, decode positions), cos/sin from :func:`rope_table`
    -> contiguous [T, nh, D]. o1 = x1*c - x2*s, o2 = x2*c + x1*s in fp32 (no FMA), one rounding.

    **Determinism:** ``rope.v1``; elementwise, batch-invariant, run-to-run bitwise.
    """
    if direct(x, positions, cos, sin):
        return L.apply_rope(x, positions, cos, sin, backward=False)
    return _rope_op(x, positions, cos, sin, False)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up: gate_up [T, 2F] bf16 (gate = [:, :F], up = [:, F:]) -> [T, F];
    silu(g) = g / (1 + exp(-g)) in fp32, one rounding.

    **Determinism:** ``swiglu.v1``; elementwise, batch-invariant, run-to-run bitwise.
    """
    if direct(gate_up):
        return L.swiglu(gate_up)
    return _swiglu_op(gate_up)


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """weight[ids]: ids [T] int64 in [0, V) (checked; raises otherwise), weight [V, H] -> [T, H],
    exact copy. Backward: dW rows summed per id in ascending token order (fp32, no atomics).

    **Determinism:** ``embedding.v1``; exact; dW run-to-run bitwise.
    """
    if direct(ids, weight):
        return L.embedding(ids, weight)
    return _embedding_op(ids, weight)


__all__ = ["rms_norm", "add_rms_norm", "qk_norm", "rope_table", "apply_rope", "swiglu", "embedding"]
