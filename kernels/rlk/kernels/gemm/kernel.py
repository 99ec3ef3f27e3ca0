"""Triton kernels of contracts ``gemm.bf16.v1`` and ``v2``: ``y[M, N] = x[M, K] @ w[N, K].T`` (decode part).

Only ``@triton.jit`` code lives here and in ``kernel_tiled.py``; checks, configuration and grids
are in ``launch.py``.

The arithmetic every kernel performs for one output element ``y[m, n]`` (the contract):

* K is cut into ``n_chunks = ceil(K / 64)`` chunks of 64 (the last one zero-padded) and the
  chunks into ``SPLIT_K`` segments of ``seg_chunks = SEG_STEPS * BLOCK_K / 64`` consecutive
  chunks (``contract.segments``): v1 cuts ``n_chunks`` into equal segments (``SPLIT_K`` by (K, N));
  v2 uses 16-chunk segments (``SPLIT_K`` by K), the last one running on past K, where the masked
  loads give exact zeros. Never a function of M.
* Inside a segment: ``acc = 0``; for each chunk ascending ``acc = tl.dot(a, b, acc)`` with fp32
  accumulation (operands in ``DOT_DTYPE``: bf16 on GPU, fp64 chunk sums under the interpreter).
* Across segments: ``total = 0.0``; ``total = total + acc_s`` for s = 0, 1, ..., SPLIT_K - 1
  (a left fold in fp32, ascending segment order).
* One fp32 -> bf16 RNE rounding at the store (or an fp32 store when ``OUT_FP32``).

The decode schedule (``gemm_segment_kernel`` + ``gemm_fold_kernel`` when SPLIT_K > 1) runs the
segments in parallel programs and folds the fp32 partials in a second kernel; the prefill
schedule (``kernel_tiled.gemm_tiled_kernel``) folds in registers. Same operations, same order.
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
def _operand(t, DOT_DTYPE: tl.constexpr):
    """A loaded bf16 tile as a dot operand. On GPU it is used as loaded (bf16 -> fp32 -> bf16
    would be an exact round trip, and skipping it keeps the smem -> MMA path); under the
    interpreter it is upcast first (interpreter bf16 arithmetic is wrong, STACK.md)."""
    if DOT_DTYPE == tl.bfloat16:
        return t
    else:
        return t.to(tl.float32).to(DOT_DTYPE)


@triton.jit
def _mma(a, b, acc, DOT_DTYPE: tl.constexpr):
    """``acc + a @ b.T`` for one k-step (a [BM, BK], b [BN, BK]), fp32 accumulation."""
    if DOT_DTYPE == tl.float64:
        # CPU interpreter only: numpy's fp32 matmul sums a chunk in an order that depends on
        # the block shape; in fp64 a 64-term chunk of bf16 products is exact (for data whose
        # products span < 2**31), so the chunk sum is order-free and rounded once to fp32.
        return acc + tl.dot(a, tl.trans(b), out_dtype=tl.float64).to(tl.float32)
    else:
        return tl.dot(a, tl.trans(b), acc, out_dtype=tl.float32)


@triton.jit
def _load_ab(x_ptr, w_ptr, offs_m, offs_n, k0, M, N, K,
             stride_xm, stride_xk, stride_wn, stride_wk,
             BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Plain (pointer) loads of the x and w tiles at k0; lanes past M, N, K are exact zeros."""
    k = k0 + tl.arange(0, BLOCK_K)
    k_ok = k[None, :] < K
    a = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + k[None, :].to(tl.int64) * stride_xk,
                mask=(offs_m[:, None] < M) & k_ok, other=0.0)
    b = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + k[None, :].to(tl.int64) * stride_wk,
                mask=(offs_n[:, None] < N) & k_ok, other=0.0)
    return _operand(a, DOT_DTYPE), _operand(b, DOT_DTYPE)


@triton.jit
def _segment_dot(x_ptr, w_ptr, offs_m, offs_n, k_begin, M, N, K,
                 stride_xm, stride_xk, stride_wn, stride_wk,
                 SEG_STEPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """fp32 sum over one segment: ``SEG_STEPS`` k-steps of BLOCK_K starting at ``k_begin``."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Reduction order: chunks of 64 ascending (BLOCK_K = 64 * j walks j chunks per step, one
    # 16-wide MMA k-step chain); acc = dot(a, b, acc) in fp32; lanes past K are exact zeros.
    for i in range(0, SEG_STEPS):
        a, b = _load_ab(x_ptr, w_ptr, offs_m, offs_n, k_begin + i * BLOCK_K, M, N, K,
                        stride_xm, stride_xk, stride_wn, stride_wk, BLOCK_K, DOT_DTYPE)
        acc = _mma(a, b, acc, DOT_DTYPE)
    return acc


# M is never specialized: the compiled code (and so the bits) must not depend on the row count.
# Loop bounds are constexprs: the interpreter (numpy 2) cannot loop over runtime scalars.
@triton.jit(do_not_specialize=["M", "stride_ws"])
def gemm_segment_kernel(
    out_ptr,  # SPLIT_K == 1: y [M, N] (bf16 or fp32); else fp32 workspace [SPLIT_K, M, N]
    x_ptr, w_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on, stride_ws, COLS,
    SPLIT_K: tl.constexpr, SEG_STEPS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, OUT_FP32: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Decode schedule, part 1: program (m_tile, segment, n_range) sums one segment of the
    output columns [n_range * COLS, min((n_range + 1) * COLS, N)) (COLS <= BLOCK_N; lanes past
    the range load zeros and are not stored).

    Grid: (cdiv(M, BLOCK_M), SPLIT_K, cdiv(N, COLS)); for M <= 64 the launcher's default
    BLOCK_M covers M, so there is one m_tile and the weights stream exactly once. COLS = BLOCK_N
    tiles N; a smaller COLS (the N_PROGS field) spreads N evenly over a chosen program count.
    """
    pid_m = tl.program_id(0)
    seg = tl.program_id(1)
    pid_n = tl.program_id(2)
    n0 = pid_n * COLS
    n_hi = tl.minimum(n0 + COLS, N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    # Weight rows past n_hi are masked (another program's columns: never read twice).
    acc = _segment_dot(x_ptr, w_ptr, offs_m, offs_n, seg * (SEG_STEPS * BLOCK_K), M, n_hi, K,
                       stride_xm, stride_xk, stride_wn, stride_wk,
                       SEG_STEPS, BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE)
    if SPLIT_K == 1:
        # Reduction order: the fold over one segment is total = 0.0 + acc_0.
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + acc
        _store_out(out_ptr, total, offs_m, offs_n, M, n_hi, stride_om, stride_on, OUT_FP32, INTERPRET)
    else:
        ws = out_ptr + seg.to(tl.int64) * stride_ws
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < n_hi)
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
