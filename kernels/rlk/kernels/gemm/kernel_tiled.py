"""Prefill/training kernel of contracts ``gemm.bf16.v1`` and ``v2`` (arithmetic: see ``kernel.py``).

One kernel, schedule variants as constexprs (all perform the same operations in the same order
per element; the GPU evidence is the tuner's byte-identity check and the ``gpu`` tests):

* ``FLAT``: one K loop over all SPLIT_K * SEG_STEPS k-steps (one software pipeline); at each
  segment end ``total += acc; acc = 0``. Otherwise a loop over segments with a loop over the
  segment's k-steps (the pipeline restarts per segment).
* ``NUM_PROGS > 0``: persistent; program p walks tiles p, p + NUM_PROGS, ... ascending.
  ``NUM_PROGS == 0``: one program per tile. ``FLATTEN`` (persistent only): the tile walk and each
  tile's K loop are one software pipeline (``tl.range(..., flatten=True)``: the next tile's first
  loads are issued while this tile's last MMAs and its store run); the interpreter, which cannot
  range over runtime bounds, walks the same tiles with the while loop.
* ``NSUB`` (2 or 3, FLAT only): a tile NSUB * BLOCK_N columns wide (e.g. 192 = 3 x 64) as NSUB
  column sub-tiles that share each x tile, each with its own accumulator and fold.
* ``USE_TMA``: x/w tiles come through host-side tensor descriptors (TMA on sm_90; out-of-range
  lanes zero-filled), else through masked pointer loads. ``X_T`` / ``W_T``: that operand is the
  transpose of a row-major tensor (the backward's ``w.t()``, ``dy.t()``, ``x.t()``); its
  descriptor is over the row-major tensor and the loaded [BLOCK_K, BLOCK_*] tile is transposed
  in registers before the MMA. The same values reach the same MMA k-steps in the same order.
"""

import triton
import triton.language as tl

from rlk.kernels.gemm.kernel import _load_ab, _mma, _operand, _store_out


@triton.jit
def _tile_ab(x_ptr, w_ptr, x_desc, w_desc, offs_m, offs_n, m0, n0, k0, M, N, K,
             stride_xm, stride_xk, stride_wn, stride_wk,
             BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr, X_T: tl.constexpr, W_T: tl.constexpr,
             DOT_DTYPE: tl.constexpr):
    if USE_TMA:
        if X_T:
            a = _operand(tl.trans(x_desc.load([k0, m0])), DOT_DTYPE)
        else:
            a = _operand(x_desc.load([m0, k0]), DOT_DTYPE)
        if W_T:
            b = _operand(tl.trans(w_desc.load([k0, n0])), DOT_DTYPE)
        else:
            b = _operand(w_desc.load([n0, k0]), DOT_DTYPE)
    else:
        a, b = _load_ab(x_ptr, w_ptr, offs_m, offs_n, k0, M, N, K,
                        stride_xm, stride_xk, stride_wn, stride_wk, BLOCK_K, DOT_DTYPE)
    return a, b


@triton.jit
def _tile_w(w_ptr, w_desc, offs_n, n0, k0, N, K, stride_wn, stride_wk,
            BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr, W_T: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """The weight tile of a further column sub-tile at n0 (as ``_tile_ab`` loads the first one)."""
    if USE_TMA:
        if W_T:
            b = tl.trans(w_desc.load([k0, n0]))
        else:
            b = w_desc.load([n0, k0])
    else:
        k = k0 + tl.arange(0, BLOCK_K)
        b = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + k[None, :].to(tl.int64) * stride_wk,
                    mask=(offs_n[:, None] < N) & (k[None, :] < K), other=0.0)
    return _operand(b, DOT_DTYPE)


@triton.jit
def _one_tile(tile, y_ptr, x_ptr, w_ptr, x_desc, w_desc, M, N, K,
              stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
              SPLIT_K: tl.constexpr, SEG_STEPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, FLAT: tl.constexpr,
              USE_TMA: tl.constexpr, X_T: tl.constexpr, W_T: tl.constexpr, DOT_DTYPE: tl.constexpr,
              OUT_FP32: tl.constexpr, INTERPRET: tl.constexpr, NSUB: tl.constexpr = 1):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N * NSUB)
    group = GROUP_M * num_pid_n
    first_m = (tile // group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % group) % group_rows
    pid_n = (tile % group) // group_rows
    m0 = pid_m * BLOCK_M
    n0 = pid_n * (BLOCK_N * NSUB)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    if FLAT:
        _flat_tile(y_ptr, x_ptr, w_ptr, x_desc, w_desc, M, N, K, m0, n0, offs_m, offs_n,
                   stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                   SPLIT_K, SEG_STEPS, BLOCK_M, BLOCK_N, BLOCK_K, NSUB, USE_TMA, X_T, W_T, DOT_DTYPE, OUT_FP32,
                   INTERPRET)
    else:
        # Reduction order: segments s = 0 .. SPLIT_K-1 ascending; each from zero over its k-steps
        # ascending (acc = dot(a, b, acc), fp32); total = 0.0, then total += acc_s (fp32 fold).
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in range(0, SPLIT_K):
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for j in range(0, SEG_STEPS):
                k0 = (s * SEG_STEPS + j) * BLOCK_K
                a, b = _tile_ab(x_ptr, w_ptr, x_desc, w_desc, offs_m, offs_n, m0, n0, k0, M, N, K,
                                stride_xm, stride_xk, stride_wn, stride_wk, BLOCK_K, USE_TMA, X_T, W_T, DOT_DTYPE)
                acc = _mma(a, b, acc, DOT_DTYPE)
            total = total + acc
        _store_out(y_ptr, total, offs_m, offs_n, M, N, stride_ym, stride_yn, OUT_FP32, INTERPRET)


@triton.jit
def _flat_tile(y_ptr, x_ptr, w_ptr, x_desc, w_desc, M, N, K, m0, n0, offs_m, offs_n,
               stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
               SPLIT_K: tl.constexpr, SEG_STEPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, NSUB: tl.constexpr, USE_TMA: tl.constexpr, X_T: tl.constexpr,
               W_T: tl.constexpr, DOT_DTYPE: tl.constexpr, OUT_FP32: tl.constexpr, INTERPRET: tl.constexpr):
    """One tile in one flat K loop: NSUB (1-3) column sub-tiles of BLOCK_N on the shared x tile,
    sub-tile j summing columns n0 + j * BLOCK_N + [0, BLOCK_N) with its own accumulator and fold.
    Reduction order per element: k-steps ascending over all of K; acc = dot(a, b, acc) in fp32
    (chunks of 64 ascending); at the end of segment s: total = total + acc_s (s ascending, fp32 left
    fold from total = 0.0), then acc = 0 for the next segment; one rounding at the store."""
    t0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    t1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    t2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    c0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    c1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    c2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in tl.range(0, SPLIT_K * SEG_STEPS):
        k0 = i * BLOCK_K
        a, b = _tile_ab(x_ptr, w_ptr, x_desc, w_desc, offs_m, offs_n, m0, n0, k0, M, N, K,
                        stride_xm, stride_xk, stride_wn, stride_wk, BLOCK_K, USE_TMA, X_T, W_T, DOT_DTYPE)
        c0 = _mma(a, b, c0, DOT_DTYPE)
        if NSUB > 1:
            b = _tile_w(w_ptr, w_desc, offs_n + BLOCK_N, n0 + BLOCK_N, k0, N, K, stride_wn, stride_wk,
                        BLOCK_K, USE_TMA, W_T, DOT_DTYPE)
            c1 = _mma(a, b, c1, DOT_DTYPE)
        if NSUB > 2:
            b = _tile_w(w_ptr, w_desc, offs_n + 2 * BLOCK_N, n0 + 2 * BLOCK_N, k0, N, K, stride_wn, stride_wk,
                        BLOCK_K, USE_TMA, W_T, DOT_DTYPE)
            c2 = _mma(a, b, c2, DOT_DTYPE)
        if SPLIT_K > 1:
            if i % SEG_STEPS == SEG_STEPS - 1:
                t0 = t0 + c0
                c0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                if NSUB > 1:
                    t1 = t1 + c1
                    c1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                if NSUB > 2:
                    t2 = t2 + c2
                    c2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SPLIT_K == 1:  # the fold of one segment, after the loop (no fold registers live in it)
        t0 = t0 + c0
        if NSUB > 1:
            t1 = t1 + c1
        if NSUB > 2:
            t2 = t2 + c2
    _store_out(y_ptr, t0, offs_m, offs_n, M, N, stride_ym, stride_yn, OUT_FP32, INTERPRET)
    if NSUB > 1:
        _store_out(y_ptr, t1, offs_m, offs_n + BLOCK_N, M, N, stride_ym, stride_yn, OUT_FP32, INTERPRET)
    if NSUB > 2:
        _store_out(y_ptr, t2, offs_m, offs_n + 2 * BLOCK_N, M, N, stride_ym, stride_yn, OUT_FP32, INTERPRET)


@triton.jit(do_not_specialize=["M"])
def gemm_tiled_kernel(
    y_ptr, x_ptr, w_ptr, x_desc, w_desc,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    SPLIT_K: tl.constexpr, SEG_STEPS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGS: tl.constexpr, FLAT: tl.constexpr, USE_TMA: tl.constexpr,
    DOT_DTYPE: tl.constexpr, OUT_FP32: tl.constexpr, INTERPRET: tl.constexpr,
    X_T: tl.constexpr = False, W_T: tl.constexpr = False, FLATTEN: tl.constexpr = False,
    NSUB: tl.constexpr = 1,
):
    """Prefill/training schedule: each output tile computed whole by one program (no
    cross-program sum), segments folded in registers; tiles grouped by GROUP_M row tiles.

    Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N * NSUB),) or, persistent, (min(NUM_PROGS, tiles),).
    x_desc / w_desc: tensor descriptors of x [M, K] / w [N, K] when USE_TMA, else None; with
    X_T (W_T) the descriptor is of the row-major x.T [K, M] (w.T [K, N]).
    """
    if NUM_PROGS == 0:
        _one_tile(tl.program_id(0), y_ptr, x_ptr, w_ptr, x_desc, w_desc, M, N, K,
                  stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                  SPLIT_K, SEG_STEPS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, FLAT, USE_TMA, X_T, W_T, DOT_DTYPE, OUT_FP32,
                  INTERPRET, NSUB)
    else:
        num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N * NSUB)
        # Tiles are independent (each element is summed by exactly one program): the walk order
        # and the pipelining across tiles only change timing, never a sum.
        if FLATTEN and not INTERPRET:
            for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGS, flatten=True):
                _one_tile(tile, y_ptr, x_ptr, w_ptr, x_desc, w_desc, M, N, K,
                          stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                          SPLIT_K, SEG_STEPS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, FLAT, USE_TMA, X_T, W_T,
                          DOT_DTYPE, OUT_FP32, INTERPRET, NSUB)
        else:
            # (a while loop: the interpreter cannot run range() over runtime bounds.)
            tile = tl.program_id(0)
            while tile < num_tiles:
                _one_tile(tile, y_ptr, x_ptr, w_ptr, x_desc, w_desc, M, N, K,
                          stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                          SPLIT_K, SEG_STEPS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, FLAT, USE_TMA, X_T, W_T,
                          DOT_DTYPE, OUT_FP32, INTERPRET, NSUB)
                tile += NUM_PROGS
