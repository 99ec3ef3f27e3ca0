"""vLLM KV-cache layouts -> rlk's strided ``[num_blocks, block_size, Hk, D]`` views (no copies).

rlk's paged kernels take any strides on the first three dims (last dim contiguous), so each
engine layout is adapted here by views only; the kernels stay independent of the layout and
``write_kv`` writes the engine's own cache in place.

* CPU (``CPUAttentionBackendImpl``): ``[num_blocks, Hk, block_size, 2 * D]``, read by vLLM as
  ``view(num_blocks, Hk, 2 * block_size, D).chunk(2, dim=2)``: within each (block, head) the
  first ``block_size * D`` elements are K rows, the next ``block_size * D`` are V rows.
* FlashAttention / Triton (GPU, vLLM 0.32/0.33): ``[num_blocks, Hk, block_size, 2 * D]`` read
  as ``kv_cache.transpose(1, 2).split(D, dim=-1)``: each (block, head, token) row holds K then V.
The GPU entry is written from the backends' source (``api_check_probe`` pins that line) and is not
run here; other backends (FlashInfer, MLA, ROCm) are rejected.
"""

from __future__ import annotations

import torch

from rlk.errors import UnsupportedConfigError
from rlk.models.qwen3.routes import PagedMeta

CPU_IMPLS = ("CPUAttentionBackendImpl",)
GPU_BHN2D_IMPLS = ("FlashAttentionImpl", "TritonAttentionImpl")


def kv_views(kv_cache: torch.Tensor, impl_name: str, num_kv_heads: int, head_dim: int):
    """(k, v) views ``[num_blocks, block_size, Hk, D]`` of one layer's vLLM KV cache."""
    Hk, D = num_kv_heads, head_dim
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.numel() == 0:
        raise UnsupportedConfigError("rlk strict vLLM: the layer has no KV cache bound")
    s = tuple(kv_cache.shape)
    if impl_name in CPU_IMPLS:
        if len(s) != 4 or s[1] != Hk or s[3] != 2 * D or not kv_cache.is_contiguous():
            raise UnsupportedConfigError(f"rlk strict vLLM: CPU KV cache {s} is not [nb, {Hk}, bs, {2 * D}]")
        nb, _, bs, _ = s
        kv = kv_cache.view(nb, Hk, 2 * bs, D)
        return kv[:, :, :bs].permute(0, 2, 1, 3), kv[:, :, bs:].permute(0, 2, 1, 3)
    if impl_name in GPU_BHN2D_IMPLS:
        if len(s) != 4 or s[1] != Hk or s[3] != 2 * D or kv_cache.stride(-1) != 1:
            raise UnsupportedConfigError(f"rlk strict vLLM: KV cache {s} is not [nb, {Hk}, bs, {2 * D}]")
        k, v = kv_cache.transpose(1, 2).split(D, dim=-1)
        return k, v
    raise UnsupportedConfigError(f"rlk strict vLLM: KV layout of attention impl {impl_name!r} is not known")


def paged_meta(md) -> tuple[PagedMeta, int]:
    """rlk ``PagedMeta`` from one layer's vLLM attention metadata, and the real token count.

    Exact conversions only (index dtypes); ``block_size`` is filled in by the caller from the
    cache view.
    """
    seq_lens = md.seq_lens
    B = seq_lens.shape[0]
    cu = md.query_start_loc[: B + 1]
    n = int(getattr(md, "num_actual_tokens", md.slot_mapping.shape[0]))
    meta = PagedMeta(
        block_tables=md.block_table[:B].to(torch.int32),
        cu_seqlens_q=cu.to(torch.int32),
        seq_lens_kv=seq_lens.to(torch.int32),
        slot_mapping=md.slot_mapping[:n].to(torch.int64),
        block_size=0,
        max_seqlen_q=int(md.max_query_len),
    )
    return meta, n
