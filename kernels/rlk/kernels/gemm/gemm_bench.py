"""Benchmark of contract gemm.bf16.v1 against cuBLAS (``torch.matmul``) on the same tensors.

Run on the H200 (not in CI):
  python -m rlk.kernels.gemm.gemm_bench --out gemm_h200.json [--quick] [--eager]

Times are medians of ``triton.testing.do_bench_cudagraph`` (both arms replayed from CUDA graphs,
as vLLM decode runs; ``--eager`` uses ``do_bench`` instead, which at decode sizes also measures
Python launch overhead). Rows: shape, K, N, M, strict_us, native_us, ratio (= strict / native),
strict_tbps (bytes of x, w, y over strict time), strict_tflops, schedule, split_k.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from rlk.testing.shapes import QWEN3_8B_GEMMS

M_LIST = (1, 8, 32, 128, 512, 2048, 8192)
QUICK_SHAPES = ("qkv", "down", "tp4_qkv", "tp4_lm_head")
QUICK_M = (1, 32, 2048)


def _provenance() -> dict:
    try:
        from rlk.provenance import capability_record  # noqa: PLC0415 (optional module)

        return capability_record(contracts=["gemm.bf16.v1"])
    except Exception as e:  # the provenance module may not exist yet
        import triton

        return {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
                "gpu": torch.cuda.get_device_name(), "contract": "gemm.bf16.v1",
                "note": f"rlk.provenance unavailable ({type(e).__name__})"}


def _time(fn, eager: bool) -> float:
    import triton.testing as tt

    fn()
    torch.cuda.synchronize()
    if eager:
        return float(tt.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    return float(tt.do_bench_cudagraph(fn, rep=100, return_mode="median"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--quick", action="store_true", help="4 shapes x M in (1, 32, 2048)")
    ap.add_argument("--eager", action="store_true", help="time eager launches instead of graph replays")
    ap.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gemm_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    from rlk.kernels.gemm import config, launch

    names = args.shapes.split(",") if args.shapes else list(QUICK_SHAPES if args.quick else QWEN3_8B_GEMMS)
    m_list = QUICK_M if args.quick else M_LIST
    rows = []
    print(f"{'shape':<12}{'K':>6}{'N':>7}{'M':>6}{'strict us':>11}{'cuBLAS us':>11}{'ratio':>7}{'TB/s':>7}{'TFLOP/s':>9}  sched")
    for name in names:
        K, N = QWEN3_8B_GEMMS[name]
        g = torch.Generator(device="cuda").manual_seed(0)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g)
        xa = torch.randn(max(m_list), K, device="cuda", dtype=torch.bfloat16, generator=g)
        for M in m_list:
            x = xa[:M]
            p = launch.plan(M, K, N, x.device)
            strict_ms = _time(lambda: launch.gemm(x, w), args.eager)
            native_ms = _time(lambda: torch.matmul(x, w.T), args.eager)
            nbytes = 2 * (M * K + N * K + M * N)
            flops = 2.0 * M * N * K
            row = {"shape": name, "K": K, "N": N, "M": M,
                   "strict_us": round(strict_ms * 1e3, 2), "native_us": round(native_ms * 1e3, 2),
                   "ratio": round(strict_ms / native_ms, 4),
                   "strict_tbps": round(nbytes / (strict_ms * 1e-3) / 1e12, 3),
                   "strict_tflops": round(flops / (strict_ms * 1e-3) / 1e12, 1),
                   "schedule": p["schedule"], "split_k": p["split_k"],
                   "config": {k: p[k] for k in config.SCHEDULE_KEYS[p["schedule"]] if k in p},
                   "timing": "eager" if args.eager else "cudagraph"}
            rows.append(row)
            print(f"{name:<12}{K:>6}{N:>7}{M:>6}{row['strict_us']:>11.2f}{row['native_us']:>11.2f}"
                  f"{row['ratio']:>7.3f}{row['strict_tbps']:>7.2f}{row['strict_tflops']:>9.1f}  {p['schedule']}/S{p['split_k']}",
                  flush=True)
    doc = {"provenance": _provenance(), "table": config.table_path("sm_90"), "contract": config.CONTRACT.to_json(), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
