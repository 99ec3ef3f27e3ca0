"""Helpers shared by the attention tests, sweep and benchmark: random packed batches and paged
caches with pages in shuffled order, and the rollout patterns (chunked prefill, decode)."""

from __future__ import annotations

import torch

from rlk.kernels.attention import launch


def packed(lens, hq, hk, d, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(lens)
    mk = lambda h: torch.randn((t, h, d), generator=g).to(torch.bfloat16).to(device)  # noqa: E731
    cu = torch.tensor([0] + torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32, device=device)
    return mk(hq), mk(hk), mk(hk), cu


def paged_cache(k, v, cu, page, seed=0, extra_pages=3, capacity_pages=None):
    """Caches holding every sequence of the packed k, v (written with ``write_kv``) in randomly
    permuted pages; unused slots hold NaN, so a kernel that reads them fails loudly.
    Returns (k_cache, v_cache, block_tables [B, nb] int32)."""
    lens = (cu[1:] - cu[:-1]).tolist()
    need = [(n + page - 1) // page for n in lens]
    nb = max(capacity_pages or 0, max(need) if need else 1, 1)
    total = sum(need) + extra_pages
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(total, generator=g)
    hk, d = k.shape[1], k.shape[2]
    kc = torch.full((total, page, hk, d), float("nan"), dtype=k.dtype, device=k.device)
    vc = torch.full_like(kc, float("nan"))
    bt = torch.full((len(lens), nb), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        bt[b, :n] = perm[used:used + n].to(torch.int32)
        used += n
    slots = torch.cat([bt[b, torch.arange(n) // page].long() * page + torch.arange(n) % page
                       for b, n in enumerate(lens)]) if sum(lens) else torch.zeros(0, dtype=torch.long)
    launch.write_kv(k, v, kc, vc, slots.to(k.device))
    return kc, vc, bt.to(k.device)


def decode_rows(q, cu, kc, vc, bt, rows, scale, **kw):
    """One decode request per packed row index in ``rows`` (query at that row's position, KV of
    its sequence up to and including it). Returns out [len(rows), Hq, D], lse."""
    cu_l = cu.tolist()
    seq_of = [max(b for b in range(len(cu_l) - 1) if cu_l[b] <= r < cu_l[b + 1]) for r in rows]
    kv = torch.tensor([r - cu_l[b] + 1 for r, b in zip(rows, seq_of)], dtype=torch.int32, device=q.device)
    tables = bt[torch.tensor(seq_of, device=bt.device)].contiguous()
    cuq = torch.arange(len(rows) + 1, dtype=torch.int32, device=q.device)
    return launch.paged(q[torch.tensor(rows, device=q.device)].contiguous(), kc, vc, tables, cuq, kv, scale, **kw)


def chunked_prefill(q, cu, kc, vc, bt, chunk, scale, **kw):
    """Every sequence's queries in chunks of ``chunk`` tokens; step i batches chunk i of every
    sequence still running (so batch composition changes). Returns out, lse for all rows."""
    cu_l = cu.tolist()
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    step = 0
    while True:
        parts = []
        for b in range(len(cu_l) - 1):
            lo = cu_l[b] + step * chunk
            hi = min(lo + chunk, cu_l[b + 1])
            if lo < hi:
                parts.append((b, lo, hi))
        if not parts:
            return out, lse
        idx = torch.cat([torch.arange(lo, hi) for _, lo, hi in parts]).to(q.device)
        cuq = torch.tensor([0] + torch.tensor([hi - lo for _, lo, hi in parts]).cumsum(0).tolist(),
                           dtype=torch.int32, device=q.device)
        kv = torch.tensor([hi - cu_l[b] for b, _, hi in parts], dtype=torch.int32, device=q.device)
        tables = bt[torch.tensor([b for b, _, _ in parts], device=bt.device)].contiguous()
        o, l = launch.paged(q[idx].contiguous(), kc, vc, tables, cuq, kv, scale, **kw)
        out[idx], lse[idx] = o, l
        step += 1
