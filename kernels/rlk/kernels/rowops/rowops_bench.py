"""Benchmark: strict row ops vs native torch (eager, and torch.compile where it runs).

    python -m rlk.kernels.rowops.rowops_bench --out rowops_h200.json [--quick]

Qwen3-8B sizes (hidden 4096, head_dim 128, 32 q / 8 kv heads, FFN 12288, vocab 151936), rows
{1, 32, 256, 2048, 8192, 16384}. Native = the faster of eager torch (Hugging Face Qwen3 forms)
and torch.compile(dynamic=True) of the same function; a compile failure is recorded, not fatal.
Times: medians over 5 alternating rounds (strict, eager, compiled, strict, ...) of short
``triton.testing.do_bench`` medians (ms -> us), same tensors, same process; the rounds are kept.
JSON rows: op, rows, strict_us, native_us, ratio (= strict / native), eager_us, compiled_us; rows
<= 256 also strict_graph_us, native_graph_us (eager native form), graph_ratio (device time only),
and strict_b2b_us, native_b2b_us, b2b_ratio (back-to-back eager calls: the host launch path in
full; do_bench's L2 flush before each timed call hides up to ~60 us of it, see
rlk.testing.timing).
Needs a GPU; never run in CI.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as Fn
import triton

from rlk.kernels.rowops import launch as L
from rlk.testing.timing import interleaved_us

H, D, NQ, NK, FFN, VOCAB, EPS = 4096, 128, 32, 8, 12288, 151936, 1e-6
ROWS = (1, 32, 256, 2048, 8192, 16384)
QUICK_ROWS = (1, 2048, 16384)


def _hf_rms(x, w):
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return w * n.to(x.dtype)


def _hf_add_rms(x, r, w):
    s = x + r
    return _hf_rms(s, w), s


def _rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def _hf_rope(x, pos, cos, sin):
    c = torch.cat([cos[pos], cos[pos]], -1)[:, None, :]
    s = torch.cat([sin[pos], sin[pos]], -1)[:, None, :]
    xf = x.float()
    return (xf * c + _rotate_half(xf) * s).to(x.dtype)


def _hf_swiglu(gu):
    g, u = gu.chunk(2, dim=-1)
    return Fn.silu(g) * u


def _hf_rms_bwd(x, w, dy):
    xr, wr = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
    y = _hf_rms(xr, wr)
    return lambda: torch.autograd.grad(y, (xr, wr), dy, retain_graph=True)


def _hf_swiglu_bwd(gu, dy):
    gr = gu.detach().requires_grad_(True)
    y = _hf_swiglu(gr)
    return lambda: torch.autograd.grad(y, (gr,), dy, retain_graph=True)


ROUNDS = 5
GRAPH_ROWS_MAX = 256  # rows up to this also get CUDA-graph and back-to-back times (decode sizes)
B2B_CALLS = 50


def _compiled(fn):
    try:
        return torch.compile(fn, dynamic=True)
    except Exception as e:  # pragma: no cover - depends on the toolchain
        print(f"torch.compile unavailable: {e}", file=sys.stderr)
        return None


def _cases(T, dev, compiled, embedding=None):
    g = torch.Generator(device=dev).manual_seed(T)

    def rnd(*shape, scale=1.0):
        return (torch.randn(shape, generator=g, device=dev) * scale).to(torch.bfloat16)

    x, r, w = rnd(T, H), rnd(T, H), rnd(H)
    q, k, wd = rnd(T, NQ, D), rnd(T, NK, D), rnd(D)
    cos, sin = L.rope_table(40960, D, 1_000_000.0, dev)
    pos = torch.randint(0, 40960, (T,), generator=g, device=dev)
    gu, emb = rnd(T, 2 * FFN), rnd(VOCAB, H)
    ids = torch.randint(0, VOCAB, (T,), generator=g, device=dev)
    dy, dyf = rnd(T, H), rnd(T, FFN)
    c = compiled
    return [
        ("rms_norm", lambda: L.rms_norm(x, w, EPS), lambda: _hf_rms(x, w), c.get("rms") and (lambda: c["rms"](x, w))),
        ("add_rms_norm", lambda: L.add_rms_norm(x, r, w, EPS), lambda: _hf_add_rms(x, r, w),
         c.get("add_rms") and (lambda: c["add_rms"](x, r, w))),
        ("q_norm", lambda: L.qk_norm(q, wd, EPS), lambda: _hf_rms(q, wd), c.get("rms") and (lambda: c["rms"](q, wd))),
        ("k_norm", lambda: L.qk_norm(k, wd, EPS), lambda: _hf_rms(k, wd), c.get("rms") and (lambda: c["rms"](k, wd))),
        ("rope_q", lambda: L.apply_rope(q, pos, cos, sin), lambda: _hf_rope(q, pos, cos, sin),
         c.get("rope") and (lambda: c["rope"](q, pos, cos, sin))),
        ("swiglu", lambda: L.swiglu(gu), lambda: _hf_swiglu(gu), c.get("swiglu") and (lambda: c["swiglu"](gu))),
        ("embedding", lambda: (embedding or L.embedding)(ids, emb), lambda: Fn.embedding(ids, emb), None),
        ("rms_norm_bwd", lambda: L.rms_norm_backward(dy, x, w, EPS), _hf_rms_bwd(x, w, dy), None),
        ("swiglu_bwd", lambda: L.swiglu_backward(dyf, gu), _hf_swiglu_bwd(gu, dyf), None),
    ]


def run(rows, quick: bool, only=None, embedding=None):
    dev = "cuda"
    compiled = {}
    for name, fn in (("rms", _hf_rms), ("add_rms", _hf_add_rms), ("rope", _hf_rope), ("swiglu", _hf_swiglu)):
        cf = _compiled(fn)
        if cf is not None:
            compiled[name] = cf
    out = []
    for T in rows:
        for op, strict, eager, comp in _cases(T, dev, compiled, embedding):
            if (quick and op in ("k_norm", "swiglu_bwd")) or (only and op not in only):
                continue
            if eager is None:
                continue
            fns = {"strict": strict, "eager": eager}
            if comp:
                fns["compiled"] = comp
            # Alternating rounds (rlk.testing.timing.interleaved_us): the host of the H200 machine
            # is noisy, and these small ops are launch-bound.
            t = interleaved_us(fns, rounds=ROUNDS)
            if "error" in t.get("compiled", {}):  # compile failures are recorded, never fatal
                print(f"torch.compile failed for {op} T={T}: {t['compiled']['error']}", file=sys.stderr)
            s_us, e_us = t["strict"]["us"], t["eager"]["us"]
            c_us = t.get("compiled", {}).get("us")
            native = min(e_us, c_us) if c_us is not None else e_us
            row = {"op": op, "rows": T, "strict_us": round(s_us, 2), "native_us": round(native, 2),
                   "ratio": round(s_us / native, 3), "eager_us": round(e_us, 2),
                   "compiled_us": None if c_us is None else round(c_us, 2),
                   "strict_rounds": t["strict"]["rounds"], "eager_rounds": t["eager"]["rounds"]}
            if T <= GRAPH_ROWS_MAX:
                row.update(_graph_columns(strict, eager))
                row.update(_b2b_columns(strict, eager))
            out.append(row)
            print(f"{op:14s} {T:6d}  strict {s_us:9.2f} us  eager {e_us:9.2f}  compiled "
                  f"{'   n/a' if c_us is None else f'{c_us:9.2f}'}  ratio {row['ratio']:.3f}", flush=True)
    return out


def _b2b_columns(strict, eager) -> dict:
    """Back-to-back eager time per call (rlk.testing.timing.back_to_back_us: max(host launch path,
    device) per call, no L2 flush before each call), strict and the eager native form in alternating
    rounds. The do_bench times above hide up to ~60 us of host launch time behind do_bench's L2
    flush; these do not. Columns only: ``ratio`` stays the do_bench one (comparable across runs)."""
    from rlk.testing.timing import back_to_back_us

    t = interleaved_us({"strict": strict, "native": eager}, rounds=ROUNDS,
                       measure=lambda fn: back_to_back_us(fn, calls=B2B_CALLS))
    s, n = t["strict"].get("us"), t["native"].get("us")
    return {"strict_b2b_us": None if s is None else round(s, 2), "native_b2b_us": None if n is None else round(n, 2),
            "b2b_ratio": None if not (s and n) else round(s / n, 3)}


def _graph_columns(strict, eager) -> dict:
    """Device time per call of the strict op and the eager native form replayed from CUDA graphs
    (decode-sized rows: engines capture decode steps; the eager times above include the host
    launch path, which swings 2-10x on the H200 machine). Columns only: ``ratio`` stays eager."""
    from rlk.testing.timing import cuda_graph_us

    g = {}
    for name, fn in (("strict", strict), ("native", eager)):
        try:
            g[name] = cuda_graph_us(fn)
        except Exception as e:  # noqa: BLE001 - e.g. an op that cannot be captured: recorded
            print(f"graph timing failed ({name}): {type(e).__name__}: {e}", file=sys.stderr)
            g[name] = None
    s, n = g["strict"], g["native"]
    return {"strict_graph_us": None if s is None else round(s, 2), "native_graph_us": None if n is None else round(n, 2),
            "graph_ratio": None if not (s and n) else round(s / n, 3)}


def embedding_tiles(rows, tiles=(4096, 8192, 16384, 32768), warps=(4, 8)):
    """Device time (CUDA-graph replay) of the embedding kernel (``L.embedding_kernel``) for each
    (TILE_ELEMS, num_warps): schedule fields of embedding.v1 (an exact copy); every variant's
    output is compared with ``F.embedding`` bytes."""
    from rlk.kernels.rowops import schedule
    from rlk.testing.timing import cuda_graph_us

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    emb = torch.randn((151936, 4096), device=dev, generator=g).to(torch.bfloat16)
    out = []
    for T in rows:
        ids = torch.randint(0, emb.shape[0], (T,), device=dev, generator=g)
        ref = Fn.embedding(ids, emb)
        native = cuda_graph_us(lambda: Fn.embedding(ids, emb))
        for te in tiles:
            for nw in warps:
                with schedule.override("embedding", TILE_ELEMS=te, num_warps=nw):
                    same = bool(torch.equal(L.embedding_kernel(ids, emb), ref))
                    us = cuda_graph_us(lambda: L.embedding_kernel(ids, emb))
                out.append({"rows": T, "TILE_ELEMS": te, "num_warps": nw, "graph_us": round(us, 2),
                            "native_graph_us": round(native, 2), "ratio": round(us / native, 3),
                            "same_bytes_as_native": same})
                print(f"embedding T={T:6d} tile={te:6d} w={nw}  {us:8.2f} us  native {native:8.2f}  "
                      f"same={same}", flush=True)
    return out


def provenance():
    try:
        from rlk import provenance as P

        return P.capability_record(route="bench", contract_ids=["rmsnorm.v1", "rope.v1", "swiglu.v1",
                                                               "embedding.v1"], load_contracts=False)
    except Exception as e:  # pragma: no cover
        return {"torch": torch.__version__, "triton": triton.__version__,
                "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                "provenance_error": f"{type(e).__name__}: {e}"}


def main(argv=None):
    global ROUNDS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--embedding-tiles", action="store_true",
                    help="only the embedding tile/warps sweep (CUDA-graph device times) into --out")
    ap.add_argument("--ops", nargs="+", default=None,
                    help="only these ops, default route only (a focused re-measure, e.g. --ops embedding --rows 1 32 "
                         "--rounds 21)")
    ap.add_argument("--rows", nargs="+", type=int, default=None, help="row counts (default: the full list)")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"alternating rounds per case (default {ROUNDS})")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    if not torch.cuda.is_available():
        sys.exit("rowops_bench needs a GPU")
    if a.embedding_tiles:
        rows = embedding_tiles(QUICK_ROWS if a.quick else ROWS)
        with open(a.out, "w") as f:
            json.dump({"provenance": provenance(), "timing": "cuda_graph", "rows": rows}, f, indent=1)
        print(f"wrote {a.out} ({len(rows)} rows)")
        return
    ROUNDS = a.rounds
    sizes = tuple(a.rows) if a.rows else (QUICK_ROWS if a.quick else ROWS)
    if a.ops:
        rows = run(sizes, a.quick, only=tuple(a.ops))
        with open(a.out, "w") as f:
            json.dump({"provenance": provenance(), "meta": {"value_checks": L.effective_value_checks(), "rounds": ROUNDS},
                       "rows": rows}, f, indent=1)
        print(f"wrote {a.out} ({len(rows)} rows)")
        return
    # The process's value checks (default "device": range asserts on the device, nothing read back).
    rows = run(sizes, a.quick)
    # The ops with range checks (ids / positions), as the trainer, the replay harness and the
    # rollout call them: inside host_validated() (ids and positions built or checked on the host
    # once per batch). The embedding is then the index_select copy route.
    from rlk.kernels.common import host_validated

    with host_validated():
        for r in run(sizes, a.quick, only=("rope_q", "embedding")):
            r["op"] += "_validated"
            rows.append(r)
    # "host" value checks (min / max read back: one synchronization per call), the debugging mode.
    prev = L.set_value_checks("host")
    try:
        for r in run(sizes, a.quick, only=("rope_q", "embedding")):
            r["op"] += "_hostcheck"
            rows.append(r)
    finally:
        L.set_value_checks(prev)
    # Value checks off without that promise: the embedding's kernel route (NaN row per bad id),
    # called as L.embedding_kernel so that the CUDA-graph columns (captured inside
    # host_validated(), where L.embedding copies with index_select) time the kernel too.
    prev = L.set_value_checks("off")
    try:
        for r in run(sizes, a.quick, only=("embedding",), embedding=L.embedding_kernel):
            r["op"] += "_nocheck"
            rows.append(r)
    finally:
        L.set_value_checks(prev)
    meta = {"value_checks": f"{L.effective_value_checks()!r} (the process's mode; 'device', the default: range "
                            "asserts on the device, nothing read back) unless op "
                            "ends in _validated (inside host_validated(): the production route), _hostcheck "
                            "(set_value_checks('host'): min/max read back, one sync per call) or _nocheck "
                            "(set_value_checks('off'): the embedding's kernel)",
            "graph columns": "captured inside host_validated() (no value checks in the graph): embedding and "
                             "embedding_validated time the index_select copy, embedding_nocheck the kernel "
                             "(L.embedding_kernel)",
            "native": "min(eager, compiled)",
            "add_rms_norm native": "unfused eager add then HF rms_norm (or its compiled fusion)"}
    with open(a.out, "w") as f:
        json.dump({"provenance": provenance(), "meta": meta, "rows": rows}, f, indent=1)
    print(f"wrote {a.out} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
