"""Hardware counters of GEMM routes at a few token counts, read by Nsight Compute (ncu).

The K scan (``sm90_kscan_probe``) times a route; it cannot say where the time goes. On the H100,
``ws64x128`` (one 64-deep K step per stage) streamed the weights at cuBLAS's rate at M 152-256 but
took 1.47-1.79x cuBLAS's time per K where its last 64-row token tile held 4-16 rows (M 136, 144,
196-204), and its 128-deep twin did not. This tool launches each (route, M) once, inside an NVTX
range, so that ncu profiles exactly those kernels, and turns ncu's CSV into JSON with, per case:
the kernel time with cold caches, the DRAM bytes (read and write: ncu's DRAM rate times the
kernel's duration) against the weights' bytes (N x K x 2: well above 1 means some weight tiles
came from DRAM more than once), the DRAM and SM shares of peak, the L2 hit rate, and the warp
stall reasons per issued instruction that ncu's WarpStateStats section reports.

    ncu --clock-control none --nvtx --nvtx-include "rlk_counters/" --export counters \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \\
        python3 -m rlk.kernels.gemm.sm90_counters run --routes ws64x128,ws64x128x128,cublas \\
        --m 136,144,160,192,200,208 --n 4096 --k 4096 --order order.json
    ncu --import counters.ncu-rep --csv --page raw --print-units base > counters.csv
    python -m rlk.kernels.gemm.sm90_counters report --csv counters.csv --order order.json --out sm90_counters.json

(``ci/h200_check.sh``'s ``sm90_counters`` stage runs the three.) Each case launches a one-element
int32 fill before its GEMM, inside the range: the report splits ncu's rows at those fills, so a
route that launches several kernels (cuBLAS with split K and its reduction) is summed per case.
A count of marker fills other than the cases launched, an empty case, or a configuration's case
that is not one CUTLASS kernel is an error (cuBLAS's kernels are not checked by name). Bytes are
compared with the Triton kernels' output for the CUTLASS configurations (``torch.equal``) before
the profiled launch, so the counters describe a kernel that computes the contract; a difference
exits 1, a usage or input error 2. Each case is one launch with the clocks unlocked: a diagnosis,
not a timing (``sm90_probe``'s graph-replay medians are the timings of record).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys

RANGE = "rlk_counters"
MARKER = "FillFunctor<int>"

# Columns of ncu's raw page that the report names, taken from a case's longest kernel (rates, shares).
METRICS = {
    "dram_pct_of_peak": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "sm_pct_of_peak": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "grid_size": "launch__grid_size",
}
TIME = "gpu__time_duration.sum"
DRAM_RATE = "dram__bytes.sum.per_second"  # read and write, over the kernel's duration
STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")

# The units the report reads TIME and DRAM_RATE in, scaled to microseconds and bytes per second.
# Other columns are kept as ncu printed them (their units are in the CSV's units row).
_TIME_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
_RATE = {"byte/s": 1.0, "Kbyte/s": 1e3, "Mbyte/s": 1e6, "Gbyte/s": 1e9, "Tbyte/s": 1e12,
         "byte/second": 1.0, "Kbyte/second": 1e3, "Mbyte/second": 1e6, "Gbyte/second": 1e9, "Tbyte/second": 1e12}
_SCALED = {TIME: _TIME_US, DRAM_RATE: _RATE}


def _number(text: str) -> float | None:
    text = (text or "").replace(",", "").strip()
    if not text or text.lower() in ("n/a", "nan"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def read_csv(text: str) -> list[dict]:
    """ncu's ``--csv --page raw`` output -> one dict per profiled kernel: ``name`` and every metric
    as a number (TIME in microseconds, DRAM_RATE in bytes/s, the rest as printed); lines before the
    header (ncu's ``==PROF==`` notes, the program's own output) are skipped. A row of another width
    than the header, or a unit the report cannot scale for the two columns it computes with, is an
    error: a dropped kernel would under-sum its case."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise ValueError("sm90_counters: no ncu raw-page header (a line starting with \"ID\") in the CSV")
    rows = [r for r in csv.reader(lines[start:]) if r]
    header, rest = rows[0], rows[1:]
    units = [""] * len(header)
    if rest and not rest[0][0].strip():
        units, rest = rest[0], rest[1:]
    for metric, known in _SCALED.items():
        if metric in header and units[header.index(metric)] not in known:
            raise ValueError(f"sm90_counters: {metric} in unit {units[header.index(metric)]!r}: not understood "
                             f"(expected one of {sorted(known)})")
    out = []
    for r in rest:
        if len(r) != len(header):
            raise ValueError(f"sm90_counters: a row of {len(r)} fields under a header of {len(header)}: {r[:3]}")
        rec = dict(zip(header, r))
        kernel = {"name": rec.get("Kernel Name", ""), "metrics": {}}
        for h, u, v in zip(header, units, r):
            if "__" in h:
                x = _number(v)
                kernel["metrics"][h] = x * _SCALED[h][u] if (x is not None and h in _SCALED) else x
        out.append(kernel)
    return out


def group_cases(kernels: list[dict], order: list[dict]) -> list[dict]:
    """ncu's kernels (launch order) split at the marker fills: one case per marker, the kernels after
    it summed (times, bytes) or taken from the longest (rates, grid). The number of markers must
    equal ``order``'s cases, each case must hold at least one kernel, and a CUTLASS configuration's
    case exactly one CUTLASS kernel (``cutlass`` in its name)."""
    segments: list[list[dict]] = []
    for k in kernels:
        if MARKER in k["name"]:
            segments.append([])
        elif segments:
            segments[-1].append(k)
        else:
            raise ValueError(f"sm90_counters: kernel {k['name'][:80]!r} came before the first marker fill")
    if len(segments) != len(order):
        raise ValueError(f"sm90_counters: {len(segments)} marker fills in ncu's rows, {len(order)} cases launched")
    out = []
    for case, seg in zip(order, segments):
        if not seg:
            raise ValueError(f"sm90_counters: case {case} has no kernel after its marker")
        if case["route"] not in ("cublas", "triton") and (len(seg) != 1 or "cutlass" not in seg[0]["name"]):
            raise ValueError(f"sm90_counters: case {case} should be one CUTLASS kernel, ncu has "
                             f"{[k['name'][:60] for k in seg]}")
        main = max(seg, key=lambda k: k["metrics"].get(TIME) or 0.0)
        row = dict(case)
        row["kernels"] = [k["name"][:160] for k in seg]
        times = [k["metrics"].get(TIME) for k in seg]
        if any(t is None for t in times):
            raise ValueError(f"sm90_counters: case {case} has a kernel without {TIME}")
        row["time_us"] = sum(times)
        rates = [k["metrics"].get(DRAM_RATE) for k in seg]
        row["dram_bytes"] = (sum(r * t * 1e-6 for r, t in zip(rates, times)) if all(r is not None for r in rates)
                             else None)
        for key, metric in METRICS.items():
            row[key] = main["metrics"].get(metric)
        weight_bytes = case["N"] * case["K"] * 2
        if row["dram_bytes"] is not None:
            row["dram_bytes_over_weights"] = row["dram_bytes"] / weight_bytes
        if row["time_us"]:
            row["weight_tb_s"] = weight_bytes / (row["time_us"] * 1e-6) / 1e12
        row["stalls"] = {m[len(STALL[0]):-len(STALL[1])]: v for m, v in main["metrics"].items()
                         if m.startswith(STALL[0]) and m.endswith(STALL[1]) and v}
        out.append(row)
    return out


def run(routes: list[str], ms: list[int], N: int, K: int, seed: int = 0) -> list[dict]:
    """Launches each (route, M) once after a warm-up launch: marker fill then the GEMM, inside the
    NVTX range ncu is told to profile. Returns the launch order."""
    import torch  # noqa: PLC0415

    from rlk.kernels.gemm import sm90  # noqa: PLC0415

    for r in routes:
        if r not in ("cublas", "triton") and r not in sm90.CONFIGS:
            raise ValueError(f"sm90_counters: unknown route {r!r} (cublas, triton or an sm90 configuration)")
        if r not in ("cublas", "triton") and not sm90.serves_k(r, K):
            raise ValueError(f"sm90_counters: {r} does not serve K={K} (sm90.serves_k)")
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn((N, K), generator=g, device="cuda") * K ** -0.5).to(torch.bfloat16)
    order = []
    for M in ms:
        x = torch.randn((M, K), generator=g, device="cuda").to(torch.bfloat16)
        ref = None
        for r in routes:
            if r not in ("cublas", "triton"):
                if ref is None:
                    ref = _triton(x, w)
                y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                sm90.gemm_into(y, x, w, r)
                torch.cuda.synchronize()
                if not torch.equal(y.view(torch.int16), ref.view(torch.int16)):
                    raise RuntimeError(f"sm90_counters: {r} at M={M} differs from the Triton kernels' bytes")

                def launch(r=r, y=y, x=x):
                    sm90.gemm_into(y, x, w, r)
            elif r == "cublas":
                def launch(x=x):
                    torch.nn.functional.linear(x, w)
            else:
                def launch(x=x):
                    _triton(x, w)
            launch()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(RANGE)
            torch.empty(1, device="cuda", dtype=torch.int32).fill_(1)  # one fill kernel: the marker
            launch()
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
            order.append({"route": r, "M": M, "N": N, "K": K})
            print(f"sm90_counters: {r} M={M} launched", flush=True)
    return order


def _triton(x, w):
    from rlk import determinism  # noqa: PLC0415
    from rlk.kernels.gemm import sm90  # noqa: PLC0415
    from rlk.kernels.gemm.launch import gemm  # noqa: PLC0415

    with determinism.scoped({sm90.MODE_ENV: "off"}):
        return gemm(x, w)


def _ints(text: str) -> list[int]:
    vals = [int(v) for v in text.split(",") if v.strip()]
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return vals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="sm90_counters", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="launch the cases (run it under ncu)")
    r.add_argument("--routes", required=True, help="cublas, triton or sm90 configuration names, comma-separated")
    r.add_argument("--m", type=_ints, required=True)
    r.add_argument("--n", type=int, required=True)
    r.add_argument("--k", type=int, required=True)
    r.add_argument("--order", required=True, help="where the launch order (JSON) goes")
    p = sub.add_parser("report", help="ncu's raw CSV and the launch order -> JSON")
    p.add_argument("--csv", required=True)
    p.add_argument("--order", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tool", default="ncu (flags not given)",
                   help="the ncu command line that profiled the run, recorded in the JSON")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        import torch  # noqa: PLC0415

        from rlk.kernels.gemm import sm90  # noqa: PLC0415

        routes = [s.strip() for s in a.routes.split(",") if s.strip()]
        try:
            order = run(routes, a.m, a.n, a.k)
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        except RuntimeError as e:  # a configuration's bytes differ from the Triton kernels'
            print(e, file=sys.stderr)
            return 1
        with open(a.order, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "library": sm90.library_manifest(), "cases": order}, f, indent=1)
        return 0
    try:
        with open(a.csv) as f:
            kernels = read_csv(f.read())
        with open(a.order) as f:
            order_doc = json.load(f)
        order = order_doc["cases"]
        cases = group_cases(kernels, order)
    except (OSError, ValueError, KeyError) as e:
        print(e, file=sys.stderr)
        return 2
    doc = {"library": order_doc.get("library"), "device": order_doc.get("device"), "tool": a.tool,
           "sampling": "one launch per case, clocks unlocked", "cases": cases}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)

    def fmt(v, spec: str) -> str:
        return "n/a" if v is None else format(v, spec)

    for c in cases:
        top = sorted(c["stalls"].items(), key=lambda kv: -kv[1])[:3]
        print(f"{c['route']:>14} M={c['M']:>4}: {fmt(c['time_us'], '8.2f')} us  DRAM bytes / weights "
              f"{fmt(c.get('dram_bytes_over_weights'), '.3f')}  DRAM {fmt(c['dram_pct_of_peak'], '5.1f')}% of peak  "
              f"L2 hit {fmt(c['l2_hit_pct'], '5.1f')}%  grid {fmt(c['grid_size'], '.0f')}  stalls "
              + " ".join(f"{k} {v:.2f}" for k, v in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
