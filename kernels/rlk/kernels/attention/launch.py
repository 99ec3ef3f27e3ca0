"""Host side of ``attn.v2``: checks, fixed schedule lookup, grids, launches.

Every launch takes its block sizes from the per-architecture table (never from batch size or
sequence length). Value checks that need device data (lengths vs cache capacity, block ids)
read it back to the host; pass ``validate=False`` inside CUDA-graph capture (the default skips
them while a capture is active).
"""

from __future__ import annotations

import functools
import math

import torch
import triton.language as tl

from rlk.errors import UnsupportedConfigError
from rlk.kernels import plans
from rlk.kernels.attention import contract as attention_contract
from rlk.kernels.attention import schedule
from rlk.kernels.attention.contract import HEAD_DIMS, PAGE_SIZES
from rlk.kernels.attention.kernel import attn_fwd_kernel, attn_merge_kernel, write_kv_kernel
from rlk.kernels.attention.kernel_bwd import bwd_delta_kernel, bwd_dkdv_kernel, bwd_dq_kernel, bwd_fold_kernel
from rlk.kernels.common import (cdiv, check_tensor, device_value_checks_enabled, dot_dtype_for, interpret_flag,
                                launch_options, next_pow2, sm_count)
from rlk.kernels.launcher import LaunchSite, launch


def _dot(device):
    """``tl.dot`` operand dtype: bf16 on GPU, fp64 under the interpreter (exact dot sums, see
    kernel._mma)."""
    d = dot_dtype_for(device)
    return tl.float64 if d == tl.float32 else d


LOG2E = 1.4426950408889634
_ACT = (torch.bfloat16,)


def qk_scale_of(scale: float) -> float:
    """fp32(scale * log2(e)): the float64 product rounded once (RNE) to fp32."""
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise UnsupportedConfigError(f"attention: scale must be a finite positive float, got {scale!r}")
    return _fp32_scaled(float(scale))


@functools.lru_cache(maxsize=64)
def _fp32_scaled(scale: float) -> float:
    """fp32(scale * log2(e)) (memoized: a tensor round trip per launch costs host time)."""
    return torch.tensor(scale * LOG2E, dtype=torch.float64).to(torch.float32).item()


def _opts(sched: dict) -> dict:
    out = dict(launch_options())
    if out:  # GPU: the table's warps/stages are part of the launch
        for k in ("num_warps", "num_stages"):
            if k in sched:
                out[k] = sched[k]
    return out


def _should_validate(validate) -> bool:
    if validate is not None:
        return bool(validate)
    return device_value_checks_enabled()  # off inside host_validated() and graph capture


def _check_heads(q, k, v, what_q="q", what_k="k"):
    check_tensor(what_q, q, dtype=_ACT, dim=3)
    check_tensor(what_k, k, dtype=_ACT, dim=q.dim() if what_k == "k" else 4, device=q.device)
    check_tensor("v", v, dtype=_ACT, dim=k.dim(), device=q.device)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise UnsupportedConfigError(f"attention: q/k/v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    if tuple(k.shape) != tuple(v.shape):
        raise UnsupportedConfigError(f"attention: k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    hq, d = q.shape[1], q.shape[2]
    hk, dk = k.shape[-2], k.shape[-1]
    if d not in HEAD_DIMS:
        raise UnsupportedConfigError(f"attention: head_dim {d} not supported (allowed {HEAD_DIMS})")
    if dk != d:
        raise UnsupportedConfigError(f"attention: q head_dim {d} != kv head_dim {dk}")
    if hk == 0 or hq % hk:
        raise UnsupportedConfigError(f"attention: Hq={hq} must be a multiple of Hk={hk}")
    return hq, hk, d


def _check_cu(name, cu, device, n_tokens, validate):
    check_tensor(name, cu, dtype=torch.int32, dim=1, device=device)
    if cu.numel() < 1:
        raise UnsupportedConfigError(f"{name}: needs B+1 >= 1 entries")
    if validate:
        c = cu.cpu()
        if int(c[0]) != 0 or int(c[-1]) != n_tokens or bool((c[1:] < c[:-1]).any()):
            raise UnsupportedConfigError(f"{name}: must start at 0, be non-decreasing and end at {n_tokens}, got {c.tolist()}")
        return c
    return None


def prefill(q, k, v, cu_seqlens, max_seqlen, scale, *, contract="attn.v2", validate=None):
    """Packed causal varlen attention.

    Args: q [T, Hq, D], k/v [T, Hk, D] bf16 (D in 16/32/64/128, Hq % Hk == 0); cu_seqlens
      [B+1] int32; max_seqlen (int, >= every length); scale (float).
    Returns: out [T, Hq, D] bf16, lse [T, Hq] fp32 (natural log).
    Determinism: contract ``attn.v2``: each row's bytes equal ``paged`` for the same position,
    for any batch composition, page layout, chunking; run-to-run bitwise.
    """
    val = _should_validate(validate)
    pk = _plan_key("prefill", (q, k, v, cu_seqlens), (max_seqlen, scale, contract), val)
    plan = _PLANS.get(pk) if pk is not None else None
    if plan is None:
        plan = _prefill_plan(q, k, v, cu_seqlens, max_seqlen, scale, contract, val)
        if pk is not None:
            _PLANS.put(pk, plan)
    out, lse = _outputs(q)
    if plan is not _EMPTY:
        _launch_fwd(plan, out, lse, None, q, k, v, cu_seqlens, cu_seqlens, cu_seqlens)
    return out, lse


def _prefill_plan(q, k, v, cu_seqlens, max_seqlen, scale, contract, val):
    """prefill's checks and launch derivation (see :mod:`rlk.kernels.plans`)."""
    c = attention_contract.contract(contract)
    hq, hk, d = _check_heads(q, k, v)
    if k.shape[0] != q.shape[0]:
        raise UnsupportedConfigError(f"attention: q has {q.shape[0]} tokens, k has {k.shape[0]}")
    cu = _check_cu("cu_seqlens", cu_seqlens, q.device, q.shape[0], val)
    max_seqlen = int(max_seqlen)
    if cu is not None and cu.numel() > 1 and int((cu[1:] - cu[:-1]).max()) > max_seqlen:
        raise UnsupportedConfigError(f"attention: a sequence is longer than max_seqlen={max_seqlen}")
    qk = qk_scale_of(scale)
    nb = cu_seqlens.numel() - 1
    if q.shape[0] == 0 or nb == 0 or max_seqlen == 0:
        return _EMPTY
    g = hq // hk
    s, gp, grid = pick_prefill_schedule(schedule.schedule("prefill", q.device),
                                        schedule.one_wave_schedule("prefill", q.device),
                                        max_seqlen, hk, g, nb, lambda: sm_count(q.device))
    return _fwd_plan(grid, q, k, v, None, qk, c, g, gp, s, paged=False, split=1, page=16)


def _prefill_grid(s, max_seqlen, hk, g, nb):
    # q heads packed per tile: the table's GP where it divides the GQA group, else their gcd
    # (GP is bit-neutral; a GP that does not divide g would leave heads without a program:
    # g // GP == 0 at Qwen3-1.7B's 16/8 heads gave an empty grid and unwritten output).
    gp = math.gcd(int(s.get("GP", 1)), g)
    return gp, (cdiv(max_seqlen, s["BLOCK_M"] // gp), hk * (g // gp), nb)


def pick_prefill_schedule(default, one_wave, max_seqlen, hk, g, nb, sms):
    """(schedule, GP, grid) of a prefill launch. ``one_wave`` (None or a table entry) is taken when
    its whole grid fits in one wave (programs <= ``sms()``): then each SM runs one program and
    nothing hides a program's memory latency but its own pipeline (deeper ``num_stages``); with
    more programs than SMs the default's occupancy wins (attention_variants_h200.json). Both
    entries are bit-neutral schedules: a row's bytes do not depend on which one ran."""
    if one_wave is not None:
        gp, grid = _prefill_grid(one_wave, max_seqlen, hk, g, nb)
        if grid[0] * grid[1] * grid[2] <= sms():
            return one_wave, gp, grid
    gp, grid = _prefill_grid(default, max_seqlen, hk, g, nb)
    return default, gp, grid


_EMPTY = "empty"  # a plan: no launch (no tokens, sequences or queries); outputs only
_PLANS = plans.PlanCache("attention")


def _plan_key(kind, tensors, scalars, val):
    """A plan key, or None: device value checks on (they read contents), plans off, or a
    schedule override active (sweeps)."""
    if val or not plans.enabled() or schedule.overrides_active():
        return None
    return plans.key(kind, tensors, scalars)


def _outputs(q):
    return torch.empty_like(q), torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)


def _fwd_plan(grid, q, k, v, bt, qk, c, g, gp, s, *, paged, split, page):
    """attn_fwd_kernel's grid and non-tensor arguments that follow from the inputs' metadata.
    Outputs' and workspaces' strides are read at launch (:func:`_launch_fwd`)."""
    # Each tensor's strides read once (a .stride(i) call costs ~0.3 us of host time).
    qs, ks, vs = q.stride(), k.stride(), v.stride()
    kb, vb = (ks[0], vs[0]) if paged else (0, 0)
    kt, vt = (ks[1], vs[1]) if paged else (ks[0], vs[0])
    head = (qk, split, qs[0], qs[1])
    kv = (kt, ks[-2], kb, vt, vs[-2], vb, bt.stride()[0] if paged else 0)
    kw = dict(G=g, GP=gp, BLOCK_M=s["BLOCK_M"], HEAD_DIM=q.shape[2], KV_CHUNK=c.bit_fields["kv_chunk"],
              SEG=c.bit_fields["segment"], PAGE=page, PAGED=paged, SPLIT=split > 1,
              DOT_DTYPE=_dot(q.device), INTERPRET=interpret_flag(), **_opts(s))
    return grid, head, kv, kw, LaunchSite()


def _launch_fwd(plan, out, lse, ws, q, k, v, bt, cu_q, kv_len):
    grid, head, kv, kw, site = plan
    os_, ls = out.stride(), lse.stride()
    if ws is None:
        ws_m = ws_l = ws_acc = lse  # unread (SPLIT=False)
        wss = (0, 0, 0)
    else:
        (ws_m, ws_l, ws_acc), wss = ws, ws[0].stride()
    site.launch(attn_fwd_kernel, grid,
        (out, lse, ws_m, ws_l, ws_acc, q, k, v, bt, cu_q, kv_len,
         *head, os_[0], os_[1], ls[0], ls[1], *kv, wss[0], wss[1], wss[2]), **kw)


def paged(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens_kv, scale, *,
          max_seqlen_q=None, contract="attn.v2", validate=None, out=None):
    """Attention of new queries against a paged KV cache (chunked prefill / decode).

    Args: q [Tq, Hq, D] bf16; k_cache/v_cache [num_blocks, block_size, Hk, D] bf16
      (block_size in 16/32/64/128/256); block_tables [B, nb] int32 (pages in any order);
      cu_seqlens_q [B+1] int32; seq_lens_kv [B] int32 (KV length including the new queries,
      whose K/V must already be written); max_seqlen_q (int; read back from the device if None).
      Query i of sequence b sits at position seq_lens_kv[b] - q_len_b + i.
      A sequence with kv length 0 (padding slot) gives out 0 and lse -inf for its rows.
      out: optional buffer shaped and typed like q (any token/head strides, last dim
      contiguous) that receives the output, e.g. the leading rows of an engine's padded batch.
    Returns: out [Tq, Hq, D] bf16, lse [Tq, Hq] fp32.
    Determinism: contract ``attn.v2``: rows byte-identical to ``prefill`` at the same position,
    whatever the batch, page size, page order, chunking or split; run-to-run bitwise.
    """
    val = _should_validate(validate)
    if out is not None:
        check_tensor("out", out, dtype=q.dtype, dim=3, device=q.device)
        if tuple(out.shape) != tuple(q.shape) or out.stride(-1) != 1:
            raise UnsupportedConfigError(f"attention: out {tuple(out.shape)} (strides {out.stride()}) must be "
                                         f"shaped like q {tuple(q.shape)} with a contiguous last dim")
    pk = _plan_key("paged", (q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens_kv),
                   (max_seqlen_q, scale, contract), val)
    plan = _PLANS.get(pk) if pk is not None else None
    if plan is None:
        plan = _paged_plan(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens_kv, scale,
                           max_seqlen_q, contract, val)
        if pk is not None:
            _PLANS.put(pk, plan)
    if out is None:
        out, lse = _outputs(q)
    else:
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    if plan is _EMPTY:
        return out, lse
    fwd, n_seg, merge = plan
    ws = None
    if n_seg:
        # Split-KV: one program per segment; partials folded in order by the merge kernel.
        ws_m = torch.empty((q.shape[0], q.shape[1], n_seg), dtype=torch.float32, device=q.device)
        ws = (ws_m, torch.empty_like(ws_m),
              torch.empty((q.shape[0], q.shape[1], n_seg, q.shape[2]), dtype=torch.float32, device=q.device))
    _launch_fwd(fwd, out, lse, ws, q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens_kv)
    if merge is not None:
        grid, kw, site = merge
        os_, ls, wss = out.stride(), lse.stride(), ws[0].stride()
        site.launch(attn_merge_kernel, grid,
            (out, lse, ws[0], ws[1], ws[2], cu_seqlens_q, seq_lens_kv,
             os_[0], os_[1], ls[0], ls[1], wss[0], wss[1], wss[2]), **kw)
    return out, lse


def _paged_plan(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens_kv, scale, max_seqlen_q,
                contract, val):
    """paged's checks and launch derivation: (forward plan, split segments or 0, merge plan or
    None), or ``_EMPTY``."""
    c = attention_contract.contract(contract)
    hq, hk, d = _check_heads(q, k_cache, v_cache, what_k="k_cache")
    page = k_cache.shape[1]
    if page not in PAGE_SIZES:
        raise UnsupportedConfigError(f"attention: page size {page} not supported (allowed {PAGE_SIZES})")
    check_tensor("block_tables", block_tables, dtype=torch.int32, dim=2, device=q.device)
    check_tensor("seq_lens_kv", seq_lens_kv, dtype=torch.int32, dim=1, device=q.device)
    nb_seq = seq_lens_kv.numel()
    if cu_seqlens_q.numel() != nb_seq + 1 or block_tables.shape[0] < nb_seq:
        raise UnsupportedConfigError(
            f"attention: cu_seqlens_q has {cu_seqlens_q.numel()} entries, seq_lens_kv {nb_seq}, "
            f"block_tables {block_tables.shape[0]} rows (need B+1, B, >= B)")
    cu = _check_cu("cu_seqlens_q", cu_seqlens_q, q.device, q.shape[0], val)
    capacity = block_tables.shape[1] * page
    if val:
        kl = seq_lens_kv.cpu().long()
        ql = (cu[1:] - cu[:-1]).long()
        if bool((kl > capacity).any()):
            b = int(torch.nonzero(kl > capacity)[0])
            raise UnsupportedConfigError(f"attention: seq_lens_kv[{b}]={int(kl[b])} beyond the block table "
                                         f"capacity {block_tables.shape[1]} pages x {page}")
        bad = (kl > 0) & (kl < ql)
        if bool(bad.any()):
            b = int(torch.nonzero(bad)[0])
            raise UnsupportedConfigError(f"attention: sequence {b} has q_len {int(ql[b])} > kv length {int(kl[b])}")
        bt = block_tables[:nb_seq].cpu().long()
        need = (kl + page - 1) // page
        used = torch.arange(bt.shape[1])[None, :] < need[:, None]
        if bool(((bt < 0) | (bt >= k_cache.shape[0]))[used].any()):
            raise UnsupportedConfigError(f"attention: block_tables hold ids outside [0, {k_cache.shape[0]}) "
                                         "for pages in use")
        if max_seqlen_q is None:
            max_seqlen_q = int(ql.max()) if nb_seq else 0
    if max_seqlen_q is None:
        raise UnsupportedConfigError("attention: pass max_seqlen_q when validate=False")
    max_seqlen_q = int(max_seqlen_q)
    qk = qk_scale_of(scale)
    if q.shape[0] == 0 or nb_seq == 0 or max_seqlen_q == 0:
        return _EMPTY
    g = hq // hk
    decode = max_seqlen_q == 1
    s = schedule.schedule("paged_decode" if decode else "paged_chunk", q.device)
    if g > s["BLOCK_M"]:
        raise UnsupportedConfigError(f"attention: GQA group {g} larger than the tile ({s['BLOCK_M']} rows)")
    tiles = cdiv(max_seqlen_q, s["BLOCK_M"] // g)
    n_seg = cdiv(capacity, c.bit_fields["segment"])
    split = n_seg if decode and n_seg > 1 else 1
    fwd = _fwd_plan((tiles * split, hk, nb_seq), q, k_cache, v_cache, block_tables, qk, c, g, g, s,
                    paged=True, split=split, page=page)
    if split == 1:
        return fwd, 0, None
    sm = schedule.schedule("merge", q.device)
    merge = ((max_seqlen_q, hk, nb_seq),
             dict(G=g, BLOCK_G=next_pow2(g), HEAD_DIM=d, SEG=c.bit_fields["segment"],
                  INTERPRET=interpret_flag(), **_opts(sm)), LaunchSite())
    return fwd, split, merge


def write_kv(k, v, k_cache, v_cache, slot_mapping, *, validate=None):
    """Exact copy of k, v [T, Hk, D] into k_cache, v_cache [num_blocks, block_size, Hk, D] at
    slots slot_mapping [T] int64 (slot = block * block_size + offset; -1 = skip).
    Determinism: bytes copied unchanged (contract ``attn.v2``); duplicate slots are an error."""
    check_tensor("k", k, dtype=_ACT, dim=3)
    check_tensor("v", v, dtype=_ACT, dim=3, device=k.device)
    check_tensor("k_cache", k_cache, dtype=k.dtype, dim=4, device=k.device)
    check_tensor("v_cache", v_cache, dtype=k.dtype, dim=4, device=k.device)
    check_tensor("slot_mapping", slot_mapping, dtype=torch.int64, dim=1, device=k.device)
    if tuple(k.shape) != tuple(v.shape) or tuple(k_cache.shape) != tuple(v_cache.shape):
        raise UnsupportedConfigError("write_kv: k/v or k_cache/v_cache shapes differ")
    if k.shape[1:] != k_cache.shape[2:] or slot_mapping.numel() != k.shape[0]:
        raise UnsupportedConfigError(f"write_kv: k {tuple(k.shape)}, cache {tuple(k_cache.shape)}, "
                                     f"slot_mapping {tuple(slot_mapping.shape)} do not fit")
    page = k_cache.shape[1]
    if page not in PAGE_SIZES or k.shape[2] not in HEAD_DIMS:
        raise UnsupportedConfigError(f"write_kv: page size {page} / head_dim {k.shape[2]} not supported")
    if _should_validate(validate) and slot_mapping.numel():
        sl = slot_mapping.cpu()
        if int(sl.max()) >= k_cache.shape[0] * page or int(sl.min()) < -1:
            raise UnsupportedConfigError(f"write_kv: slot ids outside [-1, {k_cache.shape[0] * page})")
        pos = sl[sl >= 0]
        if pos.unique().numel() != pos.numel():
            raise UnsupportedConfigError("write_kv: duplicate slots (the winner would be unordered)")
    if k.shape[0] == 0:
        return
    s = schedule.schedule("write_kv", k.device)
    launch(write_kv_kernel, (k.shape[0],),
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HK=k.shape[1], BLOCK_H=next_pow2(k.shape[1]), HEAD_DIM=k.shape[2], PAGE=page,
        **_opts(s))


def backward(do, q, k, v, out, lse, cu_seqlens, max_seqlen, scale):
    """Gradients of ``prefill``: (dq [T, Hq, D], dk [T, Hk, D], dv [T, Hk, D]) bf16.
    Determinism: contract ``attn.v2`` backward: no atomics, fixed loop orders; run-to-run bitwise
    (not batch-invariant across packings)."""
    hq, hk, d = _check_heads(q, k, v)
    check_tensor("do", do, dtype=q.dtype, dim=3, device=q.device)
    check_tensor("out", out, dtype=q.dtype, dim=3, device=q.device)
    check_tensor("lse", lse, dtype=torch.float32, dim=2, device=q.device)
    if do.shape != q.shape or out.shape != q.shape or tuple(lse.shape) != tuple(q.shape[:2]):
        raise UnsupportedConfigError("attention backward: do/out/lse shapes do not match q")
    lse = lse.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    nb = cu_seqlens.numel() - 1
    if q.shape[0] == 0 or nb <= 0 or max_seqlen == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    dq.zero_()  # tokens outside every sequence keep 0 (dK/dV: the fold writes every row)
    delta = torch.empty_like(lse)
    s = schedule.schedule("bwd_delta", q.device)
    launch(bwd_delta_kernel, (cdiv(q.shape[0], s["BLOCK_M"]), hq),
        delta, out, do, q.shape[0], out.stride(0), out.stride(1), do.stride(0), do.stride(1),
        delta.stride(0), delta.stride(1), BLOCK_M=s["BLOCK_M"], HEAD_DIM=d, **_opts(s))
    g = hq // hk
    common = dict(HEAD_DIM=d, DOT_DTYPE=_dot(q.device), INTERPRET=interpret_flag())
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
               do.stride(0), do.stride(1), lse.stride(0), lse.stride(1))
    qs = qk_scale_of(scale)
    s = schedule.schedule("bwd_dkdv", q.device)
    # Per-head fp32 partials (zero for tokens outside every sequence), then the ordered fold.
    ws_dk = torch.zeros((g, k.shape[0], hk, d), dtype=torch.float32, device=q.device)
    ws_dv = torch.zeros_like(ws_dk)
    wst = (ws_dk.stride(0), ws_dk.stride(1), ws_dk.stride(2))
    launch(bwd_dkdv_kernel, (cdiv(max_seqlen, s["BLOCK_N"]), hq, nb),
        ws_dk, ws_dv, q, k, v, do, lse, delta, cu_seqlens, qs, *strides, *wst,
        G=g, BLOCK_M=s["BLOCK_M"], BLOCK_N=s["BLOCK_N"], **common, **_opts(s))
    sf = schedule.schedule("bwd_fold", q.device)
    launch(bwd_fold_kernel, (cdiv(k.shape[0], sf["BLOCK_T"]), hk),
        dk, dv, ws_dk, ws_dv, k.shape[0], float(scale), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
        *wst, G=g, BLOCK_T=sf["BLOCK_T"], HEAD_DIM=d, INTERPRET=interpret_flag(), **_opts(sf))
    s = schedule.schedule("bwd_dq", q.device)
    launch(bwd_dq_kernel, (cdiv(max_seqlen, s["BLOCK_M"]), hq, nb),
        dq, q, k, v, do, lse, delta, cu_seqlens, qs, float(scale), *strides,
        dq.stride(0), dq.stride(1),
        G=g, BLOCK_M=s["BLOCK_M"], BLOCK_N=s["BLOCK_N"], **common, **_opts(s))
    return dq, dk, dv
