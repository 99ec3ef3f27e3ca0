"""Triton kernels of ``logp.v2`` (fused LM head + selected-token log-prob). ``@triton.jit`` only.

Host code (checks, tables, grids) is in ``launch.py``; the arithmetic contract is written out in
``contract.py``. Every kernel loads bf16, upcasts to fp32 at once, feeds ``tl.dot`` in ``DOT_DTYPE``
(bf16 on GPU, fp64 chunk sums under the CPU interpreter: see ``_mma``) and rounds to bf16 only through ``round_bf16``.
"""

import triton
import triton.language as tl

from rlk.kernels.common import round_bf16


# Loop bounds: Triton 3.6's interpreter with numpy 2.x cannot use a runtime scalar as a range()
# bound (it is a 1-element array), so under the interpreter every runtime loop bound is also
# passed as a constexpr (*_I, free there: nothing is compiled) and picked by a static ternary (an assignment in a static if would
# be turned into a runtime tensor by the interpreter). On GPU
# the *_I constexprs are 0 and the runtime value is used (one compiled kernel for every size).


@triton.jit
def _mma(a, b, acc, DOT_DTYPE: tl.constexpr):
    """``acc + a @ b`` for one 64-chunk, fp32 accumulation. On GPU one chained ``tl.dot``. Under
    the CPU interpreter (DOT_DTYPE fp64) the chunk is summed exactly in fp64 and rounded once to
    fp32: numpy's fp32 matmul sums in an order that depends on a row's place in the tile, which
    would break row invariance on CPU only (the same model as gemm.bf16.v1's interpreter path)."""
    if DOT_DTYPE == tl.float64:
        return acc + tl.dot(a, b, out_dtype=tl.float64).to(tl.float32)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _tile_ptrs(h_ptr, w_ptr, rows, cols, T, col_hi, stride_ht, stride_wv):
    """Base pointers and masks of one [BLOCK_T, BLOCK_V] logits tile."""
    h_base = h_ptr + rows.to(tl.int64)[:, None] * stride_ht
    w_base = w_ptr + cols.to(tl.int64)[None, :] * stride_wv
    return h_base, w_base, (rows < T)[:, None], (cols < col_hi)[None, :]


@triton.jit
def _k_step(acc, h_base, w_base, rmask, cmask, k0, BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """acc = tl.dot(h[:, k0:k0+64], w[:, k0:k0+64]^T, acc); rows >= T / columns >= col_hi read 0."""
    ks = k0 + tl.arange(0, BLOCK_K)
    a = tl.load(h_base + ks[None, :], mask=rmask, other=0.0).to(tl.float32).to(DOT_DTYPE)
    b = tl.load(w_base + ks[:, None], mask=cmask, other=0.0).to(tl.float32).to(DOT_DTYPE)
    return _mma(a, b, acc, DOT_DTYPE)


@triton.jit
def _tile_logits(h_ptr, w_ptr, h_desc, w_desc, rows, cols, row0, col0, T, col_hi, H,
                 stride_ht, stride_wv, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr,
                 BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr, DOT_DTYPE: tl.constexpr,
                 INTERPRET: tl.constexpr, H_I: tl.constexpr):
    """acc [BLOCK_T, BLOCK_V] = h[rows] @ w[cols]^T in fp32.

    Reduction order: K (hidden) in chunks of BLOCK_K=64 ascending, one fp32 accumulator chained
    through tl.dot (the gemm.bf16.v1 K walk); H % 64 == 0 (checked by the launcher). Rows >= T
    and columns >= col_hi read 0 (pointer path: masks; TMA path: the descriptor's zero fill past
    its edges, and columns in [col_hi, V_local) are real columns whose results are masked by the
    caller: each output element is its own chain, so neighbours never change it).
    """
    acc = tl.zeros((BLOCK_T, BLOCK_V), dtype=tl.float32)
    if USE_TMA:
        for k0 in range(0, H_I if INTERPRET else H, BLOCK_K):
            a = h_desc.load([row0, k0])
            b = w_desc.load([col0, k0])
            if DOT_DTYPE != tl.bfloat16:
                a = a.to(tl.float32).to(DOT_DTYPE)
                b = b.to(tl.float32).to(DOT_DTYPE)
            acc = _mma(a, tl.trans(b), acc, DOT_DTYPE)
    else:
        h_base, w_base, lrm, lcm = _tile_ptrs(h_ptr, w_ptr, rows, cols, T, col_hi, stride_ht, stride_wv)
        for k0 in range(0, H_I if INTERPRET else H, BLOCK_K):
            acc = _k_step(acc, h_base, w_base, lrm, lcm, k0, BLOCK_K, DOT_DTYPE)
    return acc


@triton.jit
def _grouped(pid, n_a, n_b, GROUP: tl.constexpr):
    """Program id -> (a, b) tile coordinates, GROUP consecutive a-tiles per sweep over b (L2
    reuse). Programs are independent: the order never changes a value."""
    width = GROUP * n_b
    first = (pid // width) * GROUP
    size = tl.minimum(n_a - first, GROUP)
    return first + (pid % width) % size, (pid % width) // size


@triton.jit
def fwd_stats_kernel(m_ptr, s_ptr, e_ptr, tg_ptr, logits_ptr,
                     h_ptr, w_ptr, tgt_ptr, h_desc, w_desc,
                     T, V_local, H, vocab_start, vocab_real, n_seg,
                     stride_ht, stride_wv, stride_lt, inv_temp,
                     ALIGN: tl.constexpr, SEG_V: tl.constexpr,
                     BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_T: tl.constexpr, USE_TMA: tl.constexpr,
                     DOT_DTYPE: tl.constexpr, WITH_ENTROPY: tl.constexpr, WITH_LOGITS: tl.constexpr,
                     INTERPRET: tl.constexpr, H_I: tl.constexpr):
    """Per-(segment, token) statistics of one token tile over one vocabulary segment.

    Grid: (cdiv(T, BLOCK_T) * n_seg,), program -> (token tile, segment) by ``_grouped`` with
    GROUP_T token tiles per sweep. Segment g of this shard covers local columns
    [b*ALIGN + j*SEG_V, min(b*ALIGN + (j+1)*SEG_V, (b+1)*ALIGN, V_local)) with
    b = g // cdiv(ALIGN, SEG_V), j = g % cdiv(ALIGN, SEG_V).
    Outputs (fp32, [S_local, T]): running max m, sum of exp(x - m) s, sum of exp(x - m) * x e
    (WITH_ENTROPY); tg [T] gets the target logit from the one program owning the target column.
    """
    SEGS_PER_BLOCK: tl.constexpr = (ALIGN + SEG_V - 1) // SEG_V
    pid_t, g = _grouped(tl.program_id(0), tl.cdiv(T, BLOCK_T), n_seg, GROUP_T)
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < T
    blk = g // SEGS_PER_BLOCK
    seg_lo = blk * ALIGN + (g % SEGS_PER_BLOCK) * SEG_V
    seg_hi = tl.minimum(tl.minimum(seg_lo + SEG_V, (blk + 1) * ALIGN), V_local)
    real_hi = tl.minimum(seg_hi, vocab_real - vocab_start)
    tcol = tl.load(tgt_ptr + rows, mask=rmask, other=-1) - vocab_start

    m = tl.full((BLOCK_T,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK_T,), tl.float32)
    e = tl.zeros((BLOCK_T,), tl.float32)
    tg = tl.full((BLOCK_T,), float("-inf"), tl.float32)
    # Reduction order (per token): the segment's BLOCK_V tiles ascending, online rule
    # m' = max(m, max_tile x); s' = s * exp(m - m') + sum_tile exp(x - m') (same for e with
    # exp(x - m') * x); within a tile tl.max / tl.sum over BLOCK_V columns (tree fixed by BLOCK_V
    # and num_warps, both pinned by the contract). Masked columns give exactly 0.
    for j0 in range(0, SEG_V, BLOCK_V):
        cols = seg_lo + j0 + tl.arange(0, BLOCK_V)
        # Reduction order: K in chunks of 64 ascending, one fp32 chain (see _tile_logits).
        acc = _tile_logits(h_ptr, w_ptr, h_desc, w_desc, rows, cols, pid_t * BLOCK_T, seg_lo + j0, T,
                           seg_hi, H, stride_ht, stride_wv, BLOCK_T, BLOCK_V, BLOCK_K, USE_TMA,
                           DOT_DTYPE, INTERPRET, H_I)
        # Temperature: one fp32 multiply by the fp32 reciprocal computed on the host; no bf16 rounding.
        x = acc * inv_temp
        valid = (cols < real_hi)[None, :]
        x = tl.where(valid, x, float("-inf"))
        if WITH_LOGITS:
            lp = logits_ptr + rows.to(tl.int64)[:, None] * stride_lt + cols[None, :]
            tl.store(lp, x, mask=rmask[:, None] & (cols < seg_hi)[None, :])
        m_new = tl.maximum(m, tl.max(x, axis=1))
        alpha = tl.where(m_new == m, 1.0, tl.exp(m - m_new))
        p = tl.where(valid, tl.exp(x - m_new[:, None]), 0.0)
        s = s * alpha + tl.sum(p, axis=1)
        if WITH_ENTROPY:
            e = e * alpha + tl.sum(tl.where(valid, p * x, 0.0), axis=1)
        hit = valid & (cols[None, :] == tcol[:, None])
        tg = tl.maximum(tg, tl.max(tl.where(hit, x, float("-inf")), axis=1))
        m = m_new
    off = g.to(tl.int64) * T + rows
    tl.store(m_ptr + off, m, mask=rmask)
    tl.store(s_ptr + off, s, mask=rmask)
    if WITH_ENTROPY:
        tl.store(e_ptr + off, e, mask=rmask)
    own = rmask & (tcol >= seg_lo) & (tcol < real_hi)
    tl.store(tg_ptr + rows, tg, mask=own)


@triton.jit
def merge_kernel(logp_ptr, lse_ptr, ent_ptr, m_ptr, s_ptr, e_ptr, tg_ptr, S, R, T,
                 WITH_ENTROPY: tl.constexpr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr,
                 S_I: tl.constexpr, R_I: tl.constexpr, UNROLL: tl.constexpr):
    """Folds per-segment statistics [S, T] (segments in ascending global order) into
    lse, logp (and entropy) [T]; tg is [R, T] (one row per shard, -inf where not owned).

    The segment loops advance UNROLL segments per trip (``tl.static_range``), so the loads of
    those segments are independent and issued together instead of one memory latency per
    segment; each row still sees segments 0..S-1 one at a time, in ascending order, with the
    same operations. Segments past S (the last trip) load m = -inf, s = e = 0: a max with -inf
    and an added exact +0.0 (ssum, esum >= +0) leave every byte as it was, so UNROLL is no bit
    field (it is a module constant, ``config.MERGE_UNROLL``).
    """
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rmask = rows < T
    T64 = tl.cast(T, tl.int64)  # segment offsets k * T in int64: S * T may pass 2**31 (600 segments x 3.6M rows)
    n_seg = S_I if INTERPRET else S
    big_m = tl.full((BLOCK,), float("-inf"), tl.float32)
    # Reduction order: max over segments (exact, order-free).
    for k0 in range(0, S_I if INTERPRET else S, UNROLL):
        for u in tl.static_range(UNROLL):
            k = k0 + u
            big_m = tl.maximum(big_m, tl.load(m_ptr + k * T64 + rows, mask=rmask & (k < n_seg), other=float("-inf")))
    tgt = tl.full((BLOCK,), float("-inf"), tl.float32)
    for r in range(0, R_I if INTERPRET else R):
        tgt = tl.maximum(tgt, tl.load(tg_ptr + r * T64 + rows, mask=rmask, other=float("-inf")))
    ssum = tl.zeros((BLOCK,), tl.float32)
    esum = tl.zeros((BLOCK,), tl.float32)
    # Reduction order: segments 0..S-1 ascending, ssum += s_k * exp(m_k - M) (a term whose
    # m_k is -inf, an all-padding segment, is exactly 0); esum likewise with e_k.
    for k0 in range(0, S_I if INTERPRET else S, UNROLL):
        for u in tl.static_range(UNROLL):
            k = k0 + u
            kmask = rmask & (k < n_seg)
            mk = tl.load(m_ptr + k * T64 + rows, mask=kmask, other=float("-inf"))
            scale = tl.where(mk == float("-inf"), 0.0, tl.exp(mk - big_m))
            ssum = ssum + tl.load(s_ptr + k * T64 + rows, mask=kmask, other=0.0) * scale
            if WITH_ENTROPY:
                esum = esum + tl.load(e_ptr + k * T64 + rows, mask=kmask, other=0.0) * scale
    ssum = tl.where(rmask, ssum, 1.0)  # rows past T: keep log() quiet; never stored
    lse = big_m + tl.log(ssum)
    tl.store(lse_ptr + rows, lse, mask=rmask)
    tl.store(logp_ptr + rows, tgt - lse, mask=rmask)
    if WITH_ENTROPY:
        tl.store(ent_ptr + rows, lse - tl.math.div_rn(esum, ssum), mask=rmask)


@triton.jit
def _grad_store(g_ptr, stride_gt, x, rows, lc, cols, rmask, col_hi, tgt_ptr, lse_ptr, ent_ptr, dlogp_ptr,
                dlse_ptr, dent_ptr, vocab_start, vocab_real, inv_temp,
                HAS_DLSE: tl.constexpr, HAS_DENT: tl.constexpr, INTERPRET: tl.constexpr):
    """The contract's gradient of one tile of temperature-scaled logits x [BLOCK_T, BLOCK_V] (local
    columns ``cols``), stored as bf16 at g[rows, lc]. The one copy of the backward formula: the
    recomputing kernel (bwd_grad) and the stored-logits kernel (grad_from_logits) both call it, so
    equal x gives equal G bytes.

    With p = exp(x - lse):
      dL/dx = dlogp * (onehot - p) + dlse * p - dent * p * (x - lse + entropy);
      dL/dacc = dL/dx * inv_temp, rounded once to bf16 (RNE). Columns >= min(col_hi,
      vocab_real - vocab_start) and rows >= T (rmask) give 0; columns >= col_hi are not stored.
    """
    valid = (cols < tl.minimum(col_hi, vocab_real - vocab_start))[None, :] & rmask[:, None]
    lse = tl.load(lse_ptr + rows, mask=rmask, other=0.0)
    p = tl.where(valid, tl.exp(x - lse[:, None]), 0.0)
    dl = tl.load(dlogp_ptr + rows, mask=rmask, other=0.0)
    tcol = tl.load(tgt_ptr + rows, mask=rmask, other=-1) - vocab_start
    onehot = cols[None, :] == tcol[:, None]
    gx = tl.where(onehot, dl[:, None], 0.0) - dl[:, None] * p
    if HAS_DLSE:
        gx = gx + tl.load(dlse_ptr + rows, mask=rmask, other=0.0)[:, None] * p
    if HAS_DENT:
        ent = tl.load(ent_ptr + rows, mask=rmask, other=0.0)
        de = tl.load(dent_ptr + rows, mask=rmask, other=0.0)
        gx = gx - de[:, None] * (p * ((x - lse[:, None]) + ent[:, None]))
    gx = tl.where(valid, gx, 0.0) * inv_temp
    gp = g_ptr + rows.to(tl.int64)[:, None] * stride_gt + lc[None, :]
    tl.store(gp, round_bf16(gx, INTERPRET), mask=rmask[:, None] & (cols < col_hi)[None, :])


@triton.jit
def bwd_grad_kernel(g_ptr, h_ptr, w_ptr, tgt_ptr, lse_ptr, ent_ptr, dlogp_ptr, dlse_ptr, dent_ptr,
                    h_desc, w_desc, T, V_local, H, col0, col_end, vocab_start, vocab_real,
                    stride_ht, stride_wv, stride_gt, inv_temp,
                    BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr,
                    BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr,
                    DOT_DTYPE: tl.constexpr, HAS_DLSE: tl.constexpr,
                    HAS_DENT: tl.constexpr, INTERPRET: tl.constexpr, H_I: tl.constexpr):
    """Recomputes logits of local columns [col0, col_end) and writes the bf16 gradient
    w.r.t. the pre-temperature logits (dL/dacc) into g [T, col_end - col0] (formula: _grad_store).

    Grid: (cdiv(T, BLOCK_T), cdiv(col_end - col0, BLOCK_V)). Every element is its own
    computation, so the chunking never changes a byte.
    """
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    lc = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    cols = col0 + lc
    rmask = rows < T
    col_hi = tl.minimum(col_end, V_local)
    # Reduction order: K in chunks of 64 ascending, one fp32 chain (see _tile_logits).
    acc = _tile_logits(h_ptr, w_ptr, h_desc, w_desc, rows, cols, tl.program_id(0) * BLOCK_T,
                       col0 + tl.program_id(1) * BLOCK_V, T, col_hi, H, stride_ht, stride_wv,
                       BLOCK_T, BLOCK_V, BLOCK_K, USE_TMA, DOT_DTYPE, INTERPRET, H_I)
    # Temperature: one fp32 multiply by the fp32 reciprocal computed on the host; no bf16 rounding.
    x = acc * inv_temp
    _grad_store(g_ptr, stride_gt, x, rows, lc, cols, rmask, col_hi, tgt_ptr, lse_ptr, ent_ptr, dlogp_ptr,
                dlse_ptr, dent_ptr, vocab_start, vocab_real, inv_temp, HAS_DLSE, HAS_DENT, INTERPRET)


@triton.jit
def grad_from_logits_kernel(g_ptr, x_ptr, tgt_ptr, lse_ptr, dlogp_ptr, T, V_local, vocab_start,
                            vocab_real, stride_xt, stride_gt, inv_temp,
                            BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, INTERPRET: tl.constexpr):
    """bwd_grad's G from stored logits instead of recomputed ones: x [T, V_local] fp32 is the
    forward's ``return_logits`` output (temperature-scaled, -inf past vocab_real), g [T, V_local]
    bf16 gets dL/dacc for the dlogp term only (formula: _grad_store). Elementwise, no reduction:
    the tile shape never changes a byte, and G equals bwd_grad's wherever x equals its recomputed
    logits (GPU test: fused_test). Grid: (cdiv(T, BLOCK_T), cdiv(V_local, BLOCK_V)).
    """
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < T
    xp = x_ptr + rows.to(tl.int64)[:, None] * stride_xt + cols[None, :]
    x = tl.load(xp, mask=rmask[:, None] & (cols < V_local)[None, :], other=0.0)
    _grad_store(g_ptr, stride_gt, x, rows, cols, cols, rmask, V_local, tgt_ptr, lse_ptr, lse_ptr, dlogp_ptr,
                lse_ptr, lse_ptr, vocab_start, vocab_real, inv_temp, False, False, INTERPRET)


@triton.jit
def gemm_kernel(c_ptr, a_ptr, b_ptr, a_desc, b_desc, M, N, K,
                stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                ACC_IN: tl.constexpr, OUT_BF16: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, USE_TMA: tl.constexpr, A_KM: tl.constexpr, B_KN: tl.constexpr,
                DOT_DTYPE: tl.constexpr, INTERPRET: tl.constexpr, K_I: tl.constexpr):
    """C[M, N] = A[M, K] @ B[K, N]. With ACC_IN, C holds fp32 partial sums and the K walk
    continues from them (bitwise the same chain as one longer walk).

    Pointer path: any strides. TMA path: descriptors with unit inner stride (zero fill past the
    edges): a_desc over A stored [M, K] (or [K, M] when A_KM, i.e. A^T row-major), b_desc over B
    stored [K, N] when B_KN (else B^T [N, K]). Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),),
    program -> tile by ``_grouped`` (GROUP_M row tiles per sweep)."""
    pid_m, pid_n = _grouped(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = (rm < M)[:, None] & (rn < N)[None, :]
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn.to(tl.int64)[None, :] * stride_cn
    if ACC_IN:
        acc = tl.load(c_ptrs, mask=cmask, other=0.0)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    a_base = a_ptr + rm.to(tl.int64)[:, None] * stride_am
    b_base = b_ptr + rn.to(tl.int64)[None, :] * stride_bn
    # Reduction order: K in chunks of BLOCK_K=64 ascending, fp32 accumulator chained through
    # tl.dot; the K tail is zero-filled (adds exact zeros).
    if USE_TMA:
        for k0 in range(0, K_I if INTERPRET else K, BLOCK_K):
            if A_KM:
                a = tl.trans(a_desc.load([k0, pid_m * BLOCK_M]))
            else:
                a = a_desc.load([pid_m * BLOCK_M, k0])
            if B_KN:
                b = b_desc.load([k0, pid_n * BLOCK_N])
            else:
                b = tl.trans(b_desc.load([pid_n * BLOCK_N, k0]))
            if DOT_DTYPE != tl.bfloat16:
                a = a.to(tl.float32).to(DOT_DTYPE)
                b = b.to(tl.float32).to(DOT_DTYPE)
            acc = _mma(a, b, acc, DOT_DTYPE)
    else:
        for k0 in range(0, K_I if INTERPRET else K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            kk = ks.to(tl.int64)
            a = tl.load(a_base + kk[None, :] * stride_ak, mask=(rm < M)[:, None] & (ks < K)[None, :],
                        other=0.0).to(tl.float32).to(DOT_DTYPE)
            b = tl.load(b_base + kk[:, None] * stride_bk, mask=(ks < K)[:, None] & (rn < N)[None, :],
                        other=0.0).to(tl.float32).to(DOT_DTYPE)
            acc = _mma(a, b, acc, DOT_DTYPE)
    if OUT_BF16:
        tl.store(c_ptrs, round_bf16(acc, INTERPRET), mask=cmask)
    else:
        tl.store(c_ptrs, acc, mask=cmask)


@triton.jit
def scale_kernel(x_ptr, s_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr, OUT_BF16: tl.constexpr,
                 INTERPRET: tl.constexpr):
    """x[i] = round(fp32(x[i]) * s) in place over a contiguous buffer of n elements (bf16 when
    OUT_BF16, else fp32), s = the fp32 scalar at s_ptr, read on the device (no host sync).

    Every program loads s first; when s == 1.0 it touches no element (the bytes stay exactly what
    they were, also under the interpreter, which writes back what it read). Otherwise each element
    gets one fp32 multiply and, for bf16, one RNE rounding (``round_bf16``): the bytes of torch's
    ``(x.float() * s).to(x.dtype)`` (NaN payloads aside). Elementwise, no reduction: BLOCK, ITERS
    and the grid never change a byte. Grid: (cdiv(n, BLOCK * ITERS),); program p covers elements
    [p * BLOCK * ITERS, (p + 1) * BLOCK * ITERS).
    """
    s = tl.load(s_ptr)
    if s != 1.0:
        base = tl.program_id(0).to(tl.int64) * (BLOCK * ITERS)
        for i in range(ITERS):
            offs = base + i * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            y = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) * s
            if OUT_BF16:
                tl.store(x_ptr + offs, round_bf16(y, INTERPRET), mask=mask)
            else:
                tl.store(x_ptr + offs, y, mask=mask)
