"""Contracts of the fixed-order collectives: ``ar.v1``, ``rs.v1``, ``ag.v1``.

Imported by ``rlk.contracts.load_all`` (listed in ``CONTRACT_MODULES``). The transport (gloo,
NCCL/RCCL all-gather or all-to-all, or the single-node IPC path) only copies bytes; every
floating-point addition across ranks happens in rlk's local fold, in the order written here.
Choosing a transport is contract-preserving (it moves identical bytes); changing the fold order,
the accumulator dtype or the rounding point needs a new version.
"""

from __future__ import annotations

from rlk.contracts import Contract, register

_COMMON_DTYPES = {
    "inputs": ["bfloat16", "float32"],
    "accumulator": "float32",
    "output": "out_dtype argument (default: input dtype); bfloat16 or float32",
}

_RANK_ORDER = (
    "every element: acc = fp32(x_0); acc = acc + fp32(x_1); ...; acc = acc + fp32(x_{N-1}) "
    "(group ranks 0..N-1 ascending, a left-to-right chain, no tree, no algorithm switch by "
    "message size, dtype, backend or topology)"
)

AR_V1 = register(
    Contract(
        id="ar.v1",
        summary="fixed-order all-reduce (sum): byte-exact all-gather, rank-ordered fp32 chain, one rounding",
        bit_fields={
            "dtypes": _COMMON_DTYPES,
            "accumulation": "fp32 scalar chain per element; IEEE-754 add, round-to-nearest-even, no FMA, no FTZ",
            "rounding": "one RNE rounding fp32 -> output dtype after the last rank is added (none when the output is fp32)",
            "reduction_order": _RANK_ORDER,
            "fp_fusion": False,
            "signed_zero": "-0.0 is the additive identity; a rank that owns no value contributes -0.0 "
            "(vocab-parallel embedding), so the owner's bytes pass through unchanged",
            "result_placement": "identical bytes on every rank",
        },
        schedule_fields={
            "transport": ["torch.distributed.all_gather_single (gloo/nccl/rccl)", "ipc-oneshot (rlk.collectives.ipc: symmetric memory + fold_pointers kernel; fold tested on CPU, transport not run)"],
        },
        bit_neutral_evidence={
            "transport": "transports copy bytes; collectives_test.py::test_all_reduce_* compares against "
            "rlk.collectives.reference on gloo (cpu); GPU NCCL: collectives_test.py gpu tests (not run yet)",
        },
        targets=("sm_90", "gfx942", "cpu"),
    )
)

RS_V1 = register(
    Contract(
        id="rs.v1",
        summary="fixed-order reduce-scatter (sum) along dim 0: byte-exact all-to-all, rank-ordered fp32 chain, one rounding",
        bit_fields={
            "dtypes": _COMMON_DTYPES,
            "accumulation": "fp32 scalar chain per element; IEEE-754 add, RNE, no FMA, no FTZ",
            "rounding": "one RNE rounding fp32 -> output dtype at the end",
            "reduction_order": _RANK_ORDER,
            "fp_fusion": False,
            "split_rule": "input dim 0 split into N equal chunks; rank r receives the sum of chunk r",
            "result_placement": "chunk r on rank r; bytes equal to ar.v1's result rows of chunk r",
        },
        schedule_fields={"transport": ["torch.distributed.all_to_all_single", "all-gather + slice"]},
        bit_neutral_evidence={"transport": "collectives_test.py::test_reduce_scatter_equals_all_reduce_slice (cpu gloo)"},
        targets=("sm_90", "gfx942", "cpu"),
    )
)

AG_V1 = register(
    Contract(
        id="ag.v1",
        summary="all-gather along dim 0 in rank order: exact byte copies, no arithmetic",
        bit_fields={
            "dtypes": {"inputs": "any fixed-size dtype", "accumulator": "none", "output": "input dtype"},
            "accumulation": "none (copy)",
            "rounding": "none",
            "reduction_order": "none; output rows are rank 0's rows, then rank 1's, ... (ascending rank)",
            "fp_fusion": False,
        },
        schedule_fields={"transport": ["torch.distributed.all_gather_single"]},
        bit_neutral_evidence={"transport": "collectives_test.py::test_all_gather_exact (cpu gloo)"},
        targets=("sm_90", "gfx942", "cpu"),
    )
)

# Contract IDs exchanged by the rank handshake (see rlk.collectives.group).
COLLECTIVE_CONTRACT_IDS = {"ar": AR_V1.id, "rs": RS_V1.id, "ag": AG_V1.id}
