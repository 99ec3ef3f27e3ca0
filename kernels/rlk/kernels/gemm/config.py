"""Contract ``gemm.bf16.v1``, its split-K rule and the schedule tables.

Bit-relevant (contract): the 64-wide ascending K walk (a sequential chain of 16-wide MMA k-steps),
the split count ``split_k(K, N) = split_rule(K, N)`` (tables may restate it, never change it),
the segment fold order, fp32 accumulation and the single RNE rounding at the store. Free
(schedule, measured bit-neutral): decode vs prefill kernel, BLOCK_M, BLOCK_N, BLOCK_K (a
multiple of 64), GROUP_M, num_warps, num_stages, the MMA instruction form, FLAT / PERSISTENT /
TMA variants of the prefill kernel. Tables are keyed by (K, N); M buckets may select the
schedule and its free fields (bit-neutral), never the split. ``$RLK_GEMM_TABLE`` replaces the sm_90 table
file (e.g. the output of ``gemm_tune``).

Bucket format (per (K, N) entry, or the table's ``default_buckets`` rule for every (K, N) without
an entry): ``[max_m or null, schedule, fields]`` ascending by ``max_m``, where ``fields`` is null
(the schedule's entry config), an int (BLOCK_M) or a dict of that schedule's free fields.
"""

from __future__ import annotations

import functools
import json
import os

import torch

from rlk import contracts
from rlk.determinism import FP_FUSION
from rlk.errors import UnsupportedConfigError
from rlk.kernels import registry
from rlk.kernels.common import cdiv, device_capability  # noqa: F401 - cdiv: launch.py, tests
from rlk.kernels.gemm import kernel, kernel_tiled

CONTRACT_ID = "gemm.bf16.v1"
CHUNK_K = 64
# Split rule parameters (contract bits): decode parallelism comes first from narrow N tiles
# (N_TILE = 16 wide); split K only where cdiv(N, N_TILE) programs cannot fill TARGET_PROGRAMS
# (the H200's 132 SMs), at most MAX_SPLIT segments, each at least MIN_SEG_CHUNKS chunks long.
TARGET_PROGRAMS = 132
N_TILE = 16
MAX_SPLIT = 8
MIN_SEG_CHUNKS = 4
SCHEDULES = ("decode", "prefill")
# Free fields per schedule (what a table entry or a config override may set).
SCHEDULE_KEYS = {
    "decode": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"),
    "prefill": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "FLAT",
                "PERSISTENT", "TMA"),
}
DECODE_BLOCK_M = (16, 32, 64)  # auto decode BLOCK_M: the smallest that covers M (max 64)

_HERE = os.path.dirname(os.path.abspath(__file__))
TABLE_FILES = {"sm_90": "sm90.json", "gfx942": "gfx942.json"}
TABLE_ENV = "RLK_GEMM_TABLE"  # path of an sm_90 table replacing configs/sm90.json (tuner output)


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


def table_path(arch: str = "sm_90") -> str:
    if arch not in TABLE_FILES:
        raise UnsupportedConfigError(f"gemm.bf16.v1: no table for arch {arch!r} (have {sorted(TABLE_FILES)})")
    if arch == "sm_90" and os.environ.get(TABLE_ENV):
        return os.environ[TABLE_ENV]
    return os.path.join(_HERE, "configs", TABLE_FILES[arch])


def load_table(arch: str = "sm_90") -> dict:
    """The schedule table of ``arch`` (``$RLK_GEMM_TABLE`` replaces the sm_90 file)."""
    return _load_table_file(table_path(arch))


@functools.lru_cache(maxsize=None)
def _load_table_file(path: str) -> dict:
    with open(path) as f:
        table = json.load(f)
    name = os.path.basename(path)
    for key, entry in table["shapes"].items():
        k, n = (int(v) for v in key.split("x"))
        s = entry.get("split_k")
        if s is not None and s != split_rule(k, n):
            # The split count is contract bits: a table documents it, never changes it.
            raise UnsupportedConfigError(f"{name}: {key} split_k={s} differs from the contract rule "
                                         f"split_rule({k}, {n}) = {split_rule(k, n)}")
        for sched in SCHEDULES:
            bad = set(entry.get(sched, {})) - set(SCHEDULE_KEYS[sched])
            if bad:
                raise UnsupportedConfigError(f"{name}: {key} {sched} has non-schedule fields {sorted(bad)}")
        _check_buckets(name, key, entry.get("buckets", []))
    _check_buckets(name, "default_buckets", table.get("default_buckets", []))
    return table


def _check_buckets(name: str, key: str, bks: list) -> None:
    """A bucket list selects schedules and free fields only, ascending by max_m, ending open."""
    prev = 0
    for i, b in enumerate(bks):
        if not isinstance(b, (list, tuple)) or len(b) != 3 or b[1] not in SCHEDULES:
            raise UnsupportedConfigError(f"{name}: {key} bucket {b} is not [max_m|null, schedule, fields]")
        max_m, sched, fields = b
        if max_m is None:
            if i != len(bks) - 1:
                raise UnsupportedConfigError(f"{name}: {key} open bucket {b} is not the last")
        elif not isinstance(max_m, int) or max_m <= prev:
            raise UnsupportedConfigError(f"{name}: {key} bucket bounds must ascend (got {max_m} after {prev})")
        else:
            prev = max_m
        if isinstance(fields, dict):
            bad = set(fields) - set(SCHEDULE_KEYS[sched])
            if bad:
                raise UnsupportedConfigError(f"{name}: {key} bucket {b} has non-schedule fields {sorted(bad)}")
        elif fields is not None and not isinstance(fields, int):
            raise UnsupportedConfigError(f"{name}: {key} bucket {b}: fields must be null, BLOCK_M or a dict")
    if bks and bks[-1][0] is not None:
        raise UnsupportedConfigError(f"{name}: {key} buckets must end with an open [null, ...] bucket")


def split_k(K: int, N: int) -> int:
    """Contract split count for (K, N): :func:`split_rule` (tables may only restate it).

    The same value is used on every architecture (it is part of the contract, not a schedule).
    """
    return split_rule(K, N)


def arch_of(device: torch.device) -> str:
    """Table name for ``device``; the interpreter uses the sm_90 table (same code paths)."""
    if device.type == "cpu":
        return "sm_90"
    if getattr(torch.version, "hip", None):
        return "gfx942"
    major, minor = device_capability(device)
    if (major, minor) != (9, 0):
        raise UnsupportedConfigError(f"gemm.bf16.v1: sm_{major}{minor} is not a target of the contract "
                                     "(sm_90 measured; add a table and invariance evidence first)")
    return "sm_90"


def schedule_config(K: int, N: int, schedule: str, arch: str = "sm_90") -> dict:
    """Launch parameters of ``schedule`` for (K, N). Never keyed by M (decode BLOCK_M: see
    :func:`pick_schedule`)."""
    if schedule not in SCHEDULES:
        raise UnsupportedConfigError(f"gemm: unknown schedule {schedule!r} (have {SCHEDULES})")
    table = load_table(arch)
    cfg = dict(table["default"][schedule])
    cfg.update(table["shapes"].get(f"{K}x{N}", {}).get(schedule, {}))
    return cfg


def buckets(K: int, N: int, arch: str = "sm_90") -> list:
    """M buckets ``[[max_m or None, schedule, fields], ...]`` ascending for (K, N): the (K, N)
    entry's, else the table's ``default_buckets`` rule, else decode up to ``decode_max_m``.

    They select only bit-neutral fields (schedule and its free fields): bytes never depend on
    the bucket.
    """
    table = load_table(arch)
    entry = table["shapes"].get(f"{K}x{N}", {})
    if "buckets" in entry:
        return [list(b) for b in entry["buckets"]]
    if "default_buckets" in table:
        return [list(b) for b in table["default_buckets"]]
    return [[int(table["decode_max_m"]), "decode", None], [None, "prefill", None]]


def pick_schedule(M: int, K: int, N: int, arch: str = "sm_90") -> tuple[str, int | dict | None]:
    """(schedule, fields) for M rows: the first bucket with M <= max_m (fields: None, BLOCK_M
    or a dict of free fields)."""
    for max_m, sched, fields in buckets(K, N, arch):
        if max_m is None or M <= max_m:
            return sched, fields
    return "prefill", None


def decode_block_m(M: int) -> int:
    """Decode BLOCK_M covering all M rows in one tile (M <= 64): 16, 32 or 64."""
    for bm in DECODE_BLOCK_M:
        if M <= bm:
            return bm
    return DECODE_BLOCK_M[-1]


def fold_config(arch: str = "sm_90") -> dict:
    return dict(load_table(arch)["default"]["fold"])


def decode_max_m(arch: str = "sm_90") -> int:
    return int(load_table(arch)["decode_max_m"])


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


def _register_kernels() -> None:
    common = {"M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_xk": "i32",
              "stride_wn": "i32", "stride_wk": "i32"}
    flags = {"DOT_DTYPE": "constexpr", "OUT_FP32": "constexpr", "INTERPRET": "constexpr"}
    dec = schedule_config(4096, 6144, "decode")
    pre = schedule_config(4096, 6144, "prefill")
    bwd = load_table("sm_90")["default"]["prefill"]
    gpu = {"DOT_DTYPE": "bf16", "OUT_FP32": False, "INTERPRET": False}
    registry.register_kernel(registry.KernelEntry(
        name="gemm.segment", contract_id=CONTRACT_ID, fn=kernel.gemm_segment_kernel,
        signature={"out_ptr": "*fp32", "x_ptr": "*bf16", "w_ptr": "*bf16", **common,
                   "stride_om": "i32", "stride_on": "i32", "stride_ws": "i32",
                   "SPLIT_K": "constexpr", "SEG_STEPS": "constexpr", "BLOCK_M": "constexpr",
                   "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", **flags},
        configs=({"SPLIT_K": 2, "SEG_STEPS": 32, "BLOCK_M": 16, **{k: dec[k] for k in ("BLOCK_N", "BLOCK_K")},
                  **gpu, "num_warps": dec["num_warps"], "num_stages": dec["num_stages"]},),
        expects_mma=True))
    fold = fold_config()
    registry.register_kernel(registry.KernelEntry(
        name="gemm.fold", contract_id=CONTRACT_ID, fn=kernel.gemm_fold_kernel,
        signature={"y_ptr": "*bf16", "ws_ptr": "*fp32", "M": "i32", "N": "i32", "stride_ym": "i32",
                   "stride_yn": "i32", "stride_ws": "i32", "SPLIT_K": "constexpr", "BLOCK_M": "constexpr",
                   "BLOCK_N": "constexpr", "OUT_FP32": "constexpr", "INTERPRET": "constexpr"},
        configs=({"SPLIT_K": 2, "BLOCK_M": fold["BLOCK_M"], "BLOCK_N": fold["BLOCK_N"], "OUT_FP32": False,
                  "INTERPRET": False, "num_warps": fold["num_warps"], "num_stages": 1},)))
    registry.register_kernel(registry.KernelEntry(
        name="gemm.tiled", contract_id=CONTRACT_ID, fn=kernel_tiled.gemm_tiled_kernel,
        signature={"y_ptr": "*bf16", "x_ptr": "*bf16", "w_ptr": "*bf16", "x_desc": "constexpr",
                   "w_desc": "constexpr", **common,
                   "stride_ym": "i32", "stride_yn": "i32", "SPLIT_K": "constexpr", "SEG_STEPS": "constexpr",
                   "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
                   "GROUP_M": "constexpr", "NUM_PROGS": "constexpr", "FLAT": "constexpr",
                   "USE_TMA": "constexpr", **flags},
        configs=({"x_desc": None, "w_desc": None, "SPLIT_K": 2, "SEG_STEPS": 32,
                  **{k: pre[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
                  "NUM_PROGS": 132 if pre.get("PERSISTENT") else 0, "FLAT": bool(pre.get("FLAT", 1)),
                  "USE_TMA": False, **gpu, "num_warps": pre["num_warps"], "num_stages": pre["num_stages"]},
                 # The training backward's path: both operands transposes of row-major tensors,
                 # read through tensor descriptors (TMA on sm_90, plain loads on gfx942) and
                 # transposed in registers; the default prefill tiles (every dw shape is untuned).
                 {"SIGNATURE": {"x_desc": f"tensordesc<bf16[{bwd['BLOCK_K']}, {bwd['BLOCK_M']}]>",
                                "w_desc": f"tensordesc<bf16[{bwd['BLOCK_K']}, {bwd['BLOCK_N']}]>"},
                  "SPLIT_K": 1, "SEG_STEPS": 27, **{k: bwd[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
                  "NUM_PROGS": 0, "FLAT": bool(bwd.get("FLAT", 1)), "USE_TMA": True, "X_T": True, "W_T": True,
                  **gpu, "num_warps": bwd["num_warps"], "num_stages": bwd["num_stages"]}),
        expects_mma=True))


_register_kernels()
