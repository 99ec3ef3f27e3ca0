"""Bitwise batch invariance of the row ops: a row's bytes never depend on the row count, the
row's position in the batch (prefix, offset, permutation), padding, or strided views.

CPU (Triton interpreter): the tiling logic is exercised at row counts straddling the 16-row tile
(BLOCK_ROWS of H=64/80/16/32) and the 64-row backward program. The interpreter cannot show GPU
reduction-tree properties; the ``gpu`` tests repeat everything at Qwen3-8B sizes, 1..16384 rows.
"""

import pytest
import torch

from rlk.kernels.rowops import launch as L
from rlk.testing import assert_bitwise_equal

EPS = 1e-6
CPU_SIZES = (1, 2, 3, 7, 16, 17, 33)
GPU_SIZES = (1, 2, 3, 8, 15, 16, 17, 31, 32, 33, 64, 127, 128, 129, 255, 256, 257, 1000, 2048,
             4095, 4097, 8192, 16383)


def _rand(shape, seed, dev, scale=1.0):
    g = torch.Generator(device=dev).manual_seed(seed)
    return (torch.randn(shape, generator=g, device=dev) * scale).to(torch.bfloat16)


def _as_tuple(o):
    return o if isinstance(o, tuple) else (o,)


def check_rows(fn, tensors, sizes, name, perm_seed=0):
    """fn(*rows) vs fn(*all)[rows] for prefixes, an offset suffix and a permutation (dim 0)."""
    full = _as_tuple(fn(*tensors))
    T = tensors[0].shape[0]

    def sub(idx, what):
        part = _as_tuple(fn(*[t[idx] for t in tensors]))
        for i, (a, b) in enumerate(zip(part, full)):
            assert_bitwise_equal(a, b[idx], f"{name} out{i} {what}")

    for k in sizes:
        if k <= T:
            sub(slice(0, k), f"rows[:{k}] of {T}")
    for off in (1, 5):
        if off < T:
            sub(slice(off, T), f"rows[{off}:] of {T}")
    g = torch.Generator().manual_seed(perm_seed)
    sub(torch.randperm(T, generator=g).to(tensors[0].device), "permuted")


def _norm_cases(dev, T, H, D, nh, F, V, sizes):
    x, r, dy = _rand((T, H), 1, dev, 3.0), _rand((T, H), 2, dev), _rand((T, H), 3, dev)
    w = (1 + 0.2 * _rand((H,), 4, dev).float()).bfloat16()
    check_rows(lambda a: L.rms_norm(a, w, EPS), [x], sizes, "rms_norm")
    check_rows(lambda a, b: L.add_rms_norm(a, b, w, EPS), [x, r], sizes, "add_rms_norm")
    check_rows(lambda a, g: L.rms_norm_backward(g, a, w, EPS)[0], [x, dy], sizes, "rms_norm dx")
    check_rows(lambda a, g, d: L.rms_norm_backward(g, a, w, EPS, d)[0], [x, dy, r], sizes, "fused dx")
    # Padded rows: a row stride larger than H (garbage columns) gives the same bytes.
    big = torch.cat([x, _rand((T, 7), 5, dev, 100.0)], dim=1)
    assert_bitwise_equal(L.rms_norm(big[:, :H], w, EPS), L.rms_norm(x, w, EPS), "rms_norm padded stride")

    q = _rand((T, nh, D), 6, dev, 2.0)
    wq = (1 + 0.2 * _rand((D,), 7, dev).float()).bfloat16()
    check_rows(lambda a: L.qk_norm(a, wq, EPS), [q], sizes, "qk_norm")
    qkv = torch.cat([q.reshape(T, -1), _rand((T, 2 * D), 8, dev)], dim=1)
    qv = qkv[:, : nh * D].view(T, nh, D)
    check_rows(lambda a: L.qk_norm(a, wq, EPS), [qv], sizes, "qk_norm strided view")
    assert_bitwise_equal(L.qk_norm(qv, wq, EPS), L.qk_norm(q, wq, EPS), "qk strided vs contiguous")

    cos, sin = L.rope_table(4096, D, 1_000_000.0, dev)
    pos = torch.randint(0, 4096, (T,), generator=torch.Generator().manual_seed(9)).to(dev)
    check_rows(lambda a, p: L.apply_rope(a, p, cos, sin), [q, pos], sizes, "rope")
    check_rows(lambda a, p: L.apply_rope(a, p, cos, sin), [qv, pos], sizes, "rope strided")
    # Fused QK-norm + RoPE over the q and k heads of a strided QKV view: the bytes of the parts.
    nk = max(1, nh // 4)
    qkv3 = _rand((T, (nh + 2 * nk) * D), 14, dev, 2.0)
    qk = qkv3[:, : (nh + nk) * D].view(T, nh + nk, D)
    wk = (1 + 0.2 * _rand((D,), 15, dev).float()).bfloat16()
    fq, fk = L.qk_norm_rope(qk, wq, wk, EPS, nh, pos, cos, sin)
    assert_bitwise_equal(fq, L.apply_rope(L.qk_norm(qk[:, :nh], wq, EPS), pos, cos, sin), "fused q vs parts")
    assert_bitwise_equal(fk, L.apply_rope(L.qk_norm(qk[:, nh:], wk, EPS), pos, cos, sin), "fused k vs parts")
    check_rows(lambda a, p: L.qk_norm_rope(a, wq, wk, EPS, nh, p, cos, sin), [qk, pos], sizes, "qk_norm_rope")
    # The same token at another place in a packed batch, same position: same bytes.
    y = L.apply_rope(q, pos, cos, sin)
    rev = torch.arange(T - 1, -1, -1, device=dev)
    assert_bitwise_equal(L.apply_rope(q[rev], pos[rev], cos, sin), y[rev], "rope reversed batch")

    gu = _rand((T, 2 * F), 10, dev, 3.0)
    dyf = _rand((T, F), 11, dev)
    check_rows(L.swiglu, [gu], sizes, "swiglu")
    check_rows(lambda a, g: L.swiglu_backward(g, a), [gu, dyf], sizes, "swiglu backward")

    emb = _rand((V, H), 12, dev)
    ids = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(13)).to(dev)
    check_rows(lambda i: L.embedding(i, emb), [ids], sizes, "embedding")
    check_rows(lambda i: L.embedding_kernel(i, emb), [ids], sizes, "embedding kernel route")


@pytest.mark.parametrize("H,D,nh", [(64, 16, 4), (80, 32, 2)])
def test_row_invariance_cpu(H, D, nh):
    if torch.cuda.is_available():
        pytest.skip("the CPU-size variant runs under the interpreter; GPU runs test_row_invariance_gpu")
    _norm_cases("cpu", 40, H, D, nh, F=96, V=50, sizes=CPU_SIZES)


def test_rms_norm_dw_run_to_run_and_order_cpu():
    # dw depends on the batch (it is a sum over it) but never on the run: 3 runs, same bytes.
    x, dy, w = _rand((150, 80), 20, "cpu"), _rand((150, 80), 21, "cpu"), _rand((80,), 22, "cpu")
    dws = [L.rms_norm_backward(dy, x, w, EPS)[1] for _ in range(3)]
    for d in dws[1:]:
        assert_bitwise_equal(d, dws[0], "dw run to run (3 partials + fold)")


def test_embedding_backward_order_cpu():
    # dW[v] sums its tokens in ascending token order: a permutation of tokens with *distinct*
    # ids gives the same dW; reordering tokens that share an id is allowed to change it.
    V, H = 30, 64
    ids = torch.tensor([4, 9, 4, 0, 29, 4, 9])
    dy = _rand((7, H), 23, "cpu")
    dw = L.embedding_backward(dy, ids, V)
    assert bool((dw[[1, 2, 3]] == 0).all())
    solo = torch.tensor([3, 4])  # ids 0 and 29 appear once
    perm = torch.tensor([4, 3, 0, 1, 2, 5, 6])
    dwp = L.embedding_backward(dy[perm], ids[perm], V)
    assert_bitwise_equal(dwp[ids[solo]], dw[ids[solo]], "single-token ids under permutation")


@pytest.mark.gpu
def test_row_invariance_gpu():
    # Qwen3-8B: hidden 4096, head_dim 128, 32 q heads, FFN 12288; 16384 rows.
    _norm_cases("cuda", 16384, 4096, 128, 32, F=12288, V=151936, sizes=GPU_SIZES)


@pytest.mark.gpu
def test_kv_heads_and_fused_equal_unfused_gpu():
    T, D, nk, H = 16384, 128, 8, 4096
    k = _rand((T, nk, D), 30, "cuda")
    wk = _rand((D,), 31, "cuda")
    check_rows(lambda a: L.qk_norm(a, wk, EPS), [k], GPU_SIZES, "k_norm 8 heads")
    x, r, w = _rand((T, H), 32, "cuda"), _rand((T, H), 33, "cuda", 8.0), _rand((H,), 34, "cuda")
    y, s = L.add_rms_norm(x, r, w, EPS)
    assert_bitwise_equal(s, x + r, "new residual vs torch add")
    assert_bitwise_equal(y, L.rms_norm(s, w, EPS), "fused vs unfused")
    for _ in range(3):
        y2, s2 = L.add_rms_norm(x, r, w, EPS)
        assert_bitwise_equal(y2, y, "run to run")
        assert_bitwise_equal(s2, s, "run to run")
