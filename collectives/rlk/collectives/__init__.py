"""Fixed-order collectives (contracts ``ar.v1``, ``rs.v1``, ``ag.v1``).

rlk owns every floating-point reduction across ranks: the transport (gloo, NCCL, RCCL, or the
single-node IPC path in :mod:`rlk.collectives.ipc`) only copies bytes, and the sum is a rank-ordered
fp32 chain with one rounding. See :mod:`rlk.collectives.api` and :mod:`rlk.collectives.group`.
"""

from rlk.collectives.api import (
    all_gather,
    all_reduce,
    fold_rank_order,
    gather_rank_ordered,
    merge_logsumexp_stats,
    reduce_scatter,
)
from rlk.collectives.group import (
    CollectiveError,
    RankTimeoutError,
    StaleGenerationError,
    StrictGroup,
    as_strict_group,
)

__all__ = [
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "gather_rank_ordered",
    "merge_logsumexp_stats",
    "fold_rank_order",
    "StrictGroup",
    "as_strict_group",
    "CollectiveError",
    "RankTimeoutError",
    "StaleGenerationError",
]
