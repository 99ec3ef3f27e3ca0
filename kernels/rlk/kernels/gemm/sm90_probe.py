"""Every sm_90 CUTLASS configuration against the Triton strict GEMM and cuBLAS, on one GPU.

For each shape (split count 1 under gemm.bf16.v1), M and configuration: the output's bytes
against the Triton kernel's at the same M (``torch.equal`` on the raw bits; the Triton kernel's
rows are those of M = 1 by the invariance sweep), then CUDA-graph time with cold weights (a ring
of weight copies 4x the L2, as a decode step meets them) for cuBLAS (``torch.nn.functional.linear``,
the native route), the Triton kernel under the installed table, and every configuration. Each
row also names the kernels one cuBLAS call launches, whether they split K (``cublas_k``: the
decomposition ``gemm.bf16.v1`` forbids at these shapes) and cuBLAS's tile and cluster as the name
of the swapped configuration that would match it (``cublas_tile``).

    python -m rlk.kernels.gemm.sm90_probe --out sm90_probe.json [--shapes qkv,o] [--m 64,128] \
        [--table-out sm90_cutlass.json] [--eval-table configs/sm90_cutlass.json]

Shapes: the Qwen3-8B projections by name (``qkv``, ``tp4_down``, ...; ``8b`` for all of them) and
the other dense Qwen3 sizes' (``4b_down``, ...; ``other`` for all, ``rlk.testing.shapes``). The
route table (``--table-out``) is built from the Qwen3-8B rows only (``--table-shapes``); every
row is then scored under a table: its entry for that K x N if it has one, else the table's
default rule, which is what a shape nobody tuned for gets. The score (``table_eval`` in the
JSON) is the route's time (the picked configuration's, or the Triton kernels' where it picks
none) over cuBLAS and over the Triton kernels, per row and per rule.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import math
import re
import sys
import time
from collections import defaultdict

import torch

from rlk import determinism
from rlk.kernels.gemm import sm90
from rlk.kernels.gemm.contract import split_rule
from rlk.kernels.gemm.gemm_tune import WeightRing, bench_ms, l2_bytes, ring_size
from rlk.kernels.gemm.launch import gemm
from rlk.kernels.gemm.sm90_probe_pairs import (direct_pairs, padded_estimate, print_padded, read_json,  # noqa: F401
                                               schedule_pairs, spread, tile_k_pairs)
from rlk.kernels.gemm.sm90_probe_select import contenders, parse_m, split_names
from rlk.testing.shapes import QWEN3_8B_GEMMS, QWEN3_OTHER_GEMMS

SHAPES = {**QWEN3_8B_GEMMS, **QWEN3_OTHER_GEMMS}
GROUPS = {"8b": tuple(QWEN3_8B_GEMMS), "other": tuple(QWEN3_OTHER_GEMMS)}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def kernel_names(fn) -> list[str]:
    """The device kernels one call of ``fn`` launches, in launch order (torch.profiler's CUDA
    activity; one untraced call first, so no first-call setup is counted)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def cublas_k_split(names: list[str]) -> str:
    """How the cuBLAS call behind ``names`` (:func:`kernel_names`) walked K: ``split`` when a kernel
    says so (cuBLAS's sm_90 GEMM kernels name ``segment_k_on``; a split-K fold kernel names
    ``splitk``), ``single`` when a GEMM kernel names ``segment_k_off`` and none splits, else
    ``unknown`` (the names do not tell). gemm.bf16.v1 never splits K for these shapes, so a
    ``split`` row is one where cuBLAS uses a decomposition the strict contract forbids."""
    low = [n.lower() for n in names]
    if any("segment_k_on" in n or "splitk" in n or "split_k" in n for n in low):
        return "split"
    if any("segment_k_off" in n for n in low):
        return "single"
    return "unknown"


_NVJET = re.compile(r"nvjet_sm90_[a-z]+_(\d+)x(\d+)_(\d+)x(\d+)_(\d+)x(\d+)_")


def cublas_tile(names: list[str]) -> dict | None:
    """The tile of the cuBLAS sm_90 GEMM kernel among ``names`` (nvjet kernels name it:
    ``nvjet_sm90_tst_64x72_64x12_2x1_v_bz_TNT`` is a 64 x 72 tile, K chunks of 64, 12 stages, a
    2 x 1 cluster), or None where no kernel names one. cuBLAS is column-major, so for
    ``F.linear(x, w)`` it computes y^T = w @ x^T: the tile's first side runs along the weight rows
    (N), its second along the tokens (M), as in this library's swapped configurations.
    ``as_config`` is the name that tile would have here (``sw<rows>x<tokens>`` plus ``m<c>`` /
    ``n<c>`` for a cluster). The same tile unswapped (tokens on wgmma's M side: 64 ping-pong, 128 or
    256 cooperative; weight rows on its N side: a multiple of 8 up to 256) is ``as_unswapped``
    (``pp64x<rows>`` / ``co<tokens>x<rows>``, cluster sides exchanged), None where wgmma cannot take
    it that way. ``in_library``: whether ``sm90.CONFIGS`` has either."""
    for n in names:
        m = _NVJET.search(n)
        if m:
            rows, tokens, chunk, stages, c_rows, c_tokens = map(int, m.groups())
            name = f"sw{rows}x{tokens}" + _cluster_suffix(c_rows, c_tokens)
            unswapped = None
            if rows % 8 == 0 and rows <= 256 and tokens in (64, 128, 256):
                unswapped = ("pp" if tokens == 64 else "co") + f"{tokens}x{rows}" + _cluster_suffix(c_tokens, c_rows)
            return {"kernel": n, "weight_rows": rows, "tokens": tokens, "k_chunk": chunk, "stages": stages,
                    "cluster": [c_rows, c_tokens], "split_k": cublas_k_split([n]) == "split", "as_config": name,
                    "as_unswapped": unswapped, "in_library": name in sm90.CONFIGS or unswapped in sm90.CONFIGS}
    return None


def _cluster_suffix(along_m: int, along_n: int) -> str:
    return (f"m{along_m}" if along_m > 1 else "") + (f"n{along_n}" if along_n > 1 else "")


def probe(shapes, m_list, configs, out_path: str, device: str = "cuda") -> dict:
    """Times every (shape, M, configuration). ``out_path`` is rewritten after each shape, marked
    ``partial`` until the last: a probe stopped by a time limit keeps the shapes it finished, and a
    later probe of those left merges with it (``--from-json partial.json,rest.json``)."""
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows, t0 = [], time.perf_counter()
    doc = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else device, "torch": torch.__version__,
           "triton": __import__("triton").__version__, "library": sm90.library_manifest(), "timing":
           "CUDA graph replay of back-to-back calls, cold weights (ring of copies >= 4x L2), median of 3",
           "baseline": "cuBLAS via torch.nn.functional.linear, same process, same inputs; cublas_kernels: "
           "the kernels one call launches (torch.profiler), cublas_k: split / single / unknown K walk, "
           "cublas_tile: the nvjet kernel's tile and cluster as a swapped configuration's name"}
    for i, name in enumerate(shapes):
        K, N = SHAPES[name]
        if split_rule(K, N) != 1:
            print(f"{name}: split {split_rule(K, N)} under v1: not served by sm90, skipped", flush=True)
            continue
        w = (torch.randn((N, K), generator=gen, device=dev) * K ** -0.5).to(torch.bfloat16)
        ring = WeightRing(w, ring_size(w.numel() * 2, l2_bytes()))
        for M in m_list:
            x = torch.randn((M, K), generator=gen, device=dev).to(torch.bfloat16)
            ref = gemm(x, w)
            row = {"shape": name, "K": K, "N": N, "M": M, "configs": {}}
            row["cublas_ms"] = bench_ms(lambda: torch.nn.functional.linear(x, ring.next()))
            row["cublas_kernels"] = kernel_names(lambda: torch.nn.functional.linear(x, w))
            row["cublas_k"] = cublas_k_split(row["cublas_kernels"])
            row["cublas_tile"] = cublas_tile(row["cublas_kernels"])
            row["triton_ms"] = bench_ms(lambda: gemm(x, ring.next()))
            for c in configs:
                y = torch.full_like(ref, float("nan"))
                try:
                    sm90.gemm_into(y, x, w, c)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 (recorded per configuration)
                    row["configs"][c] = {"error": f"{type(e).__name__}: {e}"[:300]}
                    continue
                diff = int((_bits(y) != _bits(ref)).sum())
                yo = torch.empty_like(ref)
                ms = bench_ms(lambda: sm90.gemm_into(yo, x, ring.next(), c))
                row["configs"][c] = {"differing": diff, "ms": ms}
            ok = {c: v for c, v in row["configs"].items() if "ms" in v}
            if ok:
                best = min(ok, key=lambda c: ok[c]["ms"])
                row["best"] = best
                row["best_vs_cublas"] = ok[best]["ms"] / row["cublas_ms"]
            row["triton_vs_cublas"] = row["triton_ms"] / row["cublas_ms"]
            row["differing_total"] = sum(v.get("differing", 0) for v in row["configs"].values())
            rows.append(row)
            print(f"{name:12s} M={M:5d} cuBLAS {row['cublas_ms'] * 1e3:8.1f} us  triton {row['triton_vs_cublas']:.3f}x  "
                  f"sm90 best {row.get('best', '-'):12s} {row.get('best_vs_cublas', float('nan')):.3f}x  "
                  f"differing {row['differing_total']}  cuBLAS K {row['cublas_k']} "
                  f"tile {(row['cublas_tile'] or {}).get('as_config', '-')}", flush=True)
        del ring, w
        if i + 1 < len(shapes):
            _write(_totals(doc, rows, t0) | {"partial": {"shapes_done": list(shapes[:i + 1]),
                                                          "shapes_left": list(shapes[i + 1:])}}, out_path)
    _write(_totals(doc, rows, t0), out_path)
    print(f"cuBLAS split K at: {doc['cublas_split_k_rows'] or 'no row'}", flush=True)
    return doc


def _write(doc: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def _totals(doc: dict, rows: list, t0: float) -> dict:
    """The probe's rows and what is summed over them, in place; returns ``doc``."""
    doc.update(rows=rows, seconds=time.perf_counter() - t0,
               differing_total=sum(r["differing_total"] for r in rows))
    split = defaultdict(list)
    for r in rows:
        if r.get("cublas_k") == "split":
            split[r["shape"]].append(r["M"])
    doc["cublas_split_k_rows"] = dict(split)  # shape -> the M at which cuBLAS split K
    doc["errors"] = sorted({f"{c}: {v['error']}" for r in rows for c, v in r["configs"].items() if "error" in v})
    return doc


def _runs(points: list) -> list:
    """``[(M, choice), ...]`` ascending -> buckets ``[[max_m, choice], ...]``, the last one open."""
    out = []
    for M, choice in points:
        if out and out[-1][1] == choice:
            out[-1][0] = M
        else:
            out.append([M, choice])
    if out:
        out[-1][0] = None
    return out


def shape_names(spec: str) -> list[str]:
    """``qkv,4b_down,other`` -> shape names (groups expanded, order kept, no repeats)."""
    out: list[str] = []
    for tok in filter(None, spec.split(",")):
        names = GROUPS.get(tok, (tok,))
        for n in names:
            if n not in SHAPES:
                raise SystemExit(f"sm90_probe: unknown shape {n!r}: {sorted(SHAPES)} or a group {sorted(GROUPS)}")
            if n not in out:
                out.append(n)
    return out


RULES = ("beats_all", "geomean")


def make_table(doc: dict, source: str, shapes=None, rule: str = "beats_all", rule_shapes=None) -> dict:
    """The ``configs/sm90_cutlass.json`` table from a probe: per (K, N) and measured M, the fastest
    configuration where it beats the Triton kernel (else null: Triton serves), each M's choice
    serving the M range from the previous measured M up to it; the default rule (shapes without
    an entry) takes per M, among the configurations faster than the Triton kernel at every probed
    shape, the one with the best geometric-mean time over the Triton kernel's (none: Triton);
    ``rule="geomean"`` (the earlier rule, kept to compare) drops the "every shape" condition and
    takes the best geometric mean where it is below 1. Entries: the rows of ``shapes`` (None:
    all); the default rule: the rows of ``rule_shapes`` (None: as ``shapes``)."""
    if rule not in RULES:
        raise ValueError(f"make_table: rule {rule!r}: one of {RULES}")
    rule_shapes = rule_shapes if rule_shapes is not None else shapes
    entries = _per_shape(doc, shapes)
    rule_sums = _per_shape(doc, rule_shapes)
    table_entries = {}
    for kn, per_m in entries.items():
        picks = []
        for M, t in per_m.items():
            ok = {c: ms for c, ms in t.items() if c != "triton" and ms < math.inf}
            best = min(ok, key=ok.get) if ok else None
            picks.append((M, best if best and ok[best] < t["triton"] else None))
        table_entries[kn] = _runs(sorted(picks))
    ratios = defaultdict(lambda: defaultdict(list))
    for kn, per_m in rule_sums.items():
        for M, t in per_m.items():
            for c, ms in t.items():
                if c != "triton" and ms < math.inf:
                    ratios[M][c].append(ms / t["triton"])
    n_shapes = len(rule_sums)
    default = []
    for M in sorted(ratios):
        # Candidates beat the Triton kernels at every probed shape (the rule serves shapes nobody
        # timed: a configuration that loses at one tuned shape may lose at an untuned one too).
        geo = {c: _geomean(v) for c, v in ratios[M].items()
               if len(v) == n_shapes and (rule == "geomean" or max(v) < 1.0)}
        best = min(geo, key=geo.get) if geo else None
        default.append((M, best if best and geo[best] < 1.0 else None))
    return {"what": "sm_90 GEMM route: [max_m, CUTLASS configuration or null (Triton kernels)] per K x N",
            "written_by": "python -m rlk.kernels.gemm.sm90_probe --table-out", "source": source,
            "shapes": _names(doc, shapes), "rule": rule, "rule_shapes": _names(doc, rule_shapes),
            "device": doc["device"], "timing": doc["timing"], "library_sha256": doc["library"].get("sha256"),
            "entries": dict(sorted(table_entries.items())), "default": _runs(default)}


def overlay_entries(table: dict, other: dict, source: str, sha256: str, kns=None) -> dict:
    """``table`` with ``other``'s entry in place of its own for each K x N of ``kns`` (None: every
    K x N ``other`` has an entry for); the default rule and the other entries stay. For picks an
    engine run preferred to the probe's (a GEMM probe times one projection in isolation; the
    engine measures the decode step): which entries came from where is recorded under
    ``entries_from``."""
    have = other.get("entries", {})
    kns = sorted(have if kns is None else set(kns))
    missing = [kn for kn in kns if kn not in have]
    if not kns or missing:
        raise SystemExit(f"sm90_probe: --entries-from {source}: no entry for {missing or 'any K x N'}")
    out = dict(table)
    out["entries"] = dict(sorted({**table["entries"], **{kn: have[kn] for kn in kns}}.items()))
    out["entries_from"] = {"table": source, "sha256": sha256, "kn": kns}
    return out


def merge_probes(docs: list[dict]) -> dict:
    """One probe from several: each shape's rows from the first probe that has that shape (a
    shape's M grid and timings are never mixed across runs); device, timing and library from the
    first; ``merged_from`` counts the rows taken from each. Probes of other devices or libraries
    are refused."""
    if len(docs) == 1:
        return docs[0]
    head = docs[0]
    for d in docs[1:]:
        for k in ("device", "timing"):
            if d.get(k) != head.get(k):
                raise SystemExit(f"sm90_probe: probes differ in {k}: {head.get(k)!r} vs {d.get(k)!r}")
        if d.get("library", {}).get("sha256") != head.get("library", {}).get("sha256"):
            raise SystemExit("sm90_probe: probes of different libraries (sha256) are not merged")
    rows, seen, taken = [], set(), []
    for d in docs:
        mine = [r for r in d["rows"] if r["shape"] not in seen]
        rows += mine
        taken.append(len(mine))
        seen |= {r["shape"] for r in d["rows"]}
    out = {k: v for k, v in head.items() if k not in ("rows", "table_eval", "leave_one_out", "partial")}
    out.update(rows=rows, merged_from=taken, differing_total=sum(r["differing_total"] for r in rows),
               errors=sorted({e for d in docs for e in d.get("errors", [])}))
    left = sorted({n for d in docs for n in d.get("partial", {}).get("shapes_left", [])} - seen)
    if left:
        out["partial"] = {"shapes_left": left}
    return out


def _geomean(v) -> float:
    return math.exp(sum(map(math.log, v)) / len(v))


def _names(doc: dict, shapes) -> list[str]:
    return sorted({r["shape"] for r in doc["rows"] if shapes is None or r["shape"] in shapes})


def _per_shape(doc: dict, shapes) -> dict:
    """``{K x N: {M: {"triton": ms, config: ms or inf (differs / failed)}}}`` over the rows of
    ``shapes`` (None: all); shapes probed twice under different names (e.g. qkv and tp4_gate_up,
    both 4096 x 6144) add up."""
    sums = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    for r in doc["rows"]:
        if shapes is not None and r["shape"] not in shapes:
            continue
        t = sums[f"{r['K']}x{r['N']}"][r["M"]]
        t["triton"] += r["triton_ms"]
        for c, v in r["configs"].items():
            t[c] += v["ms"] if "ms" in v and v.get("differing") == 0 else math.inf
    return sums


def evaluate_table(doc: dict, table: dict, source: str) -> dict:
    """Every probe row scored under ``table``: the route's pick for (K, N, M) (the entry of that
    K x N, else the default rule, as ``sm90.buckets``), its time over cuBLAS and over the Triton
    kernels (the Triton kernels' own time where the pick is null). A pick whose configuration
    differed from the Triton kernels' bytes, or failed, at that row is listed under ``bad_picks``
    (the route would then change the arithmetic or fail: the table is wrong for that shape)."""
    rows, bad = [], []
    for r in doc["rows"]:
        rule = "entry" if f"{r['K']}x{r['N']}" in table.get("entries", {}) else "default"
        name = sm90.pick_in(sm90.buckets_in(table, r["K"], r["N"]), r["M"])
        if name is None:
            ms = r["triton_ms"]
        else:
            v = r["configs"].get(name, {})
            if "ms" not in v or v.get("differing") != 0:
                bad.append({"shape": r["shape"], "M": r["M"], "pick": name, "probe": v or "not probed"})
                continue
            ms = v["ms"]
        rows.append({"shape": r["shape"], "M": r["M"], "rule": rule, "pick": name,
                     "route_vs_cublas": round(ms / r["cublas_ms"], 4), "route_vs_triton": round(ms / r["triton_ms"], 4)})
    summary = {}
    for rule in ("entry", "default"):
        rr = [x for x in rows if x["rule"] == rule]
        if not rr:
            continue
        worst_t = max(rr, key=lambda x: x["route_vs_triton"])
        worst_c = max(rr, key=lambda x: x["route_vs_cublas"])
        summary[rule] = {"rows": len(rr), "shapes": sorted({x["shape"] for x in rr}),
                         "route_vs_triton_max": worst_t["route_vs_triton"],
                         "route_vs_triton_max_at": [worst_t["shape"], worst_t["M"]],
                         "rows_slower_than_triton": sum(x["route_vs_triton"] > 1.0 for x in rr),
                         "route_vs_cublas_max": worst_c["route_vs_cublas"],
                         "route_vs_cublas_max_at": [worst_c["shape"], worst_c["M"]],
                         "rows_over_cublas": sum(x["route_vs_cublas"] > 1.0 for x in rr)}
    return {"table": source, "table_device": table.get("device"), "summary": summary, "bad_picks": bad, "rows": rows}


def leave_one_out(doc: dict, shapes, rule: str = "beats_all") -> dict:
    """The default rule on shapes it never saw: for each K x N among ``shapes``, a table from the
    other K x N (``make_table``) scores that one's rows, all of which its default rule serves.
    Returns per held-out K x N and in total: rows, route / Triton geometric mean and maximum, rows
    slower than the Triton kernels, route / cuBLAS geometric mean and maximum."""
    by_kn: dict[str, set] = {}
    for r in doc["rows"]:
        if r["shape"] in shapes:
            by_kn.setdefault(f"{r['K']}x{r['N']}", set()).add(r["shape"])
    out, every = {}, []
    for kn, names in sorted(by_kn.items()):
        table = make_table(doc, "leave-one-out", set(shapes) - names, rule)
        rows = [x for x in evaluate_table(doc, table, kn)["rows"] if x["shape"] in names]
        every += rows
        out[kn] = _loo_summary(rows)
    return {"rule": rule, "held_out": out, "total": _loo_summary(every)}


def _loo_summary(rows: list) -> dict:
    if not rows:
        return {"rows": 0}
    t, c = [x["route_vs_triton"] for x in rows], [x["route_vs_cublas"] for x in rows]
    return {"rows": len(rows), "route_vs_triton_geomean": round(_geomean(t), 4), "route_vs_triton_max": max(t),
            "rows_slower_than_triton": sum(x > 1.0 for x in t), "route_vs_cublas_geomean": round(_geomean(c), 4),
            "route_vs_cublas_max": max(c)}


def cublas_twins(doc: dict, max_m: int = 512) -> dict:
    """Each probe row (M <= ``max_m``) whose cuBLAS kernel's tile and cluster the library holds
    (``cublas_tile``'s ``as_config`` or ``as_unswapped``, read again from ``cublas_kernels`` so that
    older probes are scored against today's configurations) and that configuration's time over
    cuBLAS's there: the same tile run by CUTLASS's kernel instead of nvjet."""
    per_row = []
    for r in doc["rows"]:
        tile = cublas_tile(r.get("cublas_kernels") or [])
        if r["M"] > max_m or not tile:
            continue
        for name in (tile["as_config"], tile["as_unswapped"]):
            timed = r["configs"].get(name) or {}
            if "ms" in timed:
                per_row.append({"shape": r["shape"], "M": r["M"], "config": name,
                                "vs_cublas": timed["ms"] / r["cublas_ms"]})
    ratios = [t["vs_cublas"] for t in per_row]
    return {"max_m": max_m, "rows": len(per_row), "at_or_under_cublas": sum(x <= 1.0 for x in ratios),
            "per_row": per_row, **spread(ratios)}


def _print_eval(ev: dict) -> None:
    for rule, s in ev["summary"].items():
        print(f"table {ev['table']} {rule:7s}: {s['rows']} rows of {len(s['shapes'])} shapes; route / Triton max "
              f"{s['route_vs_triton_max']:.3f} at {s['route_vs_triton_max_at']} ({s['rows_slower_than_triton']} rows > 1); "
              f"route / cuBLAS max {s['route_vs_cublas_max']:.3f} at {s['route_vs_cublas_max_at']} "
              f"({s['rows_over_cublas']} rows > 1)", flush=True)
    for b in ev["bad_picks"][:20]:
        print(f"  bad pick: {b}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="probe JSON (with --from-json: that probe plus the scores)")
    ap.add_argument("--shapes", default="8b", help="shape names and groups (8b, other), comma-separated")
    ap.add_argument("--m", default="default",
                    help="token counts: integers and the lists 'default' and 'decode' (every vLLM decode batch)")
    ap.add_argument("--configs", default=None, help="configuration names, comma-separated (default: the library's)")
    ap.add_argument("--configs-from", default=None,
                    help="earlier probes' JSON, comma-separated: probe only the configurations within --within "
                         "of a row's fastest there (added to --configs where both are given)")
    ap.add_argument("--within", type=float, default=None, help="with --configs-from: the margin (default 0.02: 2%%)")
    ap.add_argument("--table-out", default=None, help="also write the route table (configs/sm90_cutlass.json format)")
    ap.add_argument("--table-shapes", default="8b", help="the rows the table is built from (others: its default rule)")
    ap.add_argument("--eval-table", action="append", default=[],
                    help="also score the rows under this table (repeatable; the --table-out table always is)")
    ap.add_argument("--from-json", default=None,
                    help="tables and scores from earlier probes' JSON (no GPU); several, comma-separated: "
                         "each shape's rows from the first that has it")
    ap.add_argument("--rule", default="beats_all", choices=RULES, help="the --table-out table's default rule")
    ap.add_argument("--rule-shapes", default=None,
                    help="the rows the default rule is built from (default: --table-shapes), e.g. 8b,0.6b_qkv,...")
    ap.add_argument("--entries-from", default=None,
                    help="a table whose entries replace the --table-out table's (recorded in the table)")
    ap.add_argument("--entries-shapes", default=None,
                    help="with --entries-from: only these shapes' K x N (default: every entry it has)")
    ap.add_argument("--leave-one-out", action="store_true",
                    help="also score each rule's default on every --table-shapes K x N left out of its table")
    args = ap.parse_args(argv)
    if args.from_json:
        given = [f for f, v in (("--m", args.m != "default"), ("--configs", args.configs is not None),
                                ("--configs-from", args.configs_from), ("--within", args.within is not None)) if v]
        if given:
            ap.error(f"--from-json probes nothing: {', '.join(given)} would be ignored")
        paths = args.from_json.split(",")
        doc = merge_probes([read_json(p) for p in paths])
        source = ",".join(paths)
        if doc.get("partial"):
            print(f"sm90_probe: {paths[0]} is a partial probe; shapes not probed: {doc['partial']['shapes_left']}",
                  flush=True)
    else:
        if args.within is not None and not args.configs_from:
            ap.error("--within needs --configs-from")
        if args.configs is not None and not split_names(args.configs):
            ap.error("--configs names no configuration")
        within = 0.02 if args.within is None else args.within
        try:
            m_list = parse_m(args.m)
            configs = split_names(args.configs) or ([] if args.configs_from else list(sm90.CONFIGS))
            if args.configs_from:
                chosen = contenders([read_json(p) for p in split_names(args.configs_from)], within, sm90.CONFIGS)
                configs += [c for c in chosen if c not in configs]
                print(f"sm90_probe: {len(chosen)} configurations within {within:.1%} of a row's fastest in "
                      f"{args.configs_from}, or timed in none of its rows", flush=True)
        except (ValueError, OSError, EOFError, KeyError, lzma.LZMAError) as e:
            ap.error(f"{type(e).__name__}: {e}")
        unknown = [c for c in configs if c not in sm90.CONFIGS]
        if unknown:
            ap.error(f"--configs: unknown configurations {unknown}")
        if sm90.library() is None:
            print(f"sm90_probe: no library (set {sm90.LIB_ENV} or build it)", file=sys.stderr)
            return 2
        # The reference and the "triton" arm are the Triton kernels alone: the route is switched off
        # (gemm() would otherwise serve table picks with these very configurations).
        with determinism.scoped({sm90.MODE_ENV: "off"}):
            doc = probe(shape_names(args.shapes), m_list, configs, args.out)
        source = args.out
    tables = [(p, json.load(open(p))) for p in args.eval_table]
    if args.table_out:
        table = make_table(doc, source, set(shape_names(args.table_shapes)), args.rule,
                           set(shape_names(args.rule_shapes)) if args.rule_shapes else None)
        if args.entries_from:
            raw = open(args.entries_from, "rb").read()
            kns = ({f"{SHAPES[n][0]}x{SHAPES[n][1]}" for n in shape_names(args.entries_shapes)}
                   if args.entries_shapes else None)
            table = overlay_entries(table, json.loads(raw), args.entries_from, hashlib.sha256(raw).hexdigest(), kns)
        with open(args.table_out, "w") as f:
            json.dump(table, f, indent=1)
        tables.append((args.table_out, table))
    doc["table_eval"] = [evaluate_table(doc, t, p) for p, t in tables]
    for ev in doc["table_eval"]:
        _print_eval(ev)
    doc["cublas_twins"] = tw = cublas_twins(doc)
    if tw["rows"]:
        print(f"cuBLAS's own tile and cluster in the library at {tw['rows']} rows (M <= {tw['max_m']}): "
              f"configuration / cuBLAS {tw['min']:.3f}-{tw['max']:.3f}, median {tw['median']:.3f}, "
              f"{tw['at_or_under_cublas']} rows at or under 1", flush=True)
    # (JSON key, pairing, the two sides as printed, the faster side as printed, its key prefix)
    for key, pairs, mine, theirs, short, prefix in (
            ("direct_pairs", direct_pairs, "direct epilogue", "TMA epilogue", "direct", "direct"),
            ("schedule_pairs", schedule_pairs, "non-persistent", "persistent ping-pong", "non-persistent",
             "nonpersistent"),
            ("tile_k_pairs", tile_k_pairs, "128-deep", "64-deep", "128-deep", "k128")):
        doc[key] = pp = pairs(doc)
        for name, d in pp["configs"].items():
            print(f"{mine} {name} / {theirs} {d['twin']} at {d['rows']} rows (M <= {pp['max_m']}): "
                  f"{d['min']:.3f}-{d['max']:.3f}, median {d['median']:.3f}, {short} faster at "
                  f"{d[f'{prefix}_faster_rows']}", flush=True)
    doc["padded_estimate"] = padded_estimate(doc)
    print_padded(doc["padded_estimate"])
    if args.leave_one_out:
        doc["leave_one_out"] = [leave_one_out(doc, set(shape_names(args.table_shapes)), r) for r in RULES]
        for lo in doc["leave_one_out"]:
            print(f"leave-one-out, default rule {lo['rule']}: {lo['total']}", flush=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    bad = sum(len(ev["bad_picks"]) for ev in doc["table_eval"])
    print(f"sm90_probe: differing elements in total {doc['differing_total']}; errors {len(doc['errors'])}; "
          f"table picks that differ or fail {bad}")
    for e in doc["errors"][:20]:
        print("  ", e)
    return 0 if doc["differing_total"] == 0 and not doc["errors"] and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
