"""Triton kernels of contract ``attn.v2`` (forward: prefill, chunked prefill, paged decode).

Every forward kernel computes each query row with the same three jit routines, so a row's bytes
do not depend on which kernel, tile, page layout or split schedule computed it:

* :func:`_online_step` - one KV chunk (KV_CHUNK=64 positions) of the online softmax;
* :func:`_fold` - the left fold that merges one KV segment's state (SEG positions) into the
  running state, in ascending segment order;
* :func:`_finalize` - the single division, the LSE formula, and the canonical zero.

Scores live in the log2 domain: ``s2 = fp32(q . k) * qk_scale`` with
``qk_scale = fp32(scale * log2(e))`` computed on the host. Masked lanes have ``s2 = -inf`` and
their K/V are loaded as 0, so garbage in unused cache slots never reaches a product.
Row sums of ``p`` are taken with the MMA (``p @ ones[KV_CHUNK, 16]``), like the GEMM rows that
are measured bit-identical across BLOCK_M, instead of a ``tl.sum`` whose tree follows the layout.
"""

import triton
import triton.language as tl

from rlk.kernels.common import round_bf16

NEG_INF = float("-inf")


@triton.jit
def _mma(a, b, acc, DOT_DTYPE: tl.constexpr):
    """``acc + a @ b`` with an fp32 accumulator. GPU: one ``tl.dot`` (MMA into acc). Under the
    CPU interpreter (DOT_DTYPE fp64) the dot is an exact fp64 sum rounded once to fp32 and then
    added: numpy's fp32 matmul sums in an order that depends on a row's place in the tile, which
    would break row invariance on CPU only (the model gemm.bf16.v1 and logp.v2 use too)."""
    if DOT_DTYPE == tl.float64:
        return acc + tl.dot(a, b, out_dtype=tl.float64).to(tl.float32)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _mm(a, b, DOT_DTYPE: tl.constexpr):
    """``a @ b`` in fp32 (from zero): see :func:`_mma`."""
    if DOT_DTYPE == tl.float64:
        return tl.dot(a, b, out_dtype=tl.float64).to(tl.float32)
    else:
        return tl.dot(a, b)


@triton.jit
def _online_step(s2, m, l_mat, acc, v, ones, DOT_DTYPE: tl.constexpr):
    """One KV chunk. s2 [BM, C] log2-domain scores (-inf where masked); v [C, D] fp32 (0 where
    masked); m [BM]; l_mat [BM, 16] (every column holds the running row sum); acc [BM, D]."""
    # Reduction order: row max over the chunk (max is exact, order-free).
    m_new = tl.maximum(m, tl.max(s2, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    # alpha is exactly 1 whenever the running max does not change (fully masked chunks are no-ops).
    alpha = tl.where(m_new == m, 1.0, tl.exp2(m - m_safe))
    p = tl.exp2(s2 - m_safe[:, None])
    pd = p.to(DOT_DTYPE)
    # Reduction order: MMA over the chunk's 64 positions into the rescaled fp32 accumulator
    # (row sum through the same MMA form, against a ones matrix).
    l_mat = _mma(pd, ones, l_mat * alpha[:, None], DOT_DTYPE)
    acc = _mma(pd, v.to(DOT_DTYPE), acc * alpha[:, None], DOT_DTYPE)
    return m_new, l_mat, acc


@triton.jit
def _fold(m1, l1, acc1, m2, l2, acc2):
    """Left fold of segment states (state 1 = running, state 2 = next segment)."""
    m = tl.maximum(m1, m2)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    a1 = tl.where(m1 == m, 1.0, tl.exp2(m1 - m_safe))
    a2 = tl.where(m2 == m, 1.0, tl.exp2(m2 - m_safe))
    l = l1 * a1 + l2 * a2
    acc = acc1 * a1[:, None] + acc2 * a2[:, None]
    return m, l, acc


@triton.jit
def _finalize(m, l, acc):
    """out = acc / l (0 for rows with no key), +0.0 canonicalizes -0; lse = (m + log2 l) * ln2."""
    valid = l > 0.0
    l_safe = tl.where(valid, l, 1.0)
    out = tl.where(valid[:, None], acc / l_safe[:, None], 0.0) + 0.0
    lse = tl.where(valid, (m + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    return out, lse


@triton.jit
def _chunk(c, q, pos, row_valid, kv_len, k_base, v_base, bt_row, tok0, m, l_mat, acc, ones,
           stride_kt, stride_kb, stride_vt, stride_vb, qk_scale,
           HEAD_DIM: tl.constexpr, KV_CHUNK: tl.constexpr, PAGE: tl.constexpr,
           PAGED: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Loads the KV chunk [c, c + KV_CHUNK) (masked lanes as 0) and runs the online step."""
    j = c + tl.arange(0, KV_CHUNK)
    offs_d = tl.arange(0, HEAD_DIM)
    col_valid = j < kv_len
    if PAGED:
        blk = tl.load(bt_row + j // PAGE, mask=col_valid, other=0).to(tl.int64)
        k_rows = blk * stride_kb + (j % PAGE).to(tl.int64) * stride_kt
        v_rows = blk * stride_vb + (j % PAGE).to(tl.int64) * stride_vt
    else:
        k_rows = (tok0 + j).to(tl.int64) * stride_kt
        v_rows = (tok0 + j).to(tl.int64) * stride_vt
    k = tl.load(k_base + k_rows[:, None] + offs_d[None, :], mask=col_valid[:, None], other=0.0)
    v = tl.load(v_base + v_rows[:, None] + offs_d[None, :], mask=col_valid[:, None], other=0.0)
    k = k.to(tl.float32)
    v = v.to(tl.float32)
    # Reduction order: MMA over head_dim, fp32 accumulator from 0.
    s = _mm(q, tl.trans(k.to(DOT_DTYPE)), DOT_DTYPE)
    s2 = s * qk_scale
    keep = row_valid[:, None] & col_valid[None, :] & (j[None, :] <= pos[:, None])
    s2 = tl.where(keep, s2, float("-inf"))
    return _online_step(s2, m, l_mat, acc, v, ones, DOT_DTYPE)


@triton.jit
def _segment(q, pos, row_valid, seg_start, seg_end, kv_len, k_base, v_base, bt_row, tok0,
             stride_kt, stride_kb, stride_vt, stride_vb, qk_scale,
             BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, KV_CHUNK: tl.constexpr,
             PAGE: tl.constexpr, PAGED: tl.constexpr, DOT_DTYPE: tl.constexpr,
             INTERPRET: tl.constexpr):
    """Fresh state, then chunks [seg_start, seg_end) of one segment in ascending order."""
    ones = tl.full((KV_CHUNK, 16), 1.0, tl.float32).to(DOT_DTYPE)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_mat = tl.zeros((BLOCK_M, 16), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    # Reduction order: chunks of KV_CHUNK ascending (the loop form differs only because the
    # interpreter cannot take a data-dependent range() bound under numpy >= 2.4; same steps).
    if INTERPRET:
        c = seg_start
        while c < seg_end:
            m, l_mat, acc = _chunk(c, q, pos, row_valid, kv_len, k_base, v_base, bt_row, tok0,
                                   m, l_mat, acc, ones, stride_kt, stride_kb, stride_vt, stride_vb,
                                   qk_scale, HEAD_DIM, KV_CHUNK, PAGE, PAGED, DOT_DTYPE)
            c += KV_CHUNK
    else:
        for c in range(seg_start, seg_end, KV_CHUNK):
            m, l_mat, acc = _chunk(c, q, pos, row_valid, kv_len, k_base, v_base, bt_row, tok0,
                                   m, l_mat, acc, ones, stride_kt, stride_kb, stride_vt, stride_vb,
                                   qk_scale, HEAD_DIM, KV_CHUNK, PAGE, PAGED, DOT_DTYPE)
    # Every column of l_mat holds the same row sum: max picks it exactly.
    l = tl.max(l_mat, axis=1)
    return m, l, acc


@triton.jit
def attn_fwd_kernel(
    out_ptr, lse_ptr, ws_m_ptr, ws_l_ptr, ws_acc_ptr,
    q_ptr, k_ptr, v_ptr, bt_ptr, cu_q_ptr, kv_len_ptr,
    qk_scale, NSPLIT,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_lh,
    stride_kt, stride_kh, stride_kb, stride_vt, stride_vh, stride_vb, stride_btb,
    stride_wt, stride_wh, stride_ws,
    G: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
    KV_CHUNK: tl.constexpr, SEG: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr,
    SPLIT: tl.constexpr, DOT_DTYPE: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Grid: (query tiles * NSPLIT, Hk * (G // GP), B).

    A tile holds BLOCK_M rows = (BLOCK_M // GP) query tokens of one sequence x GP q heads of one
    KV head's group. Prefill: PAGED=0 and kv_len = q_len (both from cu_q). Paged: query i sits at
    position kv_len - q_len + i. SPLIT: this program computes one segment (index
    program_id(0) % NSPLIT) and writes its (m, l, acc) to the workspace; attn_merge_kernel folds
    them. Otherwise the segments are folded here, in registers, by the same rule.
    """
    tile = tl.program_id(0) // NSPLIT
    split = tl.program_id(0) % NSPLIT
    hk = tl.program_id(1)
    b = tl.program_id(2)
    NG: tl.constexpr = G // GP
    TPT: tl.constexpr = BLOCK_M // GP
    kvh = hk // NG
    hg = hk % NG
    q_start = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_start
    if PAGED:
        kv_len = tl.load(kv_len_ptr + b)
        tok0 = 0
    else:
        kv_len = q_len
        tok0 = q_start
    t_lo = tile * TPT
    if t_lo >= q_len:
        return
    t_hi = tl.minimum(t_lo + TPT, q_len)
    # Keys any row of this tile may see: [0, kv_hi).
    kv_hi = tl.maximum(tl.minimum(kv_len - q_len + t_hi, kv_len), 0)
    seg_lo = split
    if SPLIT:
        if seg_lo * SEG >= kv_hi:
            return

    r = tl.arange(0, BLOCK_M)
    t_loc = t_lo + r // GP
    head = kvh * G + hg * GP + r % GP
    row_valid = (r < TPT * GP) & (t_loc < q_len)
    pos = kv_len - q_len + t_loc
    tok = (q_start + t_loc).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_valid[:, None], other=0.0)
    q = q.to(tl.float32).to(DOT_DTYPE)
    k_base = k_ptr + kvh * stride_kh
    v_base = v_ptr + kvh * stride_vh
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb

    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    # Reduction order: segments of SEG positions ascending, each from a fresh state, left-folded
    # into the running state (starting from the empty state) by _fold.
    if SPLIT:
        m_s, l_s, acc_s = _segment(q, pos, row_valid, seg_lo * SEG, tl.minimum(seg_lo * SEG + SEG, kv_hi),
                                   kv_len, k_base, v_base, bt_row, tok0, stride_kt, stride_kb,
                                   stride_vt, stride_vb, qk_scale, BLOCK_M, HEAD_DIM, KV_CHUNK,
                                   PAGE, PAGED, DOT_DTYPE, INTERPRET)
        w = tok * stride_wt + head * stride_wh + seg_lo * stride_ws
        tl.store(ws_m_ptr + w, m_s, mask=row_valid)
        tl.store(ws_l_ptr + w, l_s, mask=row_valid)
        tl.store(ws_acc_ptr + w[:, None] * HEAD_DIM + offs_d[None, :], acc_s, mask=row_valid[:, None])
    else:
        # Reduction order: segments ascending, each from a fresh state, left-folded into the
        # running state (starting from the empty state) by _fold.
        s_start = kv_hi * 0
        while s_start < kv_hi:
            s_end = tl.minimum(s_start + SEG, kv_hi)
            m_s, l_s, acc_s = _segment(q, pos, row_valid, s_start, s_end, kv_len, k_base, v_base,
                                       bt_row, tok0, stride_kt, stride_kb, stride_vt, stride_vb,
                                       qk_scale, BLOCK_M, HEAD_DIM, KV_CHUNK, PAGE, PAGED,
                                       DOT_DTYPE, INTERPRET)
            m, l, acc = _fold(m, l, acc, m_s, l_s, acc_s)
            s_start += SEG
    if not SPLIT:
        out, lse = _finalize(m, l, acc)
        tl.store(out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                 round_bf16(out, INTERPRET), mask=row_valid[:, None])
        tl.store(lse_ptr + tok * stride_lt + head * stride_lh, lse, mask=row_valid)


@triton.jit
def attn_merge_kernel(
    out_ptr, lse_ptr, ws_m_ptr, ws_l_ptr, ws_acc_ptr, cu_q_ptr, kv_len_ptr,
    stride_ot, stride_oh, stride_lt, stride_lh, stride_wt, stride_wh, stride_ws,
    G: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, SEG: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Grid: (max q_len, Hk, B). Folds the segment partials of one token's G q heads in
    ascending segment order (the same _fold as the in-register path) and finalizes."""
    t_loc = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_start
    if t_loc >= q_len:
        return
    kv_len = tl.load(kv_len_ptr + b)
    pos = kv_len - q_len + t_loc
    n_seg = tl.cdiv(tl.maximum(pos + 1, 0), SEG)
    g = tl.arange(0, BLOCK_G)
    row_valid = g < G
    head = kvh * G + g
    tok = (q_start + t_loc).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, HEAD_DIM), tl.float32)
    # Reduction order: segments ascending, left fold from the empty state (as in attn_fwd_kernel).
    sg = n_seg * 0
    while sg < n_seg:
        w = tok * stride_wt + head * stride_wh + sg * stride_ws
        m_s = tl.load(ws_m_ptr + w, mask=row_valid, other=float("-inf"))
        l_s = tl.load(ws_l_ptr + w, mask=row_valid, other=0.0)
        acc_s = tl.load(ws_acc_ptr + w[:, None] * HEAD_DIM + offs_d[None, :],
                        mask=row_valid[:, None], other=0.0)
        m, l, acc = _fold(m, l, acc, m_s, l_s, acc_s)
        sg += 1
    out, lse = _finalize(m, l, acc)
    tl.store(out_ptr + tok * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             round_bf16(out, INTERPRET), mask=row_valid[:, None])
    tl.store(lse_ptr + tok * stride_lt + head * stride_lh, lse, mask=row_valid)


@triton.jit
def write_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
                    stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_cb, stride_cs, stride_ch, stride_vcb, stride_vcs, stride_vch,
                    HK: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
                    PAGE: tl.constexpr):
    """Grid: (T,). Exact copy of one token's K and V rows (all KV heads) into its cache slot;
    slot < 0 means padding (nothing written). No arithmetic: bytes are moved unchanged."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t)
    if slot < 0:
        return
    blk = slot // PAGE
    off = slot % PAGE
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, HEAD_DIM)
    mask = (h < HK)[:, None]
    k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    tl.store(kc_ptr + blk * stride_cb + off * stride_cs + h[:, None] * stride_ch + d[None, :], k,
             mask=mask)
    tl.store(vc_ptr + blk * stride_vcb + off * stride_vcs + h[:, None] * stride_vch + d[None, :], v,
             mask=mask)
