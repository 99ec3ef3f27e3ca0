"""Backward kernels of ``attn.v2`` (FA2 form, deterministic: no atomics, fixed loop orders).

p is recomputed from the saved LSE: ``p = exp2(fp32(q . k) * qk_scale - lse * log2(e))``.
dS = p * (dP - delta), delta = rowsum(dO * O). dQ = scale * dS @ K, dK = scale * dS^T @ Q,
dV = p^T @ dO. Each output element is written by exactly one program.
"""

import triton
import triton.language as tl

from rlk.kernels.attention.kernel import _mm, _mma
from rlk.kernels.common import round_bf16


@triton.jit
def bwd_delta_kernel(delta_ptr, o_ptr, do_ptr, T, stride_ot, stride_oh, stride_dt, stride_dh,
                     stride_delt, stride_delh, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Grid: (cdiv(T, BLOCK_M), Hq). delta[t, h] = sum_d dO * O in fp32."""
    t = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    h = tl.program_id(1)
    d = tl.arange(0, HEAD_DIM)
    mask = (t < T)[:, None]
    t64 = t.to(tl.int64)
    o = tl.load(o_ptr + t64[:, None] * stride_ot + h * stride_oh + d[None, :], mask=mask, other=0.0)
    do = tl.load(do_ptr + t64[:, None] * stride_dt + h * stride_dh + d[None, :], mask=mask, other=0.0)
    # Reduction order: tl.sum over head_dim, tree fixed by (BLOCK_M, HEAD_DIM, num_warps) of the
    # pinned config (backward needs run-to-run equality only).
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(delta_ptr + t64 * stride_delt + h * stride_delh, delta, mask=t < T)


@triton.jit
def _probs(q, k, lse2, offs_m, offs_n, seq_len, qk_scale, DOT_DTYPE: tl.constexpr):
    """p [BM, BN] recomputed from the LSE; 0 on causal-masked and out-of-range lanes."""
    s = _mm(q, tl.trans(k), DOT_DTYPE) * qk_scale
    keep = (offs_m[:, None] < seq_len) & (offs_n[None, :] < seq_len) & (offs_n[None, :] <= offs_m[:, None])
    return tl.where(keep, tl.exp2(s - lse2[:, None]), 0.0)


@triton.jit
def _dkdv_step(m0, h, start, seq_len, q_ptr, do_ptr, lse_ptr, delta_ptr, k, v, dk, dv, offs_n,
               qk_scale, stride_qt, stride_qh, stride_dot, stride_doh, stride_lt, stride_lh,
               BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_DTYPE: tl.constexpr):
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_ok = offs_m < seq_len
    tm = (start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + tm[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=m_ok[:, None], other=0.0).to(tl.float32).to(DOT_DTYPE)
    do = tl.load(do_ptr + tm[:, None] * stride_dot + h * stride_doh + offs_d[None, :],
                 mask=m_ok[:, None], other=0.0).to(tl.float32).to(DOT_DTYPE)
    lse2 = tl.load(lse_ptr + tm * stride_lt + h * stride_lh, mask=m_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + tm * stride_lt + h * stride_lh, mask=m_ok, other=0.0)
    p = _probs(q, k, lse2, offs_m, offs_n, seq_len, qk_scale, DOT_DTYPE)
    dv = _mma(tl.trans(p.to(DOT_DTYPE)), do, dv, DOT_DTYPE)
    dp = _mm(do, tl.trans(v), DOT_DTYPE)
    ds = p * (dp - delta[:, None])
    dk = _mma(tl.trans(ds.to(DOT_DTYPE)), q, dk, DOT_DTYPE)
    return dk, dv


@triton.jit
def bwd_dkdv_kernel(ws_dk_ptr, ws_dv_ptr, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, cu_ptr,
                    qk_scale,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_dot, stride_doh, stride_lt, stride_lh,
                    stride_wg, stride_wt, stride_wh,
                    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    HEAD_DIM: tl.constexpr, DOT_DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """Grid: (cdiv(max_seqlen, BLOCK_N), Hq, B). One program owns BLOCK_N keys of one KV head for
    ONE q head h of its group: it writes that head's fp32 partials dK_h, dV_h (unscaled) into the
    workspaces ws [G, T, Hk, D]; ``bwd_fold_kernel`` folds the G partials in ascending order."""
    n0 = tl.program_id(0) * BLOCK_N
    h = tl.program_id(1)
    b = tl.program_id(2)
    kvh = h // G
    g = h % G
    start = tl.load(cu_ptr + b)
    seq_len = tl.load(cu_ptr + b + 1) - start
    if n0 >= seq_len:
        return
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    n_mask = (offs_n < seq_len)[:, None]
    tn = (start + offs_n).to(tl.int64)
    k = tl.load(k_ptr + tn[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :], mask=n_mask, other=0.0)
    v = tl.load(v_ptr + tn[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :], mask=n_mask, other=0.0)
    k = k.to(tl.float32).to(DOT_DTYPE)
    v = v.to(tl.float32).to(DOT_DTYPE)
    dk = tl.zeros((BLOCK_N, HEAD_DIM), tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), tl.float32)
    m_first = (n0 // BLOCK_M) * BLOCK_M
    # Reduction order: query blocks ascending from the diagonal block; MMA accumulation into this
    # head's fp32 dK/dV partials (heads are folded later, ascending).
    # (while-loop under the interpreter only: numpy >= 2.4 rejects data-dependent range bounds.)
    if INTERPRET:
        m0 = m_first
        while m0 < seq_len:
            dk, dv = _dkdv_step(m0, h, start, seq_len, q_ptr, do_ptr, lse_ptr, delta_ptr, k, v,
                                dk, dv, offs_n, qk_scale, stride_qt, stride_qh, stride_dot,
                                stride_doh, stride_lt, stride_lh, BLOCK_M, HEAD_DIM, DOT_DTYPE)
            m0 += BLOCK_M
    else:
        for m0 in range(m_first, seq_len, BLOCK_M):
            dk, dv = _dkdv_step(m0, h, start, seq_len, q_ptr, do_ptr, lse_ptr, delta_ptr, k, v,
                                dk, dv, offs_n, qk_scale, stride_qt, stride_qh, stride_dot,
                                stride_doh, stride_lt, stride_lh, BLOCK_M, HEAD_DIM, DOT_DTYPE)
    w = g.to(tl.int64) * stride_wg + tn[:, None] * stride_wt + kvh * stride_wh + offs_d[None, :]
    tl.store(ws_dk_ptr + w, dk, mask=n_mask)
    tl.store(ws_dv_ptr + w, dv, mask=n_mask)


@triton.jit
def bwd_fold_kernel(dk_ptr, dv_ptr, ws_dk_ptr, ws_dv_ptr, T, scale,
                    stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_wg, stride_wt, stride_wh,
                    G: tl.constexpr, BLOCK_T: tl.constexpr, HEAD_DIM: tl.constexpr,
                    INTERPRET: tl.constexpr):
    """Grid: (cdiv(T, BLOCK_T), Hk). dK = scale * fold(dK_0..dK_{G-1}), dV = fold(dV_0..): fp32
    left fold from 0.0 over the group's q heads ascending, one bf16 rounding (tokens outside every
    sequence hold zero partials, so they get 0)."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    kvh = tl.program_id(1)
    d = tl.arange(0, HEAD_DIM)
    mask = (t < T)[:, None]
    t64 = t.to(tl.int64)
    w = t64[:, None] * stride_wt + kvh * stride_wh + d[None, :]
    dk = tl.zeros((BLOCK_T, HEAD_DIM), tl.float32)
    dv = tl.zeros((BLOCK_T, HEAD_DIM), tl.float32)
    # Reduction order: q heads of the group g = 0 .. G-1 ascending, fp32 adds (no FMA).
    for g in tl.static_range(G):
        dk = dk + tl.load(ws_dk_ptr + g * stride_wg + w, mask=mask, other=0.0)
        dv = dv + tl.load(ws_dv_ptr + g * stride_wg + w, mask=mask, other=0.0)
    dk = dk * scale
    tl.store(dk_ptr + t64[:, None] * stride_dkt + kvh * stride_dkh + d[None, :], round_bf16(dk, INTERPRET), mask=mask)
    tl.store(dv_ptr + t64[:, None] * stride_dvt + kvh * stride_dvh + d[None, :], round_bf16(dv, INTERPRET), mask=mask)


@triton.jit
def _dq_step(n0, kvh, start, seq_len, k_ptr, v_ptr, q, do, lse2, delta, dq, offs_m, qk_scale,
             stride_kt, stride_kh, stride_vt, stride_vh,
             BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_DTYPE: tl.constexpr):
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    n_mask = (offs_n < seq_len)[:, None]
    tn = (start + offs_n).to(tl.int64)
    k = tl.load(k_ptr + tn[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :],
                mask=n_mask, other=0.0).to(tl.float32).to(DOT_DTYPE)
    v = tl.load(v_ptr + tn[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :],
                mask=n_mask, other=0.0).to(tl.float32).to(DOT_DTYPE)
    p = _probs(q, k, lse2, offs_m, offs_n, seq_len, qk_scale, DOT_DTYPE)
    dp = _mm(do, tl.trans(v), DOT_DTYPE)
    ds = p * (dp - delta[:, None])
    return _mma(ds.to(DOT_DTYPE), k, dq, DOT_DTYPE)


@triton.jit
def bwd_dq_kernel(dq_ptr, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, cu_ptr,
                  qk_scale, scale,
                  stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                  stride_dot, stride_doh, stride_lt, stride_lh, stride_dqt, stride_dqh,
                  G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  HEAD_DIM: tl.constexpr, DOT_DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """Grid: (cdiv(max_seqlen, BLOCK_M), Hq, B). One program owns BLOCK_M query rows of a head."""
    m0 = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1)
    b = tl.program_id(2)
    kvh = h // G
    start = tl.load(cu_ptr + b)
    seq_len = tl.load(cu_ptr + b + 1) - start
    if m0 >= seq_len:
        return
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_ok = offs_m < seq_len
    tm = (start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + tm[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=m_ok[:, None], other=0.0).to(tl.float32).to(DOT_DTYPE)
    do = tl.load(do_ptr + tm[:, None] * stride_dot + h * stride_doh + offs_d[None, :],
                 mask=m_ok[:, None], other=0.0).to(tl.float32).to(DOT_DTYPE)
    lse2 = tl.load(lse_ptr + tm * stride_lt + h * stride_lh, mask=m_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + tm * stride_lt + h * stride_lh, mask=m_ok, other=0.0)
    dq = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    n_end = tl.minimum(m0 + BLOCK_M, seq_len)
    # Reduction order: KV blocks ascending up to the diagonal; MMA into the fp32 dQ accumulator.
    if INTERPRET:
        n0 = n_end * 0
        while n0 < n_end:
            dq = _dq_step(n0, kvh, start, seq_len, k_ptr, v_ptr, q, do, lse2, delta, dq, offs_m,
                          qk_scale, stride_kt, stride_kh, stride_vt, stride_vh, BLOCK_N, HEAD_DIM,
                          DOT_DTYPE)
            n0 += BLOCK_N
    else:
        for n0 in range(0, n_end, BLOCK_N):
            dq = _dq_step(n0, kvh, start, seq_len, k_ptr, v_ptr, q, do, lse2, delta, dq, offs_m,
                          qk_scale, stride_kt, stride_kh, stride_vt, stride_vh, BLOCK_N, HEAD_DIM,
                          DOT_DTYPE)
    dq = dq * scale
    tl.store(dq_ptr + tm[:, None] * stride_dqt + h * stride_dqh + offs_d[None, :],
             round_bf16(dq, INTERPRET), mask=m_ok[:, None])
