"""Contracts ``gemm.bf16.v1`` and ``gemm.bf16.v2``: every bit-relevant choice of the strict GEMM.

Both: the 64-wide ascending K walk (a sequential chain of 16-wide MMA k-steps), segments of
consecutive chunks each summed from zero, the ascending segment fold, fp32 accumulation and the
single RNE rounding at the store. They differ in how K is cut into segments:

* v1 (the default everywhere): ``split_rule(K, N)`` equal segments, split only where
  ``ceil(N/16)`` programs cannot fill 132 SMs (schedule tables may restate it, never change it);
* v2 (opt-in): fixed segments of ``SEG_CHUNKS = 16`` chunks (1024 K elements), the last one
  padded with zero chunks; the segment count ``n_seg(K) = ceil(ceil(K/64)/16)`` depends on K only.

The free launch choices (``schedule.py``) are listed in the contracts' schedule fields with their
evidence; both contracts run the same kernels.
"""

from __future__ import annotations

from rlk import contracts
from rlk.determinism import FP_FUSION
from rlk.errors import UnsupportedConfigError
from rlk.kernels.common import cdiv

CONTRACT_ID = "gemm.bf16.v1"  # the default of every caller
CONTRACT_ID_V2 = "gemm.bf16.v2"
CHUNK_K = 64
# v2: chunks per segment (contract bits). 16 chunks = 1024 K elements: Qwen3-8B's K of 4096 and
# 12288 give 4 and 12 segments, so decode has 4-12x the N-tile programs without an N-dependent rule.
SEG_CHUNKS = 16
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


def segment_rule(K: int) -> int:
    """v2 segment count ``n_seg(K) = ceil(ceil(K/64) / SEG_CHUNKS)``: K only (never M, never N)."""
    return cdiv(cdiv(K, CHUNK_K), SEG_CHUNKS)


def check_contract_id(contract_id: str) -> str:
    """``contract_id`` if it names a GEMM contract, else a clear UnsupportedConfigError."""
    if contract_id not in (CONTRACT_ID, CONTRACT_ID_V2):
        raise UnsupportedConfigError(f"gemm: unknown contract {contract_id!r} "
                                     f"(known: {CONTRACT_ID}, {CONTRACT_ID_V2})")
    return contract_id


def split_k(K: int, N: int, contract_id: str = CONTRACT_ID) -> int:
    """Contract split count (segments) for (K, N) under ``contract_id``.

    v1: :func:`split_rule` (tables may only restate it); v2: :func:`segment_rule` (K only). The
    same value is used on every architecture (it is part of the contract, not a schedule).
    """
    if check_contract_id(contract_id) == CONTRACT_ID_V2:
        return segment_rule(K)
    return split_rule(K, N)


def segments(K: int, N: int, contract_id: str = CONTRACT_ID) -> tuple[int, int]:
    """``(split, seg_chunks)``: the segment count and the chunks of 64 per segment.

    v1 cuts the ``ceil(K/64)`` chunks into ``split`` equal segments; v2 uses segments of
    ``SEG_CHUNKS`` chunks, so ``split * seg_chunks`` may pass ``ceil(K/64)``: the padded chunks
    lie past K and are executed with exact-zero operands (masked / zero-filled loads).
    """
    if check_contract_id(contract_id) == CONTRACT_ID_V2:
        return split_k(K, N, contract_id), SEG_CHUNKS
    s = split_k(K, N)
    return s, cdiv(K, CHUNK_K) // s


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

# Bit fields both contracts share (v2 replaces reduction_order, split_k and backward, adds seg_chunks).
_DTYPES = {"x": "bf16", "w": "bf16", "y": "bf16 (fp32 when out_dtype=fp32)", "accumulator": "fp32",
           "dot_operands": "bf16 on GPU; fp64 chunk sums under the CPU interpreter (same exact products)"}
_ACCUMULATION = ("fp32; inside a segment acc = tl.dot(a, b, acc) per 64-chunk (a sequential chain of "
                 "16-wide MMA k-steps), from zero")
_ROUNDING = "one fp32->bf16 round-to-nearest-even at the store; none before"
_MMA = ("Triton 3.6 tl.dot lowering, bf16 x bf16 -> fp32 (sm_90: wgmma for BLOCK_M >= 64, mma.sync "
        "m16n8k16 for BLOCK_M = 16; their equality is measured, see invariance_sm90.json); gfx942 MFMA not run")
# Checked in the compiled code by rlk.gate.crosstarget. Both sm_90 forms were measured
# bit-identical on the H200 (invariance_sm90.json); gfx942 forms are recorded, not run.
_MMA_FORM = {
    "gemm.tiled": {"sm_90": ["wgmma.f32.bf16.bf16", "mma.sync.m16n8k16.f32.bf16.bf16"],
                   "gfx942": ["v_mfma_f32_32x32x8_bf16", "v_mfma_f32_16x16x16_bf16"]},
    "gemm.segment": {"sm_90": ["mma.sync.m16n8k16.f32.bf16.bf16", "wgmma.f32.bf16.bf16"],
                     "gfx942": ["v_mfma_f32_16x16x16_bf16", "v_mfma_f32_32x32x8_bf16"]},
}
_SCHEDULE_FIELDS = {
    "schedule": list(SCHEDULES),
    "BLOCK_M": [16, 32, 64, 128],
    "BLOCK_N": [16, 32, 64, 128, 256],
    "BLOCK_K": [64, 128, 256],
    "GROUP_M": [1, 8],
    "num_warps": [4, 8],
    "num_stages": [2, 3, 4, 5],
    "FLAT": [0, 1],
    "PERSISTENT": [0, 1, 2],
    "TMA": [0, 1],
    "NSUB": [1, 2, 3],
    "N_PROGS": "decode: 0 (tiles of BLOCK_N) or a program count along N (columns cut into ranges of "
               "cdiv(N, N_PROGS) rounded up to 8, each in one BLOCK_N tile)",
    "m_bucket": "per (K, N) or the table's default rule: M ranges select the schedule and its free fields, never the split",
}
_EVIDENCE = {
    "schedule": f"{_H200}; gemm_invariance_test.py (interpreter) + {_SWEEP}",
    "BLOCK_M": f"{_H200} (16/64/128); PERF.md plain-kernel sweep@sm_90",
    "BLOCK_N": f"{_H200} (16-256); PERF.md plain-kernel sweep@sm_90",
    "BLOCK_K": f"{_H200} (64/128); 256: {_TUNE} (the table's decode entries)",
    "GROUP_M": f"{_H200} (1/8); program order only (no cross-program sum)",
    "num_warps": f"{_H200} (4/8)",
    "num_stages": f"{_H200} (2/3/4)",
    "mma_form": f"{_H200}: mma.sync (BLOCK_M 16) vs wgmma identical",
    "FLAT": f"same operation sequence (interpreter tests); {_TUNE}",
    "PERSISTENT": (f"tile walk order only (no cross-program sum); {_TUNE}; 2 (the walk and each tile's K loop as "
                   "one flattened software pipeline: the same per-tile operations, issued earlier): the "
                   "interpreter walks it as 1; H100 (sm_90): the tuner's byte check and the GPU candidate test"),
    "TMA": f"load path only (zero fill past the edges); {_TUNE}",
    "NSUB": (f"prefill tiles of NSUB x BLOCK_N columns (e.g. 3 x 64 = 192: widths no power of two gives) as "
             f"NSUB sub-tiles on one x tile, each with its own accumulator and fold in the same K order; "
             f"gemm_invariance_test.py (interpreter: NSUB 2 and 3, transposed operands too); {_TUNE} "
             f"(H100: the NSUB 3 tuner candidates)"),
    "N_PROGS": f"which program sums which output columns: every column still summed by one program "
               f"with the same K walk; gemm_invariance_test.py (interpreter: ragged ranges, odd N) + {_TUNE}",
    "m_bucket": f"selects schedule and free fields only (each measured bit-neutral above); {_TUNE}",
}
_KERNELS = ("gemm.segment", "gemm.fold", "gemm.tiled")
# v1 only (launch routes no other contract there): the sm_90 CUTLASS kernels (sm90.py).
_V1_SCHEDULE_FIELDS = {**_SCHEDULE_FIELDS, "sm90_cutlass": (
    "sm_90, split count 1, bf16 out: configs/sm90_cutlass.json may pick a CUTLASS configuration "
    "(sm90.CONFIGS: tile M 64/128/256 x tile N 48-256, tile K one 64-chunk or two, ping-pong, cooperative or non-persistent, "
    "clusters of up to 4 CTAs along M or N, a TMA or a direct epilogue; or operands swapped, y^T = w @ x^T: "
    "64 or 128 weight rows x 32-208 tokens) per (K, N) and M range instead of the Triton kernels")}
_V1_EVIDENCE = {**_EVIDENCE, "sm90_cutlass": (
    "same arithmetic: one fp32 accumulator from zero per element, 64-wide K chunks ascending, each four "
    "wgmma k16 steps (a 128-deep tile issues two chunks' eight in the same order), alpha 1 and no C operand, one RNE rounding; sm90_probe@H100 (sm_90): 0 differing "
    "elements against the Triton kernels over 8 Qwen3-8B shapes x 15 M (odd M 77 and 200 included) x every "
    "unswapped configuration; sm90_test.py (GPU: three (K, N) incl. 192 x 200, M 1-513, and a CUDA-graph "
    "replay). The operand-swapped configurations (sw*: the same products and K chain per element): "
    "sm90_probe@H100: 0 differing elements over the 8 Qwen3-8B shapes x 31 M (1-8192) and 15 other Qwen3 "
    "sizes' projections x 7 M; the checked-in table names none, and sm90_probe picks only configurations "
    "with 0 differing elements. The 128-deep configurations (x128) serve only K with an even number of "
    "64-chunks (sm90.serves_k); sm90_probe@H100: 0 differing elements for each of the 14 over the 8 Qwen3-8B "
    "shapes x 26 M (1-4096), sm90_kscan_probe 0 at N 4096, K 128-8192 (docs/results/h100_2026-12-07_session34); "
    "no table names them. M 1, 2, 4, every 8 to 256, 320, 384, 448, 512, 1024, 2048 and 4096 x the 4 Qwen3-8B "
    "TP1 shapes x the 50 configurations nearest the fastest: 0 differing (docs/results/h100_2026-12-08_session35)")}

CONTRACT = contracts.register(contracts.Contract(
    id=CONTRACT_ID,
    summary="y = x @ w.T, bf16 in/out, fp32 accumulate, K chunks of 64 ascending, split-K by (K, N) only, ordered fold, one RNE rounding",
    bit_fields={
        "dtypes": _DTYPES,
        "accumulation": _ACCUMULATION,
        "rounding": _ROUNDING,
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
        "mma": _MMA,
        "mma_form": _MMA_FORM,
        "backward": "dx = dy @ w and dw = dy.T @ x are this contract with (K, N) = (N, K) and (M, K)",
    },
    schedule_fields=_V1_SCHEDULE_FIELDS,
    bit_neutral_evidence=_V1_EVIDENCE,
    targets=("sm_90", "cpu-interpreter"),
    kernels=_KERNELS,
))

# v2 runs v1's kernels with other SPLIT_K / SEG_STEPS constants: v1's GPU evidence covers the same
# code, but no v2 split was swept on the H200 yet; the interpreter evidence is gemm_v2_test.py.
_V2_EVIDENCE = {k: f"{v}; v2: same kernels and fields, gemm_v2_test.py (interpreter), sm_90 v2 sweep not run"
                for k, v in _EVIDENCE.items()}

CONTRACT_V2 = contracts.register(contracts.Contract(
    id=CONTRACT_ID_V2,
    summary="y = x @ w.T, bf16 in/out, fp32 accumulate, K chunks of 64 ascending in fixed segments of 16 chunks "
            "(segment count a function of K only), ordered fold, one RNE rounding",
    bit_fields={
        "dtypes": _DTYPES,
        "accumulation": _ACCUMULATION,
        "rounding": _ROUNDING,
        "reduction_order": (
            f"K in chunks of {CHUNK_K} ascending (chunk c = K elements [64c, 64c+64), the last real chunk "
            f"zero-padded); chunks grouped into fixed segments of SEG_CHUNKS = {SEG_CHUNKS} chunks "
            f"({SEG_CHUNKS * CHUNK_K} K elements): segment s holds chunks [16s, 16s+16); when ceil(K/64) is "
            "not a multiple of 16 the last segment is padded with chunks past K, executed like real chunks: "
            "their masked (pointer) or zero-filled (TMA) loads give exact +0.0 operands and every schedule "
            "runs acc = dot(0, 0, acc) for each of them (in IEEE fp32 that adds +0.0 to an accumulator that "
            "is never -0.0, as it starts at +0.0; skipping them would be bit-neutral only where the MMA "
            "passes the accumulator through a zero product unchanged, subnormals included, which is not "
            "measured); inside a segment acc = 0 then acc = dot(a, b, acc) per chunk ascending; "
            "across segments total = 0.0 then total += acc_s for s ascending (fp32); one rounding at the store"),
        "fp_fusion": FP_FUSION,
        "chunk_k": CHUNK_K,
        "seg_chunks": SEG_CHUNKS,
        "split_k": {"rule": "n_seg(K) = ceil(ceil(K/64) / SEG_CHUNKS): a function of K only (never M, never N); "
                            "schedule tables' split_k restates gemm.bf16.v1 and is never used by v2",
                    "params": {"SEG_CHUNKS": SEG_CHUNKS},
                    "table": {f"{k}x{n}": segment_rule(k) for k, n in SPLIT_TABLE_SHAPES}},
        "mma": _MMA,
        "mma_form": _MMA_FORM,
        "backward": "dx = dy @ w and dw = dy.T @ x are this contract with their own reduction length: "
                    "K = N (n_seg(N) segments) and K = M, the tokens (n_seg(M) segments)",
    },
    schedule_fields=_SCHEDULE_FIELDS,
    bit_neutral_evidence=_V2_EVIDENCE,
    targets=("sm_90", "cpu-interpreter"),
    kernels=_KERNELS,
))

CONTRACTS = {c.id: c for c in (CONTRACT, CONTRACT_V2)}


def contract(contract_id: str = CONTRACT_ID) -> contracts.Contract:
    """The registered record of a GEMM contract ID (UnsupportedConfigError for an unknown one)."""
    return CONTRACTS[check_contract_id(contract_id)]
