"""Thin nn.Module over strict attention (contract ``attn.v2``)."""

from __future__ import annotations

import torch

from rlk.kernels.attention.autograd import varlen_attention


class VarlenCausalAttention(torch.nn.Module):
    """Core attention of a packed batch (after QKV projection, q/k norm and RoPE).

    forward(q [T, Hq, D], k [T, Hk, D], v [T, Hk, D], cu_seqlens [B+1] int32, max_seqlen)
      -> [T, Hq, D] bf16.
    Determinism: contract ``attn.v2`` (rows byte-identical to rlk's paged rollout kernels;
    backward bitwise run to run).
    """

    contract_id = "attn.v2"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float | None = None):
        super().__init__()
        if num_heads % num_kv_heads:
            from rlk.errors import UnsupportedConfigError

            raise UnsupportedConfigError(f"num_heads {num_heads} not a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = float(scale) if scale is not None else head_dim ** -0.5

    def forward(self, q, k, v, cu_seqlens, max_seqlen: int):
        return varlen_attention(q, k, v, cu_seqlens, max_seqlen, self.scale)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, contract=attn.v2"
