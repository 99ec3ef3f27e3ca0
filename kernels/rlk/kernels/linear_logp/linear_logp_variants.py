"""Launch-table variants of ``logp`` on the H200: time and bytes of each against the current table.

    python -m rlk.kernels.linear_logp.linear_logp_variants --out variants.json [--T 1024 8192] [--graph]
    python -m rlk.kernels.linear_logp.linear_logp_variants --out merge.json --merge 8 16 32 --T 8 1024 \
        --V 37984 151936 --fwd --bwd

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


def _host_vs_device(h, w, tg, dlogp, calls: int = 20) -> dict:
    """One fwd+bwd of ``linear_logp_loss`` (as linear_logp_bench's fused row, under host_validated):
    ``eager_us`` (do_bench median), ``host_us`` (median host time to issue one call, no sync: the
    device queue does not fill at these sizes), ``device_us`` (kernel time per call, profiler).
    eager ~ device: device-bound; eager ~ host > device: the host sets the pace."""
    import statistics
    import time

    import triton.testing

    from rlk.kernels.common import host_validated
    from rlk.kernels.linear_logp.autograd import linear_logp_loss

    hg, wg = h.clone().requires_grad_(True), w.clone().requires_grad_(True)

    def fb():
        with host_validated():
            linear_logp_loss(hg, wg, tg, lambda lp, lo, hi: lp * dlogp[lo:hi])[0].backward()
        hg.grad = wg.grad = None

    for _ in range(3):
        fb()
    torch.cuda.synchronize()
    host = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fb()
        host.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    eager = float(triton.testing.do_bench(fb, warmup=5, rep=100, return_mode="median")) * 1e3
    parts = _bwd_parts(fb)
    return {"eager_us": eager, "host_us": statistics.median(host), "host_us_all": [round(x, 1) for x in host],
            "device_us": round(sum(parts.values()), 1), "kernels_us": parts, "host_profile": _pstats(fb)}


def _pstats(fn, calls: int = 50, top: int = 40) -> dict:
    """cProfile of ``calls`` calls of ``fn`` (a sync after each): the top functions by own time and
    by cumulative time, as text lines (where the host time of one call goes)."""
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    for _ in range(calls):
        pr.enable()
        fn()
        pr.disable()
        torch.cuda.synchronize()
    out = {}
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats(key).print_stats(top)
        out[key] = [ln for ln in buf.getvalue().splitlines() if ln.strip()][-(top + 1):]
    return out


MERGE_FIELDS = {"BLOCK", "num_warps", "num_stages"}  # what merge_segment_stats reads of its entry


def parse_fields(text: str) -> dict:
    """``"BLOCK=64,num_stages=3"`` -> {"BLOCK": 64, "num_stages": 3} (integer launch fields of the
    merge table entry); "" or "table" -> {} (the table as it is)."""
    out = {}
    if text.strip() == "table":
        return out
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, val = part.partition("=")
        if not sep or not key.strip() or not val.strip().lstrip("-").isdigit():
            raise ValueError(f"merge fields: {part!r} is not NAME=INT (in {text!r})")
        out[key.strip()] = int(val)
    return out


def merge_line(r: dict) -> str:
    """The log line of one merge row of :func:`run_merge`."""
    return (f"merge T={r['T']:6d} V={r['V']} S={r['segments']} unroll={r['unroll']:3d} "
            f"{r['merge_cfg'] or 'table':28s} {r['graph_us']:9.2f} us same={r['same_logp'] and r['same_lse']}")


def bwd_line(r: dict) -> str:
    """The log line of one backward row of :func:`run`."""
    return (f"bwd T={r['T']:6d} {r['variant']:28s} {r['us']:10.1f} us {r['tflops']:6.1f} TF/s "
            f"peak={r['peak_mb']:.0f}MB same={r['same_dh'] and r['same_dw']}")


def run_merge(T_list, V, H, unrolls, cfgs=("",), log=print):
    """merge_kernel alone (device time, CUDA-graph replay) for each ``config.MERGE_UNROLL`` in
    ``unrolls`` and each launch-field override of the merge entry in ``cfgs`` (``parse_fields``
    strings; "" is the table's), on the statistics of one forward; logp/lse bytes compared with
    the first combination's. Neither is a bit of the arithmetic (merge_kernel's docstring: each
    row sees the segments in the same order with the same operations): every row must come out
    identical."""
    from rlk.kernels.linear_logp import schedule
    from rlk.kernels.linear_logp import launch
    from rlk.testing.timing import cuda_graph_us

    fields = [(c, parse_fields(c)) for c in cfgs]
    rows = []
    keep = schedule.MERGE_UNROLL
    for T in T_list:
        g = torch.Generator(device="cuda").manual_seed(T)
        h = (torch.randn((T, H), device="cuda", generator=g) * 0.5).to(torch.bfloat16)
        w = (torch.randn((V, H), device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        tg = torch.randint(0, V, (T,), device="cuda", generator=g)
        st, _ = launch.segment_stats(h, w, tg, validate_targets=False)
        base = None
        for u in unrolls:
            for text, f in fields:
                schedule.MERGE_UNROLL = int(u)
                try:
                    with schedule.override("merge", **f):
                        fn = lambda: launch.merge_segment_stats([st])  # noqa: E731
                        out = fn()
                        torch.cuda.synchronize()
                        us = cuda_graph_us(fn, calls=10, rep_ms=60)
                except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported
                    rows.append({"pass": "merge", "T": T, "V": V, "unroll": u, "merge_cfg": text,
                                 "error": repr(e)[:300]})
                    log(f"merge T={T} V={V} unroll={u} {text}: ERROR {e!r}"[:300])
                    continue
                finally:
                    schedule.MERGE_UNROLL = keep
                if base is None:
                    base = out
                r = {"pass": "merge", "T": T, "V": V, "segments": int(st.m.shape[0]), "unroll": int(u),
                     "merge_cfg": text, "graph_us": us, "same_logp": _same(out[0], base[0]),
                     "same_lse": _same(out[1], base[1])}
                rows.append(r)
                log(merge_line(r))
    return rows


def run(T_list, V, H, fwd_names, bwd_names, log=print):
    from rlk.kernels.linear_logp import schedule
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
                with schedule.override("fwd", **var):
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
        if not bwd_names:
            continue
        if T > 8192 // 2 and "parts" not in bwd_names:
            bwd_names = list(bwd_names) + ["parts"]
        if base is None:  # no forward variant asked: the table's forward gives lse
            base = launch.linear_logp_fwd(h, w, tg, validate_targets=False)
        lse = base[1]
        dlogp = torch.randn((T,), device="cuda", generator=g)
        bbase = None
        for name in bwd_names:
            if name == "parts":
                rows.append({"pass": "bwd_parts", "T": T, "V": V, "kernels_us": _bwd_parts(
                    lambda: launch.linear_logp_bwd(h, w, tg, lse, dlogp))})
                log(f"bwd parts T={T}: {rows[-1]['kernels_us']}")
                continue
            if name == "fused_host":  # fwd+bwd through linear_logp_loss: host issue vs device time
                rows.append({"pass": "fused_host", "T": T, "V": V, **_host_vs_device(h, w, tg, dlogp)})
                log(f"fused host T={T}: {rows[-1]}")
                continue
            if name == "fused_parts":  # the fused logp + loss path (forward included), per kernel
                from rlk.kernels.linear_logp.fused import linear_logp_fused_loss

                rows.append({"pass": "fused_parts", "T": T, "V": V, "kernels_us": _bwd_parts(
                    lambda: linear_logp_fused_loss(h, w, tg, lambda lp, lo, hi: dlogp[lo:hi]))})
                log(f"fused parts T={T}: {rows[-1]['kernels_us']}")
                continue
            gv, mv = BWD_VARIANTS[name]
            try:
                with schedule.override("bwd_grad", **gv), schedule.override("gemm", **mv):
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
            log(bwd_line(r))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--T", type=int, nargs="+", default=[8, 64, 1024, 8192])
    ap.add_argument("--V", type=int, nargs="+", default=[37984])
    ap.add_argument("--H", type=int, default=4096)
    ap.add_argument("--fwd", nargs="*", default=list(FWD_VARIANTS))
    ap.add_argument("--bwd", nargs="*", default=list(BWD_VARIANTS),
                    help=f"backward variants ({', '.join(BWD_VARIANTS)}), or 'parts' / 'fused_parts': per-kernel "
                         "device times of the unfused backward / the fused logp + loss path, or "
                         "'fused_host': host issue time vs device time of linear_logp_loss fwd+bwd")
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays (device time)")
    ap.add_argument("--merge", type=int, nargs="*", default=[],
                    help="merge_kernel alone for these MERGE_UNROLL values (CUDA-graph device time, bytes "
                         "compared with the first)")
    ap.add_argument("--merge-cfg", nargs="*", default=["table"], metavar="FIELDS",
                    help="with --merge: launch-field overrides of the merge entry to time, e.g. "
                         "table num_stages=3 BLOCK=64,num_warps=2 ('table' or '' = the table's own)")
    a = ap.parse_args(argv)
    for c in a.merge_cfg:
        try:
            unknown = set(parse_fields(c)) - MERGE_FIELDS  # refused before the GPU work
        except ValueError as e:
            ap.error(str(e))
        if unknown:
            ap.error(f"--merge-cfg {c!r}: {sorted(unknown)} are not merge launch fields {sorted(MERGE_FIELDS)}")
    _GRAPH["on"] = a.graph
    if not torch.cuda.is_available():
        raise SystemExit("linear_logp_variants needs a GPU")
    rows = []
    for V in a.V:
        if a.merge:
            rows += run_merge(a.T, V, a.H, a.merge, a.merge_cfg)
        rows += run(a.T, V, a.H, a.fwd, a.bwd)
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
