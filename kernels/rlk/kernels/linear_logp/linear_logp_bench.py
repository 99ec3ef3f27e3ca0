"""Benchmark of ``logp.v2`` on the H200: strict fused vs native (matmul logits, fp32 log_softmax,
gather) and Liger-Kernel's fused linear cross-entropy when importable.

    python -m rlk.kernels.linear_logp.linear_logp_bench --out linear_logp_h200.json [--quick]

Rows per shape: ``fwd``; ``fwd_bwd`` (linear_logp + loss.backward(), loss = sum(logp * coef) with
a fixed random per-token coef); ``fwd_bwd_fused`` (the same loss through linear_logp_loss: gradients
formed in the forward, 3 GEMM-equivalents; its native/Liger numbers are the ``fwd_bwd`` row's,
measured on the same inputs in the same process; ``grads_equal_unfused``: d_hidden/d_weight
torch.equal to the fwd_bwd row's).

Times are medians of ``triton.testing.do_bench`` (warm-up excluded), both routes on the same
tensors in the same process. Peak memory: torch.cuda.max_memory_allocated() after
reset_peak_memory_stats(), minus the memory allocated before the call (inputs, i.e. hidden,
weight, targets, are excluded; outputs and gradients are included). Not for CI.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

H = 4096
FULL = [(T, V) for V in (37984, 151936) for T in (1024, 8192, 32768)]
QUICK = [(1024, 37984), (8192, 37984), (1024, 151936)]
ERR_T = 1024  # rows used for the accuracy column


def _provenance():
    try:
        from rlk.provenance import capability_record

        extra = {"bench": "linear_logp"}
        try:
            import importlib.metadata

            extra["liger_kernel"] = importlib.metadata.version("liger-kernel")
        except Exception:  # noqa: BLE001 - not installed: recorded as absent
            extra["liger_kernel"] = None
        return capability_record(route="strict", contract_ids=["logp.v2"], extra=extra)
    except Exception as e:  # noqa: BLE001 - a record must still be written
        import triton

        return {"torch": torch.__version__, "triton": triton.__version__,
                "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                "provenance_error": repr(e)}


def _liger():
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

        return LigerFusedLinearCrossEntropyFunction, None
    except Exception as e:  # noqa: BLE001
        return None, f"liger_kernel not importable: {e!r}"


def _peak_mb(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def run(shapes, out_path):
    import triton.testing as tt

    from rlk.kernels.linear_logp import reference as R
    from rlk.ops.linear_logp import linear_logp, linear_logp_loss

    liger_fn, liger_reason = _liger()
    if liger_reason:
        print(f"liger: skipped ({liger_reason})")
    else:
        import importlib.metadata

        print(f"liger: liger-kernel {importlib.metadata.version('liger-kernel')}")
    rows = []
    dev = "cuda"
    prov = _provenance()
    for T, V in shapes:
        g = torch.Generator(device=dev).manual_seed(0)
        h = torch.randn(T, H, device=dev, generator=g).bfloat16()
        w = (torch.randn(V, H, device=dev, generator=g) / 16).bfloat16()
        tg = torch.randint(0, V, (T,), device=dev, generator=g)
        coef = torch.randn(T, device=dev, generator=g)

        def strict_fwd():
            with torch.no_grad():
                return linear_logp(h, w, tg).logp

        def native_fwd():
            with torch.no_grad():
                return R.native_linear_logp(h, w, tg)

        hg, wg = h.clone().requires_grad_(True), w.clone().requires_grad_(True)

        def strict_fb():
            (linear_logp(hg, wg, tg).logp * coef).sum().backward()

        def native_fb():
            (R.native_linear_logp(hg, wg, tg) * coef).sum().backward()

        def liger_fb():
            out = liger_fn.apply(hg, wg, tg)
            (out[0] if isinstance(out, tuple) else out).backward()

        def fused_fb():
            linear_logp_loss(hg, wg, tg, lambda lp, lo, hi: lp * coef[lo:hi])[0].backward()

        for pas, s_fn, n_fn in (("fwd", strict_fwd, native_fwd), ("fwd_bwd", strict_fb, native_fb)):
            gn = [hg, wg] if pas == "fwd_bwd" else None
            row = {"T": T, "V": V, "H": H, "pass": pas}
            try:
                row["strict_us"] = tt.do_bench(s_fn, grad_to_none=gn, return_mode="median") * 1e3
                row["strict_peak_mb"] = _peak_mb(s_fn)
            except torch.cuda.OutOfMemoryError as e:
                row["strict_error"] = f"OOM: {e}"[:200]
            hg.grad = wg.grad = None
            try:
                row["native_us"] = tt.do_bench(n_fn, grad_to_none=gn, return_mode="median") * 1e3
                row["native_peak_mb"] = _peak_mb(n_fn)
            except torch.cuda.OutOfMemoryError as e:
                row["native_error"] = f"OOM: {e}"[:200]
            hg.grad = wg.grad = None
            torch.cuda.empty_cache()
            if "strict_us" in row and "native_us" in row:
                row["ratio"] = row["strict_us"] / row["native_us"]
            if pas == "fwd_bwd":
                if liger_fn is not None:
                    try:
                        row["liger_us"] = tt.do_bench(liger_fb, grad_to_none=gn, return_mode="median") * 1e3
                        row["liger_peak_mb"] = _peak_mb(liger_fb)
                        if "strict_us" in row:
                            row["ratio_vs_liger"] = row["strict_us"] / row["liger_us"]
                    except Exception as e:  # noqa: BLE001
                        row["liger_error"] = repr(e)[:200]
                    hg.grad = wg.grad = None
                else:
                    row["liger_skipped"] = liger_reason
            if pas == "fwd" and T == ERR_T:
                ref, _, _ = R.linear_logp_ref(h, w, tg)
                row["strict_logp_max_abs_err_fp64"] = (strict_fwd().double() - ref).abs().max().item()
                row["native_logp_max_abs_err_fp64"] = (native_fwd().double() - ref).abs().max().item()
                del ref
            rows.append(row)
            _print_row(row)
        rows.append(_fused_row(rows[-1], fused_fb, strict_fb, hg, wg))
        _print_row(rows[-1])
        del h, w, hg, wg
        torch.cuda.empty_cache()
        _write(out_path, prov, rows)  # after every shape: a stage time limit keeps what was measured
    _table(rows)
    print(f"wrote {out_path}")


def _write(out_path, prov, rows):
    with open(out_path, "w") as f:
        json.dump({"provenance": prov, "rows": rows}, f, indent=1, default=str)


def _print_row(row):
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)


def _fused_row(fb_row, fused_fb, strict_fb, hg, wg):
    """The fused path timed like ``fwd_bwd``'s strict column; native and Liger numbers copied from
    ``fb_row`` (same inputs, same process, same loss)."""
    import triton.testing as tt

    row = {k: fb_row[k] for k in ("T", "V", "H")}
    row["pass"] = "fwd_bwd_fused"
    try:
        row["strict_us"] = tt.do_bench(fused_fb, grad_to_none=[hg, wg], return_mode="median") * 1e3
        row["strict_peak_mb"] = _peak_mb(fused_fb)
        hg.grad = wg.grad = None
        fused_fb()
        fused_grads = (hg.grad, wg.grad)
        hg.grad = wg.grad = None
        strict_fb()
        row["grads_equal_unfused"] = bool(torch.equal(fused_grads[0], hg.grad)
                                          and torch.equal(fused_grads[1], wg.grad))
        del fused_grads
    except torch.cuda.OutOfMemoryError as e:
        row["strict_error"] = f"OOM: {e}"[:200]
    hg.grad = wg.grad = None
    torch.cuda.empty_cache()
    for k in ("native_us", "native_peak_mb", "native_error", "liger_us", "liger_peak_mb", "liger_error",
              "liger_skipped"):
        if k in fb_row:
            row[k] = fb_row[k]
    if "strict_us" in fb_row:
        row["unfused_strict_us"] = fb_row["strict_us"]
    if "strict_us" in row:
        for key, base in (("ratio", "native_us"), ("ratio_vs_liger", "liger_us"),
                          ("ratio_vs_unfused", "unfused_strict_us")):
            if base in row:
                row[key] = row["strict_us"] / row[base]
    return row


def _table(rows):
    print(f"\n{'T':>6} {'V':>7} {'pass':>13} {'strict_us':>10} {'native_us':>10} {'ratio':>6} "
          f"{'s_MB':>8} {'n_MB':>8} {'liger_us':>9}")
    for r in rows:
        f = lambda k, fmt: format(r[k], fmt) if k in r else "-"  # noqa: E731
        print(f"{r['T']:>6} {r['V']:>7} {r['pass']:>13} {f('strict_us', '10.1f')} {f('native_us', '10.1f')} "
              f"{f('ratio', '6.3f')} {f('strict_peak_mb', '8.1f')} {f('native_peak_mb', '8.1f')} "
              f"{f('liger_us', '9.1f')}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="3 shapes instead of 6")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("linear_logp_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    from rlk import determinism

    determinism.apply_strict_env()
    run(QUICK if a.quick else FULL, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
