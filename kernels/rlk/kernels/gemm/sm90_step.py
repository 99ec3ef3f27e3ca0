"""Route tables A/B on a decode step's GEMMs: every layer's projections in sequence, one CUDA graph.

``sm90_probe`` times one projection at a time (back-to-back calls on a weight ring); an engine's
decode step runs qkv, o, gate_up and down of every layer in turn, each on its own weights, each
reading activations the previous kernel wrote. On an H100 the two disagreed by 3% about which
route table is faster (``docs/results/h100_2026-12-06_session24/``). This benchmark sits between
them: for each batch size M, one CUDA graph of ``layers`` x (qkv, o, gate_up, down) with distinct
weights per layer (cold in L2 as in decode), captured once per arm and replayed in alternating
order (A B C A B C ...) so that clock drift spreads over the arms. No attention, norms or
activations between the GEMMs: what it isolates is the route's picks in sequence.

Arms: ``cublas`` (``torch.nn.functional.linear``, the native route), ``triton`` (the route off),
and one per route table (``RLK_GEMM_SM90=require`` with ``RLK_GEMM_SM90_TABLE`` set while the arm
is captured). Each row records what the route picks per shape under each arm's environment
(``routes``: a configuration name, or null for the Triton kernels), and every arm's last-layer
outputs must equal the Triton kernels' bytes (earlier layers' outputs are overwritten in the graph
and not compared; cuBLAS's bytes are not expected to match: its max difference is recorded).

    python -m rlk.kernels.gemm.sm90_step --tables A.json,B.json --out step.json \
        [--m 1,8,16,...] [--layers 36] [--shapes qkv,o,gate_up,down] [--rounds 5] [--pad-m 64]

``--pad-m 64`` adds one arm per table, ``table:X+pad64``: each GEMM runs over its input's rows
padded with zeros up to a multiple of 64, allocated so in advance (no copies in the graph), the
route picking at the padded M, and only the first M output rows compared. That is what a route
would get whose input kernels allocate their outputs with rows up to the token tile: on the
H100 a token tile reaching past its tensor streams the weights slowly
(docs/results/h100_2026-12-08_session35).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from rlk import determinism
from rlk.kernels.gemm import sm90
from rlk.kernels.gemm.contract import split_rule
from rlk.kernels.gemm.launch import gemm
from rlk.kernels.gemm.sm90_configs import padded_rows
from rlk.testing.shapes import QWEN3_8B_GEMMS

# vLLM 0.26's CUDA-graph capture sizes up to 256 (1, 2, 4, then every 8) and prefill-like sizes.
M_DEFAULT = (1, 2, 4) + tuple(range(8, 257, 8)) + (320, 384, 512)
STEP_SHAPES = ("qkv", "o", "gate_up", "down")


def parse_arms(tables: str | None) -> list[tuple[str, str | None]]:
    """``[(arm name, table path or None), ...]``: cublas, triton, then each table (named by its
    file stem; a stem given twice is refused)."""
    arms: list[tuple[str, str | None]] = [("cublas", None), ("triton", None)]
    for p in filter(None, (tables or "").split(",")):
        name = f"table:{Path(p).stem}"
        if any(a == name for a, _ in arms):
            raise SystemExit(f"sm90_step: two tables named {Path(p).stem!r}")
        if not Path(p).is_file():
            raise SystemExit(f"sm90_step: no table {p}")
        arms.append((name, p))
    return arms


def arm_env(arm: str, table: str | None) -> dict:
    if arm == "cublas":
        return {}
    if arm == "triton":
        return {sm90.MODE_ENV: "off"}
    return {sm90.MODE_ENV: "require", sm90.TABLE_ENV: str(table)}


def summarize(ms: dict[str, list[float]]) -> dict:
    """Per arm: the median over rounds, and its ratio to cuBLAS's and to the Triton kernels'."""
    med = {a: statistics.median(v) for a, v in ms.items()}
    return {a: {"ms": med[a], "rounds_ms": ms[a], "vs_cublas": med[a] / med["cublas"],
                "vs_triton": med[a] / med["triton"]} for a in ms}


def totals(rows: list[dict], arms: list[str]) -> dict:
    """Over all M: each arm's summed step time, its ratio to cuBLAS's sum, and the geometric mean
    of the per-M ratios to cuBLAS."""
    out = {}
    for a in arms:
        s = sum(r["arms"][a]["ms"] for r in rows)
        out[a] = {"sum_ms": s, "sum_vs_cublas": s / sum(r["arms"]["cublas"]["ms"] for r in rows),
                  "geomean_vs_cublas": statistics.geometric_mean(r["arms"][a]["vs_cublas"] for r in rows)}
    return out


def _capture(fn, env: dict, side=None):
    """A CUDA graph of ``fn`` captured with ``env`` exported (the route reads its mode and table
    while the graph is captured; warmed up once on the ``side`` stream); on the CPU, ``fn`` run
    with ``env`` exported on every call."""
    if not torch.cuda.is_available():
        def run():
            with determinism.scoped(env):
                fn()
        return run
    with determinism.scoped(env):
        s = side or torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
    return g.replay


def _time_ms(run) -> float:
    if not torch.cuda.is_available():
        t = time.perf_counter()
        run()
        return (time.perf_counter() - t) * 1e3
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    run()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1)


def padded_arms(arms, pad_m: int) -> list:
    """``arms`` and, with ``pad_m``, each table arm again as ``<name>+pad<pad_m>`` (same table)."""
    return list(arms) + ([(f"{a}+pad{pad_m}", t) for a, t in arms if a.startswith("table:")] if pad_m else [])


def step(m_list, arms, layers: int, shapes=STEP_SHAPES, rounds: int = 5, seed: int = 0, dims=None,
         pad_m: int = 0) -> dict:
    """Times every arm's decode-step GEMMs at each M; ``dims`` (name -> (K, N)) overrides the
    Qwen3-8B shapes (small ones for the CPU test); ``pad_m`` adds the padded arms
    (:func:`padded_arms`)."""
    if pad_m < 0:
        raise ValueError(f"sm90_step: pad_m must be >= 0, got {pad_m}")
    extra = padded_arms(arms, pad_m)[len(arms):]
    padded = {a for a, _ in extra}
    arms = list(arms) + extra
    if len({a for a, _ in arms}) != len(arms):
        raise SystemExit(f"sm90_step: two arms share a name in {[a for a, _ in arms]} (a table stem ending in +pad?)")
    dims = dims or {n: QWEN3_8B_GEMMS[n] for n in shapes}
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=dev).manual_seed(seed)
    weights = [{n: (torch.randn(dims[n][::-1], generator=gen, device=dev) * dims[n][0] ** -0.5).to(torch.bfloat16)
                for n in shapes} for _ in range(layers)]
    side = torch.cuda.Stream() if torch.cuda.is_available() else None  # one warm-up stream for every capture
    rows, t0 = [], time.perf_counter()
    for M in m_list:
        xs = {n: torch.randn((M, dims[n][0]), generator=gen, device=dev).to(torch.bfloat16) for n in shapes}
        mp = padded_rows(M, pad_m)
        xs_pad = {n: torch.cat([xs[n], xs[n].new_zeros((mp - M, dims[n][0]))]) for n in shapes}
        outs, runs, routes = {}, {}, {}
        for arm, table in arms:
            ys, xin = {}, (xs_pad if arm in padded else xs)

            def fn(arm=arm, ys=ys, xin=xin):
                for lw in weights:
                    for n in shapes:
                        ys[n] = (torch.nn.functional.linear(xin[n], lw[n]) if arm == "cublas" else gemm(xin[n], lw[n]))

            runs[arm] = _capture(fn, arm_env(arm, table), side)
            runs[arm]()
            if arm != "cublas":
                with determinism.scoped(arm_env(arm, table)):
                    routes[arm] = {n: sm90.route(xin[n], weights[0][n], xin[n].shape[0], *dims[n], split_rule(*dims[n]))
                                   for n in shapes}
            outs[arm] = {n: ys[n][:M].clone() for n in shapes}
        ms = {a: [] for a, _ in arms}
        for _ in range(rounds):
            for a, _ in arms:
                ms[a].append(_time_ms(runs[a]))
        row = {"M": M, "arms": summarize(ms), "routes": routes, "differing": {}, "cublas_max_abs_diff": 0.0}
        for a, _ in arms:
            if a == "cublas":
                row["cublas_max_abs_diff"] = max(float((outs[a][n].float() - outs["triton"][n].float()).abs().max())
                                                 for n in shapes)
                continue
            row["differing"][a] = sum(int((outs[a][n].view(torch.int16) != outs["triton"][n].view(torch.int16)).sum())
                                      for n in shapes)
        rows.append(row)
        print(f"M={M:4d} " + "  ".join(f"{a} {row['arms'][a]['vs_cublas']:.3f}x" for a, _ in arms if a != "cublas")
              + f"  (cuBLAS {row['arms']['cublas']['ms']:.3f} ms; differing {sum(row['differing'].values())})",
              flush=True)
        del runs, outs
    names = [a for a, _ in arms]
    doc = {"what": "route tables A/B on a decode step's GEMMs (layers x shapes in sequence, one CUDA graph per arm "
                   "and M, distinct weights per layer, arms replayed in alternating order, median over rounds)",
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "library": sm90.library_manifest(),
           "arms": {a: t for a, t in arms}, "pad_m": pad_m, "layers": layers, "shapes": {n: list(dims[n]) for n in shapes},
           "rounds": rounds, "baseline": "cuBLAS via torch.nn.functional.linear, same process, same inputs",
           "rows": rows, "totals": totals(rows, names), "seconds": time.perf_counter() - t0}
    doc["differing_total"] = sum(sum(r["differing"].values()) for r in rows)
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", default=None, help="route tables to compare, comma-separated")
    ap.add_argument("--out", required=True)
    ap.add_argument("--m", default=",".join(map(str, M_DEFAULT)))
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--shapes", default=",".join(STEP_SHAPES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pad-m", type=int, default=0,
                    help="also run each table over token rows padded to a multiple of this (e.g. 64), allocated in advance")
    a = ap.parse_args(argv)
    shapes = tuple(a.shapes.split(","))
    unknown = [n for n in shapes if n not in QWEN3_8B_GEMMS]
    m_list = [int(m) for m in a.m.split(",")]
    if a.pad_m < 0 or (a.pad_m and a.pad_m % 8):
        raise SystemExit(f"sm90_step: --pad-m {a.pad_m}: a positive multiple of 8, or 0")
    if unknown or a.layers < 1 or a.rounds < 1 or min(m_list) < 1:
        raise SystemExit(f"sm90_step: unknown shapes {unknown} (of {sorted(QWEN3_8B_GEMMS)}), or M, layers or "
                         "rounds < 1")
    doc = step(m_list, parse_arms(a.tables), a.layers, shapes, a.rounds, pad_m=a.pad_m)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    for arm, t in doc["totals"].items():
        print(f"{arm}: step GEMMs summed over M {t['sum_ms']:.2f} ms = {t['sum_vs_cublas']:.3f}x cuBLAS "
              f"(geomean over M {t['geomean_vs_cublas']:.3f}x)")
    print(f"sm90_step: differing elements against the Triton kernels {doc['differing_total']}")
    return 0 if doc["differing_total"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
