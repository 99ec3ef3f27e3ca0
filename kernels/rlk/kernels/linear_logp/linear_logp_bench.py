"""Benchmark of ``logp.v2`` on the H200: strict fused vs native (matmul logits, fp32 log_softmax,
gather) and Liger-Kernel's fused linear cross-entropy when importable.

    python -m rlk.kernels.linear_logp.linear_logp_bench --out linear_logp_h200.json [--quick]

Rows per shape: ``fwd``; ``fwd_bwd`` (linear_logp + loss.backward(), loss = sum(logp * coef) with
a fixed random per-token coef); ``fwd_bwd_fused`` (the same loss through linear_logp_loss: gradients
formed in the forward, 3 GEMM-equivalents; its native/Liger numbers are the ``fwd_bwd`` row's,
measured on the same inputs in the same process; ``grads_equal_unfused``: d_hidden/d_weight
torch.equal to the fwd_bwd row's). Liger is timed twice: as called by default (``liger_us``: its
grad_weight accumulator has the weight's dtype, bf16 here, rounded after every token chunk) and
with ``accum_dtype=torch.float32`` (``liger_fp32acc_us``, ``ratio_vs_liger_fp32acc``: an fp32
accumulator, as rlk's one fp32 d_weight chain rounded once).

Times: every arm of a pass is measured in alternating rounds (``interleaved_us``; each round a
``triton.testing.do_bench`` median, warm-up excluded), all on the same tensors in the same
process; the row gives the median over rounds and the rounds. ``strict_us`` is the trainer's
configuration: the call inside ``host_validated()`` (the trainer and the replay harness range-check
token ids on the host once per batch); ``strict_checked_us`` is the plain eager call, which reads
the targets back for a range check (one device sync per call). ``ratio`` = strict_us / native_us,
``ratio_checked`` = strict_checked_us / native_us. Peak memory: torch.cuda.max_memory_allocated() after
reset_peak_memory_stats(), minus the memory allocated before the call (inputs, i.e. hidden,
weight, targets, are excluded; outputs and gradients are included). ``*_workspace_mb`` = peak
minus what the pass returns (fwd: logp [T] fp32; fwd_bwd: the bf16 gradients of hidden and weight,
the same for every arm), ``workspace_ratio`` = strict / native workspace.

``fwd_bwd_fused_main_grad``: the fused path accumulating d_weight into an fp32 ``main_grad`` the
trainer already holds (megatron's gradient-accumulation fusion; allocated before the call, so not
counted): its workspace is peak minus d_hidden (its only returned gradient); the like-for-like
comparison is Liger with an fp32 accumulator (``ratio_vs_liger_fp32acc``; Liger's workspace there
holds its fp32 accumulator). ``main_grad_equal_unfused``: from a zero main_grad, d_hidden and
bf16(main_grad) torch.equal to the unfused path's gradients. ``native_main_grad``: megatron-core's own
route to the same buffer without TransformerEngine or Apex (whose fused wgrad GEMM the device
lacks): native forward + backward, then DDP's post-backward hook, ``main_grad.add_(weight.grad)``
and ``weight.grad = None``; ``ratio_vs_native_main_grad`` and ``workspace_ratio_vs_native_main_grad``
compare like for like (its workspace: peak minus d_hidden, the bf16 weight gradient counted as the
transient it is).

``--fused-budgets MB [MB ...]`` adds arms of the fused path with the row-chunk budget
(``fused.ROWS_BUDGET_MB``, a bit-neutral schedule field) overridden; the ``fwd_bwd_fused`` row
lists their times, peaks and workspaces in ``budget_variants`` (the memory/time trade-off of the
chunk). Not for CI.
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


def ddp_accumulate(weight: torch.Tensor, main_grad: torch.Tensor) -> None:
    """What megatron-core's DistributedDataParallel does after a parameter's backward when there is
    no gradient-accumulation fusion: ``main_grad += weight.grad`` (fp32 add of the bf16 gradient),
    then ``weight.grad = None``."""
    main_grad.add_(weight.grad)
    weight.grad = None


def _peak_mb(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


ROUNDS = 3  # alternating measurement rounds per pass (rlk.testing.timing.interleaved_us)


def _validated(fn):
    """``fn`` inside ``host_validated()``: how the trainer and the replay harness call the op (token
    ids range-checked on the host once per batch, no per-call device read)."""
    from rlk.kernels.common import host_validated

    def call():
        with host_validated():
            return fn()

    return call


def _with_budget(fn, mb):
    """``fn`` with the fused path's row-chunk budget overridden (schedule field)."""
    from rlk.kernels.linear_logp import schedule

    def call():
        with schedule.override("fused", ROWS_BUDGET_MB=mb):
            return fn()

    return call


def _arm(mb) -> str:
    """Name of the fused arm at row-chunk budget ``mb``."""
    return f"fused_b{mb:g}"


def _budget_row(mb, timing, peak, out_mb) -> dict:
    """One ``budget_variants`` entry: the budget, its time (or error), peak and workspace."""
    row = {"ROWS_BUDGET_MB": mb, **({"us": timing["us"]} if "us" in timing else {"error": timing["error"]})}
    if peak is not None:
        row.update(peak_mb=peak, workspace_mb=peak - out_mb)
    return row


def _out_mb(pas, T, V) -> float:
    """MiB the pass returns: logp [T] fp32 (fwd), the bf16 gradients of hidden and weight (fwd_bwd)."""
    return (T * 4 if pas == "fwd" else (T + V) * H * 2) / 2**20


def run(shapes, out_path, rounds: int = ROUNDS, dev: str = "cuda", fused_budgets=()):
    import triton.testing as tt

    from rlk.kernels.linear_logp import reference as R
    from rlk.kernels.linear_logp.autograd import linear_logp, linear_logp_loss
    from rlk.testing.timing import interleaved_us

    liger_fn, liger_reason = _liger()
    if liger_reason:
        print(f"liger: skipped ({liger_reason})")
    else:
        import importlib.metadata

        print(f"liger: liger-kernel {importlib.metadata.version('liger-kernel')}")
    rows = []
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

        def liger_fp32acc_fb():
            # Function.apply takes positional arguments only: (input, weight, target, bias,
            # ce_weight, ignore_index, lse_square_scale, label_smoothing, reduction, softcap,
            # return_z_loss, accum_dtype) in liger-kernel 0.8.5.
            out = liger_fn.apply(hg, wg, tg, None, None, -100, 0.0, 0.0, "mean", None, False, torch.float32)
            (out[0] if isinstance(out, tuple) else out).backward()

        def fused_fb():
            linear_logp_loss(hg, wg, tg, lambda lp, lo, hi: lp * coef[lo:hi])[0].backward()

        mg = torch.zeros(V, H, dtype=torch.float32, device=dev)  # the trainer's buffer: held, not workspace

        def fused_mg_fb():
            linear_logp_loss(hg, wg, tg, lambda lp, lo, hi: lp * coef[lo:hi], main_grad=mg)[0].backward()

        mg_native = torch.zeros(V, H, dtype=torch.float32, device=dev)

        def native_mg_fb():
            native_fb()
            ddp_accumulate(wg, mg_native)

        passes = {
            "fwd": {"strict": _validated(strict_fwd), "strict_checked": strict_fwd, "native": native_fwd},
            "fwd_bwd": {"strict": _validated(strict_fb), "strict_checked": strict_fb, "native": native_fb,
                        **({"liger": liger_fb, "liger_fp32acc": liger_fp32acc_fb} if liger_fn is not None else {}),
                        "fused": _validated(fused_fb), "fused_checked": fused_fb,
                        "fused_main_grad": _validated(fused_mg_fb), "native_main_grad": native_mg_fb,
                        **{_arm(mb): _validated(_with_budget(fused_fb, mb)) for mb in fused_budgets}},
        }
        for pas, fns in passes.items():
            gn = [hg, wg] if pas == "fwd_bwd" else None

            def measure(fn, gn=gn):
                return tt.do_bench(fn, grad_to_none=gn, return_mode="median") * 1e3

            t = interleaved_us(fns, rounds=rounds, measure=measure)
            hg.grad = wg.grad = None
            peaks = {}
            for name in ("strict", "native", "liger", "liger_fp32acc", "fused", "fused_main_grad",
                         "native_main_grad", *map(_arm, fused_budgets)):
                if name in fns and "us" in t[name]:
                    try:
                        peaks[name] = _peak_mb(fns[name])
                    except torch.cuda.OutOfMemoryError as e:
                        peaks[name] = None
                        t[name] = {"error": f"OOM: {e}"[:200]}
                    hg.grad = wg.grad = None
            torch.cuda.empty_cache()
            row = {"T": T, "V": V, "H": H, "pass": pas}
            _fill(row, t, peaks, "strict", "native", "liger" if pas == "fwd_bwd" else None, _out_mb(pas, T, V))
            if pas == "fwd_bwd" and liger_fn is None:
                row["liger_skipped"] = liger_reason
            if pas == "fwd" and T == ERR_T:
                ref, _, _ = R.linear_logp_ref(h, w, tg)
                row["strict_logp_max_abs_err_fp64"] = (strict_fwd().double() - ref).abs().max().item()
                row["native_logp_max_abs_err_fp64"] = (native_fwd().double() - ref).abs().max().item()
                del ref
            rows.append(row)
            _print_row(row)
            if pas == "fwd_bwd":
                fused = {"T": T, "V": V, "H": H, "pass": "fwd_bwd_fused"}
                _fill(fused, {**t, "strict": t["fused"], "strict_checked": t["fused_checked"]},
                      {**peaks, "strict": peaks.get("fused")}, "strict", "native", "liger" if liger_fn else None,
                      _out_mb(pas, T, V))
                fused["budget_variants"] = [_budget_row(mb, t[_arm(mb)], peaks.get(_arm(mb)), _out_mb(pas, T, V))
                                            for mb in fused_budgets]
                if "us" in t["strict"] and "us" in t["fused"]:
                    fused["unfused_strict_us"] = t["strict"]["us"]
                    fused["ratio_vs_unfused"] = t["fused"]["us"] / t["strict"]["us"]
                fused["grads_equal_unfused"] = _grads_equal(fused_fb, strict_fb, hg, wg)
                rows.append(fused)
                _print_row(fused)
                mrow = _main_grad_row(T, V, t, peaks)
                mrow["main_grad_equal_unfused"] = _main_grad_equal(fused_mg_fb, strict_fb, hg, wg, mg)
                rows.append(mrow)
                _print_row(mrow)
        del h, w, hg, wg
        torch.cuda.empty_cache()
        _write(out_path, prov, rows)  # after every shape: a stage time limit keeps what was measured
    _table(rows)
    print(f"wrote {out_path}")


def _fill(row, t, peaks, strict, native, liger, out_mb):
    """Times (medians of the interleaved rounds), peaks, workspaces (peak - out_mb) and ratios."""
    for key, name in (("strict", strict), ("strict_checked", strict + "_checked"), ("native", native),
                      ("liger", liger)):
        if name is None or name not in t:
            continue
        if "us" in t[name]:
            row[f"{key}_us"] = t[name]["us"]
            row[f"{key}_rounds_us"] = t[name]["rounds"]
        else:
            row[f"{key}_error"] = t[name]["error"]
        if key in ("strict", "native", "liger") and peaks.get(name) is not None:
            row[f"{key}_peak_mb"] = peaks[name]
            row[f"{key}_workspace_mb"] = peaks[name] - out_mb
    if liger is not None and "liger_fp32acc" in t:  # Liger with an fp32 grad_weight accumulator
        if "us" in t["liger_fp32acc"]:
            row["liger_fp32acc_us"] = t["liger_fp32acc"]["us"]
            row["liger_fp32acc_rounds_us"] = t["liger_fp32acc"]["rounds"]
            if peaks.get("liger_fp32acc") is not None:
                row["liger_fp32acc_peak_mb"] = peaks["liger_fp32acc"]
            if "strict_us" in row:
                row["ratio_vs_liger_fp32acc"] = row["strict_us"] / row["liger_fp32acc_us"]
        else:
            row["liger_fp32acc_error"] = t["liger_fp32acc"]["error"]
    if "strict_us" in row and "native_us" in row:
        row["ratio"] = row["strict_us"] / row["native_us"]
    if "strict_checked_us" in row and "native_us" in row:
        row["ratio_checked"] = row["strict_checked_us"] / row["native_us"]
    if "strict_us" in row and "liger_us" in row:
        row["ratio_vs_liger"] = row["strict_us"] / row["liger_us"]
    if row.get("native_workspace_mb") and "strict_workspace_mb" in row:
        row["workspace_ratio"] = row["strict_workspace_mb"] / row["native_workspace_mb"]


def _main_grad_row(T, V, t, peaks) -> dict:
    """The ``fwd_bwd_fused_main_grad`` row: the main_grad arm's time, peak and workspace (peak
    minus d_hidden: d_weight went into the held main_grad), against native and Liger (fp32
    accumulator: like for like; workspaces minus their returned bf16 gradients)."""
    row = {"T": T, "V": V, "H": H, "pass": "fwd_bwd_fused_main_grad", "main_grad_mb": V * H * 4 / 2**20}
    arm = t["fused_main_grad"]
    if "us" not in arm:
        row["strict_error"] = arm["error"]
        return row
    row.update(strict_us=arm["us"], strict_rounds_us=arm["rounds"])
    if peaks.get("fused_main_grad") is not None:
        row["strict_peak_mb"] = peaks["fused_main_grad"]
        row["strict_workspace_mb"] = peaks["fused_main_grad"] - T * H * 2 / 2**20
    for name in ("native", "liger_fp32acc", "native_main_grad"):
        if name in t and "us" in t[name]:
            row[f"{name}_us"] = t[name]["us"]
            row[f"ratio_vs_{name}" if name != "native" else "ratio"] = arm["us"] / t[name]["us"]
            if peaks.get(name) is not None:
                # native_main_grad returns only d_hidden (its d_weight went into main_grad)
                out_mb = T * H * 2 / 2**20 if name == "native_main_grad" else _out_mb("fwd_bwd", T, V)
                row[f"{name}_workspace_mb"] = peaks[name] - out_mb
    if row.get("native_workspace_mb") and "strict_workspace_mb" in row:
        row["workspace_ratio"] = row["strict_workspace_mb"] / row["native_workspace_mb"]
    if row.get("native_main_grad_workspace_mb") and "strict_workspace_mb" in row:
        row["workspace_ratio_vs_native_main_grad"] = row["strict_workspace_mb"] / row["native_main_grad_workspace_mb"]
    return row


def _main_grad_equal(fused_mg_fb, strict_fb, hg, wg, mg):
    """From a zero main_grad: d_hidden equal to the unfused path's and bf16(main_grad) equal to
    its d_weight (torch.equal); None on OOM."""
    try:
        hg.grad = wg.grad = None
        mg.zero_()
        fused_mg_fb()
        dh, no_dw = hg.grad, wg.grad
        hg.grad = wg.grad = None
        strict_fb()
        same = bool(no_dw is None and torch.equal(dh, hg.grad) and torch.equal(mg.to(torch.bfloat16), wg.grad))
    except torch.cuda.OutOfMemoryError:
        same = None
    hg.grad = wg.grad = None
    torch.cuda.empty_cache()
    return same


def _grads_equal(fused_fb, strict_fb, hg, wg):
    """Whether the fused path's d_hidden / d_weight equal the unfused path's bitwise."""
    try:
        hg.grad = wg.grad = None
        fused_fb()
        fused_grads = (hg.grad, wg.grad)
        hg.grad = wg.grad = None
        strict_fb()
        same = bool(torch.equal(fused_grads[0], hg.grad) and torch.equal(fused_grads[1], wg.grad))
    except torch.cuda.OutOfMemoryError:
        same = None
    hg.grad = wg.grad = None
    torch.cuda.empty_cache()
    return same


def _write(out_path, prov, rows):
    with open(out_path, "w") as f:
        json.dump({"provenance": prov, "rows": rows}, f, indent=1, default=str)


def _print_row(row):
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)


def _table(rows):
    print(f"\n{'T':>6} {'V':>7} {'pass':>13} {'strict_us':>10} {'native_us':>10} {'ratio':>6} "
          f"{'s_MB':>8} {'n_MB':>8} {'liger_us':>9} {'liger32_us':>10}")
    for r in rows:
        f = lambda k, fmt: format(r[k], fmt) if k in r else "-"  # noqa: E731
        print(f"{r['T']:>6} {r['V']:>7} {r['pass']:>13} {f('strict_us', '10.1f')} {f('native_us', '10.1f')} "
              f"{f('ratio', '6.3f')} {f('strict_peak_mb', '8.1f')} {f('native_peak_mb', '8.1f')} "
              f"{f('liger_us', '9.1f')} {f('liger_fp32acc_us', '10.1f')}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="3 shapes instead of 6")
    p.add_argument("--fused-budgets", type=float, nargs="*", default=[],
                   help="also time the fused path at these fused.ROWS_BUDGET_MB values")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("linear_logp_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    from rlk import determinism

    determinism.apply_strict_env()
    if any(mb <= 0 for mb in a.fused_budgets):
        p.error("--fused-budgets: each budget must be > 0 MB")
    run(QUICK if a.quick else FULL, a.out, fused_budgets=tuple(a.fused_budgets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
