"""KV layout views: rlk's write_kv through the CPU-layout views lands exactly where vLLM's CPU
backend reads K and V (``view(nb, Hk, 2 bs, D).chunk(2, dim=2)``); GPU layouts by shape."""

import types

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.integrations.vllm import kv_layout
from rlk.testing import assert_bitwise_equal


def test_cpu_views_match_vllm_cpu_reading():
    nb, Hk, bs, D = 3, 2, 32, 64
    cache = torch.zeros(nb, Hk, bs, 2 * D, dtype=torch.bfloat16)
    k, v = kv_layout.kv_views(cache, "CPUAttentionBackendImpl", Hk, D)
    assert k.shape == (nb, bs, Hk, D) and k.stride(-1) == 1
    g = torch.Generator().manual_seed(0)
    kt = torch.randn(nb, bs, Hk, D, generator=g).to(torch.bfloat16)
    vt = torch.randn(nb, bs, Hk, D, generator=g).to(torch.bfloat16)
    k.copy_(kt)
    v.copy_(vt)
    kc, vc = cache.view(nb, Hk, 2 * bs, D).chunk(2, dim=2)  # vLLM CPU backend's reading
    assert_bitwise_equal(kc.permute(0, 2, 1, 3), kt)
    assert_bitwise_equal(vc.permute(0, 2, 1, 3), vt)


def test_rlk_write_kv_into_cpu_layout_is_exact():
    from rlk.kernels.attention import launch

    nb, Hk, bs, D = 2, 1, 32, 64
    cache = torch.zeros(nb, Hk, bs, 2 * D, dtype=torch.bfloat16)
    kview, vview = kv_layout.kv_views(cache, "CPUAttentionBackendImpl", Hk, D)
    g = torch.Generator().manual_seed(1)
    k = torch.randn(3, Hk, D, generator=g).to(torch.bfloat16)
    v = torch.randn(3, Hk, D, generator=g).to(torch.bfloat16)
    slots = torch.tensor([5, bs + 7, 2 * bs - 1])
    launch.write_kv(k, v, kview, vview, slots)
    kc, vc = cache.view(nb, Hk, 2 * bs, D).chunk(2, dim=2)
    for i, s in enumerate(slots.tolist()):
        assert_bitwise_equal(kc[s // bs, :, s % bs], k[i])
        assert_bitwise_equal(vc[s // bs, :, s % bs], v[i])
    assert int((cache != 0).sum()) == int((k != 0).sum() + (v != 0).sum())


def test_gpu_flash_layout_views_and_unknown():
    """vLLM's FlashAttention reading: ``kv_cache.transpose(1, 2).split(D, dim=-1)`` (not run on a GPU)."""
    c = torch.arange(4 * 2 * 16 * 128, dtype=torch.float32).view(4, 2, 16, 128)
    k, v = kv_layout.kv_views(c, "FlashAttentionImpl", 2, 64)
    ek, ev = c.transpose(1, 2).split(64, dim=-1)
    assert k.shape == (4, 16, 2, 64) and torch.equal(k, ek) and torch.equal(v, ev) and k.stride(-1) == 1
    with pytest.raises(UnsupportedConfigError, match="not known"):
        kv_layout.kv_views(c, "FlashInferImpl", 2, 64)
    with pytest.raises(UnsupportedConfigError):
        kv_layout.kv_views(torch.zeros(4, 2, 16, 64), "CPUAttentionBackendImpl", 2, 64)


def test_paged_meta_exact_conversion():
    md = types.SimpleNamespace(seq_lens=torch.tensor([5, 9], dtype=torch.int32),
                               query_start_loc=torch.tensor([0, 1, 2, 2], dtype=torch.int32),
                               block_table=torch.tensor([[3, 0], [1, 2], [0, 0]], dtype=torch.int32),
                               slot_mapping=torch.tensor([100, 200, -1]), num_actual_tokens=2, max_query_len=1)
    meta, n = kv_layout.paged_meta(md)
    assert n == 2 and meta.cu_seqlens_q.tolist() == [0, 1, 2] and meta.block_tables.shape == (2, 2)
    assert meta.slot_mapping.dtype == torch.int64 and meta.slot_mapping.tolist() == [100, 200]
