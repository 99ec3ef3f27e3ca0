"""Launch-table variants of ``logp`` on the H200: time and bytes of each against the current table.

    python -m rlk.kernels.linear_logp.linear_logp_variants --out variants.json [--T 1024 8192] [--graph]

For every forward variant (block sizes, warps, stages, TMA, program grouping) and every backward
variant, on the same inputs: median time (``triton.testing.do_bench``) and whether logp/lse
(forward) or d_hidden/d_weight (backward) are byte-identical to the current table's. A variant
that changes bytes is a different contract version; one that does not is a schedule choice.
Not run in CI (GPU only).
"""

from __future__ import annotations

import argparse
import json

import torch

FWD_VARIANTS = {
    "table": {},
    "prefill_tile": {},  # the table's 128-row tile at every T (DECODE_T_MAX 0)
    "ptr": {"TMA": 0, "GROUP_T": 1},
    "tma_s4": {"num_stages": 4},
    "tma_g1": {"GROUP_T": 1},
    "tma_bt256_w8s3": {"BLOCK_T": 256, "BLOCK_V": 128, "num_warps": 8},  # bit field: different bytes expected
    # Decode-sized token tiles (BLOCK_T is row-independent; MMA form changes: check the bytes).
    "dec_bt64_w4s4": {"BLOCK_T": 64, "num_warps": 4, "num_stages": 4},
    "dec_bt64_w8s4": {"BLOCK_T": 64, "num_warps": 8, "num_stages": 4},
    "dec_bt32_w4s4": {"BLOCK_T": 32, "num_warps": 4, "num_stages": 4},
    "dec_bt16_w4s4": {"BLOCK_T": 16, "num_warps": 4, "num_stages": 4},
    "dec_bt16_w4s6": {"BLOCK_T": 16, "num_warps": 4, "num_stages": 6},
    # Two programs per SM at decode sizes (smem of 2 stages): num_stages is a schedule field.
    "tma_s2": {"num_stages": 2},
    "dec_bt64_w4s2": {"BLOCK_T": 64, "num_warps": 4, "num_stages": 2},
    "dec_bt64_w4s3": {"BLOCK_T": 64, "num_warps": 4, "num_stages": 3},
    # 128-wide k-steps (two 64-chunks per step: the same MMA k16 chain; bytes are compared).
    "bk128_s2": {"BLOCK_K": 128, "num_stages": 2},
    "dec_bt64_w4_bk128_s2": {"BLOCK_T": 64, "num_warps": 4, "BLOCK_K": 128, "num_stages": 2},
}
BWD_VARIANTS = {
    "table": ({}, {}),
    "ptr": ({"TMA": 0}, {"TMA": 0, "GROUP_M": 1}),
    "tma_gemm_s4": ({}, {"num_stages": 4}),
}


_GRAPH = {"on": False}


def _bench(fn, rep=60):
    """Median us per call: eager (do_bench), or with ``--graph`` the replay of a CUDA graph of 10
    calls (device time only: the eager time of decode-sized T is the host launch path's)."""
    import triton.testing

    if _GRAPH["on"]:
        from rlk.testing.timing import cuda_graph_us

        return cuda_graph_us(fn, calls=10, rep_ms=rep)
    return float(triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")) * 1e3


def _same(a, b):
    return bool(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8)))


def _bwd_parts(fn):
    """Device time per kernel name (us, one call) of the backward with the current table."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA or getattr(e, "self_device_time_total", 0):
            t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            if t:
                out[e.key[:60]] = round(float(t), 1)
    return out


def run(T_list, V, H, fwd_names, bwd_names, log=print):
    from rlk.kernels.linear_logp import config as cfg
    from rlk.kernels.linear_logp import launch

    rows = []
    for T in T_list:
        g = torch.Generator(device="cuda").manual_seed(T)
        h = (torch.randn((T, H), device="cuda", generator=g) * 0.5).to(torch.bfloat16)
        w = (torch.randn((V, H), device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        tg = torch.randint(0, V, (T,), device="cuda", generator=g)
        base = None
        for name in fwd_names:
            # Every variant but the table's own runs its tile at every T (no decode tile).
            var = dict(FWD_VARIANTS[name]) if name == "table" else {"DECODE_T_MAX": 0, **FWD_VARIANTS[name]}
            seg = var.pop("segmentation", None)
            try:
                with cfg.override("fwd", **var):
                    fn = lambda: launch.linear_logp_fwd(h, w, tg, segmentation=seg, validate_targets=False)  # noqa: E731
                    out = fn()
                    torch.cuda.synchronize()
                    us = _bench(fn)
            except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported
                rows.append({"pass": "fwd", "T": T, "V": V, "variant": name, "error": repr(e)[:300]})
                log(f"fwd T={T} {name}: ERROR {e!r}"[:300])
                continue
            if base is None:
                base = out
            if seg is not None:  # another contract: compare against fp64 instead of bytes
                ref = torch.log_softmax(h.double() @ w.double().T, -1).gather(1, tg[:, None])[:, 0]
                err = float((out[0].double() - ref).abs().max())
            else:
                err = None
            r = {"pass": "fwd", "max_abs_err_fp64": err, "T": T, "V": V, "variant": name, "us": us,
                 "tflops": 2 * T * V * H / us / 1e6,
                 "same_logp": _same(out[0], base[0]), "same_lse": _same(out[1], base[1])}
            rows.append(r)
            log(f"fwd T={T:6d} {name:28s} {us:10.1f} us {r['tflops']:6.1f} TF/s same={r['same_logp'] and r['same_lse']}")
        if T > 8192 // 2 and bwd_names and "parts" not in bwd_names:
            bwd_names = list(bwd_names) + ["parts"]
        lse = base[1]
        dlogp = torch.randn((T,), device="cuda", generator=g)
        bbase = None
        for name in bwd_names:
            if name == "parts":
                rows.append({"pass": "bwd_parts", "T": T, "V": V, "kernels_us": _bwd_parts(
                    lambda: launch.linear_logp_bwd(h, w, tg, lse, dlogp))})
                log(f"bwd parts T={T}: {rows[-1]['kernels_us']}")
                continue
            if name == "fused_parts":  # the fused logp + loss path (forward included), per kernel
                from rlk.kernels.linear_logp.fused import linear_logp_fused_loss

                rows.append({"pass": "fused_parts", "T": T, "V": V, "kernels_us": _bwd_parts(
                    lambda: linear_logp_fused_loss(h, w, tg, lambda lp, lo, hi: dlogp[lo:hi]))})
                log(f"fused parts T={T}: {rows[-1]['kernels_us']}")
                continue
            gv, mv = BWD_VARIANTS[name]
            try:
                with cfg.override("bwd_grad", **gv), cfg.override("gemm", **mv):
                    fn = lambda: launch.linear_logp_bwd(h, w, tg, lse, dlogp)  # noqa: E731
                    out = fn()
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    m0 = torch.cuda.memory_allocated()
                    fn()
                    torch.cuda.synchronize()
                    peak = (torch.cuda.max_memory_allocated() - m0) / 2**20
                    us = _bench(fn, rep=100)
            except Exception as e:  # noqa: BLE001
                rows.append({"pass": "bwd", "T": T, "V": V, "variant": name, "error": repr(e)[:300]})
                log(f"bwd T={T} {name}: ERROR {e!r}"[:300])
                continue
            if bbase is None:
                bbase = out
            r = {"pass": "bwd", "T": T, "V": V, "variant": name, "us": us, "tflops": 6 * T * V * H / us / 1e6,
                 "peak_mb": peak, "same_dh": _same(out[0], bbase[0]), "same_dw": _same(out[1], bbase[1])}
            rows.append(r)
            log(f"bwd T={T:6d} {name:28s} {us:10.1f} us {r['tflops']:6.1f} TF/s peak={peak:.0f}MB "
                f"same={r['same_dh'] and r['same_dw']}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--T", type=int, nargs="+", default=[8, 64, 1024, 8192])
    ap.add_argument("--V", type=int, default=37984)
    ap.add_argument("--H", type=int, default=4096)
    ap.add_argument("--fwd", nargs="*", default=list(FWD_VARIANTS))
    ap.add_argument("--bwd", nargs="*", default=list(BWD_VARIANTS),
                    help=f"backward variants ({', '.join(BWD_VARIANTS)}), or 'parts' / 'fused_parts': per-kernel "
                         "device times of the unfused backward / the fused logp + loss path")
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays (device time)")
    a = ap.parse_args(argv)
    _GRAPH["on"] = a.graph
    if not torch.cuda.is_available():
        raise SystemExit("linear_logp_variants needs a GPU")
    rows = run(a.T, a.V, a.H, a.fwd, a.bwd)
    try:
        from rlk import provenance

        prov = provenance.capability_record(contract_ids=["logp.v2"])
    except Exception as e:  # noqa: BLE001
        prov = {"error": repr(e)}
    with open(a.out, "w") as f:
        json.dump({"provenance": prov, "timing": "cuda_graph" if a.graph else "eager", "rows": rows}, f,
                  indent=2, default=str)


if __name__ == "__main__":
    main()
