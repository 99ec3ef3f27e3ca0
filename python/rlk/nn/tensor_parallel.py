"""Strict tensor-parallel layers: column/row-parallel linear and vocab-parallel embedding.

Arithmetic comes from ``gemm.bf16.v1`` (``rlk.kernels.gemm.autograd``) and ``embedding.v1``
(``rlk.kernels.rowops.autograd``); every cross-rank sum is ``ar.v1`` (``rlk.collectives``): rank
order 0..N-1, fp32, one rounding. Autograd follows megatron-core's conjugate pairs:

| function | forward | backward |
| --- | --- | --- |
| ``copy_to_tp`` | identity | ``ar.v1`` all-reduce of the input gradient |
| ``reduce_from_tp`` | ``ar.v1`` all-reduce (fp32 partials -> bf16, one rounding) | identity |
| ``gather_last_dim`` | ``ag.v1`` all-gather along the last dim | this rank's slice |

Which TP degrees give the TP=1 bits:
  * ``ColumnParallelLinear``: every degree. Output column j depends only on row j of the weight
    and the fixed K walk of gemm.bf16.v1 (no reduction across ranks), so the shards are the
    TP=1 columns.
  * ``VocabParallelEmbedding``: every degree (non-owning ranks contribute -0.0, the additive
    identity, so the owner's bytes pass through the ar.v1 sum unchanged).
  * ``RowParallelLinear``: only where the K split of the layer lines up with the gemm's own
    split-K: ``split_k(K, N) == tp`` and ``split_k(K / tp, N) == 1`` (the gemm folds its
    segments as ``0.0 + s_0 + s_1 + ...`` in fp32 ascending, which equals the rank-ordered
    chain of unsplit partials). :func:`row_parallel_matches_tp1` evaluates the rule. Otherwise
    only equality at the same TP degree is promised (trainer TP4 vs rollout TP4), bitwise on
    every rank and run to run.
"""

from __future__ import annotations

import torch

from rlk.errors import UnsupportedConfigError


def _collectives():
    from rlk import collectives

    return collectives


def _gemm_ops():
    try:
        from rlk.kernels.gemm import autograd as g
    except ImportError as e:  # fail closed: there is no native fallback
        raise UnsupportedConfigError(f"tensor_parallel: rlk.kernels.gemm.autograd unavailable ({e})") from None
    return g


def _world(group) -> tuple[int, int]:
    c = _collectives()
    sg = c.as_strict_group(group)
    return sg.world_size, sg.rank


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        # Reduction order: ar.v1 (ranks 0..N-1, fp32, one rounding to dy's dtype).
        return _collectives().all_reduce(dy.contiguous(), ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, group, out_dtype):
        ctx.in_dtype = partial.dtype
        # Reduction order: ar.v1 (ranks 0..N-1, fp32, one rounding to out_dtype).
        return _collectives().all_reduce(partial.contiguous(), group, out_dtype=out_dtype)

    @staticmethod
    def backward(ctx, dy):
        return dy.to(ctx.in_dtype), None, None


class _GatherLastDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        c = _collectives()
        sg = c.as_strict_group(group)
        ctx.group, ctx.n, ctx.rank, ctx.width = group, sg.world_size, sg.rank, x.shape[-1]
        parts = c.gather_rank_ordered(x.contiguous(), sg)  # exact copies (ag.v1)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, dy):
        w = ctx.width
        return dy[..., ctx.rank * w:(ctx.rank + 1) * w].contiguous(), None


def copy_to_tp(x, group=None):
    return _CopyToTP.apply(x, group)


def reduce_from_tp(partial, group=None, out_dtype=torch.bfloat16):
    return _ReduceFromTP.apply(partial, group, out_dtype)


def gather_last_dim(x, group=None):
    return _GatherLastDim.apply(x, group)


def _shard(full: torch.Tensor, dim: int, n: int, rank: int) -> torch.Tensor:
    if full.shape[dim] % n:
        raise UnsupportedConfigError(f"tensor_parallel: dim {dim} of {tuple(full.shape)} not divisible by TP={n}")
    return full.chunk(n, dim=dim)[rank].contiguous()


class ColumnParallelLinear(torch.nn.Module):
    """``y = x @ W.T`` with ``W [out, in]`` split along ``out``; no cross-rank reduction.

    Input ``x [..., in]`` bf16 (replicated); output ``[..., out / tp]`` (or ``[..., out]`` with
    ``gather_output``). **Determinism:** ``gemm.bf16.v1`` (+ ``ag.v1`` when gathering; ``ar.v1``
    on the input gradient); columns equal TP=1 at every TP degree.
    """

    def __init__(self, weight_full: torch.Tensor, group=None, gather_output: bool = False):
        super().__init__()
        n, r = _world(group)
        self.group, self.gather_output, self.tp = group, gather_output, n
        self.weight = torch.nn.Parameter(_shard(weight_full.detach(), 0, n, r))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = _gemm_ops()
        y = g.linear(copy_to_tp(x, self.group), self.weight)
        return gather_last_dim(y, self.group) if self.gather_output else y


class RowParallelLinear(torch.nn.Module):
    """``y = x @ W.T`` with ``W [out, in]`` split along ``in``; partials summed with ``ar.v1``.

    Input ``x [..., in / tp]`` bf16 (already split, ``input_is_parallel``) or ``[..., in]``
    (this rank takes its slice). Each rank computes its fp32 partial ``x_r @ W_r.T`` (gemm with
    no output rounding); the partials are summed in rank order in fp32 and rounded once to bf16.
    **Determinism:** ``gemm.bf16.v1`` + ``ar.v1``; bitwise on every rank, run to run, and across
    engines at the same TP degree; equal to TP=1 only under :func:`row_parallel_matches_tp1`.
    """

    def __init__(self, weight_full: torch.Tensor, group=None, input_is_parallel: bool = True):
        super().__init__()
        n, r = _world(group)
        self.group, self.input_is_parallel, self.tp, self.rank = group, input_is_parallel, n, r
        self.weight = torch.nn.Parameter(_shard(weight_full.detach(), 1, n, r))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = _gemm_ops()
        if not self.input_is_parallel:
            k = self.weight.shape[1]
            x = x[..., self.rank * k:(self.rank + 1) * k]
        lead = x.shape[:-1]
        partial = g.gemm(x.reshape(-1, x.shape[-1]).contiguous(), self.weight, out_fp32=True)
        y = reduce_from_tp(partial, self.group, torch.bfloat16)
        return y.reshape(*lead, self.weight.shape[0])


class VocabParallelEmbedding(torch.nn.Module):
    """``weight[ids]`` with the vocabulary split in equal contiguous shards over TP ranks.

    ids ``[T]`` int64 (global, replicated); output ``[T, H]`` bf16 (replicated). The owner copies
    the row (``embedding.v1``), the others contribute -0.0, and ``ar.v1`` sums: the bytes are the
    owner's. **Determinism:** exact; equal to TP=1 at every degree; dW as ``embedding.v1``.
    """

    def __init__(self, weight_full: torch.Tensor, group=None):
        super().__init__()
        n, r = _world(group)
        self.group = group
        self.vocab_per_rank = weight_full.shape[0] // n
        self.vocab_start = r * self.vocab_per_rank
        self.weight = torch.nn.Parameter(_shard(weight_full.detach(), 0, n, r))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        from rlk.kernels.rowops import autograd as rowops

        if ids.dtype != torch.int64 or ids.dim() != 1:
            raise UnsupportedConfigError(f"VocabParallelEmbedding: ids must be [T] int64, got {ids.dtype} {tuple(ids.shape)}")
        local = ids - self.vocab_start
        owned = (local >= 0) & (local < self.vocab_per_rank)
        rows = rowops.embedding(torch.where(owned, local, torch.zeros_like(local)), self.weight)
        neg_zero = torch.full((), -0.0, dtype=rows.dtype, device=rows.device)
        contrib = torch.where(owned[:, None], rows, neg_zero)
        # Reduction order: ar.v1; exactly one rank holds a value, the rest -0.0 (identity).
        return reduce_from_tp(contrib, self.group, rows.dtype)


def row_parallel_matches_tp1(K: int, N: int, tp: int) -> bool:
    """Whether ``RowParallelLinear`` at TP=``tp`` gives the TP=1 bits for weight ``[N, K]``."""
    from rlk.kernels.gemm.contract import split_k

    if tp == 1:
        return True
    if K % tp or (K // tp) % 64:
        return False
    return split_k(K, N) == tp and split_k(K // tp, N) == 1


__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "copy_to_tp",
           "reduce_from_tp", "gather_last_dim", "row_parallel_matches_tp1"]
