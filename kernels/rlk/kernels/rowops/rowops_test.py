"""Accuracy (vs fp64), contract rounding points, backward, run-to-run and error tests of the row ops.

Tolerances (|got - fp64| <= RTOL * |fp64| + ATOL, bf16 outputs):
  one bf16 rounding: RTOL 2**-8; two roundings (RMSNorm, HF order): RTOL 2**-7; backward
  (fp32 math, bf16 operands and rounding points treated as identity): RTOL 2**-6 of the max.
Under the CPU interpreter the arithmetic is numpy fp32; these tests do not claim GPU bf16
properties (the ``gpu`` tests run the same checks at Qwen3-8B sizes on the H200).
"""

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.kernels.rowops import launch as L
from rlk.kernels.rowops import reference as R
from rlk.testing import assert_bitwise_equal

EPS = 1e-6
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _close(got, ref, rtol, atol=1e-6, what=""):
    err = (got.double().cpu() - ref.double().cpu()).abs()
    lim = rtol * ref.double().cpu().abs() + atol
    bad = err > lim
    assert not bool(bad.any()), f"{what}: {int(bad.sum())} elements outside tolerance, max err {err.max():.3g}"


def _data(shape, seed=0, scale=1.0, dtype=torch.bfloat16, device=DEV):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype).to(device)


@pytest.mark.parametrize("H", [64, 80])
@pytest.mark.parametrize("T", [1, 7, 33])
def test_rms_norm_accuracy(H, T):
    x, w = _data((T, H), 1, 3.0), (1 + 0.2 * _data((H,), 2)).to(torch.bfloat16)
    y = L.rms_norm(x, w, EPS)
    assert y.dtype == torch.bfloat16 and y.shape == (T, H)
    _close(y, R.rms_norm(x, w, EPS, math=torch.float64), 2**-7, what="rms_norm vs fp64")
    # Same rounding points as the fp32 spec: at most one bf16 ulp apart (sum trees differ).
    ref32 = R.rms_norm(x.cpu(), w.cpu(), EPS)
    _close(y, ref32, 2**-7, what="rms_norm vs fp32 spec")
    _mostly_bitwise(y, ref32, "rms_norm rounding points vs fp32 spec")


def _mostly_bitwise(y, ref, what, min_frac=0.99):
    # Same rounding points as the spec: only a differing sum tree (rstd off by an fp32 ulp) may
    # flip a rare bf16 rounding; another rounding order flips many more.
    frac = float((y.cpu() == ref.cpu()).float().mean())
    assert frac >= min_frac, f"{what}: only {frac:.4f} of elements bitwise equal"


def test_rms_norm_fp32_input():
    x, w = _data((5, 64), 3, dtype=torch.float32), _data((64,), 4, dtype=torch.float32)
    _close(L.rms_norm(x, w, EPS), R.rms_norm(x, w, EPS, math=torch.float64), 1e-6, what="fp32")


def test_add_rms_norm_matches_unfused_and_torch_add():
    x, r, w = _data((17, 80), 5), _data((17, 80), 6, 4.0), _data((80,), 7)
    y, s = L.add_rms_norm(x, r, w, EPS)
    assert_bitwise_equal(s, x + r, "new_residual vs torch bf16 add (RNE)")
    assert_bitwise_equal(y, L.rms_norm(s, w, EPS), "fused vs unfused normed")


def test_qk_norm_equals_rms_norm_rows_and_strided_view():
    T, nq, nk, D = 7, 4, 2, 16
    qkv = _data((T, (nq + 2 * nk) * D), 8)
    w = _data((D,), 9)
    q = qkv[:, : nq * D].view(T, nq, D)  # strided token dim, no copy
    k = qkv[:, nq * D:(nq + nk) * D].view(T, nk, D)
    yq = L.qk_norm(q, w, EPS)
    assert_bitwise_equal(yq, L.qk_norm(q.contiguous(), w, EPS), "strided view vs copy")
    assert_bitwise_equal(yq.reshape(-1, D), L.rms_norm(q.reshape(-1, D), w, EPS), "qk_norm vs rms_norm")
    _close(L.qk_norm(k, w, EPS), R.rms_norm(k, w, EPS, math=torch.float64), 2**-7, what="qk_norm")


def test_nan_propagates_to_its_row_only():
    x, w = _data((7, 64), 10), _data((64,), 11)
    x[3, 5] = float("nan")
    y = L.rms_norm(x, w, EPS)
    assert bool(torch.isnan(y[3]).all())
    assert not bool(torch.isnan(y[[0, 1, 2, 4, 5, 6]]).any())
    x2 = x.clone()
    x2[3] = 0
    assert_bitwise_equal(y[:3], L.rms_norm(x2, w, EPS)[:3], "other rows unaffected")


@pytest.mark.parametrize("H,T", [(64, 33), (80, 70)])
def test_rms_norm_backward(H, T):
    # T=70 at H=80 spans two dw partials (64 rows per program): the fold is exercised.
    x, w, dy = _data((T, H), 12, 2.0), (1 + 0.2 * _data((H,), 13)).to(torch.bfloat16), _data((T, H), 14)
    dx, dw = L.rms_norm_backward(dy, x, w, EPS)
    rdx, rdw = R.rms_norm_backward(dy.cpu(), x.cpu(), w.cpu(), EPS)
    _close(dx, rdx, 0, 2**-6 * float(rdx.abs().max()), "dx vs fp64")
    _close(dw, rdw, 0, 2**-6 * float(rdw.abs().max()), "dw vs fp64")
    dx2, dw2 = L.rms_norm_backward(dy, x, w, EPS)
    assert_bitwise_equal(dx2, dx, "dx run to run")
    assert_bitwise_equal(dw2, dw, "dw run to run")


def test_fused_backward_equals_unfused_autograd():
    from rlk.kernels.rowops import autograd as O

    T, H = 9, 64
    x0, r0, w0 = _data((T, H), 15), _data((T, H), 16), _data((H,), 17)
    dy, ds = _data((T, H), 18), _data((T, H), 19)
    x, r, w = (t.clone().requires_grad_(True) for t in (x0, r0, w0))
    y, s = O.add_rms_norm(x, r, w, EPS)
    torch.autograd.backward([y, s], [dy, ds])
    xu, ru, wu = (t.clone().requires_grad_(True) for t in (x0, r0, w0))
    su = xu + ru
    yu = O.rms_norm(su, wu, EPS)
    torch.autograd.backward([yu, su], [dy, ds])
    assert_bitwise_equal(x.grad, xu.grad, "dx fused vs unfused")
    assert_bitwise_equal(r.grad, ru.grad, "dresidual fused vs unfused")
    assert_bitwise_equal(w.grad, wu.grad, "dw fused vs unfused")


def test_rope_table_recipe():
    cos, sin = L.rope_table(64, 16, 1_000_000.0)
    assert cos.dtype == torch.float32 and cos.shape == (64, 8)
    import math

    for p, i in [(0, 0), (5, 3), (63, 7), (17, 1)]:
        ang = p * (1.0 / (1_000_000.0 ** ((2 * i) / 16)))
        assert float(cos[p, i]) == float(torch.tensor(math.cos(ang), dtype=torch.float32))
        assert float(sin[p, i]) == float(torch.tensor(math.sin(ang), dtype=torch.float32))
    c2, s2 = R.rope_table(64, 16, 1_000_000.0)
    assert_bitwise_equal(cos, c2, "table vs reference recipe")


@pytest.mark.parametrize("D", [16, 32])
def test_rope_matches_fp32_spec_bitwise(D):
    # Pure fp32 mul/sub with no FMA on both sides: the kernel equals the torch fp32 spec exactly.
    T, nh = 7, 3
    x = _data((T, nh, D), 20, 2.0)
    cos, sin = L.rope_table(4096, D, 1_000_000.0, DEV)
    pos = torch.tensor([0, 4095, 17, 17, 3, 1000, 2], device=DEV)
    y = L.apply_rope(x, pos, cos, sin)
    if DEV == "cpu":
        assert_bitwise_equal(y, R.apply_rope(x, pos, cos, sin), "rope vs fp32 spec")
    _close(y, R.apply_rope(x, pos, cos, sin, math=torch.float64), 2**-8, 1e-5, "rope vs fp64")
    back = L.apply_rope(y, pos, cos, sin, backward=True)
    _close(back, x, 2**-6, 1e-2, "inverse rotation")
    assert_bitwise_equal(L.apply_rope(x, pos, cos, sin), y, "run to run")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("D,nq,nk", [(16, 4, 2), (64, 2, 1), (128, 3, 1)])
def test_qk_norm_rope_equals_norm_then_rope(D, nq, nk, dtype):
    T = 9
    qkv = _data((T, (nq + 2 * nk) * D), 40, 2.0, dtype=dtype)
    qk = qkv[:, : (nq + nk) * D].view(T, nq + nk, D)
    wq = (1 + 0.2 * _data((D,), 41, dtype=torch.float32)).to(dtype)
    wk = (1 + 0.2 * _data((D,), 42, dtype=torch.float32)).to(dtype)
    cos, sin = L.rope_table(64, D, 1_000_000.0, DEV)
    pos = torch.tensor([0, 1, 5, 63, 7, 7, 30, 2, 11], device=DEV)
    q, k = L.qk_norm_rope(qk, wq, wk, EPS, nq, pos, cos, sin)
    assert q.shape == (T, nq, D) and k.shape == (T, nk, D) and q.is_contiguous() and k.is_contiguous()
    assert_bitwise_equal(q, L.apply_rope(L.qk_norm(qk[:, :nq], wq, EPS), pos, cos, sin), "q: fused vs parts")
    assert_bitwise_equal(k, L.apply_rope(L.qk_norm(qk[:, nq:], wk, EPS), pos, cos, sin), "k: fused vs parts")
    assert_bitwise_equal(L.qk_norm_rope(qk, wq, wk, EPS, nq, pos, cos, sin)[0], q, "run to run")
    # A swapped weight or head split changes the bytes: the comparison above can fail.
    q2, _ = L.qk_norm_rope(qk, wk, wq, EPS, nq, pos, cos, sin)
    assert not torch.equal(q2, q)


def test_qk_norm_rope_tile_keeps_the_norm_lanes_and_has_evidence():
    from rlk.kernels.rowops import schedule

    t = schedule.table("sm_90").get("qk_norm_rope") or {}
    assert t.get("tiles"), "the sm_90 table has no qk_norm_rope tile"
    assert "byte-identical" in t.get("evidence", ""), "a qk_norm_rope tile needs its GPU evidence"
    for h in (16, 64, 128, 256):
        norm, fused = schedule.norm_config(h), schedule.qk_norm_rope_config(h)
        tile = t["tiles"].get(str(h))
        assert fused["BLOCK_H"] == norm["BLOCK_H"], h
        want = (tile["BLOCK_ROWS"], tile["num_warps"]) if tile else (norm["BLOCK_ROWS"], norm["num_warps"])
        assert (fused["BLOCK_ROWS"], fused["num_warps"]) == want, h
    # gfx942 is not measured: it keeps the norm tile.
    assert schedule.qk_norm_rope_config(128, "gfx942") == schedule.norm_config(128, "gfx942")


def test_qk_norm_rope_bad_input():
    x, w = torch.ones(2, 3, 8, device=DEV), torch.ones(8, device=DEV)
    cos, sin = L.rope_table(16, 8, 1e6, DEV)
    pos = torch.zeros(2, dtype=torch.long, device=DEV)
    for call, match in [
        (lambda: L.qk_norm_rope(x, w, w, EPS, 3, pos, cos, sin), "n_q_heads"),
        (lambda: L.qk_norm_rope(x, w, w, EPS, 0, pos, cos, sin), "n_q_heads"),
        (lambda: L.qk_norm_rope(x, w[:4], w, EPS, 2, pos, cos, sin), "weight"),
        (lambda: L.qk_norm_rope(x, w, w, EPS, 2, pos[:1], cos, sin), "positions"),
        (lambda: L.qk_norm_rope(x, w, w, EPS, 2, pos + 16, cos, sin), "positions span"),
        (lambda: L.qk_norm_rope(torch.ones(2, 3, 7, device=DEV), w[:7], w[:7], EPS, 2, pos, cos, sin), "even"),
    ]:
        # Host value checks: on a GPU the default "device" mode asserts on the device, which ends
        # the CUDA context for every later test instead of raising here.
        prev = L.set_value_checks("host")
        try:
            with pytest.raises(UnsupportedConfigError, match=match):
                call()
        finally:
            L.set_value_checks(prev)


def test_rope_backward_autograd():
    from rlk.kernels.rowops import autograd as O

    T, nh, D = 5, 2, 16
    x = _data((T, nh, D), 21).requires_grad_(True)
    cos, sin = L.rope_table(32, D, 10000.0, DEV)
    pos = torch.tensor([3, 1, 31, 0, 3], device=DEV)
    dy = _data((T, nh, D), 22)
    O.apply_rope(x, pos, cos, sin).backward(dy)
    ref = R.apply_rope(dy, pos, cos, sin, math=torch.float64, inverse=True)
    _close(x.grad, ref, 2**-8, 1e-5, "rope backward")


def test_rope_backward_reads_no_device_value(monkeypatch):
    """Positions are range-checked once, in the forward (a read-back or a device assert, by mode);
    the backward reuses the same saved positions without a second check (on GPU the autograd
    engine runs it on its own thread, outside any host_validated() of the caller)."""
    from rlk.kernels.rowops import autograd as O

    checks = []
    real_span, real_assert = L._span, L._assert_in_range_on_device
    monkeypatch.setattr(L, "_span", lambda t: checks.append("read") or real_span(t))
    monkeypatch.setattr(L, "_assert_in_range_on_device", lambda t, n: checks.append("assert") or real_assert(t, n))
    T, nh, D = 5, 2, 16
    x = _data((T, nh, D), 21).requires_grad_(True)
    cos, sin = L.rope_table(32, D, 10000.0, DEV)
    pos = torch.tensor([3, 1, 31, 0, 3], device=DEV)
    y = O.apply_rope(x, pos, cos, sin)
    assert len(checks) == 1, f"the forward's range check did not run once: {checks}"
    y.backward(_data((T, nh, D), 22))
    assert len(checks) == 1, "the backward checked the positions again"


def test_swiglu_forward_backward():
    T, F = 7, 96
    gu = _data((T, 2 * F), 23, 3.0)
    y = L.swiglu(gu)
    _close(y, R.swiglu(gu, math=torch.float64), 2**-8, 1e-5, "swiglu vs fp64")
    dy = _data((T, F), 24)
    dgu = L.swiglu_backward(dy, gu)
    ref = R.swiglu_backward(dy.cpu(), gu.cpu())
    _close(dgu, ref, 2**-8, 1e-4, "swiglu backward vs fp64")
    assert_bitwise_equal(L.swiglu(gu), y, "run to run")
    assert_bitwise_equal(L.swiglu_backward(dy, gu), dgu, "run to run")


def test_embedding_forward_backward():
    V, H = 50, 80
    w = _data((V, H), 25)
    ids = torch.tensor([3, 1, 3, 49, 0, 3, 1], device=DEV)
    assert_bitwise_equal(L.embedding(ids, w), w[ids], "exact copy")
    dy = _data((7, H), 26)
    dw = L.embedding_backward(dy, ids, V)
    assert_bitwise_equal(dw.cpu(), R.embedding_backward(dy.cpu(), ids.cpu(), V), "dW fixed order")
    assert_bitwise_equal(L.embedding_backward(dy, ids, V), dw, "run to run")
    assert L.embedding(ids[:0], w).shape == (0, H)


def test_embedding_routes_same_bytes_and_bad_ids(monkeypatch):
    """The copy route (ids known in range: torch.index_select) and the kernel route (value checks
    off: embedding_fwd_kernel) give the same bytes; the kernel route writes NaN rows for bad ids
    (never a crash, never a silent fix); the checked route raises before anything runs."""
    from rlk.kernels.common import host_validated

    V, H = 40, 72
    w = _data((V, H), 27)
    ids = torch.tensor([5, 0, 39, 5, 17, 2, 39, 11, 30], device=DEV)
    launched = []
    real = L.K.embedding_fwd_kernel
    monkeypatch.setattr(L.K, "embedding_fwd_kernel", _Spy(real, launched))
    checked = L.embedding(ids, w)
    with host_validated():
        vouched = L.embedding(ids.to(torch.int32), w)
    assert launched == [], "ids known in range: the copy route launches no Triton kernel"
    prev = L.set_value_checks(False)
    try:
        kernel = L.embedding(ids, w)
        assert len(launched) == 1, "value checks off: the kernel route"
        bad = torch.tensor([3, -1, V, 7], device=DEV)
        poisoned = L.embedding(bad, w)
    finally:
        L.set_value_checks(prev)
    for got, what in ((checked, "checked copy"), (vouched, "host_validated copy"), (kernel, "kernel"),
                      (L.embedding_kernel(ids, w), "embedding_kernel, checks on")):
        assert_bitwise_equal(got, w[ids], what)
    assert_bitwise_equal(poisoned[[0, 3]], w[[3, 7]], "good rows of a batch with bad ids")
    assert bool(torch.isnan(poisoned[[1, 2]].float()).all()), "bad ids give NaN rows on the kernel route"
    prev = L.set_value_checks("host")  # on a GPU "device" mode would end the context instead
    try:
        with pytest.raises(UnsupportedConfigError, match="out of range"):
            L.embedding(bad, w)
    finally:
        L.set_value_checks(prev)
    # The host_validated short path accepts nothing the full checks reject.
    with host_validated():
        for call, match in ((lambda: L.embedding(torch.arange(8, device=DEV)[::2], w), "contiguous"),
                            (lambda: L.embedding(ids.float(), w), "ids"),
                            (lambda: L.embedding(ids, w.t()), "contiguous"),
                            (lambda: L.embedding(ids[None], w), "dims"),
                            (lambda: L.embedding(ids, w.to(torch.int32)), "weight"),
                            *([(lambda: L.embedding(ids.cpu(), w), "different devices")] if DEV == "cuda" else [])):
            with pytest.raises(UnsupportedConfigError, match=match):
                call()


class _Spy:
    """Wraps a Triton kernel: records each ``kernel[grid](...)`` launch, then launches it."""

    def __init__(self, kernel, log):
        self.kernel, self.log = kernel, log

    def __getitem__(self, grid):
        self.log.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: L.rms_norm(torch.ones(3, 8, dtype=torch.int32), torch.ones(8), EPS), "dtype"),
        (lambda: L.rms_norm(torch.ones(3, 8), torch.ones(9), EPS), "weight"),
        (lambda: L.rms_norm(torch.ones(3, 8), torch.ones(8), float("nan")), "eps"),
        (lambda: L.rms_norm(torch.ones(3, 20000), torch.ones(20000), EPS), "hidden size"),
        (lambda: L.rms_norm(torch.ones(8, 3).t(), torch.ones(8), EPS), "contiguous"),
        (lambda: L.add_rms_norm(torch.ones(3, 8), torch.ones(2, 8), torch.ones(8), EPS), "residual"),
        (lambda: L.qk_norm(torch.ones(3, 8), torch.ones(8), EPS), "nh"),
        (lambda: L.apply_rope(torch.ones(2, 1, 7), torch.zeros(2, dtype=torch.long),
                              torch.ones(4, 3), torch.ones(4, 3)), "even"),
        (lambda: L.apply_rope(torch.ones(2, 1, 8), torch.tensor([0, 4]),
                              torch.ones(4, 4), torch.ones(4, 4)), "positions span"),
        (lambda: L.apply_rope(torch.ones(2, 1, 8), torch.zeros(2), torch.ones(4, 4), torch.ones(4, 4)), "positions"),
        (lambda: L.swiglu(torch.ones(2, 7)), "even"),
        (lambda: L.embedding(torch.tensor([-1]), torch.ones(4, 8)), "out of range"),
        (lambda: L.embedding(torch.tensor([0.0]), torch.ones(4, 8)), "ids"),
        (lambda: L.rope_table(16, 7, 1e6), "head_dim"),
    ],
)
def test_bad_input_raises_before_launch(call, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        call()


# ------------------------------------------------------------------ GPU: Qwen3-8B sizes
@pytest.mark.gpu
def test_gpu_accuracy_qwen3_8b():
    T, H, D, nq, F = 4097, 4096, 128, 32, 12288
    x, r, w = _data((T, H), 30, 2.0), _data((T, H), 31), (1 + 0.2 * _data((H,), 32)).bfloat16()
    y, s = L.add_rms_norm(x, r, w, EPS)
    assert_bitwise_equal(s, x + r, "new_residual vs torch add")
    assert_bitwise_equal(y, L.rms_norm(s, w, EPS), "fused vs unfused")
    _close(y, R.rms_norm(s, w, EPS, math=torch.float64), 2**-7, what="rms_norm")
    _mostly_bitwise(y, R.rms_norm(s, w, EPS), "rms_norm rounding points vs fp32 spec")
    q = _data((T, nq, D), 33)
    _close(L.qk_norm(q, w[:D], EPS), R.rms_norm(q, w[:D], EPS, math=torch.float64), 2**-7, what="qk")
    cos, sin = L.rope_table(40960, D, 1_000_000.0, "cuda")
    pos = torch.randint(0, 40960, (T,), device="cuda")
    yq = L.apply_rope(q, pos, cos, sin)
    assert_bitwise_equal(yq, R.apply_rope(q, pos, cos, sin), "rope vs torch fp32 spec (no FMA)")
    gu = _data((T, 2 * F), 34, 3.0)
    _close(L.swiglu(gu), R.swiglu(gu, math=torch.float64), 2**-8 + 2**-20, 1e-5, "swiglu")
    dy = _data((T, H), 35)
    dx, dw = L.rms_norm_backward(dy, s, w, EPS)
    rdx, rdw = R.rms_norm_backward(dy, s, w, EPS)
    _close(dx, rdx, 0, 2**-6 * float(rdx.abs().max()), "dx")
    _close(dw, rdw, 0, 2**-6 * float(rdw.abs().max()), "dw")
    for _ in range(3):
        dx2, dw2 = L.rms_norm_backward(dy, s, w, EPS)
        assert_bitwise_equal(dx2, dx, "dx run to run")
        assert_bitwise_equal(dw2, dw, "dw run to run")
    ids = torch.randint(0, 151936, (T,), device="cuda")
    emb = torch.randn((151936, H), device="cuda", dtype=torch.bfloat16)
    assert_bitwise_equal(L.embedding(ids, emb), emb[ids], "embedding")
    dwe = L.embedding_backward(dy, ids, 151936)
    assert_bitwise_equal(L.embedding_backward(dy, ids, 151936), dwe, "dW run to run")


@pytest.mark.gpu
def test_gpu_qk_norm_rope_tile_equals_the_norm_tile(monkeypatch):
    """The table's qk_norm_rope tile gives the bytes of the norm tile (the contract's tree) on
    inputs whose sums of squares round (magnitudes 1e-3..1e2 in one row); the (1, 1) tile, whose
    lowering differs, must differ on the same inputs, or the inputs would prove nothing."""
    from rlk.kernels.rowops import schedule

    D, nq, nk = 128, 32, 8
    cos, sin = L.rope_table(4096, D, 1_000_000.0, "cuda")
    wq, wk = (1 + 0.2 * _data((D,), 41)).bfloat16(), (1 + 0.2 * _data((D,), 42)).bfloat16()
    orig = schedule.qk_norm_rope_config

    def run(T, tile=None):
        if tile is None:
            monkeypatch.setattr(schedule, "qk_norm_rope_config", orig)
        else:
            monkeypatch.setattr(schedule, "qk_norm_rope_config",
                                lambda h, arch="sm_90": dict(schedule.norm_config(h, arch), **tile))
        g = torch.Generator().manual_seed(T)
        mag = 10.0 ** (torch.rand((T, nq + nk, D), generator=g) * 5 - 3)
        qk = (torch.randn((T, nq + nk, D), generator=g) * mag).bfloat16().cuda()
        pos = torch.randint(0, 4096, (T,), generator=g).cuda()
        return L.qk_norm_rope(qk, wq, wk, EPS, nq, pos, cos, sin)

    norm = schedule.norm_config(D)
    pinned = {"BLOCK_ROWS": norm["BLOCK_ROWS"], "num_warps": norm["num_warps"]}
    assert schedule.qk_norm_rope_config(D) != schedule.norm_config(D), "no qk_norm_rope tile at D=128"
    differs = 0
    for T in (1, 16, 257, 2048):
        ref = run(T, pinned)
        got = run(T)
        for a, b, n in zip(got, ref, ("q", "k")):
            assert_bitwise_equal(a, b, f"qk_norm_rope {n} at T={T}: table tile vs norm tile")
        differs += sum(int((a.view(torch.int16) != b.view(torch.int16)).sum())
                       for a, b in zip(run(T, {"BLOCK_ROWS": 1, "num_warps": 1}), ref))
    assert differs > 0, "the (1, 1) tile matched too: these inputs cannot tell reduction trees apart"


@pytest.mark.gpu
def test_gpu_embedding_routes_and_graph_capture(monkeypatch):
    """On the GPU: the copy route and the kernel route give the bytes of ``w[ids]``. A CUDA graph
    captured inside host_validated() or with "device" value checks (the default: nothing is read
    back, so capture works) holds the index_select copy; one captured with checks "off" holds the
    kernel, which writes NaN rows for ids that turn bad later. RoPE with "device" checks is
    captured too (its range assert is a device op)."""
    import contextlib

    from rlk.kernels.common import host_validated

    V, H, T = 151936, 4096, 257
    w = torch.randn((V, H), device="cuda").to(torch.bfloat16)
    ids = torch.randint(0, V, (T,), device="cuda")
    import os

    if "RLK_VALUE_CHECKS" not in os.environ:
        assert L.value_checks() == "device", "the default mode"
    start = L.value_checks()
    assert_bitwise_equal(L.embedding(ids, w), w[ids], "checked copy")
    assert_bitwise_equal(L.embedding_kernel(ids, w), w[ids], "kernel")
    for route in ("vouched", "device", "off"):
        ctx = host_validated if route == "vouched" else contextlib.nullcontext
        L.set_value_checks("off" if route == "off" else "device")
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), ctx():
                L.embedding_kernel(ids, w)  # compiled before capture
                L.embedding(ids, w)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            launched = []
            with monkeypatch.context() as mp:
                mp.setattr(L.K, "embedding_fwd_kernel", _Spy(L.K.embedding_fwd_kernel, launched))
                with ctx(), torch.cuda.graph(g):
                    y = L.embedding(ids, w)
        finally:
            L.set_value_checks(start)
        assert len(launched) == (1 if route == "off" else 0), f"route captured: {route}"
        new = torch.randint(0, V, (T,), device="cuda")
        ids.copy_(new)
        g.replay()
        assert_bitwise_equal(y, w[new], f"graph replay, {route}")
        if route == "off":
            ids[3] = V + 5
            g.replay()
            assert bool(torch.isnan(y[3].float()).all()), "kernel route in the graph: NaN row for a bad id"
            assert_bitwise_equal(y[4:], w[new[4:]], "other rows")
    q = _data((T, 8, 128), 34, device="cuda")
    cos, sin = L.rope_table(4096, 128, 1_000_000.0, "cuda")
    pos = torch.randint(0, 4096, (T,), device="cuda")
    want = L.apply_rope(q, pos, cos, sin)
    g = torch.cuda.CUDAGraph()
    L.set_value_checks("device")
    try:
        with torch.cuda.graph(g):
            yq = L.apply_rope(q, pos, cos, sin)
    finally:
        L.set_value_checks(start)
    g.replay()
    assert_bitwise_equal(yq, want, "rope captured with device checks")


def test_torch_library_ops_are_registered():
    from rlk.kernels.rowops import autograd  # noqa: F401  (defines the torch.library ops)

    for name in ("rms_norm", "add_rms_norm", "rms_norm_backward", "apply_rope", "swiglu", "embedding"):
        assert hasattr(torch.ops.rlk, name)
