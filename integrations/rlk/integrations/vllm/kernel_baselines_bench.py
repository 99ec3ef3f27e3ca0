"""rlk's strict kernels against the kernels vLLM 0.26.0 itself runs, on the same bytes (H200).

    python -m rlk.integrations.vllm.kernel_baselines_bench --out R/kernel_baselines_h200.json [--quick]

Needs vLLM's CUDA build (the H200 bundle, ``ci/h200_vllm.sh`` stage ``baselines``). Shapes are
Qwen3-8B at TP1, the engine bench's model: 32 q heads / 8 kv heads of 128, hidden 4096, FFN 12288.

* **Paged decode attention**: rlk's ``launch.paged`` (``attn.v2``) vs vLLM's FlashAttention 3
  (``vllm.vllm_flash_attn.flash_attn_varlen_func``, GQA, paged KV) called as vLLM's FLASH_ATTN
  backend calls it in full CUDA graphs: ahead-of-time scheduler metadata
  (``get_scheduler_metadata``) with ``num_splits`` = ``flash_attn_max_num_splits_for_cuda_graph``
  (32), ``fa_version=3``. Both read one KV cache tensor in vLLM's layout
  ``(num_blocks, block_size=16, Hk, 2*D)`` (K and V as views of it), pages in a shuffled order.
* **Row ops** vs vLLM's fused CUDA ops (``vllm._custom_ops``): residual add + RMSNorm
  (``fused_add_rms_norm``), QK-norm + RoPE over the fused QKV output (``fused_qk_norm_rope``; rlk:
  the fused ``qk_norm_rope`` and, for reference, its two-op form), RoPE alone
  (``rotary_embedding``), SwiGLU (``silu_and_mul``). vLLM's ops work in place: the timed calls
  rewrite their inputs, which changes values, not the work.
  Stock vLLM under torch.compile may run Inductor-generated kernels for some of these instead;
  these baselines are the CUDA kernels vLLM ships, named as such.

Timing: ``graph_us`` = CUDA-graph replay (``rlk.testing.timing.cuda_graph_us``: how an engine's
decode step runs), ``eager_us`` = ``triton.testing.do_bench`` median (host launch path included).
``ratio`` = rlk / vLLM at graph timing. Not run in CI (needs a GPU and vLLM's CUDA build).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

HQ, HK, D, HIDDEN, FFN = 32, 8, 128, 4096, 12288
PAGE = 16
FA_SPLITS_FOR_GRAPHS = 32  # vLLM 0.26 AttentionConfig.flash_attn_max_num_splits_for_cuda_graph
EPS = 1e-6
DECODE_CASES = ((16, 256), (16, 1024), (64, 1024), (64, "mixed"), (256, 512), (256, 1024), (4, 4096))
ROW_TOKENS = (16, 64, 256, 2048)


def _times(fn) -> dict:
    import triton.testing

    from rlk.testing.timing import cuda_graph_us

    fn()
    torch.cuda.synchronize()
    return {"graph_us": round(cuda_graph_us(fn), 3),
            "eager_us": round(float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3, 3)}


def _pair(rlk_fn, vllm_fn) -> dict:
    """Times of both sides; a side that fails records its error (the other is still timed)."""
    out = {}
    for name, fn in (("rlk", rlk_fn), ("vllm", vllm_fn)):
        try:
            out[name] = _times(fn)
        except Exception as e:  # noqa: BLE001 - recorded in the results, never hidden
            out[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
    if "graph_us" in out["rlk"] and "graph_us" in out["vllm"]:
        out["ratio"] = round(out["rlk"]["graph_us"] / out["vllm"]["graph_us"], 4)
        out["ratio_eager"] = round(out["rlk"]["eager_us"] / out["vllm"]["eager_us"], 4)
    return out


def decode_case(b: int, length, seed: int = 1) -> dict:
    """One decode step of ``b`` requests (kv length ``length``, or ``"mixed"``: 64-2048)."""
    from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata

    from rlk.kernels.attention import launch

    g = torch.Generator(device="cuda").manual_seed(seed)
    if length == "mixed":
        lens = torch.randint(64, 2049, (b,), generator=g, device="cuda", dtype=torch.int32)
    else:
        lens = torch.full((b,), int(length), dtype=torch.int32, device="cuda")
    host_lens = lens.tolist()
    pages = [(n + PAGE - 1) // PAGE for n in host_lens]
    nb_max, total = max(pages), sum(pages)
    kv = torch.randn((total, PAGE, HK, 2 * D), generator=g, device="cuda", dtype=torch.bfloat16)
    kc, vc = kv[..., :D], kv[..., D:]
    perm = torch.randperm(total, generator=g, device="cuda").to(torch.int32)
    bt = torch.zeros((b, nb_max), dtype=torch.int32, device="cuda")
    at = 0
    for i, p in enumerate(pages):
        bt[i, :p] = perm[at:at + p]
        at += p
    q = torch.randn((b, HQ, D), generator=g, device="cuda", dtype=torch.bfloat16)
    cuq = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    scale = D ** -0.5
    max_k = max(host_lens)
    out_rlk = torch.empty_like(q)
    out_fa = torch.empty_like(q)
    md = get_scheduler_metadata(batch_size=b, max_seqlen_q=1, max_seqlen_k=max_k, num_heads_q=HQ, num_heads_kv=HK,
                                headdim=D, cache_seqlens=lens, qkv_dtype=torch.bfloat16, cu_seqlens_q=cuq,
                                page_size=PAGE, causal=True, num_splits=FA_SPLITS_FOR_GRAPHS)

    def rlk_fn():
        launch.paged(q, kc, vc, bt, cuq, lens, scale, max_seqlen_q=1, validate=False, out=out_rlk)

    def fa_fn():
        flash_attn_varlen_func(q=q, k=kc, v=vc, out=out_fa, cu_seqlens_q=cuq, max_seqlen_q=1, seqused_k=lens,
                               max_seqlen_k=max_k, softmax_scale=scale, causal=True, block_table=bt,
                               scheduler_metadata=md, num_splits=FA_SPLITS_FOR_GRAPHS, fa_version=3)

    rec = {"op": "decode_attention", "B": b, "L": length, "kv_tokens": int(sum(host_lens)), **_pair(rlk_fn, fa_fn)}
    try:  # the two outputs agree to bf16 accuracy (different arithmetic: not bitwise)
        rlk_fn()
        fa_fn()
        torch.cuda.synchronize()
        rec["max_abs_diff_vs_vllm"] = float((out_rlk.float() - out_fa.float()).abs().max())
    except Exception as e:  # noqa: BLE001
        rec["max_abs_diff_vs_vllm"] = f"{type(e).__name__}: {e}"[:200]
    return rec


def row_cases(t: int, seed: int = 2) -> list[dict]:
    from vllm import _custom_ops as vops

    from rlk.kernels.rowops import launch as L

    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(shape, generator=g, device="cuda") * scale).to(torch.bfloat16)

    recs = []
    x, r, w = rnd(t, HIDDEN), rnd(t, HIDDEN), (1 + 0.1 * rnd(HIDDEN)).to(torch.bfloat16)
    xv, rv = x.clone(), r.clone()
    recs.append({"op": "add_rms_norm", "T": t, **_pair(lambda: L.add_rms_norm(x, r, w, EPS),
                                                         lambda: vops.fused_add_rms_norm(xv, rv, w, EPS))})
    qsz, kvsz = HQ * D, HK * D
    qkv = rnd(t, qsz + 2 * kvsz, scale=2.0)
    qkv_v = qkv.clone()
    wq, wk = (1 + 0.1 * rnd(D)).to(torch.bfloat16), (1 + 0.1 * rnd(D)).to(torch.bfloat16)
    cos, sin = L.rope_table(4096, D, 1_000_000.0, "cuda")
    cos_sin = torch.cat([cos, sin], dim=-1).to(torch.bfloat16)
    pos = torch.randint(0, 4096, (t,), generator=g, device="cuda")
    qk = qkv[:, :qsz + kvsz].view(t, HQ + HK, D)
    recs.append({"op": "qk_norm_rope", "T": t, **_pair(
        lambda: L.qk_norm_rope(qk, wq, wk, EPS, HQ, pos, cos, sin),
        lambda: vops.fused_qk_norm_rope(qkv_v, HQ, HK, HK, D, EPS, wq, wk, cos_sin, True, pos))})

    def parts():
        L.apply_rope(L.qk_norm(qk[:, :HQ], wq, EPS), pos, cos, sin)
        L.apply_rope(L.qk_norm(qk[:, HQ:], wk, EPS), pos, cos, sin)

    recs.append({"op": "qk_norm_then_rope_4_launches", "T": t, **_pair(
        parts, lambda: vops.fused_qk_norm_rope(qkv_v, HQ, HK, HK, D, EPS, wq, wk, cos_sin, True, pos))})
    qf, kf = rnd(t, qsz), rnd(t, kvsz)
    qr, kr = qf.view(t, HQ, D), kf.view(t, HK, D)

    def rlk_rope():
        L.apply_rope(qr, pos, cos, sin)
        L.apply_rope(kr, pos, cos, sin)

    recs.append({"op": "rope_q_and_k", "T": t, **_pair(
        rlk_rope, lambda: vops.rotary_embedding(pos, qf, kf, D, cos_sin, True))})
    gu = rnd(t, 2 * FFN, scale=2.0)
    y = torch.empty((t, FFN), dtype=torch.bfloat16, device="cuda")
    recs.append({"op": "swiglu", "T": t, **_pair(lambda: L.swiglu(gu), lambda: torch.ops._C.silu_and_mul(y, gu))})
    return recs


def run(out: str, quick: bool = False) -> dict:
    import importlib.metadata

    from rlk import provenance
    from rlk.kernels.common import host_validated

    cases = DECODE_CASES[:2] if quick else DECODE_CASES
    rows = ROW_TOKENS[:1] if quick else ROW_TOKENS
    res = {"what": __doc__.split("\n\n")[0], "gpu": torch.cuda.get_device_name(),
           "vllm_version": importlib.metadata.version("vllm"), "shapes": {"Hq": HQ, "Hk": HK, "D": D,
           "hidden": HIDDEN, "ffn": FFN, "page": PAGE}, "fa_num_splits": FA_SPLITS_FOR_GRAPHS, "rows": []}
    t0 = time.perf_counter()
    with host_validated():  # inputs built here, in range: the timed path is the engine's
        for b, length in cases:
            res["rows"].append(decode_case(b, length))
            print(json.dumps(res["rows"][-1]), flush=True)
        for t in rows:
            for r in row_cases(t):
                res["rows"].append(r)
                print(json.dumps(r), flush=True)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["provenance"] = provenance.capability_record(contract_ids=["attn.v2", "rmsnorm.v1", "rope.v1", "swiglu.v1"],
                                                     extra={"baseline": f"vllm {res['vllm_version']}"})
    with open(out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="two decode cases, one token count")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("kernel_baselines_bench needs a CUDA device and vLLM's CUDA build")
    run(a.out, a.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
