"""Triton kernels of the strict row ops (``@triton.jit`` only; host code is in ``launch.py``).

Common rules (contracts ``rmsnorm.v1``, ``rope.v1``, ``swiglu.v1``, ``embedding.v1``):
  * every load is upcast to fp32 at once; all math is fp32; outputs are rounded once to bf16
    with :func:`round_bf16` (RNE on GPU and under the interpreter) unless the contract names a
    second rounding point (RMSNorm's normalized value, Hugging Face order);
  * divisions and square roots are the correctly rounded ``div_rn`` / ``sqrt_rn``;
  * every launch pins ``enable_fp_fusion=False`` (no FMA contraction);
  * rows are independent: a row's bytes never depend on the other rows, the row count or the
    row's position in the batch; every tile size is pinned per non-batch dim (config table).
"""

import triton
import triton.language as tl

from rlk.kernels.common import round_bf16


@triton.jit
def _round_out(x, OUT_BF16: tl.constexpr, INTERPRET: tl.constexpr):
    if OUT_BF16:
        return round_bf16(x, INTERPRET)
    else:
        return x


# ----------------------------------------------------------------------------------- RMSNorm
@triton.jit
def rmsnorm_fwd_kernel(
    y_ptr, res_out_ptr, x_ptr, r_ptr, w_ptr,
    n_rows, NH, stride_xt, stride_xh, stride_rt, H_F, eps,
    H: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_ROWS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, OUT_BF16: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Rows of ``x`` are addressed as (token t = row // NH, head h = row % NH) so a strided
    q/k view of a fused QKV output needs no copy. Outputs are contiguous [n_rows, H]."""
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    rmask = rows < n_rows
    cmask = cols < H
    mask = rmask[:, None] & cmask[None, :]
    x_off = (rows // NH) * stride_xt + (rows % NH) * stride_xh
    x = tl.load(x_ptr + x_off[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + (rows * stride_rt)[:, None] + cols[None, :], mask=mask, other=0.0)
        s = _round_out(x + r.to(tl.float32), OUT_BF16, INTERPRET)
        tl.store(res_out_ptr + (rows * H)[:, None] + cols[None, :], s, mask=mask)
        # The norm reads the *rounded* new residual: fused == add-then-norm, byte for byte.
        x = s.to(tl.float32)
    # Reduction order: per row, tl.sum over the BLOCK_H lanes of one [BLOCK_ROWS, BLOCK_H]
    # fp32 tile (masked lanes add +0.0); the tree is Triton's lowering for the pinned
    # (BLOCK_ROWS, BLOCK_H, num_warps) of the config table, never chosen from n_rows.
    ss = tl.sum(x * x, axis=1)
    rstd = tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.math.div_rn(ss, H_F) + eps))
    n = x * rstd[:, None]
    # Hugging Face order: the normalized value is rounded to the activation dtype first.
    n = _round_out(n, OUT_BF16, INTERPRET).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    y = _round_out(n * w[None, :], OUT_BF16, INTERPRET)
    tl.store(y_ptr + (rows * H)[:, None] + cols[None, :], y, mask=mask)


@triton.jit
def rmsnorm_bwd_kernel(
    dx_ptr, dwp_ptr, dy_ptr, x_ptr, w_ptr, dres_ptr,
    n_rows, NH, stride_xt, stride_xh, H_F, eps,
    H: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_ROWS: tl.constexpr, BWD_TILES: tl.constexpr,
    HAS_DRES: tl.constexpr, OUT_BF16: tl.constexpr, INTERPRET: tl.constexpr,
):
    """dx for BWD_TILES consecutive row tiles, and this program's fp32 partial of dw.

    dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd (fp32, rounding points
    of the forward treated as identity); dw partial = sum over the rows of dy * round(xhat).
    With HAS_DRES the gradient of the fused residual output is added after dx's own rounding
    (round(round(dx) + dres): the bytes autograd gives for the unfused add + norm).
    """
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    cmask = cols < H
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    acc = tl.zeros((BLOCK_ROWS, BLOCK_H), dtype=tl.float32)
    for it in range(BWD_TILES):
        rows = (pid * BWD_TILES + it) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS).to(tl.int64)
        mask = (rows < n_rows)[:, None] & cmask[None, :]
        x_off = (rows // NH) * stride_xt + (rows % NH) * stride_xh
        x = tl.load(x_ptr + x_off[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        o_off = (rows * H)[:, None] + cols[None, :]
        dy = tl.load(dy_ptr + o_off, mask=mask, other=0.0).to(tl.float32)
        # Reduction order: as in the forward (same tile, same pinned tree).
        ss = tl.sum(x * x, axis=1)
        rstd = tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.math.div_rn(ss, H_F) + eps))
        xhat = x * rstd[:, None]
        g = dy * w[None, :]
        # Reduction order: same tree as the sum of squares.
        dot = tl.sum(g * xhat, axis=1)
        c = tl.math.div_rn(dot, H_F)
        dx = (g - xhat * c[:, None]) * rstd[:, None]
        dx = _round_out(dx, OUT_BF16, INTERPRET)
        if HAS_DRES:
            dres = tl.load(dres_ptr + o_off, mask=mask, other=0.0).to(tl.float32)
            dx = _round_out(dx.to(tl.float32) + dres, OUT_BF16, INTERPRET)
        tl.store(dx_ptr + o_off, dx, mask=mask)
        # Reduction order (dw): slot (row % BLOCK_ROWS) accumulates its rows in ascending order.
        acc += dy * _round_out(xhat, OUT_BF16, INTERPRET).to(tl.float32)
    # Reduction order (dw): then tl.sum over the BLOCK_ROWS slots (pinned tree).
    part = tl.sum(acc, axis=0)
    tl.store(dwp_ptr + pid * H + cols, part, mask=cmask)


@triton.jit
def fold_partials_kernel(
    out_ptr, p_ptr, n_parts,
    H: tl.constexpr, BLOCK_F: tl.constexpr, FOLD_ROWS: tl.constexpr,
    OUT_BF16: tl.constexpr, INTERPRET: tl.constexpr,
):
    """out[c] = sum_b p[b, c] in a fixed order; one rounding at the store."""
    pid = tl.program_id(0)
    cols = pid * BLOCK_F + tl.arange(0, BLOCK_F)
    cmask = cols < H
    acc = tl.zeros((FOLD_ROWS, BLOCK_F), dtype=tl.float32)
    # Reduction order: slot j accumulates partials b = j, j + FOLD_ROWS, ... in ascending b
    # (fp32), then tl.sum over the FOLD_ROWS slots (tree pinned by FOLD_ROWS/BLOCK_F/num_warps).
    # (while, not range: the interpreter cannot iterate a range with a runtime bound)
    b0 = 0
    while b0 < n_parts:
        b = (b0 + tl.arange(0, FOLD_ROWS)).to(tl.int64)
        m = (b < n_parts)[:, None] & cmask[None, :]
        acc += tl.load(p_ptr + (b * H)[:, None] + cols[None, :], mask=m, other=0.0)
        b0 += FOLD_ROWS
    out = _round_out(tl.sum(acc, axis=0), OUT_BF16, INTERPRET)
    tl.store(out_ptr + cols, out, mask=cmask)


# -------------------------------------------------------------------------------------- RoPE
@triton.jit
def rope_kernel(
    out_ptr, x_ptr, pos_ptr, cos_ptr, sin_ptr,
    n_rows, NH, stride_xt, stride_xh, max_pos,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_ROWS: tl.constexpr,
    BACKWARD: tl.constexpr, OUT_BF16: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Rotate-half (NeoX) RoPE of BLOCK_ROWS (token, head) rows; BACKWARD: inverse rotation.

    out1 = x1*c - x2*s, out2 = x2*c + x1*s in fp32 (no FMA), one rounding. A position outside
    [0, max_pos) yields NaN (the host checks first whenever it may synchronize).
    """
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS).to(tl.int64)
    rmask = rows < n_rows
    t = rows // NH
    pos = tl.load(pos_ptr + t, mask=rmask, other=0).to(tl.int64)
    valid = (pos >= 0) & (pos < max_pos)
    pos = tl.where(valid, pos, 0)
    d = tl.arange(0, BLOCK_HALF)
    mask = rmask[:, None] & (d < HALF)[None, :]
    cs_off = (pos * HALF)[:, None] + d[None, :]
    c = tl.load(cos_ptr + cs_off, mask=mask, other=0.0)
    s = tl.load(sin_ptr + cs_off, mask=mask, other=0.0)
    c = tl.where(valid[:, None], c, float("nan"))
    if BACKWARD:
        s = -s
    x_off = (t * stride_xt + (rows % NH) * stride_xh)[:, None] + d[None, :]
    x1 = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + x_off + HALF, mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * c - x2 * s
    o2 = x2 * c + x1 * s
    o_off = (rows * (2 * HALF))[:, None] + d[None, :]
    tl.store(out_ptr + o_off, _round_out(o1, OUT_BF16, INTERPRET), mask=mask)
    tl.store(out_ptr + o_off + HALF, _round_out(o2, OUT_BF16, INTERPRET), mask=mask)


@triton.jit
def qk_norm_rope_kernel(
    q_ptr, k_ptr, x_ptr, wq_ptr, wk_ptr, pos_ptr, cos_ptr, sin_ptr,
    n_rows, NQ, NH, stride_xt, stride_xh, H_F, eps, max_pos,
    H: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_ROWS: tl.constexpr,
    OUT_BF16: tl.constexpr, INTERPRET: tl.constexpr,
):
    """QK-norm then RoPE of the q and k heads of one fused QKV output, in one pass.

    Row r is (token t = r // NH, head h = r % NH) of x, heads 0..NQ-1 being q (weight wq, out
    q[t, h]) and NQ..NH-1 being k (weight wk, out k[t, h - NQ]). The bytes are those of
    ``rope_kernel(rmsnorm_fwd_kernel(x))``: the norm lines are rmsnorm_fwd_kernel's (same tl.sum
    and roundings; the tile is norm_config(H)'s or a qk_norm_rope table tile measured
    byte-identical to it, ``schedule.qk_norm_rope_config``), and the rotation
    pairs each lane with its partner lane (d + HALF) % H of the same tile, normed the same way,
    so no value changes layout; o = y*c - yp*s below HALF, y*c + yp*s from HALF, one rounding.
    """
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    rmask = rows < n_rows
    cmask = cols < H
    mask = rmask[:, None] & cmask[None, :]
    t = rows // NH
    h = rows % NH
    x_off = t * stride_xt + h * stride_xh
    x = tl.load(x_ptr + x_off[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    ss = tl.sum(x * x, axis=1)
    rstd = tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.math.div_rn(ss, H_F) + eps))
    is_q = (h < NQ)[:, None]
    wq = tl.load(wq_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    wk = tl.load(wk_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    w = tl.where(is_q, wq[None, :], wk[None, :])
    n = _round_out(x * rstd[:, None], OUT_BF16, INTERPRET).to(tl.float32)
    y = _round_out(n * w, OUT_BF16, INTERPRET).to(tl.float32)
    # The partner lane of the rotation, normed exactly as its own lane is.
    pcols = (cols + HALF) % H
    xp = tl.load(x_ptr + x_off[:, None] + pcols[None, :], mask=mask, other=0.0).to(tl.float32)
    wqp = tl.load(wq_ptr + pcols, mask=cmask, other=0.0).to(tl.float32)
    wkp = tl.load(wk_ptr + pcols, mask=cmask, other=0.0).to(tl.float32)
    wp = tl.where(is_q, wqp[None, :], wkp[None, :])
    n_p = _round_out(xp * rstd[:, None], OUT_BF16, INTERPRET).to(tl.float32)
    yp = _round_out(n_p * wp, OUT_BF16, INTERPRET).to(tl.float32)
    pos = tl.load(pos_ptr + t, mask=rmask, other=0).to(tl.int64)
    valid = (pos >= 0) & (pos < max_pos)
    pos = tl.where(valid, pos, 0)
    d = cols % HALF
    cs_off = (pos * HALF)[:, None] + d[None, :]
    c = tl.load(cos_ptr + cs_off, mask=mask, other=0.0)
    s = tl.load(sin_ptr + cs_off, mask=mask, other=0.0)
    c = tl.where(valid[:, None], c, float("nan"))
    first = (cols < HALF)[None, :]
    o = tl.where(first, y * c - yp * s, y * c + yp * s)
    o = _round_out(o, OUT_BF16, INTERPRET)
    hq = tl.where(h < NQ, h, 0)
    hk = tl.where(h < NQ, 0, h - NQ)
    q_off = (t * NQ + hq) * H
    k_off = (t * (NH - NQ) + hk) * H
    tl.store(q_ptr + q_off[:, None] + cols[None, :], o, mask=mask & is_q)
    tl.store(k_ptr + k_off[:, None] + cols[None, :], o, mask=mask & (h >= NQ)[:, None])


# ------------------------------------------------------------------------------------ SwiGLU
@triton.jit
def swiglu_fwd_kernel(
    y_ptr, gu_ptr, n_elem, F, stride_gt,
    BLOCK: tl.constexpr, OUT_BF16: tl.constexpr, INTERPRET: tl.constexpr,
):
    """y = silu(g) * u, silu(g) = div_rn(g, 1 + exp(-g)); fp32, one rounding. Flat over T*F."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    m = e < n_elem
    t = e // F
    f = e % F
    g = tl.load(gu_ptr + t * stride_gt + f, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + t * stride_gt + F + f, mask=m, other=0.0).to(tl.float32)
    silu = tl.math.div_rn(g, 1.0 + tl.exp(-g))
    tl.store(y_ptr + e, _round_out(silu * u, OUT_BF16, INTERPRET), mask=m)


@triton.jit
def swiglu_bwd_kernel(
    dgu_ptr, dy_ptr, gu_ptr, n_elem, F, stride_gt,
    BLOCK: tl.constexpr, OUT_BF16: tl.constexpr, INTERPRET: tl.constexpr,
):
    """dg = dy * u * s * (1 + g * (1 - s)), du = dy * silu(g), s = div_rn(1, 1 + exp(-g))."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    m = e < n_elem
    t = e // F
    f = e % F
    g = tl.load(gu_ptr + t * stride_gt + f, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + t * stride_gt + F + f, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + e, mask=m, other=0.0).to(tl.float32)
    den = 1.0 + tl.exp(-g)
    s = tl.math.div_rn(1.0, den)
    silu = tl.math.div_rn(g, den)
    dg = dy * u * (s * (1.0 + g * (1.0 - s)))
    du = dy * silu
    tl.store(dgu_ptr + t * (2 * F) + f, _round_out(dg, OUT_BF16, INTERPRET), mask=m)
    tl.store(dgu_ptr + t * (2 * F) + F + f, _round_out(du, OUT_BF16, INTERPRET), mask=m)


# --------------------------------------------------------------------------------- Embedding
@triton.jit
def embedding_fwd_kernel(
    y_ptr, ids_ptr, w_ptr, T, V, H, stride_wv,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """y[t] = w[ids[t]] (exact copy: fp32 holds every bf16/fp16 value). Out-of-range -> NaN."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)
    c = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    tm = t < T
    m = tm[:, None] & (c < H)[None, :]
    i = tl.load(ids_ptr + t, mask=tm, other=0).to(tl.int64)
    valid = (i >= 0) & (i < V)
    src = (tl.where(valid, i, 0) * stride_wv)[:, None] + c[None, :]
    row = tl.load(w_ptr + src, mask=m, other=0.0).to(tl.float32)
    row = tl.where(valid[:, None], row, float("nan"))
    tl.store(y_ptr + (t * H)[:, None] + c[None, :], row.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def embedding_bwd_kernel(
    dw_ptr, dy_ptr, order_ptr, uniq_ptr, start_ptr, count_ptr, H,
    BLOCK_H: tl.constexpr, OUT_BF16: tl.constexpr, INTERPRET: tl.constexpr,
):
    """dW[id] = sum of dy[t] over the tokens t with ids[t] == id, one program per present id."""
    u = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    m = c < H
    vid = tl.load(uniq_ptr + u).to(tl.int64)
    start = tl.load(start_ptr + u).to(tl.int64)
    cnt = tl.load(count_ptr + u).to(tl.int64)
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    # Reduction order: the tokens of this id in ascending token index (stable sort), fp32,
    # one rounding at the store.
    k = start * 0
    while k < cnt:
        tok = tl.load(order_ptr + start + k).to(tl.int64)
        acc += tl.load(dy_ptr + tok * H + c, mask=m, other=0.0).to(tl.float32)
        k += 1
    tl.store(dw_ptr + vid * H + c, _round_out(acc, OUT_BF16, INTERPRET), mask=m)
