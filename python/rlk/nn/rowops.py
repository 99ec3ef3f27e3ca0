"""Thin nn.Modules over ``rlk.kernels.rowops.autograd`` (no arithmetic here), used by the Qwen3
model and the engine adapters. Contracts: ``rmsnorm.v1``, ``rope.v1``, ``swiglu.v1``, ``embedding.v1``."""

from __future__ import annotations

import torch
from torch import nn

from rlk.kernels.rowops import autograd as ops


class RMSNorm(nn.Module):
    """RMSNorm over the last dim, with an optional fused residual add.

    ``forward(x [T, H])`` -> [T, H]; ``forward(x, residual)`` -> (normed, new_residual) with
    new_residual = x + residual (rounded once), the vLLM calling convention.

    **Determinism:** ``rmsnorm.v1``.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype=torch.bfloat16, device=None):
        super().__init__()
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps)
        return ops.add_rms_norm(x, residual, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class QKNorm(nn.Module):
    """Per-head RMSNorm over head_dim: ``forward(x [T, nh, D])`` -> [T, nh, D].

    **Determinism:** ``rmsnorm.v1``.
    """

    def __init__(self, head_dim: int, eps: float = 1e-6, dtype=torch.bfloat16, device=None):
        super().__init__()
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(head_dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.qk_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE with the fixed ``rope.v1`` table (non-persistent fp32 buffers).

    ``forward(q [T, nq, D], k [T, nk, D], positions [T] int64)`` -> (q_rot, k_rot);
    ``apply(x, positions)`` rotates one tensor.

    **Determinism:** ``rope.v1``.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float = 1_000_000.0, device=None):
        super().__init__()
        self.head_dim, self.max_positions, self.theta = head_dim, max_positions, float(theta)
        cos, sin = ops.rope_table(max_positions, head_dim, theta, device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return ops.apply_rope(x, positions, self.cos, self.sin)

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        return self.apply(q, positions), self.apply(k, positions)

    def _apply(self, fn, *args, **kwargs):
        # Keep the table fp32 when the module is cast (model.to(torch.bfloat16)).
        super()._apply(fn, *args, **kwargs)
        if self.cos.dtype != torch.float32:
            self.cos, self.sin = self.cos.float(), self.sin.float()
        return self

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_positions={self.max_positions}, theta={self.theta}"


class SwiGLU(nn.Module):
    """``forward(gate_up [T, 2F])`` -> silu(gate_up[:, :F]) * gate_up[:, F:] ([T, F]).

    **Determinism:** ``swiglu.v1``.
    """

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        return ops.swiglu(gate_up)


class Embedding(nn.Module):
    """Token embedding: ``forward(ids [T] int64)`` -> [T, H], exact row copy.

    **Determinism:** ``embedding.v1``.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype=torch.bfloat16, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim, dtype=dtype, device=device))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return ops.embedding(ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}"


__all__ = ["RMSNorm", "QKNorm", "RotaryEmbedding", "SwiGLU", "Embedding"]
