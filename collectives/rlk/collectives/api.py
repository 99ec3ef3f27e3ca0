"""Fixed-order collectives over ``torch.distributed`` (contracts ``ar.v1``, ``rs.v1``, ``ag.v1``).

The transport moves exact bytes (an all-gather or an all-to-all of ``uint8`` views, so gloo,
NCCL and RCCL all carry them unchanged, bf16 included). Every addition happens afterwards in
:func:`fold_rank_order`, a local elementwise chain over ranks 0..N-1 in fp32 with one rounding.
IEEE-754 adds are exact per element on CPU and GPU, so the torch loop is a valid strict kernel;
the result is identical on every rank and equal to ``rlk.collectives.reference``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from rlk.collectives.group import StrictGroup, as_strict_group
from rlk.errors import UnsupportedConfigError

REDUCE_DTYPES = (torch.bfloat16, torch.float32)


def _check_reduce(name: str, t: torch.Tensor, out_dtype):
    if not isinstance(t, torch.Tensor):
        raise UnsupportedConfigError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in REDUCE_DTYPES:
        raise UnsupportedConfigError(f"{name}: dtype {t.dtype} not in ar.v1/rs.v1 (allowed: bf16, fp32)")
    out_dtype = t.dtype if out_dtype is None else out_dtype
    if out_dtype not in REDUCE_DTYPES:
        raise UnsupportedConfigError(f"{name}: out_dtype {out_dtype} not in the contract (bf16, fp32)")
    if t.requires_grad and torch.is_grad_enabled():
        raise UnsupportedConfigError(f"{name}: no autograd here; use the rlk.nn.tensor_parallel functions")
    return out_dtype


def fold_rank_order(stacked: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``stacked [N, ...]`` (rank r in row r) -> the rank-ordered sum, rounded once to ``out_dtype``."""
    # Reduction order: ranks 0..N-1 left to right; fp32 accumulator (bf16 widened exactly);
    # one RNE rounding to out_dtype at the end. add_ is an exact IEEE add per element.
    acc = stacked[0].to(torch.float32, copy=True)
    for r in range(1, stacked.shape[0]):
        acc.add_(stacked[r])
    return acc if out_dtype == torch.float32 else acc.to(out_dtype)


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def all_reduce(t: torch.Tensor, group=None, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Sum of ``t`` over the ranks of ``group``, in rank order.

    Args:
      t: any shape, bf16 or fp32, same shape/dtype on every rank (CPU with gloo, GPU with NCCL).
      group: a StrictGroup, a ProcessGroup or None (default group).
      out_dtype: bf16 or fp32 (default ``t.dtype``); a row-parallel GEMM passes fp32 partials
        and asks for bf16, so the partials are rounded exactly once.
    Returns a new tensor of ``t``'s shape (``t`` is not modified), identical on every rank.

    **Determinism:** ``ar.v1``: fp32 chain over ranks 0..N-1, one rounding, whatever the size,
    dtype, backend or topology; equal to ``rlk.collectives.reference.fixed_order_sum``.
    """
    out_dtype = _check_reduce("all_reduce", t, out_dtype)
    sg = as_strict_group(group)
    if t.numel() == 0 or sg.world_size == 1:
        return fold_rank_order(t.unsqueeze(0), out_dtype).reshape(t.shape)
    got = sg.gather_bytes(_bytes_of(t), "all_reduce", t.numel(), t.dtype)
    stacked = got.contiguous().view(t.dtype).view(sg.world_size, *t.shape)
    return fold_rank_order(stacked, out_dtype)


def reduce_scatter(t: torch.Tensor, group=None, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Rank r gets the rank-ordered sum of chunk r of ``t`` (``t.shape[0]`` split in N equal parts).

    Args: ``t [N*m, ...]`` bf16/fp32, same on every rank; ``out_dtype`` as for :func:`all_reduce`.
    Returns ``[m, ...]``.

    **Determinism:** ``rs.v1``: the bytes of rank r's result equal rows ``[r*m, (r+1)*m)`` of
    ``all_reduce(t)`` (same fp32 chain over ranks 0..N-1, one rounding).
    """
    out_dtype = _check_reduce("reduce_scatter", t, out_dtype)
    sg = as_strict_group(group)
    n = sg.world_size
    if t.dim() == 0 or t.shape[0] % n:
        raise UnsupportedConfigError(f"reduce_scatter: dim 0 of shape {tuple(t.shape)} not divisible by world size {n}")
    m = t.shape[0] // n
    if t.numel() == 0 or n == 1:
        return fold_rank_order(t.unsqueeze(0), out_dtype).reshape(t.shape)
    chunks = t.contiguous().view(n, -1).view(torch.uint8)  # row j: chunk j, sent to rank j
    got = sg.all_to_all_bytes(chunks, "reduce_scatter", t.numel(), t.dtype)  # row j: from rank j
    stacked = got.contiguous().view(t.dtype).view(n, m, *t.shape[1:])
    return fold_rank_order(stacked, out_dtype)


def all_gather(t: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenation along dim 0 of every rank's ``t`` in rank order (exact byte copies).

    Args: ``t [m, ...]`` any fixed-size dtype, same shape on every rank. Returns ``[N*m, ...]``.

    **Determinism:** ``ag.v1``: no arithmetic; bytes equal to each rank's input.
    """
    if not isinstance(t, torch.Tensor) or t.dim() == 0:
        raise UnsupportedConfigError("all_gather: expected a tensor with at least one dimension")
    if t.requires_grad and torch.is_grad_enabled():
        raise UnsupportedConfigError("all_gather: no autograd here; use the rlk.nn.tensor_parallel functions")
    sg = as_strict_group(group)
    n = sg.world_size
    if n == 1:
        return t.clone()
    if t.numel() == 0:
        return t.new_empty((n * t.shape[0], *t.shape[1:]))
    got = sg.gather_bytes(_bytes_of(t), "all_gather", t.numel(), t.dtype)
    return got.contiguous().view(t.dtype).view(n * t.shape[0], *t.shape[1:])


def gather_rank_ordered(t: torch.Tensor, group=None) -> list[torch.Tensor]:
    """``[t from rank 0, t from rank 1, ...]`` (exact copies; ``ag.v1``)."""
    sg = as_strict_group(group)
    return list(all_gather(t.unsqueeze(0), sg).unbind(0))


def _segment_merge() -> Callable:
    try:
        from rlk.kernels.linear_logp.launch import merge_segment_stats
    except ImportError as e:
        raise UnsupportedConfigError(
            "merge_logsumexp_stats: rlk.kernels.linear_logp.launch.merge_segment_stats is not available "
            f"({e}); strict mode has no other merge (logp.v2 owns the merge arithmetic)") from None
    return merge_segment_stats


def merge_logsumexp_stats(stats: torch.Tensor | Sequence[torch.Tensor], group=None, *,
                          merge_fn: Callable | None = None):
    """Merges per-rank softmax statistics of a vocab-parallel logp in rank order.

    Args:
      stats: this rank's statistics for its vocab shard: one tensor or a tuple of tensors (for
        example ``(max [T] fp32, sumexp [T] fp32)``), as ``merge_segment_stats`` expects them.
      group: the tensor-parallel group.
      merge_fn: defaults to ``rlk.kernels.linear_logp.launch.merge_segment_stats`` (raises
        ``UnsupportedConfigError`` if missing). Tests may pass a labelled stand-in.
    Returns ``merge_fn([stats of rank 0, stats of rank 1, ...])`` (identical on every rank).

    **Determinism:** transport ``ag.v1`` (exact copies); the merge arithmetic and its order
    (segments = ranks ascending, i.e. ascending vocab shards) belong to ``logp.v2``.
    """
    fn = merge_fn if merge_fn is not None else _segment_merge()
    sg = as_strict_group(group)
    single = isinstance(stats, torch.Tensor)
    parts = [stats] if single else list(stats)
    gathered = [gather_rank_ordered(p.detach(), sg) for p in parts]
    if single:
        per_rank = gathered[0]
    else:
        per_rank = [tuple(g[r] for g in gathered) for r in range(sg.world_size)]
    return fn(per_rank)


__all__ = ["StrictGroup", "all_reduce", "reduce_scatter", "all_gather", "gather_rank_ordered",
           "merge_logsumexp_stats", "fold_rank_order"]
