"""Bitwise invariance of ``attn.v2``: every query row has the same bytes (out and LSE) in
prefill, chunked prefill (several chunk sizes) and decode, for any batch composition, page size,
page order and split schedule, and run to run.

Under the CPU interpreter this proves the kernels' walk, masking, segment fold and split/merge
logic (the dot is numpy's fp32 matmul); it says nothing about the GPU's bf16 MMA, whose rows are
checked by the ``gpu`` tests below and by attention_invariance_sweep.py on the H200.
"""

import pytest
import torch

from rlk.kernels.attention import launch
from rlk.kernels.attention import testing as T
from rlk.testing import assert_bitwise_equal

LENS = [1, 5, 63, 64, 65, 130]
SEG_C = "attn.seg128.v2"  # 128-position segments: folds and split decode at tiny lengths
# Rows straddling chunk (64) and segment (128) boundaries, plus the short sequences.
ROWS = [0, 1, 5, 68, 69, 70, 132, 133, 196, 197, 261, 262, 263, 326, 327]


@pytest.fixture(scope="module")
def data():
    q, k, v, cu = T.packed(LENS, 4, 2, 16, seed=1)
    scale = 16 ** -0.5
    out, lse = launch.prefill(q, k, v, cu, max(LENS), scale, contract=SEG_C)
    return q, k, v, cu, scale, out, lse


def test_prefill_run_to_run_and_batch_composition(data):
    q, k, v, cu, scale, out, lse = data
    o2, l2 = launch.prefill(q, k, v, cu, max(LENS), scale, contract=SEG_C)
    assert_bitwise_equal(o2, out, "run to run")
    assert_bitwise_equal(l2, lse, "run to run lse")
    # Each sequence alone, and the batch packed in reverse order.
    cu_l = cu.tolist()
    order = list(range(len(LENS)))[::-1]
    idx = torch.cat([torch.arange(cu_l[b], cu_l[b + 1]) for b in order])
    lens_r = [LENS[b] for b in order]
    cu_r = torch.tensor([0] + torch.tensor(lens_r).cumsum(0).tolist(), dtype=torch.int32)
    o3, l3 = launch.prefill(q[idx], k[idx], v[idx], cu_r, max(LENS), scale, contract=SEG_C)
    assert_bitwise_equal(o3, out[idx], "reversed packing")
    assert_bitwise_equal(l3, lse[idx], "reversed packing lse")
    a, b = cu_l[4], cu_l[5]
    one = torch.tensor([0, b - a], dtype=torch.int32)
    o4, l4 = launch.prefill(q[a:b], k[a:b], v[a:b], one, b - a, scale, contract=SEG_C)
    assert_bitwise_equal(o4, out[a:b], "sequence alone")
    assert_bitwise_equal(l4, lse[a:b], "sequence alone lse")


@pytest.mark.parametrize("page", [16, 64, 128])
def test_decode_matches_prefill(data, page):
    q, k, v, cu, scale, out, lse = data
    kc, vc, bt = T.paged_cache(k, v, cu, page, seed=page, capacity_pages=256 // page)
    od, ld = T.decode_rows(q, cu, kc, vc, bt, ROWS, scale, contract=SEG_C)  # split-KV + merge
    assert_bitwise_equal(od, out[ROWS], f"decode page={page}")
    assert_bitwise_equal(ld, lse[ROWS], f"decode lse page={page}")


@pytest.mark.parametrize("chunk,page", [(16, 16), (64, 32), (100, 128)])
def test_chunked_prefill_matches_prefill(data, chunk, page):
    q, k, v, cu, scale, out, lse = data
    kc, vc, bt = T.paged_cache(k, v, cu, page, seed=chunk)
    oc, lc = T.chunked_prefill(q, cu, kc, vc, bt, chunk, scale, contract=SEG_C)
    assert_bitwise_equal(oc, out, f"chunk={chunk} page={page}")
    assert_bitwise_equal(lc, lse, f"chunk={chunk} page={page} lse")


def test_decode_batch_composition_and_padding_slot(data):
    """A request's row does not depend on its neighbours; a kv-length-0 slot gives 0 / -inf."""
    q, k, v, cu, scale, out, lse = data
    kc, vc, bt = T.paged_cache(k, v, cu, 32, seed=3, capacity_pages=8)
    rows = [262, 70, 1]
    od, ld = T.decode_rows(q, cu, kc, vc, bt, rows, scale, contract=SEG_C)
    assert_bitwise_equal(od, out[rows], "decode reordered")
    # Padding slot (kv length 0) in the middle of a batch.
    qq = torch.cat([q[262:263], q[0:1], q[70:71]])
    tables = torch.stack([bt[5], bt[0], bt[3]]).contiguous()
    kv = torch.tensor([65, 0, 2], dtype=torch.int32)  # row 262: seq 5 pos 64; row 70: seq 3 pos 1
    cuq = torch.arange(4, dtype=torch.int32)
    o, l = launch.paged(qq, kc, vc, tables, cuq, kv, scale, contract=SEG_C)
    assert_bitwise_equal(o[[0, 2]], out[[262, 70]], "neighbours of a padding slot")
    assert_bitwise_equal(o[1], torch.zeros_like(o[1]), "padding slot out")
    assert bool(torch.isneginf(l[1]).all()), "padding slot lse must be -inf"


def test_default_contract_segments(data):
    """attn.v2 (512-position segments): decode and chunked prefill equal its prefill."""
    q, k, v, cu, scale, _, _ = data
    out, lse = launch.prefill(q, k, v, cu, max(LENS), scale)
    kc, vc, bt = T.paged_cache(k, v, cu, 64, seed=9)
    od, ld = T.decode_rows(q, cu, kc, vc, bt, [0, 132, 327], scale)
    assert_bitwise_equal(od, out[[0, 132, 327]], "attn.v2 decode")
    oc, lc = T.chunked_prefill(q, cu, kc, vc, bt, 80, scale)
    assert_bitwise_equal(oc, out, "attn.v2 chunked")
    assert_bitwise_equal(lc, lse, "attn.v2 chunked lse")


# ---------------------------------------------------------------- GPU (H200), real sizes
@pytest.mark.gpu
# GQA groups 4 (Qwen3-8B and its TP4 shard), 2 (Qwen3-1.7B: 16/8), 5 (Qwen3-14B: 40/8), 1 (MHA).
@pytest.mark.parametrize("hq,hk", [(32, 8), (8, 2), (16, 8), (40, 8), (8, 8)])
def test_gpu_qwen3_rows_identical(hq, hk):
    lens = [1, 63, 64, 65, 511, 512, 513, 1500, 4099, 8192]
    q, k, v, cu = T.packed(lens, hq, hk, 128, device="cuda", seed=2)
    scale = 128 ** -0.5
    out, lse = launch.prefill(q, k, v, cu, max(lens), scale)
    for page in (16, 64, 256):
        kc, vc, bt = T.paged_cache(k, v, cu, page, seed=page)
        cu_l = cu.tolist()
        rows = sorted({r for b in range(len(lens)) for r in (cu_l[b], cu_l[b + 1] - 1, (cu_l[b] + cu_l[b + 1]) // 2)})
        od, ld = T.decode_rows(q, cu, kc, vc, bt, rows, scale)
        assert_bitwise_equal(od, out[rows], f"decode page={page}")
        assert_bitwise_equal(ld, lse[rows], f"decode lse page={page}")
        for chunk in (1, 37, 512, 2048):
            if chunk == 1 and page != 16:
                continue
            oc, lc = T.chunked_prefill(q, cu, kc, vc, bt, chunk, scale)
            assert_bitwise_equal(oc, out, f"chunk={chunk} page={page}")
            assert_bitwise_equal(lc, lse, f"chunk={chunk} page={page} lse")


@pytest.mark.gpu
def test_gpu_decode_batch_256_invariant():
    lens = [1024] * 256
    q, k, v, cu = T.packed(lens, 8, 2, 128, device="cuda", seed=4)
    kc, vc, bt = T.paged_cache(k, v, cu, 16, seed=4)
    rows = [int(c) - 1 for c in cu[1:].tolist()]
    full, lf = T.decode_rows(q, cu, kc, vc, bt, rows, 128 ** -0.5)
    for sub in ([0], [5, 3], list(range(0, 256, 7))):
        o, l = T.decode_rows(q, cu, kc, vc, bt, [rows[i] for i in sub], 128 ** -0.5)
        assert_bitwise_equal(o, full[sub], f"decode subset {sub[:4]}")
        assert_bitwise_equal(l, lf[sub], f"decode subset lse {sub[:4]}")


@pytest.mark.parametrize("kind,values", [("prefill", {"BLOCK_M": 128}), ("prefill", {"BLOCK_M": 32, "GP": 2}),
                                         ("prefill", {"BLOCK_M": 16, "GP": 2})])
def test_schedule_axes_interpreter(data, kind, values):
    """BLOCK_M and GQA packing are row-neutral in the kernel logic (interpreter; the GPU's MMA
    rows are measured by attention_invariance_sweep.py)."""
    from rlk.kernels.attention import schedule

    q, k, v, cu, scale, out, lse = data
    with schedule.override(kind, **values):
        o, l = launch.prefill(q, k, v, cu, max(LENS), scale, contract=SEG_C)
    assert_bitwise_equal(o, out, f"{kind} {values}")
    assert_bitwise_equal(l, lse, f"{kind} {values} lse")
