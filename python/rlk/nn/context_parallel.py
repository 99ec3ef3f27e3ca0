"""CP-local-row attention for the trainer (contracts ``attn.v2``, ``ag.v1``, ``rs.v1``).

Layout (zigzag, per packed sequence): a sequence of length L (a multiple of 2*CP) is cut into
2*CP chunks of ``c = L / (2*CP)`` tokens; CP rank r holds chunks r and 2*CP-1-r, in that order,
sequences one after another (``zigzag_positions``). Forward:

1. K/V: ``ag.v1`` all-gather of every rank's local rows (exact copies), scattered back into
   global token order (exact copies) and laid into pages (exact copies).
2. Each rank runs the strict attention (``rlk.kernels.attention.launch.paged``) on its own
   query rows only: each local chunk is one paged entry whose queries sit at their global
   positions. ``attn.v2`` makes every row byte-identical to ``prefill`` at the same position,
   so **out and LSE equal the CP=1 result bitwise for every row**, at every CP degree.

Backward: the attention backward (``launch.backward``) runs over the gathered sequence with
zero q/out/do rows for the tokens this rank does not own (their contributions are exact zeros),
giving this rank's dQ rows and its dK/dV partials for every key; the partials are merged with
``rs.v1`` (rank order 0..N-1, fp32, one rounding to bf16) so that each rank receives its own
key rows. dK/dV are bitwise equal on every rank and run to run at a given CP degree; they are
not promised equal to CP=1 (the merge adds a rank-order fold over per-rank bf16 partials).
This backward does CP times the dK/dV work of a local-rows kernel; a kernel entry taking local
query rows at given positions would remove that (attention owner).
"""

from __future__ import annotations

from typing import Sequence

import torch

from rlk.errors import UnsupportedConfigError

PAGE = 64  # page size of the gathered K/V (bit-neutral under attn.v2: any supported page size)


def _cu_list(cu_seqlens) -> list[int]:
    cu = cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else list(cu_seqlens)
    return [int(v) for v in cu]


def zigzag_positions(cu_seqlens, cp: int, rank: int) -> torch.Tensor:
    """Global token indices held by CP ``rank``, in local order ([T / cp] int64)."""
    cu = _cu_list(cu_seqlens)
    idx = []
    for a, b in zip(cu[:-1], cu[1:]):
        n = b - a
        if n % (2 * cp):
            raise UnsupportedConfigError(f"context_parallel: sequence length {n} not a multiple of 2*CP={2 * cp}")
        c = n // (2 * cp)
        for ch in (rank, 2 * cp - 1 - rank):
            idx.append(torch.arange(a + ch * c, a + (ch + 1) * c))
    return torch.cat(idx) if idx else torch.zeros(0, dtype=torch.int64)


def zigzag_split(x: torch.Tensor, cu_seqlens, cp: int, rank: int) -> torch.Tensor:
    """This rank's rows of a full-sequence tensor ``x [T, ...]`` (exact copies)."""
    return x[zigzag_positions(cu_seqlens, cp, rank).to(x.device)].contiguous()


def zigzag_merge(parts: Sequence[torch.Tensor], cu_seqlens) -> torch.Tensor:
    """Inverse of :func:`zigzag_split`: ``parts[r]`` from rank r -> ``[T, ...]`` (exact copies)."""
    cp = len(parts)
    order = torch.cat([zigzag_positions(cu_seqlens, cp, r) for r in range(cp)]).to(parts[0].device)
    out = torch.empty((order.numel(), *parts[0].shape[1:]), dtype=parts[0].dtype, device=parts[0].device)
    out[order] = torch.cat(list(parts), 0)
    return out


def _attn():
    try:
        from rlk.kernels.attention import launch
    except ImportError as e:
        raise UnsupportedConfigError(f"context_parallel: rlk.kernels.attention unavailable ({e})") from None
    return launch


def _gather_global(x_local, cu, group):
    from rlk import collectives as C

    sg = C.as_strict_group(group)
    parts = C.all_gather(x_local.contiguous(), sg).chunk(sg.world_size, 0)  # ag.v1: exact copies
    return zigzag_merge(parts, cu)


def _pages(x: torch.Tensor, cu: list[int]) -> tuple[torch.Tensor, list[int]]:
    """Lays each sequence of ``x [T, H, D]`` into fresh pages; returns (cache, first page per seq)."""
    firsts, n = [], 0
    for a, b in zip(cu[:-1], cu[1:]):
        firsts.append(n)
        n += -(-(b - a) // PAGE)
    cache = x.new_zeros((max(n, 1), PAGE, *x.shape[1:]))
    flat = cache.view(-1, *x.shape[1:])
    for f, a, b in zip(firsts, cu[:-1], cu[1:]):
        flat[f * PAGE:f * PAGE + (b - a)] = x[a:b]
    return cache, firsts


def _forward(q, k_glob, v_glob, cu, cp, rank, scale):
    launch = _attn()
    kc, firsts = _pages(k_glob, cu)
    vc, _ = _pages(v_glob, cu)
    max_pages = max((-(-(b - a) // PAGE) for a, b in zip(cu[:-1], cu[1:])), default=1)
    tables, cu_q, kv_lens = [], [0], []
    for s, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        c = (b - a) // (2 * cp)
        row = list(range(firsts[s], firsts[s] + -(-(b - a) // PAGE)))
        for ch in (rank, 2 * cp - 1 - rank):
            tables.append(row + [0] * (max_pages - len(row)))
            cu_q.append(cu_q[-1] + c)
            kv_lens.append((ch + 1) * c)  # queries of this chunk end at position (ch+1)*c - 1
    dev = q.device
    bt = torch.tensor(tables, dtype=torch.int32, device=dev)
    cu_q_t = torch.tensor(cu_q, dtype=torch.int32, device=dev)
    kv_t = torch.tensor(kv_lens, dtype=torch.int32, device=dev)
    max_q = max((cu_q[i + 1] - cu_q[i] for i in range(len(kv_lens))), default=0)
    return launch.paged(q, kc, vc, bt, cu_q_t, kv_t, scale, max_seqlen_q=max_q)


class _CPAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu, cp, rank, scale, group):
        k_glob = _gather_global(k, cu, group)
        v_glob = _gather_global(v, cu, group)
        out, lse = _forward(q, k_glob, v_glob, cu, cp, rank, scale)
        ctx.save_for_backward(q, k_glob, v_glob, out, lse)
        ctx.meta = (cu, cp, rank, scale, group)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        from rlk import collectives as C

        q, k_glob, v_glob, out, lse = ctx.saved_tensors
        cu, cp, rank, scale, group = ctx.meta
        launch = _attn()
        T = k_glob.shape[0]
        pos = zigzag_positions(cu, cp, rank).to(q.device)

        def full(x_local, fill=0.0):
            f = torch.full((T, *x_local.shape[1:]), fill, dtype=x_local.dtype, device=x_local.device)
            f[pos] = x_local
            return f

        # Rows this rank does not own: q = out = do = 0, lse = 0 -> dS = 0, exact zero terms.
        dq_f, dk_p, dv_p = launch.backward(full(dout.contiguous()), full(q), k_glob, v_glob, full(out),
                                           full(lse), torch.tensor(cu, dtype=torch.int32, device=q.device),
                                           max(b - a for a, b in zip(cu[:-1], cu[1:])), scale)
        # dK/dV partials -> rank-major zigzag order -> rs.v1: rank r receives its own key rows.
        order = torch.cat([zigzag_positions(cu, cp, r) for r in range(cp)]).to(q.device)
        sg = C.as_strict_group(group)
        dk = C.reduce_scatter(dk_p[order].contiguous(), sg, out_dtype=k_glob.dtype)
        dv = C.reduce_scatter(dv_p[order].contiguous(), sg, out_dtype=v_glob.dtype)
        return dq_f[pos], dk, dv, None, None, None, None, None


def cp_local_row_attention(q, k, v, cu_seqlens, scale, group=None):
    """Causal varlen attention of this rank's zigzag rows against the whole sequence.

    Args:
      q [T/CP, Hq, D], k, v [T/CP, Hk, D] bf16: this rank's rows (``zigzag_split`` layout).
      cu_seqlens: global packed offsets ([B+1], list or int tensor; each length a multiple of
        2*CP), the same on every rank.
      scale: softmax scale. group: the CP group (StrictGroup / ProcessGroup / None).
    Returns: out [T/CP, Hq, D] bf16, lse [T/CP, Hq] fp32 (autograd on q, k, v).

    **Determinism:** ``attn.v2`` rows + ``ag.v1`` copies: out and lse equal the CP=1
    ``prefill`` rows bitwise at every CP degree; backward dK/dV merged with ``rs.v1``.
    """
    from rlk import collectives as C

    sg = C.as_strict_group(group)
    cu = _cu_list(cu_seqlens)
    n = sg.world_size
    if q.shape[0] * n != (cu[-1] if cu else 0):
        raise UnsupportedConfigError(f"context_parallel: q has {q.shape[0]} rows, expected {cu[-1]} / CP={n}")
    return _CPAttention.apply(q, k, v, cu, n, sg.rank, float(scale), sg)


__all__ = ["zigzag_positions", "zigzag_split", "zigzag_merge", "cp_local_row_attention", "PAGE"]
