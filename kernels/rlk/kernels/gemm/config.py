"""Contract ``gemm.bf16.v1``, its split-K rule and the checked-in schedule tables.

Bit-relevant (contract): the 64-wide ascending K walk, the split count ``split_k(K, N)`` (a
table entry for known (K, N), else :func:`split_rule`), the segment fold order, fp32
accumulation, the MMA form and the single RNE rounding at the store. Free (schedule, measured
bit-neutral): decode vs prefill kernel, BLOCK_M, BLOCK_N, BLOCK_K (a multiple of 64), GROUP_M,
num_warps, num_stages. No entry is keyed by M; the only M-dependent choice is the schedule
(``decode_max_m``), which is allowed because both schedules give identical bytes.
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
from rlk.kernels.gemm import kernel

CONTRACT_ID = "gemm.bf16.v1"
CHUNK_K = 64
# Split rule parameters (contract bits): aim for >= TARGET_PROGRAMS decode programs with
# 64-wide N tiles, at most MAX_SPLIT segments, each at least MIN_SEG_CHUNKS chunks long.
TARGET_PROGRAMS = 264
MAX_SPLIT = 8
MIN_SEG_CHUNKS = 4
SCHEDULES = ("decode", "prefill")

_HERE = os.path.dirname(os.path.abspath(__file__))
TABLE_FILES = {"sm_90": "sm90.json", "gfx942": "gfx942.json"}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_rule(K: int, N: int) -> int:
    """Split count for a (K, N) without a table entry. Depends on K and N only."""
    n_chunks = cdiv(K, CHUNK_K)
    want = cdiv(TARGET_PROGRAMS, cdiv(N, 64))
    cands = [d for d in range(1, MAX_SPLIT + 1) if n_chunks % d == 0 and n_chunks // d >= MIN_SEG_CHUNKS]
    if not cands:
        return 1
    above = [d for d in cands if d >= want]
    return min(above) if above else max(cands)


@functools.lru_cache(maxsize=None)
def load_table(arch: str = "sm_90") -> dict:
    if arch not in TABLE_FILES:
        raise UnsupportedConfigError(f"gemm.bf16.v1: no table for arch {arch!r} (have {sorted(TABLE_FILES)})")
    with open(os.path.join(_HERE, "configs", TABLE_FILES[arch])) as f:
        table = json.load(f)
    for key, entry in table["shapes"].items():
        k, n = (int(v) for v in key.split("x"))
        s = entry.get("split_k")
        if s is not None and (s < 1 or cdiv(k, CHUNK_K) % s):
            raise UnsupportedConfigError(f"{TABLE_FILES[arch]}: split_k={s} does not divide the "
                                         f"{cdiv(k, CHUNK_K)} chunks of K={k}")
    return table


def split_k(K: int, N: int) -> int:
    """Contract split count for (K, N): the sm_90 table entry, else :func:`split_rule`.

    The same value is used on every architecture (it is part of the contract, not a schedule).
    """
    entry = load_table("sm_90")["shapes"].get(f"{K}x{N}", {})
    return int(entry.get("split_k", split_rule(K, N)))


def arch_of(device: torch.device) -> str:
    """Table name for ``device``; the interpreter uses the sm_90 table (same code paths)."""
    if device.type == "cpu":
        return "sm_90"
    if getattr(torch.version, "hip", None):
        return "gfx942"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        raise UnsupportedConfigError(f"gemm.bf16.v1: sm_{major}{minor} is not a target of the contract "
                                     "(sm_90 measured; add a table and invariance evidence first)")
    return "sm_90"


def schedule_config(K: int, N: int, schedule: str, arch: str = "sm_90") -> dict:
    """Launch parameters of ``schedule`` for (K, N). Never keyed by M."""
    if schedule not in SCHEDULES:
        raise UnsupportedConfigError(f"gemm: unknown schedule {schedule!r} (have {SCHEDULES})")
    table = load_table(arch)
    cfg = dict(table["default"][schedule])
    cfg.update(table["shapes"].get(f"{K}x{N}", {}).get(schedule, {}))
    return cfg


def fold_config(arch: str = "sm_90") -> dict:
    return dict(load_table(arch)["default"]["fold"])


def decode_max_m(arch: str = "sm_90") -> int:
    return int(load_table(arch)["decode_max_m"])


def _split_table() -> dict:
    return {k: v["split_k"] for k, v in sorted(load_table("sm_90")["shapes"].items()) if "split_k" in v}


_SWEEP = "gemm_invariance_sweep.py -> configs/invariance_sm90.json (sm_90, Triton 3.6.0)"
CONTRACT = contracts.register(contracts.Contract(
    id=CONTRACT_ID,
    summary="y = x @ w.T, bf16 in/out, fp32 accumulate, K chunks of 64 ascending, split-K by (K, N) only, ordered fold, one RNE rounding",
    bit_fields={
        "dtypes": {"x": "bf16", "w": "bf16", "y": "bf16 (fp32 when out_dtype=fp32)", "accumulator": "fp32",
                   "dot_operands": "bf16 on GPU; fp32 under the CPU interpreter (same exact products)"},
        "accumulation": "fp32; inside a segment acc = tl.dot(a, b, acc) per 64-chunk, from zero",
        "rounding": "one fp32->bf16 round-to-nearest-even at the store; none before",
        "reduction_order": "K in chunks of 64 ascending (last chunk zero-padded); chunks cut into split_k "
                           "equal segments; total = 0.0 then total += segment_s for s ascending (fp32)",
        "fp_fusion": FP_FUSION,
        "chunk_k": CHUNK_K,
        "split_k": {"rule": "table entry for (K, N), else smallest divisor d <= MAX_SPLIT of ceil(K/64) with "
                            "ceil(K/64)/d >= MIN_SEG_CHUNKS and d * ceil(N/64) >= TARGET_PROGRAMS, else the "
                            "largest such divisor, else 1",
                    "params": {"TARGET_PROGRAMS": TARGET_PROGRAMS, "MAX_SPLIT": MAX_SPLIT,
                               "MIN_SEG_CHUNKS": MIN_SEG_CHUNKS},
                    "table": _split_table()},
        "mma": "Triton 3.6 tl.dot lowering, bf16 x bf16 -> fp32 (sm_90: wgmma for BLOCK_M >= 64, mma.sync "
               "m16n8k16 for BLOCK_M = 16; their equality is measured, see invariance_sm90.json); gfx942 MFMA not run",
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
    },
    bit_neutral_evidence={
        "schedule": f"gemm_invariance_test.py (interpreter) + {_SWEEP}",
        "BLOCK_M": f"PERF.md plain-kernel sweep@sm_90 + {_SWEEP}",
        "BLOCK_N": f"PERF.md plain-kernel sweep@sm_90 + {_SWEEP}",
        "BLOCK_K": f"PERF.md plain-kernel sweep@sm_90 (64/128) + {_SWEEP}",
        "GROUP_M": "program order only: every element is computed by one program (no cross-program sum)",
        "num_warps": f"PERF.md plain-kernel sweep@sm_90 (4/8) + {_SWEEP}",
        "num_stages": f"pipelining only + {_SWEEP}",
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
    gpu = {"DOT_DTYPE": "bf16", "OUT_FP32": False, "INTERPRET": False}
    registry.register_kernel(registry.KernelEntry(
        name="gemm.segment", contract_id=CONTRACT_ID, fn=kernel.gemm_segment_kernel,
        signature={"out_ptr": "*fp32", "x_ptr": "*bf16", "w_ptr": "*bf16", **common,
                   "stride_om": "i32", "stride_on": "i32", "stride_ws": "i32",
                   "SPLIT_K": "constexpr", "SEG_CHUNKS": "constexpr", "BLOCK_M": "constexpr",
                   "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", **flags},
        configs=({"SPLIT_K": 4, "SEG_CHUNKS": 16, **{k: dec[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")},
                  **gpu, "num_warps": dec["num_warps"], "num_stages": dec["num_stages"]},),
        expects_mma=True))
    fold = fold_config()
    registry.register_kernel(registry.KernelEntry(
        name="gemm.fold", contract_id=CONTRACT_ID, fn=kernel.gemm_fold_kernel,
        signature={"y_ptr": "*bf16", "ws_ptr": "*fp32", "M": "i32", "N": "i32", "stride_ym": "i32",
                   "stride_yn": "i32", "stride_ws": "i32", "SPLIT_K": "constexpr", "BLOCK_M": "constexpr",
                   "BLOCK_N": "constexpr", "OUT_FP32": "constexpr", "INTERPRET": "constexpr"},
        configs=({"SPLIT_K": 4, "BLOCK_M": fold["BLOCK_M"], "BLOCK_N": fold["BLOCK_N"], "OUT_FP32": False,
                  "INTERPRET": False, "num_warps": fold["num_warps"], "num_stages": 1},)))
    registry.register_kernel(registry.KernelEntry(
        name="gemm.tiled", contract_id=CONTRACT_ID, fn=kernel.gemm_tiled_kernel,
        signature={"y_ptr": "*bf16", "x_ptr": "*bf16", "w_ptr": "*bf16", **common,
                   "stride_ym": "i32", "stride_yn": "i32", "SPLIT_K": "constexpr", "SEG_CHUNKS": "constexpr",
                   "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
                   "GROUP_M": "constexpr", **flags},
        configs=({"SPLIT_K": 4, "SEG_CHUNKS": 16,
                  **{k: pre[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
                  **gpu, "num_warps": pre["num_warps"], "num_stages": pre["num_stages"]},),
        expects_mma=True))


_register_kernels()
