"""Comparisons over an ``sm90_probe`` run. Twins: each configuration against the one that differs
from it in a single field of ``sm90.CONFIGS`` (the epilogue, the schedule, the tile depth), at
every probe row where both were timed, so one design choice is measured with the rest of the
kernel held fixed. Padded rows (:func:`padded_estimate`): what a route would gain by running a
GEMM over token rows padded up to a multiple of the token tile.

    python -m rlk.kernels.gemm.sm90_probe_pairs padded --probe sm90_probe.json.xz --pad 64 --out padded.json
"""

from __future__ import annotations

import argparse
import json
import lzma
import statistics
import sys

from rlk.kernels.gemm import sm90
from rlk.kernels.gemm.sm90_configs import padded_rows


def read_json(path: str):
    """A probe's JSON, plain or xz-compressed (``.xz``: how docs/results keeps the large ones, so
    that the tree stays small enough for a device call to carry it with the vLLM bundle)."""
    opener = lzma.open if str(path).endswith(".xz") else open
    with opener(path, "rt") as f:
        return json.load(f)


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


def best_ms(row: dict) -> float:
    """The route's best time at a probe row: the faster of the Triton kernels and the fastest
    configuration whose bytes matched."""
    return min([v["ms"] for v in row["configs"].values() if v.get("differing") == 0 and "ms" in v]
               + [row["triton_ms"]])


def padded_estimate(doc: dict, pad: int = 64, max_m: int = 512) -> dict:
    """Per probe row (M <= ``max_m``): the route's best time over cuBLAS's at M, and the best over
    the probe's rows of the same shape at every M' from M up to M rounded up to a multiple of
    ``pad``, over cuBLAS's at M. The second is what a route would get by running the GEMM over
    M' rows of storage that exist past the M rows asked for (extra rows computed and discarded:
    each row's bytes are the same at any M), with no copies. On the H100 a token tile whose TMA box
    is mostly out of bounds streams the weights slowly (docs/results/h100_2026-12-08_session35),
    which this prices from timings the probe already has.

    ``top_vs_cublas`` is the same with M' only M or the multiple itself (where the probe has it):
    fewer candidates, less of the bias below. Both compare with ``route_vs_cublas``, the best
    configuration per row (an oracle too), not with a route table's pick.

    An estimate, biased low: the minimum over several noisy timings is lower than one timing, so
    only gains well beyond the probe's spread (a few per cent) mean anything; the configuration
    that wins at M' is often another than at M."""
    if pad < 1:
        raise ValueError(f"padded_estimate: pad must be positive, got {pad}")
    best, cublas = {}, {}
    for r in doc["rows"]:
        best[(r["shape"], r["M"])] = best_ms(r)
        cublas[(r["shape"], r["M"])] = r["cublas_ms"]
    per_row = []
    for (shape, m), b in sorted(best.items()):
        if m > max_m:
            continue
        top = padded_rows(m, pad)
        at, t = min(((mm, best[(shape, mm)]) for (sh, mm) in best if sh == shape and m <= mm <= top),
                    key=lambda p: (p[1], p[0]))
        top_t = min(b, best.get((shape, top), b))
        per_row.append({"shape": shape, "M": m, "route_vs_cublas": b / cublas[(shape, m)],
                        "padded_vs_cublas": t / cublas[(shape, m)], "padded_m": at,
                        "top_vs_cublas": top_t / cublas[(shape, m)]})
    before = [r["route_vs_cublas"] for r in per_row]
    after = [r["padded_vs_cublas"] for r in per_row]
    top = [r["top_vs_cublas"] for r in per_row]
    return {"pad": pad, "max_m": max_m, "rows": len(per_row),
            "over_cublas": sum(v > 1 for v in before), "padded_over_cublas": sum(v > 1 for v in after),
            "top_over_cublas": sum(v > 1 for v in top),
            "route_vs_cublas": spread(before), "padded_vs_cublas": spread(after), "top_vs_cublas": spread(top),
            "padded_rows_used": sum(r["padded_m"] != r["M"] for r in per_row), "per_row": per_row}


def print_padded(est: dict) -> None:
    if not est["rows"]:
        return
    a, b = est["route_vs_cublas"], est["padded_vs_cublas"]
    print(f"padded to a multiple of {est['pad']} rows (estimate from this probe's rows, M <= {est['max_m']}): "
          f"rows over cuBLAS {est['over_cublas']} -> {est['padded_over_cublas']} of {est['rows']} "
          f"({est['top_over_cublas']} with M' only M or the multiple); "
          f"route / cuBLAS median {a['median']:.3f} -> {b['median']:.3f}, max {a['max']:.3f} -> {b['max']:.3f}; "
          f"a larger M is faster at {est['padded_rows_used']} rows", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="sm90_probe_pairs", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("padded", help="price padded token rows from an earlier probe (no GPU)")
    p.add_argument("--probe", required=True, help="an sm90_probe JSON (.xz too)")
    p.add_argument("--pad", type=int, default=64)
    p.add_argument("--max-m", type=int, default=512)
    p.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        est = padded_estimate(read_json(a.probe), a.pad, a.max_m)
    except (OSError, ValueError, KeyError, EOFError, lzma.LZMAError) as e:
        print(f"sm90_probe_pairs: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    est["probe"] = a.probe
    with open(a.out, "w") as f:
        json.dump(est, f, indent=1)
    print_padded(est)
    for r in est["per_row"]:
        if r["padded_vs_cublas"] < 0.97 * r["route_vs_cublas"]:
            print(f"  {r['shape']:8s} M={r['M']:4d}: {r['route_vs_cublas']:.3f} -> {r['padded_vs_cublas']:.3f} "
                  f"(at M={r['padded_m']})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
