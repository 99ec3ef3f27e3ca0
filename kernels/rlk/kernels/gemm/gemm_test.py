"""Accuracy, input checks and backward of contract gemm.bf16.v1.

CPU runs use Triton's interpreter with fp32 dot operands: they check the tiling, masking, split
and fold logic, not the GPU's bf16 MMA (the interpreter's dot is numpy's). GPU tests (marked
``gpu``) repeat accuracy at Qwen3-8B shapes on the H200.
"""

from __future__ import annotations

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.kernels.common import cdiv
from rlk.kernels.gemm import contract, gemm
from rlk.kernels.gemm import schedule as gemm_schedule
from rlk.kernels.gemm.reference import reference_fp64, tolerance
from rlk.kernels.gemm.autograd import linear
from rlk.testing.shapes import QWEN3_8B_GEMMS

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# (M, K, N): K not a multiple of 64 (100), split counts 1..4 (K 128..1024), awkward N.
CPU_CASES = [(1, 128, 96), (7, 192, 63), (17, 128, 257), (33, 512, 63), (16, 768, 96), (3, 1024, 257),
             (5, 100, 40), (2, 1000, 33)]


def _rand(*shape, seed=0, device=DEV):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16).to(device)


def assert_close_to_reference(y, x, w, out_dtype=torch.bfloat16):
    """|y - ref| <= atol * sum_k |x w| + rtol * |ref| elementwise (tolerance table in reference.py)."""
    ref = reference_fp64(x, w)
    scale = x.detach().double().cpu().abs() @ w.detach().double().cpu().abs().T
    atol, rtol = tolerance(x.shape[1], out_dtype)
    err = (y.detach().double().cpu() - ref).abs()
    bound = atol * scale + rtol * ref.abs() + 1e-30
    worst = float((err / bound).max())
    assert worst <= 1.0, f"error {worst:.3f}x the bound (K={x.shape[1]}, {out_dtype})"


@pytest.mark.parametrize("schedule", ["decode", "prefill"])
@pytest.mark.parametrize("M,K,N", CPU_CASES, ids=[f"M{m}-K{k}-N{n}" for m, k, n in CPU_CASES])
def test_accuracy_cpu(M, K, N, schedule):
    x, w = _rand(M, K, seed=1), _rand(N, K, seed=2)
    y = gemm(x, w, schedule=schedule)
    assert y.dtype == torch.bfloat16 and y.shape == (M, N)
    assert_close_to_reference(y, x, w)


def test_accuracy_fp32_out_and_split():
    x, w = _rand(9, 1024, seed=3), _rand(70, 1024, seed=4)
    assert contract.split_k(1024, 70) == 4, "this case must exercise the split-K fold"
    for schedule in ("decode", "prefill"):
        y = gemm(x, w, out_dtype=torch.float32, schedule=schedule)
        assert y.dtype == torch.float32
        assert_close_to_reference(y, x, w, torch.float32)


def test_strided_inputs():
    """x and w may be any strided views (w.t() gives x @ w): same bytes as contiguous copies."""
    base_x, base_w = _rand(96, 40, seed=5), _rand(128, 96, seed=6)
    x = base_x.t()[:, ::2][:17]  # [17, 48] with strides (1, 80)
    w = base_w[:, ::2]  # [128, 48] with strides (96, 2)
    y = gemm(x, w)
    assert torch.equal(y.view(torch.int16), gemm(x.contiguous(), w.contiguous()).view(torch.int16))
    assert_close_to_reference(y, x, w)


def test_empty_and_zero_k():
    x, w = _rand(0, 64), _rand(8, 64)
    assert gemm(x, w).shape == (0, 8)
    assert gemm(_rand(3, 64), _rand(0, 64)).shape == (3, 0)
    y = gemm(torch.empty(3, 0, dtype=torch.bfloat16, device=DEV), torch.empty(5, 0, dtype=torch.bfloat16, device=DEV))
    assert y.shape == (3, 5) and not bool(y.float().abs().sum())


@pytest.mark.parametrize("bad,match", [
    (lambda: gemm(_rand(2, 64).float(), _rand(4, 64)), "dtype"),
    (lambda: gemm(_rand(2, 64), _rand(4, 64).half()), "dtype"),
    (lambda: gemm(_rand(2, 64), _rand(4, 32)), "disagree on K"),
    (lambda: gemm(_rand(2, 3, 64), _rand(4, 64)), "2-D"),
    (lambda: gemm(_rand(2, 64), "w"), "torch.Tensor"),
    (lambda: gemm(_rand(2, 64), _rand(4, 64), out_dtype=torch.float16), "out_dtype"),
    (lambda: gemm(_rand(2, 64), _rand(4, 64), schedule="fast"), "schedule"),
    (lambda: gemm(_rand(2, 64), _rand(4, 64), schedule="decode", config={"SPLIT_K": 2}), "schedule fields"),
    (lambda: gemm(_rand(2, 64), _rand(4, 64), schedule="decode", config={"BLOCK_K": 96}), "BLOCK_K"),
])
def test_bad_input_raises(bad, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        bad()


def test_split_rule_depends_on_k_and_n_only():
    # Checked-in entries must divide the chunk count; the rule gives these for the Qwen3-8B shapes.
    for (k, n) in QWEN3_8B_GEMMS.values():
        s = contract.split_k(k, n)
        assert cdiv(k, 64) % s == 0 and 1 <= s <= contract.MAX_SPLIT
        assert s == contract.split_rule(k, n), f"table entry {k}x{n} differs from the rule"
    assert contract.split_rule(64, 8) == 1 and contract.split_rule(1024, 70) == 4
    # No table key names the row count; M buckets may pick only the schedule and its free fields.
    def keys(node):
        if isinstance(node, dict):
            for k, v in node.items():
                yield k
                yield from keys(v)

    table = gemm_schedule.load_table("sm_90")
    assert not {"M", "m", "rows", "batch", "tokens"} & set(keys(table["shapes"]))
    for bks in [e.get("buckets", []) for e in table["shapes"].values()] + [table.get("default_buckets", [])]:
        for max_m, sched, fields in bks:
            assert sched in contract.SCHEDULES
            if isinstance(fields, dict):
                assert set(fields) <= set(gemm_schedule.SCHEDULE_KEYS[sched]) and "split_k" not in fields
            else:
                assert fields in (None, *gemm_schedule.DECODE_BLOCK_M, 128)


def _backward(x, w, dy):
    x = x.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    y = linear(x, w)
    y.backward(dy)
    return y, x.grad, w.grad


@pytest.mark.parametrize("M,K,N", [(7, 128, 96), (70, 192, 63)])
def test_backward_accuracy_and_run_to_run(M, K, N):
    x, w, dy = _rand(M, K, seed=7), _rand(N, K, seed=8), _rand(M, N, seed=9)
    y, dx, dw = _backward(x, w, dy)
    assert dx.dtype == dw.dtype == torch.bfloat16
    assert_close_to_reference(dx, dy, w.t())
    assert_close_to_reference(dw, dy.t(), x.t())
    y2, dx2, dw2 = _backward(x, w, dy)
    for a, b in ((y, y2), (dx, dx2), (dw, dw2)):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_linear_leading_dims():
    from rlk.kernels.gemm.autograd import linear

    w = _rand(96, 128, seed=11)
    x = _rand(2, 3, 128, seed=10)
    y = linear(x, w)
    assert y.shape == (2, 3, 96)
    assert torch.equal(y.reshape(6, 96).view(torch.int16), gemm(x.reshape(6, 128), w).view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(QWEN3_8B_GEMMS))
def test_accuracy_gpu_qwen3(name):
    K, N = QWEN3_8B_GEMMS[name]
    x, w = _rand(33, K, seed=11), _rand(N, K, seed=12)
    for schedule in ("decode", "prefill"):
        assert_close_to_reference(gemm(x, w, schedule=schedule), x, w)


@pytest.mark.gpu
def test_backward_gpu_run_to_run():
    K, N = QWEN3_8B_GEMMS["tp4_lm_head"]  # dx reduces over N = 37984 (not a multiple of 64)
    x, w, dy = _rand(1000, K, seed=13), _rand(N, K, seed=14), _rand(1000, N, seed=15)
    y, dx, dw = _backward(x, w, dy)
    _, dx2, dw2 = _backward(x, w, dy)
    assert torch.equal(dx.view(torch.int16), dx2.view(torch.int16))
    assert torch.equal(dw.view(torch.int16), dw2.view(torch.int16))
    assert_close_to_reference(dx[:64], dy[:64], w.t())
    assert_close_to_reference(dw[:64], dy.t()[:64], x.t())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qkv", "down", "tp4_lm_head"])
def test_backward_gpu_transposed_tma_equals_pointer_path(name):
    """The backward's transposed operands (dy @ w: w.t(); dy.T @ x: dy.t(), x.t()) read through
    descriptors of the row-major tensors give the bytes of the pointer path and of contiguous
    copies, at a ragged token count (1700: not a multiple of 64, the dw reduction length)."""
    from rlk.kernels.gemm import launch

    K, N = QWEN3_8B_GEMMS[name]
    x, w, dy = _rand(1700, K, seed=16), _rand(N, K, seed=17), _rand(1700, N, seed=18)
    for a, b in ((dy, w.t()), (dy.t(), x.t())):
        y = gemm(a, b)
        assert launch.tma_layout(b) == "t" and launch.plan(a.shape[0], a.shape[1], b.shape[0], a.device)["TMA"]
        assert torch.equal(y.view(torch.int16), gemm(a.contiguous(), b.contiguous()).view(torch.int16))
        assert torch.equal(y.view(torch.int16), launch.gemm(a, b, config=dict(TMA=0)).view(torch.int16))
