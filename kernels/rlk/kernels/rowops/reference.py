"""Plain-torch specification of the row-op contracts (tests and benchmarks only; kernels never
import this module).

Casting contract (``rmsnorm.v1``, ``rope.v1``, ``swiglu.v1``, ``embedding.v1``):
  * RMSNorm, Hugging Face order: x32 = x.float(); rstd = 1 / sqrt(mean(x32^2) + eps) (both
    correctly rounded); n = round_act(x32 * rstd); y = round_act(w32 * n.float()).
    Fused residual: s = round_act(x32 + r32); normed = RMSNorm(s) (reads the rounded s).
  * QK-norm: RMSNorm over the last dim of [T, nh, D].
  * RoPE table: fp64 on the CPU, one cast to fp32; apply in fp32: o1 = x1*c - x2*s,
    o2 = x2*c + x1*s, one rounding.
  * SwiGLU: y = round_act((g / (1 + exp(-g))) * u) in fp32.
  * Embedding: exact copy; dW per id = sum of the id's dy rows in ascending token order (fp32),
    one rounding.
``math`` selects the precision: ``torch.float32`` reproduces the rounding points (the sum of
squares tree differs from the kernel's), ``torch.float64`` is the accuracy oracle (no
intermediate rounding at all).
"""

from __future__ import annotations

import torch


def _round(x: torch.Tensor, dtype: torch.dtype, math: torch.dtype) -> torch.Tensor:
    return x if math == torch.float64 else x.to(dtype).to(math)


def rms_norm(x, weight, eps, math=torch.float32):
    xm = x.to(math)
    rstd = 1.0 / torch.sqrt((xm * xm).sum(-1, keepdim=True) / x.shape[-1] + eps)
    n = _round(xm * rstd, x.dtype, math)
    return _round(weight.to(math) * n, x.dtype, math)


def add_rms_norm(x, residual, weight, eps, math=torch.float32):
    s = _round(x.to(math) + residual.to(math), x.dtype, math)
    return rms_norm(s, weight, eps, math), s


def rms_norm_backward(dy, x, weight, eps, math=torch.float64):
    """(dx, dw) by autograd through the unrounded formula y = w * x * rstd, in ``math``."""
    xm = x.detach().to(math).requires_grad_(True)
    wm = weight.detach().to(math).requires_grad_(True)
    rstd = 1.0 / torch.sqrt((xm * xm).sum(-1, keepdim=True) / x.shape[-1] + eps)
    y = wm * (xm * rstd)
    dx, dw = torch.autograd.grad(y, (xm, wm), dy.to(math))
    return dx, dw


def rope_table(max_positions, head_dim, theta):
    inv_freq = 1.0 / (float(theta) ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angle = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angle.cos().float(), angle.sin().float()


def apply_rope(x, positions, cos, sin, math=torch.float32, inverse=False):
    half = x.shape[-1] // 2
    c = cos[positions].to(math)[:, None, :]
    s = sin[positions].to(math)[:, None, :]
    if inverse:
        s = -s
    xm = x.to(math)
    x1, x2 = xm[..., :half], xm[..., half:]
    out = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    return out if math == torch.float64 else out.to(x.dtype)


def swiglu(gate_up, math=torch.float32):
    F = gate_up.shape[-1] // 2
    g, u = gate_up[..., :F].to(math), gate_up[..., F:].to(math)
    y = (g / (1.0 + torch.exp(-g))) * u
    return y if math == torch.float64 else y.to(gate_up.dtype)


def swiglu_backward(dy, gate_up, math=torch.float64):
    gu = gate_up.detach().to(math).requires_grad_(True)
    (dgu,) = torch.autograd.grad(swiglu(gu, math=math), (gu,), dy.to(math))
    return dgu


def embedding(ids, weight):
    return weight[ids]


def embedding_backward(dy, ids, num_embeddings):
    """fp32 sums in ascending token order per id, one rounding (a plain Python loop)."""
    acc = torch.zeros((num_embeddings, dy.shape[1]), dtype=torch.float32)
    for t, i in enumerate(ids.tolist()):
        acc[i] += dy[t].float().cpu()
    return acc.to(dy.dtype)
