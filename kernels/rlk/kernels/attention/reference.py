"""Plain-torch specification of ``attn.v2`` (float64 by default). Kernels never import this.

Casting contract: inputs bf16; the kernels compute scores and the online softmax in fp32 with
bf16 (GPU) / fp32 (interpreter) dot operands and round the output once to bf16 (RNE); the LSE
stays fp32 in natural-log units. This reference computes exact softmax attention in float64
(causal, GQA: q head h reads kv head h // (Hq / Hk)); rows with no visible key give out 0 and
lse -inf.
"""

from __future__ import annotations

import torch


def attention_rows(q, k, v, positions, scale, dtype=torch.float64):
    """q [Tq, Hq, D] at absolute ``positions`` [Tq] against k, v [L, Hk, D] (positions 0..L-1).
    Returns out [Tq, Hq, D] and lse [Tq, Hq] in ``dtype``."""
    hq, hk = q.shape[1], k.shape[1]
    g = hq // hk
    qd, kd, vd = q.to(dtype), k.to(dtype).repeat_interleave(g, dim=1), v.to(dtype).repeat_interleave(g, dim=1)
    s = torch.einsum("thd,lhd->htl", qd, kd) * scale
    keys = torch.arange(k.shape[0], device=q.device)
    mask = keys[None, :] <= positions.to(q.device)[:, None]  # [Tq, L]
    s = s.masked_fill(~mask[None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [H, Tq]
    p = torch.where(mask[None], torch.exp(s - lse[..., None].clamp_min(-1e300)), torch.zeros_like(s))
    out = torch.einsum("htl,lhd->thd", p, vd)
    return out, lse.transpose(0, 1).contiguous()


def prefill_reference(q, k, v, cu_seqlens, scale, dtype=torch.float64):
    """Packed causal varlen attention: out [T, Hq, D], lse [T, Hq] in ``dtype``."""
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=dtype, device=q.device)
    cu = cu_seqlens.tolist()
    for a, b in zip(cu[:-1], cu[1:]):
        if b > a:
            o, l = attention_rows(q[a:b], k[a:b], v[a:b], torch.arange(b - a), scale, dtype)
            out[a:b], lse[a:b] = o, l
    return out, lse


def gather_pages(cache, block_table, length):
    """Dense [length, Hk, D] copy of one sequence's cached K or V."""
    page = cache.shape[1]
    if length == 0:
        return cache.new_zeros((0,) + tuple(cache.shape[2:]))
    n = (length + page - 1) // page
    return cache[block_table[:n].long()].reshape(n * page, *cache.shape[2:])[:length]


def paged_reference(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens_kv, scale, dtype=torch.float64):
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=dtype, device=q.device)
    cu = cu_seqlens_q.tolist()
    for b, (a, e) in enumerate(zip(cu[:-1], cu[1:])):
        kv = int(seq_lens_kv[b])
        if e == a or kv == 0:
            continue
        k = gather_pages(k_cache, block_tables[b], kv)
        v = gather_pages(v_cache, block_tables[b], kv)
        pos = torch.arange(kv - (e - a), kv)
        out[a:e], lse[a:e] = attention_rows(q[a:e], k, v, pos, scale, dtype)
    return out, lse


def prefill_backward_reference(do, q, k, v, cu_seqlens, scale, dtype=torch.float64):
    """(dq, dk, dv) of the reference forward by float64 autograd."""
    qd, kd, vd = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
    out, _ = prefill_reference(qd, kd, vd, cu_seqlens, scale, dtype)
    out.backward(do.to(dtype))
    return qd.grad, kd.grad, vd.grad
