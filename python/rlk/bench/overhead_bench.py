"""Where the time of small strict ops goes: host launch path vs device, eager vs CUDA graph.

    python -m rlk.bench.overhead_bench --out overhead.json [--profile-top 15]

For each case (decode/small-row shapes of the Qwen3-8B TP4 shard), on the same inputs:

* ``eager_us``: median of ``triton.testing.do_bench`` (what an eager engine pays: the larger of
  host launch time and device time), median over alternating rounds of all variants of a case;
* ``graph_us``: median replay time of a CUDA graph holding 20 calls, divided by 20 (device
  time only: what a graph-captured decode step pays);
* ``host_us``: CPU time per call of 100 back-to-back calls without synchronization (the Python
  launch path; valid while the device keeps up, which it does at these sizes), median over
  alternating rounds;
* ``b2b_us``: back-to-back time per call (``rlk.testing.timing.back_to_back_us``: 100 calls
  between two events; max(host launch path, device) per call), median over alternating rounds;
* for strict cases, both the public op (``rlk.kernels.<op>.autograd``, through ``torch.library``)
  and the bare launcher, so the dispatcher's share is visible; the native counterpart beside
  them; and the bare launcher with the launch cache off (``launch_nocache``: every launch through Triton's
  ``kernel[grid]``, rlk.kernels.launcher), the A/B of that cache in the same process; for the
  attention cases also with host launch plans off (``launch_noplans``: checks and launch
  arguments derived on every call, rlk.kernels.plans) and with launch sites off (``launch_nosites``:
  every plan launch through Triton's binder; sites, on by default, skip it: rlk.kernels.launcher.LaunchSite).

With ``--profile-top N`` a cProfile of 200 calls of each strict op is summarized (top N
functions by own time) into the JSON. Not run in CI (GPU only); not a performance claim by
itself: it explains the eager-vs-graph gap in the benchmarks.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import torch

from rlk.testing.timing import interleaved_us, switched


def _graph_us(fn):
    from rlk.testing.timing import cuda_graph_us

    return cuda_graph_us(fn, calls=20)


def _host_us(fn, n=100):
    from rlk.kernels.common import host_validated

    with host_validated():
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def _b2b_us(fn):
    from rlk.kernels.common import host_validated
    from rlk.testing.timing import back_to_back_us

    with host_validated():
        return back_to_back_us(fn, calls=100)


def _profile(fn, top, n=200):
    from rlk.kernels.common import host_validated

    pr = cProfile.Profile()
    with host_validated():
        fn()
        torch.cuda.synchronize()
        pr.enable()
        for _ in range(n):
            fn()
        pr.disable()
        torch.cuda.synchronize()
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf)
    st.sort_stats("tottime").print_stats(top)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    return lines[-(top + 1):]


def cases():
    """(name, {variant: fn}) with inputs built once (decode-sized, Qwen3-8B TP4 shard)."""
    import torch.nn.functional as F

    from rlk.kernels.attention import launch as A
    from rlk.kernels.gemm import launch as G
    from rlk.kernels.linear_logp import launch as LP
    from rlk.kernels.rowops import launch as R
    from rlk.kernels.gemm import autograd as ogemm
    from rlk.kernels.linear_logp import autograd as ologp
    from rlk.kernels.rowops import autograd as orow

    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)

    def rn(*shape, scale=1.0):
        return (torch.randn(shape, device=dev, generator=gen) * scale).to(torch.bfloat16)

    out = []
    B, H, Hq, Hk, D = 8, 4096, 8, 2, 128
    x, w_norm = rn(B, H), rn(H)
    out.append(("rms_norm B=8", {"op": lambda: orow.rms_norm(x, w_norm, 1e-6),
                                 "launch": lambda: R.rms_norm(x, w_norm, 1e-6),
                                 "native": lambda: w_norm * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)}))
    q = rn(B, Hq, D)
    pos = torch.arange(B, device=dev) + 1000
    cos, sin = orow.rope_table(8192, D, 1e6, dev)
    out.append(("rope_q B=8", {"op": lambda: orow.apply_rope(q, pos, cos, sin),
                               "launch": lambda: R.apply_rope(q, pos, cos, sin)}))
    gu = rn(B, 2 * 3072)
    out.append(("swiglu B=8", {"op": lambda: orow.swiglu(gu), "launch": lambda: R.swiglu(gu),
                               "native": lambda: F.silu(gu[:, :3072]) * gu[:, 3072:]}))
    ids = torch.randint(0, 151936, (B,), device=dev, generator=gen)
    emb = rn(151936, H)
    out.append(("embedding B=8", {"op": lambda: orow.embedding(ids, emb), "launch": lambda: R.embedding(ids, emb),
                                  "native": lambda: F.embedding(ids, emb)}))
    wq = rn(1536, H)
    out.append(("gemm qkv M=8", {"op": lambda: ogemm.linear(x, wq), "launch": lambda: G.gemm(x, wq),
                                 "native": lambda: F.linear(x, wq)}))
    L, page = 2048, 16
    nb = L // page
    kc, vc = rn(B * nb, page, Hk, D), rn(B * nb, page, Hk, D)
    bt = torch.arange(B * nb, dtype=torch.int32, device=dev).view(B, nb)
    cuq = torch.arange(B + 1, dtype=torch.int32, device=dev)
    kvl = torch.full((B,), L, dtype=torch.int32, device=dev)
    kd, vd = rn(B, Hq, L, D), rn(B, Hq, L, D)
    out.append(("decode attn B=8 L=2048", {
        "launch": lambda: A.paged(q, kc, vc, bt, cuq, kvl, D ** -0.5, max_seqlen_q=1, validate=False),
        "native": lambda: F.scaled_dot_product_attention(q[:, :, None], kd, vd)}))
    # The attention bench's first decode shape (B=4, L=7168: split-KV over 14 segments).
    kc4, vc4 = rn(4 * 448, page, Hk, D), rn(4 * 448, page, Hk, D)
    bt4 = torch.arange(4 * 448, dtype=torch.int32, device=dev).view(4, 448)
    cuq4 = torch.arange(5, dtype=torch.int32, device=dev)
    kvl4 = torch.full((4,), 7168, dtype=torch.int32, device=dev)
    q4 = q[:4].contiguous()
    out.append(("decode attn B=4 L=7168", {
        "launch": lambda: A.paged(q4, kc4, vc4, bt4, cuq4, kvl4, D ** -0.5, max_seqlen_q=1, validate=False)}))
    S = 1024
    qp, kp, vp = rn(S, Hq, D), rn(S, Hk, D), rn(S, Hk, D)
    cu = torch.tensor([0, S], dtype=torch.int32, device=dev)
    qn, kn, vn = (t.transpose(0, 1)[None].contiguous() for t in (qp, kp.repeat_interleave(4, 1), vp.repeat_interleave(4, 1)))
    out.append(("prefill attn S=1024", {
        "launch": lambda: A.prefill(qp, kp, vp, cu, S, D ** -0.5, validate=False),
        "native": lambda: F.scaled_dot_product_attention(qn, kn, vn, is_causal=True)}))
    wl = rn(37984, H, scale=0.02)
    tg = torch.randint(0, 37984, (B,), device=dev, generator=gen)
    out.append(("linear_logp T=8 V=37984", {
        "op": lambda: ologp.linear_logp(x, wl, tg),
        "launch": lambda: LP.linear_logp_fwd(x, wl, tg, validate_targets=False),
        "native": lambda: torch.log_softmax(F.linear(x, wl).float(), -1).gather(1, tg[:, None])}))
    from rlk.kernels import launcher, plans

    for name, fns in out:
        if "launch" in fns:
            fns["launch_nocache"] = switched(fns["launch"], launcher.set_enabled, False)
            if " attn " in f" {name} ":  # the launchers with host plans
                fns["launch_noplans"] = switched(fns["launch"], plans.set_enabled, False)
                fns["launch_nosites"] = switched(fns["launch"], launcher.set_sites_enabled, False)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile-top", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=7, help="alternating measurement rounds per case")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("rlk.bench.overhead_bench needs a GPU")
    rows, profiles = [], {}
    print(f"{'case':26} {'variant':14} {'eager_us':>9} {'graph_us':>9} {'host_us':>9} {'b2b_us':>9}")
    for name, fns in cases():
        # Eager and host times in alternating rounds (the device host is noisy: see
        # rlk.testing.timing.interleaved_us); graph times are device times, measured once.
        eager = interleaved_us(fns, rounds=a.rounds)
        host = interleaved_us(fns, rounds=a.rounds, measure=_host_us)
        b2b = interleaved_us(fns, rounds=a.rounds, measure=_b2b_us)
        for variant, fn in fns.items():
            r = {"case": name, "variant": variant}
            e, h, b = eager[variant], host[variant], b2b[variant]
            if "error" in e or "error" in h or "error" in b:
                r["error"] = e.get("error") or h.get("error") or b.get("error")
            else:
                r.update(eager_us=e["us"], host_us=h["us"], b2b_us=b["us"], eager_rounds=e["rounds"],
                         host_rounds=h["rounds"], b2b_rounds=b["rounds"])
                try:
                    r["graph_us"] = _graph_us(fn)
                except Exception as ex:  # noqa: BLE001 - reported, the probe goes on
                    r["error"] = repr(ex)[:300]
            rows.append(r)
            print(f"{name:26} {variant:14} {r.get('eager_us', float('nan')):9.1f} {r.get('graph_us', float('nan')):9.1f} "
                  f"{r.get('host_us', float('nan')):9.1f} {r.get('b2b_us', float('nan')):9.1f} {r.get('error', '')}",
                  flush=True)
            if a.profile_top and (variant == "op" or variant.startswith("launch")) and "error" not in r:
                profiles[f"{name} [{variant}]"] = _profile(fn, a.profile_top)
    try:
        from rlk import provenance

        prov = provenance.capability_record()
    except Exception as e:  # noqa: BLE001
        prov = {"error": repr(e)}
    with open(a.out, "w") as f:
        json.dump({"provenance": prov, "rows": rows, "profiles": profiles}, f, indent=2, default=str)
    for k, v in profiles.items():
        print(f"--- {k}")
        print("\n".join(v[:8]))


if __name__ == "__main__":
    main()
