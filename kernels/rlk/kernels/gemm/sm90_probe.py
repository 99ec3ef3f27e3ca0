"""Every sm_90 CUTLASS configuration against the Triton strict GEMM and cuBLAS, on one GPU.

For each shape (split count 1 under gemm.bf16.v1), M and configuration: the output's bytes
against the Triton kernel's at the same M (``torch.equal`` on the raw bits; the Triton kernel's
rows are those of M = 1 by the invariance sweep), then CUDA-graph time with cold weights (a ring
of weight copies 4x the L2, as a decode step meets them) for cuBLAS (``torch.nn.functional.linear``,
the native route), the Triton kernel under the installed table, and every configuration.

    python -m rlk.kernels.gemm.sm90_probe --out sm90_probe.json [--shapes qkv,o] [--m 64,128]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from rlk import determinism
from rlk.kernels.gemm import sm90
from rlk.kernels.gemm.contract import split_rule
from rlk.kernels.gemm.gemm_tune import WeightRing, bench_ms, l2_bytes, ring_size
from rlk.kernels.gemm.launch import gemm
from rlk.testing.shapes import QWEN3_8B_GEMMS

# Decode batches (vLLM pads them to multiples of 8) every 16 rows up to 256, where the route's table
# changes most; odd 77 and 200 for half-empty tiles; prefill sizes sparser.
M_LIST = (1, 16, 32, 48, 64, 77, 80, 96, 112, 128, 144, 160, 176, 192, 200, 208, 224, 240, 256, 320, 384,
          448, 512, 1024, 2048, 4096)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def probe(shapes, m_list, configs, out_path: str) -> dict:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows, t0 = [], time.perf_counter()
    for name in shapes:
        K, N = QWEN3_8B_GEMMS[name]
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
                  f"differing {row['differing_total']}", flush=True)
        del ring, w
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "library": _manifest(), "timing":
           "CUDA graph replay of back-to-back calls, cold weights (ring of copies >= 4x L2), median of 3",
           "baseline": "cuBLAS via torch.nn.functional.linear, same process, same inputs",
           "rows": rows, "seconds": time.perf_counter() - t0}
    doc["differing_total"] = sum(r["differing_total"] for r in rows)
    doc["errors"] = sorted({f"{c}: {v['error']}" for r in rows for c, v in r["configs"].items() if "error" in v})
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
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


def make_table(doc: dict, source: str) -> dict:
    """The ``configs/sm90_cutlass.json`` table from a probe: per (K, N) and measured M, the fastest
    configuration where it beats the Triton kernel (else null: Triton serves), each M's choice
    serving the M range from the previous measured M up to it; the default rule (shapes without
    an entry) takes per M the configuration with the best geometric-mean time over the Triton
    kernel's across the probed shapes, where that mean is below 1."""
    import math  # noqa: PLC0415
    from collections import defaultdict  # noqa: PLC0415

    # Shapes probed twice under different names (e.g. qkv and tp4_gate_up, both 4096 x 6144) add up.
    sums = defaultdict(lambda: defaultdict(float))
    for r in doc["rows"]:
        key = (f"{r['K']}x{r['N']}", r["M"])
        sums[key]["triton"] += r["triton_ms"]
        for c, v in r["configs"].items():
            sums[key][c] += v["ms"] if "ms" in v and v.get("differing") == 0 else math.inf
    shapes, ratios = defaultdict(list), defaultdict(lambda: defaultdict(list))
    for (kn, M), t in sums.items():
        ok = {c: ms for c, ms in t.items() if c != "triton" and ms < math.inf}
        best = min(ok, key=ok.get) if ok else None
        shapes[kn].append((M, best if best and ok[best] < t["triton"] else None))
        for c, ms in ok.items():
            ratios[M][c].append(ms / t["triton"])
    n_shapes = len(shapes)
    default = []
    for M in sorted(ratios):
        geo = {c: math.exp(sum(map(math.log, v)) / len(v)) for c, v in ratios[M].items() if len(v) == n_shapes}
        best = min(geo, key=geo.get) if geo else None
        default.append((M, best if best and geo[best] < 1.0 else None))
    return {"what": "sm_90 GEMM route: [max_m, CUTLASS configuration or null (Triton kernels)] per K x N",
            "written_by": "python -m rlk.kernels.gemm.sm90_probe --table-out", "source": source,
            "device": doc["device"], "timing": doc["timing"], "library_sha256": doc["library"].get("sha256"),
            "entries": {k: _runs(sorted(v)) for k, v in sorted(shapes.items())}, "default": _runs(default)}


def _manifest() -> dict:
    m = sm90.library_path().with_name("manifest.json")
    return json.loads(m.read_text()) if m.is_file() else {"missing": str(m)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(QWEN3_8B_GEMMS))
    ap.add_argument("--m", default=",".join(map(str, M_LIST)))
    ap.add_argument("--configs", default=",".join(sm90.CONFIGS))
    ap.add_argument("--table-out", default=None, help="also write the route table (configs/sm90_cutlass.json format)")
    ap.add_argument("--from-json", default=None, help="build --table-out from an earlier probe's JSON (no GPU)")
    args = ap.parse_args(argv)
    if args.from_json:
        doc = json.load(open(args.from_json))
        with open(args.table_out, "w") as f:
            json.dump(make_table(doc, args.from_json), f, indent=1)
        return 0
    if sm90.library() is None:
        print(f"sm90_probe: no library (set {sm90.LIB_ENV} or build it)", file=sys.stderr)
        return 2
    # The reference and the "triton" arm are the Triton kernels alone: the route is switched off
    # (gemm() would otherwise serve table picks with these very configurations).
    with determinism.scoped({sm90.MODE_ENV: "off"}):
        doc = probe(args.shapes.split(","), [int(m) for m in args.m.split(",")], args.configs.split(","), args.out)
    if args.table_out:
        with open(args.table_out, "w") as f:
            json.dump(make_table(doc, args.out), f, indent=1)
    print(f"sm90_probe: differing elements in total {doc['differing_total']}; errors {len(doc['errors'])}")
    for e in doc["errors"][:20]:
        print("  ", e)
    return 0 if doc["differing_total"] == 0 and not doc["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
