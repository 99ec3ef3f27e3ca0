"""Triton kernels of contract ``gemm.bf16.v1``: ``y[M, N] = x[M, K] @ w[N, K].T``.

Only ``@triton.jit`` code lives here; checks, configuration and grids are in ``launch.py``.

The arithmetic every kernel below performs for one output element ``y[m, n]`` (the contract):

* K is cut into ``n_chunks = ceil(K / 64)`` chunks of 64 (the last one zero-padded) and the
  chunks into ``SPLIT_K`` segments of ``SEG_CHUNKS = n_chunks / SPLIT_K`` consecutive chunks.
  ``SPLIT_K`` depends on (K, N) only (``config.split_k``), never on M.
* Inside a segment: ``acc = 0``; for each chunk ascending ``acc = tl.dot(a, b, acc)`` with fp32
  accumulation (operands in ``DOT_DTYPE``: bf16 on GPU, fp32 under the interpreter).
* Across segments: ``total = 0.0``; ``total = total + acc_s`` for s = 0, 1, ..., SPLIT_K - 1
  (a left fold in fp32, ascending segment order).
* One fp32 -> bf16 RNE rounding at the store (or an fp32 store when ``OUT_FP32``).

The decode schedule (``gemm_segment_kernel`` + ``gemm_fold_kernel``) runs the segments in
parallel programs and folds the fp32 partials in a second kernel; the prefill schedule
(``gemm_tiled_kernel``) keeps a segment accumulator in registers and folds it into the tile's
total after each segment. Both perform the same operations in the same order per element.
"""

import triton
import triton.language as tl

from rlk.kernels.common import round_bf16


@triton.jit
def _store_out(y_ptr, total, offs_m, offs_n, M, N, stride_ym, stride_yn,
               OUT_FP32: tl.constexpr, INTERPRET: tl.constexpr):
    ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :].to(tl.int64) * stride_yn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if OUT_FP32:
        tl.store(ptrs, total, mask=mask)
    else:
        tl.store(ptrs, round_bf16(total, INTERPRET), mask=mask)


@triton.jit
def _segment_dot(x_ptr, w_ptr, offs_m, offs_n, k_begin, M, N, K,
                 stride_xm, stride_xk, stride_wn, stride_wk,
                 SEG_CHUNKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """fp32 sum over one segment: SEG_CHUNKS chunks of 64 starting at ``k_begin``."""
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    m_ok = offs_m[:, None] < M
    n_ok = offs_n[:, None] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Reduction order: chunks of 64 (BLOCK_K = 64 * j walks j chunks per step) ascending;
    # acc = tl.dot(a, b, acc) in fp32; zero-padded lanes past K contribute exact zeros.
    for kb in range(0, SEG_CHUNKS * 64, BLOCK_K):
        k = k_begin + kb + offs_k
        k_ok = k[None, :] < K
        a = tl.load(x_rows + k[None, :].to(tl.int64) * stride_xk, mask=m_ok & k_ok, other=0.0)
        b = tl.load(w_rows + k[None, :].to(tl.int64) * stride_wk, mask=n_ok & k_ok, other=0.0)
        # Upcast first (exact), then to the dot operand dtype (bf16 on GPU: exact round trip).
        a = a.to(tl.float32).to(DOT_DTYPE)
        b = b.to(tl.float32).to(DOT_DTYPE)
        if DOT_DTYPE == tl.float64:
            # CPU interpreter only: numpy's fp32 matmul sums a chunk in an order that depends on
            # the block shape; in fp64 a 64-term chunk of bf16 products is exact (for data whose
            # products span < 2**31), so the chunk sum is order-free and rounded once to fp32.
            acc = acc + tl.dot(a, tl.trans(b), out_dtype=tl.float64).to(tl.float32)
        else:
            acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.float32)
    return acc


# M is never specialized: the compiled code (and so the bits) must not depend on the row count.
@triton.jit(do_not_specialize=["M", "stride_ws"])
def gemm_segment_kernel(
    out_ptr,  # SPLIT_K == 1: y [M, N] (bf16 or fp32); else fp32 workspace [SPLIT_K, M, N]
    x_ptr, w_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on, stride_ws,
    SPLIT_K: tl.constexpr, SEG_CHUNKS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, OUT_FP32: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Decode schedule, part 1: program (n_tile, segment, m_tile) sums one segment.

    Grid: (cdiv(N, BLOCK_N), SPLIT_K, cdiv(M, BLOCK_M)); consecutive programs share the same x
    rows and read neighbouring weight tiles, so the weights stream once.
    """
    pid_n = tl.program_id(0)
    seg = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _segment_dot(x_ptr, w_ptr, offs_m, offs_n, seg * (SEG_CHUNKS * 64), M, N, K,
                       stride_xm, stride_xk, stride_wn, stride_wk,
                       SEG_CHUNKS, BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE)
    if SPLIT_K == 1:
        # Reduction order: the fold over one segment is total = 0.0 + acc_0.
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + acc
        _store_out(out_ptr, total, offs_m, offs_n, M, N, stride_om, stride_on, OUT_FP32, INTERPRET)
    else:
        ws = out_ptr + seg.to(tl.int64) * stride_ws
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(ws + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], acc, mask=mask)


@triton.jit(do_not_specialize=["M", "stride_ws"])
def gemm_fold_kernel(
    y_ptr, ws_ptr, M, N, stride_ym, stride_yn, stride_ws,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    OUT_FP32: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Decode schedule, part 2: ordered fold of the fp32 partials ``ws [SPLIT_K, M, N]``."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = ws_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Reduction order: total = 0.0; total += ws[s] for s = 0 .. SPLIT_K-1 ascending, fp32.
    for s in tl.static_range(SPLIT_K):
        total = total + tl.load(ptrs + s * stride_ws, mask=mask, other=0.0)
    _store_out(y_ptr, total, offs_m, offs_n, M, N, stride_ym, stride_yn, OUT_FP32, INTERPRET)


@triton.jit(do_not_specialize=["M"])
def gemm_tiled_kernel(
    y_ptr, x_ptr, w_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    SPLIT_K: tl.constexpr, SEG_CHUNKS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr, OUT_FP32: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Prefill/training schedule: one program per output tile, segments folded in registers.

    Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),), grouped by GROUP_M row tiles for L2 reuse.
    """
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_rows
    pid_n = (pid % group) // group_rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Reduction order: segments s = 0 .. SPLIT_K-1 ascending; each from zero over its chunks of
    # 64 ascending (see _segment_dot); total = 0.0, then total += acc_s (fp32 left fold).
    for s in range(0, SPLIT_K):
        acc = _segment_dot(x_ptr, w_ptr, offs_m, offs_n, s * (SEG_CHUNKS * 64), M, N, K,
                           stride_xm, stride_xk, stride_wn, stride_wk,
                           SEG_CHUNKS, BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE)
        total = total + acc
    _store_out(y_ptr, total, offs_m, offs_n, M, N, stride_ym, stride_yn, OUT_FP32, INTERPRET)
