"""Where a configuration loses its time to cuBLAS: once per call, or on every K step.

The probe (``sm90_probe``) times each configuration at the model's K only, so a configuration
that runs the same tile and cluster as cuBLAS's kernel yet takes 1.2-3x its time (the
``cublas_twins`` of the H100 probes) does not say where the time goes. This scan holds N, M and
each configuration fixed and walks K: each route's time is fitted to ``t(K) = fixed + per_k * K``
by least squares. ``fixed`` is what a call costs whatever its length (launch, prologue, pipeline fill,
epilogue, the wave's tail); ``per_k`` is the mainloop's cost per K element, from which the
weight stream's rate follows (N x 2 bytes per K element). A configuration whose ``per_k``
matches cuBLAS's but whose ``fixed`` does not loses its time outside the K walk, and the other
way round.

    python -m rlk.kernels.gemm.sm90_kscan_probe --out sm90_kscan.json --cases 4096x144,4096x200 \
        --k 64,256,1024,2048,4096,8192 --configs sw64x72m2,sw64x80,sw64x72m2w   # fits over K >= 1024
    python -m rlk.kernels.gemm.sm90_kscan_probe --from-json sm90_kscan.json --out fits.json   # refit, no GPU

cuBLAS picks its kernel per shape, so it may change kernels along K (a wider tile, split K): every
route is fitted over the longest run of consecutive K values at which cuBLAS launched the same
kernels (``ks`` and ``cublas_kernels`` in each fit), so that its line describes one kernel. The
Triton route runs with the CUTLASS route off (``RLK_GEMM_SM90=off``): the Triton kernels alone,
and the reference each configuration's bytes are compared with.

Timing is the probe's: CUDA-graph replay of back-to-back calls, cold weights (a ring of copies of
at least 4x the L2), median of 3; cuBLAS is ``torch.nn.functional.linear`` on the same tensors in
the same process. Each route is also timed with a one-element add between its calls
(``separated``, the add's own time subtracted): back to back, a kernel may start while the one
before it drains (programmatic dependent launch, or a short prologue hidden in the launch gap),
which a decode step, where norms and attention sit between the GEMMs, does not allow. A route
whose fixed cost grows when separated was hiding part of it behind its neighbour. Each
configuration's output is compared with the Triton kernels' at every point (``torch.equal`` on
the bits): a configuration that differs is reported, never fitted. A configuration that does not
serve a K (a 128-deep tile where K's 64-chunks do not come in pairs, ``sm90.serves_k``) is
recorded there as ``not_served`` and not timed; the others are timed at that K as usual, and a
configuration missing a point of the fitted K run is not fitted.

``--pad-m 64`` also times each configuration on token rows padded with zeros to a multiple of 64
(the token tile), where M is not one: ``c+pad64`` with the copy of x in and of the first M output
rows out inside the timed call (what a route that pads would pay), ``c+padded64`` the GEMM on the
padded buffers alone. The kept rows are checked against the reference's bytes. It tests whether a
nearly empty last token tile, whose TMA box is mostly out of bounds, is what slows a configuration.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from rlk.kernels.gemm.sm90_configs import padded_rows, token_tile


def parse_cases(text: str) -> list[tuple[int, int]]:
    """``"4096x144,6144x200"`` -> [(N, M), ...]: weight rows N (a multiple of 8) and tokens M."""
    cases = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            n, m = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise ValueError(f"sm90_kscan_probe: a case is NxM (weight rows x tokens), got {part!r}") from None
        if n < 8 or n % 8 or m < 1:
            raise ValueError(f"sm90_kscan_probe: case {part!r}: N must be a positive multiple of 8 and M >= 1")
        cases.append((n, m))
    if not cases:
        raise ValueError("sm90_kscan_probe: no case given")
    return cases


def parse_ks(text: str) -> list[int]:
    ks = sorted({int(v) for v in text.split(",") if v.strip()})
    if len(ks) < 2 or any(k < 64 or k % 64 for k in ks):
        raise ValueError(f"sm90_kscan_probe: at least two K, each a positive multiple of 64 (the contract's chunk), got {text!r}")
    return ks


NOT_SERVED = "tile K 128 and an odd number of 64-chunks in K (sm90.serves_k)"

# The shortest K a fit uses: below it a call is mostly pipeline fill and epilogue, and time is not
# yet linear in K (the scan may still time shorter K: what a call costs with almost no mainloop).
FIT_MIN_K = 1024


def fit_line(ks: list[int], ms: list[float]) -> dict:
    """Least-squares ``ms = fixed + per_k * K``: fixed in microseconds, per_k in microseconds per
    1024 K elements, and the largest relative residual (how well a line describes the route)."""
    if len(ks) != len(ms) or len(ks) < 2:
        raise ValueError("fit_line: needs two or more (K, time) points")
    n = len(ks)
    mk, mt = sum(ks) / n, sum(ms) / n
    sxx = sum((k - mk) ** 2 for k in ks)
    if sxx == 0:
        raise ValueError("fit_line: the K values are all equal")
    slope = sum((k - mk) * (t - mt) for k, t in zip(ks, ms)) / sxx
    icpt = mt - slope * mk
    resid = max(abs(t - (icpt + slope * k)) / t for k, t in zip(ks, ms))
    return {"fixed_us": icpt * 1e3, "per_1024k_us": slope * 1024 * 1e3, "max_rel_residual": resid}


def same_cublas_run(points: list[dict]) -> list[dict]:
    """The longest run of consecutive points (ascending K) at which cuBLAS launched the same
    kernels (the first such run on a tie); all points where no two neighbours agree."""
    best, start = (0, 1), 0
    for i in range(1, len(points) + 1):
        if i == len(points) or points[i].get("cublas_kernels") != points[start].get("cublas_kernels"):
            if i - start > best[1] - best[0]:
                best = (start, i)
            start = i
    return points[best[0]:best[1]] if best[1] - best[0] >= 2 else points


def summarize(doc: dict, timing: str = "ms", min_k: int = FIT_MIN_K) -> list[dict]:
    """Per case and route (cuBLAS, Triton, each configuration with times at every K): the fit over
    cuBLAS's longest one-kernel run of K (:func:`same_cublas_run`) among the K >= ``min_k``, and the
    configuration's fixed and per-K cost over cuBLAS's. ``timing``: "ms" (back to back) or
    "separated_ms" (a one-element add between calls, its time subtracted). Shorter K are kept in
    the scan (their times are the fixed cost with little mainloop) but left out of the line."""
    out = []
    for case in doc["cases"]:
        long_k = [p for p in case["points"] if p["K"] >= min_k]
        if len(long_k) < 2:
            raise ValueError(f"sm90_kscan_probe: case N={case['N']} M={case['M']} has fewer than two K >= {min_k} to fit")
        points = same_cublas_run(sorted(long_k, key=lambda p: p["K"]))
        ks = [p["K"] for p in points]
        routes = {"cublas": [p["cublas"][timing] for p in points], "triton": [p["triton"][timing] for p in points]}
        names = {c for p in points for c in p["configs"]}
        for c in sorted(names):
            got = [p["configs"].get(c, {}) for p in points]
            if all(timing in g and g.get("differing") == 0 for g in got):
                routes[c] = [g[timing] for g in got]
        base = fit_line(ks, routes["cublas"])
        kernels = points[0].get("cublas_kernels")
        for route, ms in routes.items():
            f = fit_line(ks, ms)
            row = {"N": case["N"], "M": case["M"], "timing": timing, "route": route, "ks": ks,
                   "cublas_kernels": kernels, **f}
            if route != "cublas":
                row["fixed_over_cublas"] = f["fixed_us"] / base["fixed_us"] if base["fixed_us"] > 0 else None
                row["per_k_over_cublas"] = f["per_1024k_us"] / base["per_1024k_us"] if base["per_1024k_us"] > 0 else None
            # Weight bytes streamed per microsecond of mainloop: N rows x 1024 K x 2 bytes per per_1024k_us.
            row["weight_stream_tb_s"] = (case["N"] * 1024 * 2 / (f["per_1024k_us"] * 1e-6) / 1e12
                                         if f["per_1024k_us"] > 0 else None)
            out.append(row)
    return out


def scan(cases, ks, configs, device: str = "cuda", pad_m: int = 0) -> dict:
    """Times every route at every (case, K); the Triton route with the CUTLASS route off. With
    ``pad_m``, each configuration is also timed on token rows padded to a multiple of ``pad_m``
    where M is not one (see :func:`_padded_routes`)."""
    from rlk import determinism  # noqa: PLC0415
    from rlk.kernels.gemm import sm90  # noqa: PLC0415

    if pad_m < 0:
        raise ValueError(f"sm90_kscan_probe: pad_m must be >= 0, got {pad_m}")
    with determinism.scoped({sm90.MODE_ENV: "off"}):
        return _scan(cases, ks, configs, device, pad_m)


def _padded_routes(c: str, x, w, ref, ring, pad_m: int, timed) -> dict:
    """Configuration ``c`` on token rows padded with zeros to a multiple of ``pad_m``; where ``c``'s
    token tile divides ``pad_m`` no token tile then reaches past the tensor (a configuration whose
    tile does not is recorded as ``not_padded``, not timed: padding would change its grid or leave
    its last tile past the tensor): ``+pad`` copies x in and the first M rows
    of the result out inside the timed call (what a route would pay), ``+padded`` times the GEMM on
    the padded buffers alone (the kernel's share). Each row's products and K chain are the same at
    any M, so the kept rows must equal the reference's bytes; a difference is recorded, not timed."""
    import torch  # noqa: PLC0415

    from rlk.kernels.gemm import sm90  # noqa: PLC0415

    if pad_m % token_tile(c):
        return {f"{c}+pad{pad_m}": {"not_padded": f"token tile {token_tile(c)} does not divide {pad_m}"}}
    M, K = x.shape
    Mp = padded_rows(M, pad_m)
    xp = torch.zeros((Mp, K), dtype=x.dtype, device=x.device)
    yp = torch.empty((Mp, ref.shape[1]), dtype=ref.dtype, device=ref.device)
    yo = torch.full_like(ref, float("nan"))

    def with_copies(wt):
        xp[:M].copy_(x)
        sm90.gemm_into(yp, xp, wt, c)
        yo.copy_(yp[:M])

    with_copies(w)
    torch.cuda.synchronize()
    diff = int((yo.view(torch.int16) != ref.view(torch.int16)).sum())
    if diff:
        return {f"{c}+pad{pad_m}": {"differing": diff, "padded_m": Mp}}
    return {f"{c}+pad{pad_m}": {"differing": 0, "padded_m": Mp, **timed(lambda: with_copies(ring.next()))},
            f"{c}+padded{pad_m}": {"differing": 0, "padded_m": Mp,
                                   **timed(lambda: sm90.gemm_into(yp, xp, ring.next(), c))}}


def _scan(cases, ks, configs, device: str, pad_m: int = 0) -> dict:
    import torch  # noqa: PLC0415

    from rlk.kernels.gemm import sm90  # noqa: PLC0415
    from rlk.kernels.gemm.gemm_tune import WeightRing, bench_ms, l2_bytes, ring_size  # noqa: PLC0415
    from rlk.kernels.gemm.launch import gemm  # noqa: PLC0415
    from rlk.kernels.gemm.sm90_probe import kernel_names  # noqa: PLC0415

    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(0)
    missing = [c for c in configs if not sm90.available(c)]
    if missing:
        print(f"sm90_kscan_probe: not in the loaded library, skipped: {missing}", flush=True)
    configs = [c for c in configs if c not in missing]
    t0, out = time.perf_counter(), []
    one = torch.zeros(1, device=dev)

    def separator():
        one.add_(1.0)  # one tiny kernel between two GEMMs: no GEMM starts under the one before it

    for N, M in cases:
        case = {"N": N, "M": M, "points": []}
        for K in ks:
            w = (torch.randn((N, K), generator=gen, device=dev) * K ** -0.5).to(torch.bfloat16)
            ring = WeightRing(w, ring_size(w.numel() * 2, l2_bytes()))
            x = torch.randn((M, K), generator=gen, device=dev).to(torch.bfloat16)
            ref = gemm(x, w)
            sep_ms = bench_ms(separator)

            def timed(fn) -> dict:
                both = bench_ms(lambda: (fn(), separator()))
                return {"ms": bench_ms(fn), "separated_ms": both - sep_ms}

            p = {"K": K, "separator_ms": sep_ms,
                 "cublas": timed(lambda: torch.nn.functional.linear(x, ring.next())),
                 "cublas_kernels": kernel_names(lambda: torch.nn.functional.linear(x, w)),
                 "triton": timed(lambda: gemm(x, ring.next())), "configs": {}}
            for c in configs:
                if not sm90.serves_k(c, K):
                    p["configs"][c] = {"not_served": NOT_SERVED}
                    continue
                y = torch.full_like(ref, float("nan"))
                sm90.gemm_into(y, x, w, c)
                torch.cuda.synchronize()
                diff = int((y.view(torch.int16) != ref.view(torch.int16)).sum())
                yo = torch.empty_like(ref)
                p["configs"][c] = {"differing": diff, **timed(lambda: sm90.gemm_into(yo, x, ring.next(), c))}
                if padded_rows(M, pad_m) != M:
                    p["configs"].update(_padded_routes(c, x, w, ref, ring, pad_m, timed))
            case["points"].append(p)
            cb = p["cublas"]
            print(f"N={N} M={M} K={K:6d} cuBLAS {cb['ms'] * 1e3:7.1f} us (separated {cb['separated_ms'] * 1e3:7.1f})  "
                  + "  ".join(f"{c} not served" if "not_served" in v else
                              f"{c} not padded" if "not_padded" in v else
                              f"{c} DIFFERS, not timed" if "ms" not in v else
                              f"{c} {v['ms'] / cb['ms']:.2f}x ({v['separated_ms'] / cb['separated_ms']:.2f}x)"
                              + ("" if v["differing"] == 0 else " DIFFERS") for c, v in p["configs"].items()), flush=True)
            del ring, w
        out.append(case)
    return {"device": torch.cuda.get_device_name() if dev.type == "cuda" else device, "torch": torch.__version__,
            "library": sm90.library_manifest(), "skipped_configs": missing,
            "timing": "CUDA graph replay of back-to-back calls, cold weights (ring of copies >= 4x L2), median of 3; "
                      "separated_ms: the same with a one-element add between calls, the add's own time subtracted",
            "baseline": "cuBLAS via torch.nn.functional.linear, same process, same inputs",
            "triton_route": f"{sm90.MODE_ENV}=off: the Triton kernels alone, also the bytes reference",
            "pad_m": pad_m, "cases": out, "seconds": time.perf_counter() - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="4096x144,4096x200", help="NxM pairs (weight rows x tokens), comma-separated")
    ap.add_argument("--k", default="1024,2048,4096,8192,12288", help="K values, multiples of 64")
    ap.add_argument("--configs", help="sm90 configuration names, comma-separated (required unless --from-json)")
    ap.add_argument("--from-json", help="an earlier scan's JSON: fit it again (no GPU) and write --out")
    ap.add_argument("--pad-m", type=int, default=0,
                    help="also time each configuration on token rows padded with zeros to a multiple of this "
                         "(e.g. 64, the token tile): '+pad' with the copies in and out, '+padded' without")
    ap.add_argument("--fit-min-k", type=int, default=FIT_MIN_K,
                    help="shortest K the fits use (shorter K are timed and kept, not fitted)")
    args = ap.parse_args(argv)
    if args.from_json:
        if args.pad_m:
            ap.error("--pad-m times padded routes on the GPU; an earlier scan (--from-json) is only refitted")
        from rlk.kernels.gemm.sm90_probe import read_json  # noqa: PLC0415

        doc = read_json(args.from_json)
        doc["refit_from"] = args.from_json
    elif not args.configs:
        ap.error("--configs is required (or --from-json)")
    else:
        ks = parse_ks(args.k)
        if sum(k >= args.fit_min_k for k in ks) < 2:  # said before the GPU time, not after it
            ap.error(f"--k {args.k}: the fits need two or more K >= --fit-min-k {args.fit_min_k}")
        from rlk.kernels.gemm import sm90  # noqa: PLC0415
        from rlk.kernels.gemm.sm90_probe_select import split_names  # noqa: PLC0415

        configs = split_names(args.configs)
        unknown = [c for c in configs if c not in sm90.CONFIGS]
        if unknown:
            ap.error(f"--configs: unknown configurations {unknown} (sm90.CONFIGS names them)")
        unserved = [f"{c}@K={k}" for c in configs for k in ks if not sm90.serves_k(c, k)]
        if unserved:
            print(f"sm90_kscan_probe: not served, so not timed ({NOT_SERVED}): {', '.join(unserved)}", flush=True)
        if args.pad_m < 0 or (args.pad_m and args.pad_m % 8):
            ap.error(f"--pad-m {args.pad_m}: a positive multiple of 8 (or 0: no padded routes)")
        doc = scan(parse_cases(args.cases), ks, configs, pad_m=args.pad_m)
    doc["fit_min_k"] = args.fit_min_k
    doc["fits"] = summarize(doc, "ms", args.fit_min_k) + summarize(doc, "separated_ms", args.fit_min_k)
    for f in doc["fits"]:
        extra = "" if f["route"] == "cublas" else (
            f"  fixed/cuBLAS {f['fixed_over_cublas'] or float('nan'):.2f}  per-K/cuBLAS {f['per_k_over_cublas'] or float('nan'):.2f}")
        print(f"N={f['N']} M={f['M']} K {f['ks'][0]}-{f['ks'][-1]} {f['timing']:12s} {f['route']:14s} fixed {f['fixed_us']:6.2f} us  per 1024 K {f['per_1024k_us']:6.2f} us  "
              f"weights {f['weight_stream_tb_s'] or float('nan'):.2f} TB/s  residual {f['max_rel_residual']:.3f}{extra}", flush=True)
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    bad = [(c["N"], c["M"], p["K"], n) for c in doc["cases"] for p in c["points"]
           for n, v in p["configs"].items() if v.get("differing")]
    print(f"sm90_kscan_probe: differing points {len(bad)} {bad[:10]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
