"""Stream-K walk of the prefill schedule (contracts ``gemm.bf16.v1`` / ``v2``; arithmetic: ``kernel.py``).

A persistent grid of ``NUM_PROGS`` programs shares out the k-steps of all output tiles evenly
instead of whole tiles, so that a tile count just past a multiple of the SM count (e.g. 192 tiles
on 132 SMs: two waves, the second 45% full) costs about tiles / SMs tile times, not the next whole
number.

Every tile's K walk stays one chain in ascending order: where a program's share ends inside a
tile, it runs that tile's first k-steps from zero and **publishes** the fp32 accumulator (and, with
several segments, the fold total) to a workspace slot; the next program **continues** the same
chain from those exact fp32 values after the flag says they are there, and stores the tile. A
k-step is the same ``acc = dot(a, b, acc)`` whether its ``acc`` came from registers or from the
workspace (fp32 stores and loads are exact), segment ends fold ``total += acc`` at the same steps,
so every output element gets the same operations in the same order as the one-program-per-tile
walk: the split is a schedule choice, not arithmetic.

Ordering: a program publishes the head of its last tile **first**, then runs its whole tiles, then
waits for its predecessor's head: no program waits on work queued behind a wait, so all programs
make progress as long as they are resident together (the launcher starts at most one program per
SM). Each share is at least one tile's k-steps long (the launcher checks tiles >= programs), so a
tile is split between at most two programs. Flags are int32, one per program; the consumer resets
its predecessor's flag in the same atomic that reads it (compare-and-swap 1 -> 0), so the flags are
all zero between launches. The atomics order the handoff only; no value is summed atomically.

Shares are contiguous runs of tiles: with many tiles per program the programs work far apart in
the output at any moment, and the grouped tile walk's L2 reuse is lost (measured on an H100 at
gate_up M >= 192: 1.5-1.9x the tile walk's time). The tuner offers it from M 65 to 1024 and keeps it
only where it is faster (``docs/results/gemm_tune_h100_streamk.json``).
"""

import triton
import triton.language as tl

from rlk.kernels.gemm.kernel import _mma, _store_out
from rlk.kernels.gemm.kernel_tiled import _tile_ab


@triton.jit
def _tile_origin(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(m0, n0) of linear tile ``tile`` in the GROUP_M-grouped order of ``gemm_tiled_kernel``."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    group = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_m = (tile // group) * GROUP_M
    rows = min(num_pid_m - first_m, GROUP_M)
    return (first_m + (tile % group) % rows) * BLOCK_M, ((tile % group) // rows) * BLOCK_N


@triton.jit
def _k_step(i, total, acc, x_ptr, w_ptr, x_desc, w_desc, offs_m, offs_n, m0, n0, M, N, K,
            stride_xm, stride_xk, stride_wn, stride_wk,
            SPLIT_K: tl.constexpr, SEG_STEPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """k-step ``i`` of a tile, as the FLAT walk of ``gemm_tiled_kernel`` runs it: acc = dot(a, b,
    acc) in fp32; at a segment end (SPLIT_K > 1) total = total + acc, then acc = 0."""
    a, b = _tile_ab(x_ptr, w_ptr, x_desc, w_desc, offs_m, offs_n, m0, n0, i * BLOCK_K, M, N, K,
                    stride_xm, stride_xk, stride_wn, stride_wk, BLOCK_K, USE_TMA, False, False, DOT_DTYPE)
    acc = _mma(a, b, acc, DOT_DTYPE)
    if SPLIT_K > 1:
        if i % SEG_STEPS == SEG_STEPS - 1:
            total = total + acc
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    return total, acc


@triton.jit
def _k_steps(i0, i1, total, acc, x_ptr, w_ptr, x_desc, w_desc, offs_m, offs_n, m0, n0, M, N, K,
             stride_xm, stride_xk, stride_wn, stride_wk,
             SPLIT_K: tl.constexpr, SEG_STEPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr, DOT_DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """k-steps i0, i0 + 1, ..., i1 - 1 of a tile in ascending order (runtime bounds: a pipelined
    ``tl.range`` on the GPU, a while loop under the interpreter, which cannot range over runtime
    values; the same steps either way)."""
    if INTERPRET:
        i = i0
        while i < i1:
            total, acc = _k_step(i, total, acc, x_ptr, w_ptr, x_desc, w_desc, offs_m, offs_n, m0, n0, M, N, K,
                                 stride_xm, stride_xk, stride_wn, stride_wk,
                                 SPLIT_K, SEG_STEPS, BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, DOT_DTYPE)
            i += 1
    else:
        for i in tl.range(i0, i1):
            total, acc = _k_step(i, total, acc, x_ptr, w_ptr, x_desc, w_desc, offs_m, offs_n, m0, n0, M, N, K,
                                 stride_xm, stride_xk, stride_wn, stride_wk,
                                 SPLIT_K, SEG_STEPS, BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, DOT_DTYPE)
    return total, acc


@triton.jit
def _finish(y_ptr, total, acc, offs_m, offs_n, M, N, stride_ym, stride_yn, SPLIT_K: tl.constexpr,
            OUT_FP32: tl.constexpr, INTERPRET: tl.constexpr):
    """Stores a tile whose k-steps all ran: with one segment the fold is total = 0.0 + acc (the
    tiled kernel's ``total + acc`` from zero); with several, the last step already folded."""
    if SPLIT_K == 1:
        total = total + acc
    _store_out(y_ptr, total, offs_m, offs_n, M, N, stride_ym, stride_yn, OUT_FP32, INTERPRET)


# M is never specialized (bits must not depend on the row count); NUM_PROGS is the grid size.
@triton.jit(do_not_specialize=["M"])
def gemm_streamk_kernel(
    y_ptr, x_ptr, w_ptr, x_desc, w_desc, carry_ptr, flag_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    SPLIT_K: tl.constexpr, SEG_STEPS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGS: tl.constexpr, USE_TMA: tl.constexpr,
    DOT_DTYPE: tl.constexpr, OUT_FP32: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Stream-K prefill schedule (module docstring). Grid: (NUM_PROGS,), with
    cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) >= NUM_PROGS.

    carry_ptr: fp32 workspace [NUM_PROGS, 2, BLOCK_M, BLOCK_N] (slot p: program p's published
    accumulator and fold total); flag_ptr: int32 [NUM_PROGS], all zero at launch (left zero).
    """
    pid = tl.program_id(0)
    ITERS: tl.constexpr = SPLIT_K * SEG_STEPS  # k-steps per tile
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    work = num_tiles.to(tl.int64) * ITERS
    start = (pid * work // NUM_PROGS).to(tl.int32)
    end = ((pid + 1) * work // NUM_PROGS).to(tl.int32)
    t_first = start // ITERS
    k_first = start % ITERS
    t_last = (end - 1) // ITERS
    k_last = (end - 1) % ITERS + 1
    slot = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tile_elems: tl.constexpr = BLOCK_M * BLOCK_N

    # 1. The head of the last tile when the share ends inside it: from zero, then published.
    if k_last < ITERS:
        m0, n0 = _tile_origin(t_last, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        total, acc = _k_steps(0, k_last, total, acc, x_ptr, w_ptr, x_desc, w_desc, offs_m, offs_n, m0, n0,
                              M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                              SPLIT_K, SEG_STEPS, BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, DOT_DTYPE, INTERPRET)
        base = carry_ptr + pid.to(tl.int64) * (2 * tile_elems)
        tl.store(base + slot, acc)
        if SPLIT_K > 1:  # with one segment the total is still 0.0: nothing to carry
            tl.store(base + tile_elems + slot, total)
        tl.debug_barrier()  # every thread's stores precede the flag
        tl.atomic_xchg(flag_ptr + pid, 1)

    # 2. Whole tiles inside the share.
    t = t_first + (k_first > 0).to(tl.int32)
    t_end = t_last + (k_last == ITERS).to(tl.int32)
    while t < t_end:
        m0, n0 = _tile_origin(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        total, acc = _k_steps(0, ITERS, total, acc, x_ptr, w_ptr, x_desc, w_desc, offs_m, offs_n, m0, n0,
                              M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                              SPLIT_K, SEG_STEPS, BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, DOT_DTYPE, INTERPRET)
        _finish(y_ptr, total, acc, offs_m, offs_n, M, N, stride_ym, stride_yn, SPLIT_K, OUT_FP32, INTERPRET)
        t += 1

    # 3. The rest of the first tile when the share starts inside it: the predecessor's chain
    #    continued from its published values.
    if k_first > 0:
        while tl.atomic_cas(flag_ptr + pid - 1, 1, 0) != 1:
            pass
        m0, n0 = _tile_origin(t_first, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        base = carry_ptr + (pid - 1).to(tl.int64) * (2 * tile_elems)
        # .cg: read from L2, where the other SM's stores are, never a stale L1 line.
        acc = tl.load(base + slot, cache_modifier=".cg")
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if SPLIT_K > 1:
            total = tl.load(base + tile_elems + slot, cache_modifier=".cg")
        total, acc = _k_steps(k_first, ITERS, total, acc, x_ptr, w_ptr, x_desc, w_desc, offs_m, offs_n, m0, n0,
                              M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                              SPLIT_K, SEG_STEPS, BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, DOT_DTYPE, INTERPRET)
        _finish(y_ptr, total, acc, offs_m, offs_n, M, N, stride_ym, stride_yn, SPLIT_K, OUT_FP32, INTERPRET)
