"""d_weight accumulated into a caller-given fp32 ``main_grad`` (megatron's gradient-accumulation
fusion) by the fused logp + loss path and by ``linear_logp_bwd``.

CPU (interpreter): from a zero main_grad both paths end with the same fp32 bytes for 1, 2 and 3
row chunks, and those bytes round (RNE) to the bf16 d_weight of the path without main_grad; two
calls accumulate in call order (two micro-batches split at a multiple of the GEMM's BLOCK_K equal
one call over both; any split equals the unfused path's two calls); the autograd op leaves
``weight.grad`` None and needs grad_out == 1; bad main_grads are refused before any launch.
"""

import pytest
import torch

from rlk.errors import ExactnessError, UnsupportedConfigError
from rlk.kernels.linear_logp import fused, launch
from rlk.kernels.linear_logp.linear_logp_test import CPU_SEG, make
from rlk.kernels.linear_logp.autograd import linear_logp_loss
from rlk.testing import assert_bitwise_equal

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

T, H, V, VR, TEMP = 150, 128, 257, 250, 0.7  # as fused_test: padded columns, T not a multiple of 64


def _dl(dlogp, off=0):
    return lambda lp, lo, hi: dlogp[off + lo:off + hi]


@pytest.fixture(scope="module")
def case():
    h, w, tg = make(T, H, V, VR, seed=41)
    dl = torch.randn(T, generator=torch.Generator().manual_seed(42))
    _, lse, _, _ = launch.linear_logp_fwd(h, w, tg, 0, VR, TEMP, segmentation=CPU_SEG)
    dh, dw = launch.linear_logp_bwd(h, w, tg, lse, dl, 0, VR, TEMP)
    mg = torch.zeros(V, H, dtype=torch.float32)
    dh2, none = launch.linear_logp_bwd(h, w, tg, lse, dl, 0, VR, TEMP, main_grad=mg)
    assert none is None
    assert_bitwise_equal(dh2, dh, "d_hidden does not change with main_grad")
    return dict(h=h, w=w, tg=tg, dl=dl, lse=lse, dh=dh, dw=dw, mg_unfused=mg)


def test_unfused_main_grad_rounds_to_the_bf16_d_weight(case):
    # The fp32 chain is the one the bf16 d_weight is rounded from (one RNE rounding).
    assert_bitwise_equal(case["mg_unfused"].to(torch.bfloat16), case["dw"], "bf16(main_grad) vs d_weight")
    assert bool(case["mg_unfused"].abs().sum() > 0)


@pytest.mark.parametrize("rows", [64, 128, 192, None])
def test_fused_main_grad_equals_unfused_fp32(case, rows):
    mg = torch.zeros(V, H, dtype=torch.float32)
    lp, _, dh, dw = fused.linear_logp_fused_loss(case["h"], case["w"], case["tg"], _dl(case["dl"]), 0, VR, TEMP,
                                                 rows, segmentation=CPU_SEG, main_grad=mg)
    assert dw is None
    assert_bitwise_equal(dh, case["dh"], f"d_hidden, rows {rows}")
    assert_bitwise_equal(mg, case["mg_unfused"], f"fp32 main_grad, rows {rows}")
    # Without main_grad the same call rounds that chain once: the bf16 d_weight.
    *_, dw_plain = fused.linear_logp_fused_loss(case["h"], case["w"], case["tg"], _dl(case["dl"]), 0, VR, TEMP,
                                                rows, segmentation=CPU_SEG)
    assert_bitwise_equal(mg.to(torch.bfloat16), dw_plain, f"bf16(main_grad) vs plain d_weight, rows {rows}")


def _two_calls(case, split, fn):
    mg = torch.zeros(V, H, dtype=torch.float32)
    for lo, hi in ((0, split), (split, T)):
        fn(case, lo, hi, mg)
    return mg


def _fused_rows(case, lo, hi, mg):
    fused.linear_logp_fused_loss(case["h"][lo:hi], case["w"], case["tg"][lo:hi], _dl(case["dl"], lo), 0, VR,
                                 TEMP, 64, segmentation=CPU_SEG, main_grad=mg)


def _unfused_rows(case, lo, hi, mg):
    h, tg = case["h"][lo:hi], case["tg"][lo:hi]
    _, lse, _, _ = launch.linear_logp_fwd(h, case["w"], tg, 0, VR, TEMP, segmentation=CPU_SEG)
    launch.linear_logp_bwd(h, case["w"], tg, lse, case["dl"][lo:hi], 0, VR, TEMP, main_grad=mg)


def test_two_micro_batches_accumulate_in_call_order(case):
    """Rows [0, 64) then [64, 150): each element's chain continues over the second call's tokens,
    so (64 = the GEMM's BLOCK_K) the result is the one call over all 150 rows, bitwise."""
    assert_bitwise_equal(_two_calls(case, 64, _fused_rows), case["mg_unfused"], "fused, split at 64")
    assert_bitwise_equal(_two_calls(case, 64, _unfused_rows), case["mg_unfused"], "unfused, split at 64")


def test_any_split_is_the_same_order_on_both_paths(case):
    """Split at 50 (not a BLOCK_K multiple): a defined order (50 rows' chain, then 100 more), the
    same bytes on both paths; it is not the one-pass chain (the check below can fail)."""
    a = _two_calls(case, 50, _fused_rows)
    assert_bitwise_equal(a, _two_calls(case, 50, _unfused_rows), "split at 50, fused vs unfused")
    with pytest.raises(ExactnessError):
        assert_bitwise_equal(a, case["mg_unfused"], "split at 50 vs one pass")


def test_main_grad_start_is_continued_not_overwritten(case):
    """A non-zero main_grad is the chain's start: the result differs from a zero start by the
    gradient, and rerunning the same sequence of calls gives the same bytes (run to run)."""
    start = torch.randn(V, H, generator=torch.Generator().manual_seed(43))
    runs = []
    for _ in range(2):
        mg = start.clone()
        _fused_rows(case, 0, T, mg)
        runs.append(mg)
    assert_bitwise_equal(runs[0], runs[1], "run to run")
    assert torch.allclose(runs[0] - start, case["mg_unfused"], atol=1e-5, rtol=0)
    with pytest.raises(ExactnessError):
        assert_bitwise_equal(runs[0], case["mg_unfused"], "a non-zero start must show")


def test_autograd_main_grad_leaves_weight_grad_none(case):
    h, w, tg, dl = case["h"], case["w"], case["tg"], case["dl"]

    def loss_fn(lp, lo, hi):
        return lp * dl[lo:hi]  # d loss / d logp = dl

    hr, wr = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    mg = torch.zeros(V, H, dtype=torch.float32)
    loss, _ = linear_logp_loss(hr, wr, tg, loss_fn, 0, VR, TEMP, segmentation=CPU_SEG, rows_per_chunk=64,
                               main_grad=mg)
    loss.backward()
    assert wr.grad is None
    assert_bitwise_equal(hr.grad, case["dh"], "d_hidden")
    assert_bitwise_equal(mg, case["mg_unfused"], "main_grad through autograd")

    # grad_out != 1 cannot scale what already went into main_grad: refused.
    loss2, _ = linear_logp_loss(h.clone().requires_grad_(True), w.clone().requires_grad_(True), tg, loss_fn, 0, VR,
                                TEMP, segmentation=CPU_SEG, main_grad=torch.zeros(V, H))
    with pytest.raises(UnsupportedConfigError, match="grad_out == 1"):
        (loss2 * 0.5).backward()


def test_bad_main_grad_is_refused(case):
    h, w, tg, dl, lse = case["h"], case["w"], case["tg"], case["dl"], case["lse"]
    bad = {"fp32": torch.zeros(V, H, dtype=torch.bfloat16), "shape": torch.zeros(V - 1, H),
           "contiguous": torch.zeros(H, V).t(), "torch.Tensor": "main_grad"}
    for match, mg in bad.items():
        with pytest.raises(UnsupportedConfigError, match=match):
            fused.linear_logp_fused_loss(h, w, tg, _dl(dl), 0, VR, TEMP, segmentation=CPU_SEG, main_grad=mg)
        with pytest.raises(UnsupportedConfigError, match=match):
            launch.linear_logp_bwd(h, w, tg, lse, dl, 0, VR, TEMP, main_grad=mg)
        with pytest.raises(UnsupportedConfigError, match=match):
            linear_logp_loss(h, w.clone().requires_grad_(True), tg, lambda lp, lo, hi: -lp, 0, VR, TEMP,
                             segmentation=CPU_SEG, main_grad=mg)
