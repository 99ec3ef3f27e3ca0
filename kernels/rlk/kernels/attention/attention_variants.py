"""Prefill/decode schedule variants of ``attn.v2`` on the H200: time and bytes vs the table.

    python -m rlk.kernels.attention.attention_variants --out variants.json [--prefill-S 1024] [--prefill-only]

Every variant changes only schedule fields (BLOCK_M, num_warps, num_stages, GP), which the
invariance sweep (``configs/invariance_sm90.json``) measured bit-neutral; this script re-checks
the bytes against the current table on the benchmark's inputs and times each variant (median of
``triton.testing.do_bench``; eager and CUDA-graph replay; prefill also ``cold_us``, the device time
after an L2 flush without the host, ``rlk.testing.timing.cold_graph_us``: under an override
the eager path has no host plan, so its eager time is the full host path). Not run in CI (GPU only).
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch


def _bench(fn):
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")) * 1e3


def _graph(fn):
    from rlk.testing.timing import cuda_graph_us

    return cuda_graph_us(fn, rep_ms=50)


def _same(a, b):
    return bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))


def prefill_variants():
    out = [{}]
    for bm, nw, ns, gp in itertools.product((64, 128), (4, 8), (2, 3, 4), (1, 4)):
        if bm == 128 and nw == 4:
            continue
        out.append({"BLOCK_M": bm, "num_warps": nw, "num_stages": ns, "GP": gp})
    return out


def decode_variants():
    return [{}] + [{"BLOCK_M": 16, "num_warps": nw, "num_stages": ns} for nw, ns in itertools.product((2, 4), (2, 3, 4))]


def backward_variants():
    """(dkdv overrides, dq overrides): warps/stages only (schedule), then block sizes (these
    change the backward's MMA chunking: bytes are compared, a difference is expected)."""
    out = [({}, {})]
    for nw, ns in itertools.product((4, 8), (1, 2, 3)):
        out.append(({"num_warps": nw, "num_stages": ns}, {"num_warps": nw, "num_stages": ns}))
    out.append(({"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
                {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2}))
    return out


def run_backward(log=print):
    from rlk.kernels.attention import launch, schedule

    rows = []
    hq, hk, d, s = 8, 2, 128, 4096
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn((s, h, d), device="cuda", generator=g, dtype=torch.bfloat16) for h in (hq, hk, hk))
    cu = torch.tensor([0, s], dtype=torch.int32, device="cuda")
    out, lse = launch.prefill(q, k, v, cu, s, d ** -0.5)
    do = torch.randn_like(q)
    base = None
    for kv_o, q_o in backward_variants():
        try:
            with schedule.override("bwd_dkdv", **kv_o), schedule.override("bwd_dq", **q_o):
                fn = lambda: launch.backward(do, q, k, v, out, lse, cu, s, d ** -0.5)  # noqa: E731
                o = fn()
                us = _bench(fn)
        except Exception as e:  # noqa: BLE001
            rows.append({"case": "backward", "S": s, "dkdv": kv_o, "dq": q_o, "error": repr(e)[:200]})
            continue
        base = base or o
        r = {"case": "backward", "S": s, "dkdv": kv_o, "dq": q_o, "eager_us": us,
             "same": all(_same(a, b) for a, b in zip(o, base))}
        rows.append(r)
        log(f"backward S={s} dkdv={kv_o} dq={q_o} {us:8.1f} us same={r['same']}")
    return rows


def run(log=print, prefill_s=(1024, 4096, 8192), decode=True):
    from rlk.kernels.attention import launch, schedule
    from rlk.kernels.attention.attention_bench import decode_inputs
    from rlk.testing.timing import cold_graph_us

    rows = []
    hq, hk, d = 8, 2, 128
    for s in prefill_s:
        g = torch.Generator(device="cuda").manual_seed(s)
        q, k, v = (torch.randn((s, h, d), device="cuda", generator=g, dtype=torch.bfloat16) for h in (hq, hk, hk))
        cu = torch.tensor([0, s], dtype=torch.int32, device="cuda")
        base = None
        for var in prefill_variants():
            try:
                with schedule.override("prefill", **var):
                    fn = lambda: launch.prefill(q, k, v, cu, s, d ** -0.5, validate=False)  # noqa: E731
                    o = fn()
                    us, gus, cus = _bench(fn), _graph(fn), cold_graph_us(fn)
            except Exception as e:  # noqa: BLE001 - reported
                rows.append({"case": "prefill", "S": s, "variant": var, "error": repr(e)[:200]})
                continue
            base = base or o
            r = {"case": "prefill", "S": s, "variant": var, "eager_us": us, "graph_us": gus, "cold_us": cus,
                 "same": _same(o[0], base[0]) and _same(o[1], base[1])}
            rows.append(r)
            log(f"prefill S={s:5d} {str(var):60s} eager {us:8.1f} graph {gus:8.1f} cold {cus:8.1f} same={r['same']}")
    for b, length in (((4, 7168), (64, 2048), (256, 1024)) if decode else ()):
        q, kc, vc, bt, cuq, kv, g = decode_inputs(b, length, hq, hk, d, seed=b)
        base = None
        for var in decode_variants():
            try:
                with schedule.override("paged_decode", **var):
                    fn = lambda: launch.paged(q, kc, vc, bt, cuq, kv, d ** -0.5, max_seqlen_q=1, validate=False)  # noqa: E731
                    o = fn()
                    us, gus = _bench(fn), _graph(fn)
            except Exception as e:  # noqa: BLE001
                rows.append({"case": "decode", "B": b, "L": length, "variant": var, "error": repr(e)[:200]})
                continue
            base = base or o
            r = {"case": "decode", "B": b, "L": length, "variant": var, "eager_us": us, "graph_us": gus,
                 "same": _same(o[0], base[0]) and _same(o[1], base[1])}
            rows.append(r)
            log(f"decode B={b:3d} L={length:5d} {str(var):45s} eager {us:8.1f} graph {gus:8.1f} same={r['same']}")
        kd = torch.randn((b, hq, length, d), device="cuda", generator=g, dtype=torch.bfloat16)
        vd = torch.randn_like(kd)
        fn = lambda: torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), kd, vd)  # noqa: E731
        rows.append({"case": "decode_native", "B": b, "L": length, "eager_us": _bench(fn), "graph_us": _graph(fn)})
        log(f"decode B={b:3d} L={length:5d} native SDPA eager {rows[-1]['eager_us']:8.1f} graph {rows[-1]['graph_us']:8.1f}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--backward-only", action="store_true")
    ap.add_argument("--prefill-only", action="store_true", help="prefill variants only (no decode, no backward)")
    ap.add_argument("--prefill-S", type=int, nargs="+", default=[1024, 4096, 8192])
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("attention_variants needs a GPU")
    rows = [] if a.backward_only else run(prefill_s=tuple(a.prefill_S), decode=not a.prefill_only)
    if not a.prefill_only:
        rows += run_backward()
    with open(a.out, "w") as f:
        json.dump({"rows": rows}, f, indent=2, default=str)


if __name__ == "__main__":
    main()
