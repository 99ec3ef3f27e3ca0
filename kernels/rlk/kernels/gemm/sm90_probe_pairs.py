"""Twin comparisons over an ``sm90_probe`` run: each configuration against the one that differs
from it in a single field of ``sm90.CONFIGS`` (the epilogue, the schedule, the tile depth), at
every probe row where both were timed, so one design choice is measured with the rest of the
kernel held fixed."""

from __future__ import annotations

import statistics

from rlk.kernels.gemm import sm90


def spread(values) -> dict:
    """min, median and max of ``values`` ({} for none)."""
    x = sorted(values)
    return {"min": x[0], "median": statistics.median(x), "max": x[-1]} if x else {}


def _twin_pairs(doc: dict, field: int, value: int, base: int, label: str, max_m: int) -> dict:
    """Each configuration whose ``field`` (an index into the CONFIGS tuple) is ``value`` against
    its twin, the configuration with the same fields but ``base`` there, at every probe row (M <=
    ``max_m``) where both were timed. ``label`` ("mine/theirs", e.g. "direct/tma") names the two
    sides in the keys (``direct_over_tma``, ``direct_faster_rows``, ...)."""
    mine, theirs = label.split("/")
    by_fields = {fields: name for name, fields in sm90.CONFIGS.items()}
    per_config = {}
    for name, fields in sm90.CONFIGS.items():
        twin = by_fields.get((*fields[:field], base, *fields[field + 1:])) if fields[field] == value else None
        if twin is None:
            continue
        ratios = []
        for r in doc["rows"]:
            a, b = r["configs"].get(name) or {}, r["configs"].get(twin) or {}
            if r["M"] <= max_m and "ms" in a and "ms" in b:
                ratios.append({"shape": r["shape"], "M": r["M"], f"{mine}_over_{theirs}": a["ms"] / b["ms"],
                               f"{mine}_vs_cublas": a["ms"] / r["cublas_ms"], f"{theirs}_vs_cublas": b["ms"] / r["cublas_ms"]})
        if ratios:
            x = [t[f"{mine}_over_{theirs}"] for t in ratios]
            per_config[name] = {"twin": twin, "rows": len(x), **spread(x),
                                f"{mine}_faster_rows": sum(v < 1.0 for v in x), "per_row": ratios}
    return {"max_m": max_m, "configs": per_config}


def direct_pairs(doc: dict, max_m: int = 512) -> dict:
    """Each direct-epilogue configuration (stores from registers) against its TMA-epilogue twin
    (the configuration with the same fields but the epilogue: same tile, cluster, schedule and
    operand order) at every probe row (M <= ``max_m``) where both were timed: which epilogue costs
    the time, the rest of the kernel held fixed. ``direct_over_tma`` < 1: the direct epilogue is faster."""
    return _twin_pairs(doc, 6, 1, 0, "direct/tma", max_m)


def schedule_pairs(doc: dict, max_m: int = 512) -> dict:
    """Each configuration on the non-persistent kernel (coop 2: one CTA per tile, one consumer warp
    group) against its persistent ping-pong twin (coop 0, every other field the same) at every
    probe row (M <= ``max_m``) where both were timed: what the persistent schedule costs or saves
    with tile, cluster and epilogue held fixed. ``nonpersistent_over_pingpong`` < 1: non-persistent is faster."""
    return _twin_pairs(doc, 4, 2, 0, "nonpersistent/pingpong", max_m)


def tile_k_pairs(doc: dict, max_m: int = 512) -> dict:
    """Each configuration with 128-deep tiles (two K chunks per pipeline stage) against its 64-deep
    twin (every other field the same) at every probe row (M <= ``max_m``) where both were timed:
    what the longer TMA rows and half the stage barriers per K save or cost with tile, cluster,
    schedule and epilogue held fixed. ``k128_over_k64`` < 1: the 128-deep tile is faster."""
    return _twin_pairs(doc, 7, 128, 64, "k128/k64", max_m)
