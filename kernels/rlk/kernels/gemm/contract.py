"""Contract ``gemm.bf16.v1`` and its split-K rule: every bit-relevant choice of the strict GEMM.

Bit-relevant: the 64-wide ascending K walk (a sequential chain of 16-wide MMA k-steps), the split
count ``split_k(K, N) = split_rule(K, N)`` (schedule tables may restate it, never change it), the
segment fold order, fp32 accumulation and the single RNE rounding at the store. The free launch
choices (``schedule.py``) are listed in the contract's schedule fields with their evidence.
"""

from __future__ import annotations

from rlk import contracts
from rlk.determinism import FP_FUSION
from rlk.kernels.common import cdiv

CONTRACT_ID = "gemm.bf16.v1"
CHUNK_K = 64
# Split rule parameters (contract bits): decode parallelism comes first from narrow N tiles
# (N_TILE = 16 wide); split K only where cdiv(N, N_TILE) programs cannot fill TARGET_PROGRAMS
# (the H200's 132 SMs), at most MAX_SPLIT segments, each at least MIN_SEG_CHUNKS chunks long.
TARGET_PROGRAMS = 132
N_TILE = 16
MAX_SPLIT = 8
MIN_SEG_CHUNKS = 4
# The schedules a table may choose between (the contract's schedule field ``schedule``).
SCHEDULES = ("decode", "prefill")


def split_rule(K: int, N: int) -> int:
    """Contract split count for (K, N). Depends on K and N only.

    The smallest divisor d <= MAX_SPLIT of ceil(K/64) with ceil(K/64)/d >= MIN_SEG_CHUNKS and
    d * ceil(N/N_TILE) >= TARGET_PROGRAMS; else the largest such divisor; else 1.
    """
    n_chunks = cdiv(K, CHUNK_K)
    want = cdiv(TARGET_PROGRAMS, cdiv(N, N_TILE))
    cands = [d for d in range(1, MAX_SPLIT + 1) if n_chunks % d == 0 and n_chunks // d >= MIN_SEG_CHUNKS]
    if not cands:
        return 1
    above = [d for d in cands if d >= want]
    return min(above) if above else max(cands)


def split_k(K: int, N: int) -> int:
    """Contract split count for (K, N): :func:`split_rule` (tables may only restate it).

    The same value is used on every architecture (it is part of the contract, not a schedule).
    """
    return split_rule(K, N)


# The (K, N) shapes at which the contract restates its split-K rule: Qwen3-8B's projections, full
# and TP4 shards. Written out here, not taken from the test shape catalog, because they are part
# of the frozen contract: editing a test catalog must not change gemm.bf16.v1's bit hash.
SPLIT_TABLE_SHAPES = ((1024, 4096), (3072, 4096), (4096, 1536), (4096, 4096), (4096, 6144), (4096, 24576),
                      (4096, 37984), (12288, 4096))


def _split_table() -> dict:
    return {f"{k}x{n}": split_rule(k, n) for k, n in SPLIT_TABLE_SHAPES}


_SWEEP = "gemm_invariance_sweep.py -> configs/invariance_sm90.json (sm_90, Triton 3.6.0)"
_H200 = "gemm_invariance_sweep@H200: 96 configs identical"
_TUNE = "gemm_tune.py byte-identity check of every candidate vs the reference config (sm_90) + gpu tests"
CONTRACT = contracts.register(contracts.Contract(
    id=CONTRACT_ID,
    summary="y = x @ w.T, bf16 in/out, fp32 accumulate, K chunks of 64 ascending, split-K by (K, N) only, ordered fold, one RNE rounding",
    bit_fields={
        "dtypes": {"x": "bf16", "w": "bf16", "y": "bf16 (fp32 when out_dtype=fp32)", "accumulator": "fp32",
                   "dot_operands": "bf16 on GPU; fp64 chunk sums under the CPU interpreter (same exact products)"},
        "accumulation": "fp32; inside a segment acc = tl.dot(a, b, acc) per 64-chunk (a sequential chain of "
                        "16-wide MMA k-steps), from zero",
        "rounding": "one fp32->bf16 round-to-nearest-even at the store; none before",
        "reduction_order": "K in chunks of 64 ascending (last chunk zero-padded); chunks cut into split_k "
                           "equal segments; total = 0.0 then total += segment_s for s ascending (fp32)",
        "fp_fusion": FP_FUSION,
        "chunk_k": CHUNK_K,
        "split_k": {"rule": "smallest divisor d <= MAX_SPLIT of ceil(K/64) with ceil(K/64)/d >= MIN_SEG_CHUNKS "
                            "and d * ceil(N/N_TILE) >= TARGET_PROGRAMS, else the largest such divisor, else 1; "
                            "tables may only restate it",
                    "params": {"TARGET_PROGRAMS": TARGET_PROGRAMS, "N_TILE": N_TILE, "MAX_SPLIT": MAX_SPLIT,
                               "MIN_SEG_CHUNKS": MIN_SEG_CHUNKS},
                    "table": _split_table()},
        "mma": "Triton 3.6 tl.dot lowering, bf16 x bf16 -> fp32 (sm_90: wgmma for BLOCK_M >= 64, mma.sync "
               "m16n8k16 for BLOCK_M = 16; their equality is measured, see invariance_sm90.json); gfx942 MFMA not run",
        # Checked in the compiled code by rlk.gate.crosstarget. Both sm_90 forms were measured
        # bit-identical on the H200 (invariance_sm90.json); gfx942 forms are recorded, not run.
        "mma_form": {
            "gemm.tiled": {"sm_90": ["wgmma.f32.bf16.bf16", "mma.sync.m16n8k16.f32.bf16.bf16"],
                           "gfx942": ["v_mfma_f32_32x32x8_bf16", "v_mfma_f32_16x16x16_bf16"]},
            "gemm.segment": {"sm_90": ["mma.sync.m16n8k16.f32.bf16.bf16", "wgmma.f32.bf16.bf16"],
                             "gfx942": ["v_mfma_f32_16x16x16_bf16", "v_mfma_f32_32x32x8_bf16"]},
        },
        "backward": "dx = dy @ w and dw = dy.T @ x are this contract with (K, N) = (N, K) and (M, K)",
    },
    schedule_fields={
        "schedule": list(SCHEDULES),
        "BLOCK_M": [16, 32, 64, 128],
        "BLOCK_N": [16, 32, 64, 128, 256],
        "BLOCK_K": [64, 128],
        "GROUP_M": [1, 8],
        "num_warps": [4, 8],
        "num_stages": [2, 3, 4, 5],
        "FLAT": [0, 1],
        "PERSISTENT": [0, 1],
        "TMA": [0, 1],
        "m_bucket": "per (K, N) or the table's default rule: M ranges select the schedule and its free fields, never the split",
    },
    bit_neutral_evidence={
        "schedule": f"{_H200}; gemm_invariance_test.py (interpreter) + {_SWEEP}",
        "BLOCK_M": f"{_H200} (16/64/128); PERF.md plain-kernel sweep@sm_90",
        "BLOCK_N": f"{_H200} (16-256); PERF.md plain-kernel sweep@sm_90",
        "BLOCK_K": f"{_H200} (64/128)",
        "GROUP_M": f"{_H200} (1/8); program order only (no cross-program sum)",
        "num_warps": f"{_H200} (4/8)",
        "num_stages": f"{_H200} (2/3/4)",
        "mma_form": f"{_H200}: mma.sync (BLOCK_M 16) vs wgmma identical",
        "FLAT": f"same operation sequence (interpreter tests); {_TUNE}",
        "PERSISTENT": f"tile walk order only (no cross-program sum); {_TUNE}",
        "TMA": f"load path only (zero fill past the edges); {_TUNE}",
        "m_bucket": f"selects schedule and free fields only (each measured bit-neutral above); {_TUNE}",
    },
    targets=("sm_90", "cpu-interpreter"),
    kernels=("gemm.segment", "gemm.fold", "gemm.tiled"),
))
