"""Benchmark of strict attention (``attn.v2``) vs torch SDPA on the same inputs (H200).

    python -m rlk.kernels.attention.attention_bench --out attention_h200.json [--quick]

Cases (Qwen3-8B TP4 shard: 8 q heads / 2 kv heads of 128):
  prefill: causal, one sequence of S in {1024, 4096, 8192}; native = SDPA flash backend on
    [1, 8, S, 128] with K/V expanded to 8 heads (expansion outside the timing; the backend
    selected once around the measurement, not per call); ``sdpa_default_*``: SDPA's own backend
    choice, for reference.
  decode: (B, L) in {(4, 7168), (64, 2048), (256, 1024)}; strict = paged kernel, page 16,
    pages in order; native = SDPA on a dense [B, 8, L, 128] cache (as in PERF.md).
  backward: S=4096; strict = launch.backward; native = SDPA flash backward (autograd.grad).
Rows: case, shape fields, strict_us, native_us, ratio (= strict / native), timing (which mode
strict_us/native_us are: ``graph`` for decode, which engines run as CUDA graphs, ``eager`` for
prefill and backward), and both modes' times (``*_eager_us``, ``*_graph_us``). Medians of
``triton.testing.do_bench`` (graph: replay of 10 calls / 10). Prefill and decode rows also carry
``*_b2b_us``: 50 back-to-back eager calls / 50, the host launch path in full (do_bench's L2 flush
before each timed call hides up to ~60 us of it: rlk.testing.timing). Prefill rows also carry
``*_cold_us``: device time right after an L2 flush, without the host (``cold_graph_us``): when
the eager time is above the graph time, it says whether the host or the cold cache is why.
Not run in CI.

``--sites`` adds, for prefill and decode, the strict arm with launch sites on
(``rlk.kernels.launcher.LaunchSite``) beside the same arm with them off, in alternating rounds in
this process: ``sites_ab`` = {mode: {"off": [...], "on": [...]}} per round and ``site_hits`` (launches
served by a site during the on arms). The headline columns keep the process's own setting.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def _provenance():
    try:
        from rlk import provenance

        return provenance.capability_record(contract_ids=["attn.v2"])
    except Exception:  # noqa: BLE001 - fall back to a minimal record
        import triton

        return {"torch": torch.__version__, "triton": triton.__version__,
                "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def _bench(fn):
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3


def _graph_bench(fn):
    from rlk.testing.timing import cuda_graph_us

    return cuda_graph_us(fn)


def _b2b(fn):
    """Back-to-back eager time per call (rlk.testing.timing.back_to_back_us): the host launch path
    in full, which do_bench's L2 flush before each timed call partly hides (up to ~60 us)."""
    from rlk.testing.timing import back_to_back_us

    return back_to_back_us(fn, calls=50)


def _both(strict_fn, native_fn, primary):
    """Eager, back-to-back eager and graph timings of both arms; strict_us/native_us are the
    ``primary`` mode's (eager or graph)."""
    r = {"strict_eager_us": _bench(strict_fn), "native_eager_us": _bench(native_fn),
         "strict_b2b_us": _b2b(strict_fn), "native_b2b_us": _b2b(native_fn),
         "strict_graph_us": _graph_bench(strict_fn), "native_graph_us": _graph_bench(native_fn)}
    r["strict_us"], r["native_us"], r["timing"] = r[f"strict_{primary}_us"], r[f"native_{primary}_us"], primary
    return r


def _sites_ab(strict_fn, rounds=3):
    """Strict arm with launch sites off / on, alternating per round (eager, b2b, graph)."""
    from rlk.kernels import launcher
    from rlk.testing.timing import switched

    off, on = (switched(strict_fn, launcher.set_sites_enabled, v) for v in (False, True))
    ab = {m: {"off": [], "on": []} for m in ("eager", "b2b", "graph")}
    hits0 = launcher.STATS["site_hits"]
    for _ in range(rounds):
        for name, fn in (("off", off), ("on", on)):
            ab["eager"][name].append(_bench(fn))
            ab["b2b"][name].append(_b2b(fn))
            ab["graph"][name].append(_graph_bench(fn))
    med = {f"strict_{label}_{m}_us": statistics.median(v[arm]) for m, v in ab.items()
           for arm, label in (("on", "sites"), ("off", "nosites"))}
    return {"sites_ab": ab, "site_hits": launcher.STATS["site_hits"] - hits0, **med}


def _sdpa_flash(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def bench_prefill(s, hq=8, hk=2, d=128, sites_ab=False):
    from rlk.kernels.attention import launch

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((s, h, d), device="cuda", generator=g, dtype=torch.bfloat16) for h in (hq, hk, hk))
    cu = torch.tensor([0, s], dtype=torch.int32, device="cuda")
    scale = d ** -0.5
    qn = q.transpose(0, 1).unsqueeze(0)
    kn = k.repeat_interleave(hq // hk, 1).transpose(0, 1).unsqueeze(0).contiguous()
    vn = v.repeat_interleave(hq // hk, 1).transpose(0, 1).unsqueeze(0).contiguous()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from rlk.testing.timing import cold_graph_us

    sdpa = torch.nn.functional.scaled_dot_product_attention
    # The flash backend is selected once around the whole measurement: entering sdpa_kernel()
    # inside the timed call adds its host cost to every native call (S=1024 eager: native
    # 72.7 us with it, the strict arm unaffected).
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        strict, native = (lambda: launch.prefill(q, k, v, cu, s, scale, validate=False),
                          lambda: sdpa(qn, kn, vn, is_causal=True))
        t = _both(strict, native, "eager")
        t["strict_cold_us"], t["native_cold_us"] = cold_graph_us(strict), cold_graph_us(native)
    if sites_ab:
        t.update(_sites_ab(strict))
    # SDPA's default backend choice on this machine, for reference (the baseline is flash).
    t["sdpa_default_eager_us"] = _bench(lambda: sdpa(qn, kn, vn, is_causal=True))
    t["sdpa_default_graph_us"] = _graph_bench(lambda: sdpa(qn, kn, vn, is_causal=True))
    return {"case": "prefill", "S": s, "Hq": hq, "Hk": hk, "D": d, "native_backend": "flash", **t}


def decode_inputs(b, length, hq=8, hk=2, d=128, page=16, seed=1):
    """(q [B, Hq, D], k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens_kv, generator) of a
    decode step of B requests of kv length ``length``, pages in order."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    nb = (length + page - 1) // page
    kc = torch.randn((b * nb, page, hk, d), device="cuda", generator=g, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    bt = torch.arange(b * nb, dtype=torch.int32, device="cuda").view(b, nb)
    q = torch.randn((b, hq, d), device="cuda", generator=g, dtype=torch.bfloat16)
    cuq = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    kv = torch.full((b,), length, dtype=torch.int32, device="cuda")
    return q, kc, vc, bt, cuq, kv, g


def bench_decode(b, length, hq=8, hk=2, d=128, page=16, sites_ab=False):
    from rlk.kernels.attention import launch

    q, kc, vc, bt, cuq, kv, g = decode_inputs(b, length, hq, hk, d, page)
    scale = d ** -0.5
    kd = torch.randn((b, hq, length, d), device="cuda", generator=g, dtype=torch.bfloat16)
    vd = torch.randn_like(kd)
    qd = q.unsqueeze(2)
    # Decode steps run as CUDA graphs in engines (vLLM, rlk's replay executor): the graph time
    # is the headline; eager times (host launch included) are kept beside it.
    strict = lambda: launch.paged(q, kc, vc, bt, cuq, kv, scale, max_seqlen_q=1, validate=False)  # noqa: E731
    t = _both(strict, lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, vd), "graph")
    if sites_ab:
        t.update(_sites_ab(strict))
    return {"case": "decode", "B": b, "L": length, "Hq": hq, "Hk": hk, "D": d, "page": page, **t}


def bench_backward(s, hq=8, hk=2, d=128):
    from rlk.kernels.attention import launch

    g = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (torch.randn((s, h, d), device="cuda", generator=g, dtype=torch.bfloat16) for h in (hq, hk, hk))
    cu = torch.tensor([0, s], dtype=torch.int32, device="cuda")
    scale = d ** -0.5
    out, lse = launch.prefill(q, k, v, cu, s, scale)
    do = torch.randn_like(q)
    strict = _bench(lambda: launch.backward(do, q, k, v, out, lse, cu, s, scale))
    strict_graph = _graph_bench(lambda: launch.backward(do, q, k, v, out, lse, cu, s, scale))
    qn = q.transpose(0, 1).unsqueeze(0).detach().requires_grad_(True)
    kn = k.repeat_interleave(hq // hk, 1).transpose(0, 1).unsqueeze(0).contiguous().requires_grad_(True)
    vn = v.repeat_interleave(hq // hk, 1).transpose(0, 1).unsqueeze(0).contiguous().requires_grad_(True)
    on = _sdpa_flash(qn, kn, vn, True)
    don = do.transpose(0, 1).unsqueeze(0)
    native = _bench(lambda: torch.autograd.grad(on, (qn, kn, vn), don, retain_graph=True))
    return {"case": "backward", "S": s, "Hq": hq, "Hk": hk, "D": d, "strict_us": strict, "native_us": native,
            "strict_eager_us": strict, "native_eager_us": native, "strict_graph_us": strict_graph,
            "timing": "eager"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sites", action="store_true", help="also time the strict arm with launch sites off/on")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("attention_bench needs a GPU")
    rows = []
    for s in ((1024, 4096) if a.quick else (1024, 4096, 8192)):
        rows.append(bench_prefill(s, sites_ab=a.sites))
    for b, length in (((4, 7168), (256, 1024)) if a.quick else ((4, 7168), (64, 2048), (256, 1024))):
        rows.append(bench_decode(b, length, sites_ab=a.sites))
    rows.append(bench_backward(4096))
    print(f"{'case':9} {'shape':22} {'strict_us':>10} {'native_us':>10} {'ratio':>7} timing")
    for r in rows:
        r["ratio"] = r["strict_us"] / r["native_us"]
        shape = f"S={r['S']}" if "S" in r else f"B={r['B']} L={r['L']}"
        print(f"{r['case']:9} {shape:22} {r['strict_us']:10.1f} {r['native_us']:10.1f} {r['ratio']:7.3f} {r['timing']}")
        if "strict_cold_us" in r:
            print(f"          cold (after an L2 flush, device only) strict/native us: {r['strict_cold_us']:.1f}/"
                  f"{r['native_cold_us']:.1f}; graph {r['strict_graph_us']:.1f}/{r['native_graph_us']:.1f}; "
                  f"b2b {r['strict_b2b_us']:.1f}/{r['native_b2b_us']:.1f}")
        if "sites_ab" in r:
            print("          sites off/on us: " + ", ".join(
                f"{m} {r[f'strict_nosites_{m}_us']:.1f}/{r[f'strict_sites_{m}_us']:.1f}" for m in ("eager", "b2b", "graph"))
                + f" (site hits {r['site_hits']}); native b2b {r['native_b2b_us']:.1f}")
    with open(a.out, "w") as f:
        json.dump({"provenance": _provenance(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
