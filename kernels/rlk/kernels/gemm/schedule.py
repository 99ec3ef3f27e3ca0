"""Schedule tables of ``gemm.bf16.v1`` (bit-neutral launch choices) and its kernel registry entries.

Free (measured bit-neutral, see the contract's evidence): decode vs prefill kernel, BLOCK_M,
BLOCK_N, BLOCK_K (a multiple of 64), GROUP_M, num_warps, num_stages, the MMA instruction form,
FLAT / PERSISTENT / TMA / NSUB variants of the prefill kernel. Tables are keyed by (K, N); M buckets may
select the schedule and its free fields (bit-neutral), never the split. An entry's ``split_k``
restates ``gemm.bf16.v1``'s ``contract.split_rule`` (checked at load); it is documentation only:
``launch.plan`` takes every split from the contract in use, so a ``gemm.bf16.v2`` plan reuses the
tiles and ignores that field. ``$RLK_GEMM_TABLE`` replaces the sm_90 table file (e.g. the output
of ``gemm_tune``).

Bucket format (per (K, N) entry, or the table's ``default_buckets`` rule for every (K, N) without
an entry): ``[max_m or null, schedule, fields]`` ascending by ``max_m``, where ``fields`` is null
(the schedule's entry config), an int (BLOCK_M) or a dict of that schedule's free fields.
"""

from __future__ import annotations

import functools
import json
import os

from rlk.errors import UnsupportedConfigError
from rlk.kernels import common, registry
from rlk.kernels.common import CPU_ARCH
from rlk.kernels.gemm import kernel, kernel_tiled
from rlk.kernels.gemm.contract import CONTRACT_ID, SCHEDULES, split_rule

# Free fields per schedule (what a table entry or a config override may set).
SCHEDULE_KEYS = {
    "decode": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "N_PROGS"),
    "prefill": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "FLAT",
                "PERSISTENT", "TMA", "NSUB"),
}
DECODE_BLOCK_M = (16, 32, 64)  # auto decode BLOCK_M: the smallest that covers M (max 64)

TABLE_ENV = "RLK_GEMM_TABLE"  # path of an sm_90 table replacing configs/sm90.json (tuner output)


def table_path(arch: str = "sm_90") -> str:
    """The table file of ``arch`` (``rlk.kernels.common.arch_of``). The interpreter
    (``cpu-interpreter``) runs the sm_90 table: the same code paths, and no table field changes
    a byte. ``$RLK_GEMM_TABLE`` replaces that table."""
    if arch == CPU_ARCH:
        arch = "sm_90"
    if arch == "sm_90" and os.environ.get(TABLE_ENV):
        return os.environ[TABLE_ENV]
    return common.table_path("gemm", arch)


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
            # The split count is contract bits: a table documents v1's, never changes it (v2
            # plans never read it).
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


def bucket_at(bks: list, M: int) -> tuple[str, int | dict | None]:
    """(schedule, fields) of the first bucket of ``bks`` with M <= max_m (fields: None, BLOCK_M
    or a dict of free fields)."""
    for max_m, sched, fields in bks:
        if max_m is None or M <= max_m:
            return sched, fields
    return "prefill", None


def pick_schedule(M: int, K: int, N: int, arch: str = "sm_90") -> tuple[str, int | dict | None]:
    """(schedule, fields) for M rows from the buckets of (K, N)."""
    return bucket_at(buckets(K, N, arch), M)


def bucket_config(K: int, N: int, M: int, schedule: str, fields, arch: str = "sm_90") -> dict:
    """The free fields a bucket gives at M rows: the schedule's (K, N) config, the bucket's
    ``fields`` over it, and for decode a BLOCK_M covering M when neither sets one."""
    cfg = schedule_config(K, N, schedule, arch)
    if isinstance(fields, dict):
        cfg.update(fields)
    elif fields is not None:
        cfg["BLOCK_M"] = int(fields)
    if schedule == "decode" and "BLOCK_M" not in cfg:
        cfg["BLOCK_M"] = decode_block_m(M)
    return cfg


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
                   "stride_om": "i32", "stride_on": "i32", "stride_ws": "i32", "COLS": "i32",
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
                  "USE_TMA": False, "NSUB": 1, **gpu, "num_warps": pre["num_warps"], "num_stages": pre["num_stages"]},
                 # The training backward's path: both operands transposes of row-major tensors,
                 # read through tensor descriptors (TMA on sm_90, plain loads on gfx942) and
                 # transposed in registers; the default prefill tiles (every dw shape is untuned).
                 {"SIGNATURE": {"x_desc": f"tensordesc<bf16[{bwd['BLOCK_K']}, {bwd['BLOCK_M']}]>",
                                "w_desc": f"tensordesc<bf16[{bwd['BLOCK_K']}, {bwd['BLOCK_N']}]>"},
                  "SPLIT_K": 1, "SEG_STEPS": 27, **{k: bwd[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")},
                  "NUM_PROGS": 0, "FLAT": bool(bwd.get("FLAT", 1)), "USE_TMA": True, "X_T": True, "W_T": True,
                  "NSUB": 1, **gpu, "num_warps": bwd["num_warps"], "num_stages": bwd["num_stages"]},
                 # A tuner candidate at mid M: three 64-wide column sub-tiles (a 192-wide tile).
                 {"x_desc": None, "w_desc": None, "SPLIT_K": 2, "SEG_STEPS": 32, "BLOCK_M": 64, "BLOCK_N": 64,
                  "BLOCK_K": 64, "GROUP_M": 8, "NUM_PROGS": 0, "FLAT": True, "USE_TMA": False, "NSUB": 3, **gpu,
                  "num_warps": 4, "num_stages": 4}),
        expects_mma=True))


_register_kernels()
