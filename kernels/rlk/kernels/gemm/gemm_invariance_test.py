"""Bitwise invariance of contract gemm.bf16.v1: row i of y = x @ w.T has the same bytes whatever
M, the row's position, padding rows, the schedule (decode split-K + ordered fold vs prefill
tiles with in-register fold), the launch geometry and the run.

Under the CPU interpreter this shows the tiling/split/fold logic is batch invariant (the dot is
numpy's fp32 matmul, so it says nothing about the GPU's bf16 MMA). fp32 outputs are compared too:
they expose accumulation-order differences that a bf16 rounding would hide. The ``gpu`` tests
repeat this on the H200 at the Qwen3-8B shapes, plus CUDA graph replay vs eager.
"""

from __future__ import annotations

import pytest
import torch

from rlk.kernels.gemm import config, gemm
from rlk.testing import assert_bitwise_equal
from rlk.testing.shapes import GPU_ROWS, QWEN3_8B_GEMMS

DEV = "cuda" if torch.cuda.is_available() else "cpu"
CPU_M = (1, 2, 7, 16, 17, 33)
# (K, N, split): splits 1, 2, 3, 4; K=1000 ends in a zero-padded chunk.
CPU_KN = [(128, 96), (192, 257), (512, 63), (768, 96), (1000, 40)]


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16).to(DEV)


@pytest.mark.parametrize("K,N,out_dtype", [(k, n, torch.float32) for k, n in CPU_KN] + [(512, 63, torch.bfloat16)],
                         ids=[f"K{k}-N{n}-fp32" for k, n in CPU_KN] + ["K512-N63-bf16"])
def test_rows_invariant_across_m_and_schedules(K, N, out_dtype):
    x, w = _rand(max(CPU_M), K, seed=K), _rand(N, K, seed=N)
    full = gemm(x, w, out_dtype=out_dtype, schedule="prefill")
    for m in CPU_M:
        for schedule in ("decode", "prefill"):
            y = gemm(x[:m], w, out_dtype=out_dtype, schedule=schedule)
            assert_bitwise_equal(y, full[:m], f"K={K} N={N} split={config.split_k(K, N)} M={m} {schedule}")


def test_rows_invariant_across_launch_geometry():
    K, N = 768, 96  # split 3
    x, w = _rand(33, K, seed=1), _rand(N, K, seed=2)
    ref = gemm(x, w, out_dtype=torch.float32, schedule="prefill")
    # BLOCK_K is not varied here: the interpreter forces 64 (see launch.plan); the GPU sweep covers it.
    geoms = [("decode", dict(BLOCK_M=16, BLOCK_N=32, num_warps=8)),
             ("decode", dict(BLOCK_M=64, BLOCK_N=16, num_stages=2)),
             ("prefill", dict(BLOCK_M=16, BLOCK_N=128, GROUP_M=1)),
             ("prefill", dict(BLOCK_M=64, BLOCK_N=32, GROUP_M=2))]
    for schedule, cfg in geoms:
        y = gemm(x, w, out_dtype=torch.float32, schedule=schedule, config=cfg)
        assert_bitwise_equal(y, ref, f"{schedule} {cfg}")


def test_row_position_permutation_and_padding():
    K, N = 512, 63
    x, w = _rand(17, K, seed=3), _rand(N, K, seed=4)
    ref = gemm(x, w, out_dtype=torch.float32)
    perm = torch.randperm(17, generator=torch.Generator().manual_seed(0)).to(DEV)
    assert_bitwise_equal(gemm(x[perm], w, out_dtype=torch.float32), ref[perm], "permuted rows")
    pad = torch.cat([_rand(5, K, seed=5) * 1e4, x, torch.zeros(6, K, dtype=x.dtype, device=DEV)])
    assert_bitwise_equal(gemm(pad, w, out_dtype=torch.float32)[5:22], ref, "padded rows")
    for i in (0, 8, 16):  # one row at a time, at any position
        assert_bitwise_equal(gemm(x[i:i + 1], w, out_dtype=torch.float32), ref[i:i + 1], f"row {i} alone")


def test_run_to_run():
    x, w = _rand(7, 1000, seed=6), _rand(40, 1000, seed=7)
    for schedule in ("decode", "prefill"):
        a = gemm(x, w, schedule=schedule, out_dtype=torch.float32)
        b = gemm(x, w, schedule=schedule, out_dtype=torch.float32)
        assert_bitwise_equal(a, b, f"run to run, {schedule}")


def test_split_count_changes_bits(monkeypatch):
    """Negative control: the invariance checks can fail. Another split count (a contract change)
    gives other fp32 bytes, even under the interpreter."""
    K, N = 1024, 70
    x, w = _rand(16, K, seed=8), _rand(N, K, seed=9)
    ref = gemm(x, w, out_dtype=torch.float32, schedule="prefill")
    assert config.split_k(K, N) == 4
    monkeypatch.setattr(config, "split_k", lambda k, n: 1)
    other = gemm(x, w, out_dtype=torch.float32, schedule="prefill")
    assert not torch.equal(other.view(torch.int32), ref.view(torch.int32)), (
        "split 1 and split 4 gave equal fp32 bytes: the invariance tests could not detect a fold change")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(QWEN3_8B_GEMMS))
def test_gpu_rows_invariant_qwen3(name):
    """Every M in GPU_ROWS (1..8192), both schedules where M <= 256, rows at an offset."""
    K, N = QWEN3_8B_GEMMS[name]
    top = max(GPU_ROWS)
    x, w = _rand(top + 8, K, seed=1), _rand(N, K, seed=2)
    full = gemm(x[:top], w)  # the prefill schedule
    for m in GPU_ROWS:
        y = gemm(x[:m], w)
        assert_bitwise_equal(y, full[:m], f"{name} M={m} auto")
        if m <= 256:
            other = "prefill" if m <= config.decode_max_m() else "decode"
            assert_bitwise_equal(gemm(x[:m], w, schedule=other), full[:m], f"{name} M={m} {other}")
    shifted = gemm(x[8:8 + 33], w)
    assert_bitwise_equal(shifted[:25], full[8:33], f"{name} rows at offset 8")
    if name not in ("qkv", "down", "tp4_lm_head"):  # split 4, 6, 1: enough fp32 coverage, fewer compiles
        return
    fp32_full = gemm(x[:256], w, out_dtype=torch.float32, schedule="prefill")
    for m in (1, 33, 64):
        assert_bitwise_equal(gemm(x[:m], w, out_dtype=torch.float32, schedule="decode"), fp32_full[:m],
                             f"{name} fp32 M={m} decode vs prefill")


@pytest.mark.gpu
def test_gpu_cuda_graph_matches_eager():
    K, N = QWEN3_8B_GEMMS["qkv"]
    w = _rand(N, K, seed=3)
    for m in (1, 8, 64, 256):
        x = _rand(m, K, seed=m)
        eager = gemm(x, w)
        static_x = x.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            gemm(static_x, w)  # warm-up: compile outside the capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = gemm(static_x, w)
        for _ in range(2):
            g.replay()
            torch.cuda.synchronize()
            assert_bitwise_equal(out, eager, f"graph replay M={m}")
        static_x.copy_(_rand(m, K, seed=m + 1))
        g.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(out, gemm(static_x, w), f"graph replay new input M={m}")
