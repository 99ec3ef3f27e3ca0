"""GPU probe: the strict actor with the fused LM head + loss path vs the unfused path.

    python -m rlk.models.qwen3.fused_actor_probe --config qwen3-1.7b --layers 2 --out probe.json

Runs ``trainer.score(actor=True)`` with ``Qwen3.fused_actor_lm_head`` on, off, on again, and
the forward-only (reference) score; reports per run the logp's NaN / zero / positive counts and
range, whether each run's logp equals the reference bitwise, and which gradients differ between
runs. Then the op alone (``linear_logp_loss`` vs ``linear_logp`` + backward) on the model's own
LM-head weight. A diagnostic, not a benchmark; GPU only.
"""

from __future__ import annotations

import argparse
import json

import torch


def _summary(lp: list[torch.Tensor]) -> dict:
    x = torch.cat([t.float() for t in lp])
    fin = x[torch.isfinite(x)]
    return {"n": x.numel(), "nan": int(torch.isnan(x).sum()), "zero": int((x == 0).sum()),
            "positive": int((x > 0).sum()), "min": float(fin.min()) if fin.numel() else None,
            "max": float(fin.max()) if fin.numel() else None}


def _same(a, b) -> bool:
    return all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b))


def op_trace(model, ids, positions, cu, max_seqlen, grad: bool):
    """Layer 0 of the strict forward op by op, with weights as grad-requiring leaves (the actor's
    custom-op / autograd path) or plain (the direct path): [(name, tensor)]."""
    cfg, ops, eps = model.cfg, model.ops, model.cfg.rms_norm_eps
    w = {k: (t.detach().clone().requires_grad_(True) if grad else t) for k, t in model.w.items()}
    T, qs, kvs = ids.shape[0], cfg.q_size, cfg.kv_size
    p = "model.layers.0."
    out = []
    with torch.set_grad_enabled(grad):
        x = ops.embedding(ids, w["model.embed_tokens.weight"])
        out.append(("embedding", x))
        r = x
        x = ops.rms_norm(x, w[p + "input_layernorm.weight"], eps)
        out.append(("rms_norm", x))
        qkv = ops.linear(x, w[p + "self_attn.qkv_proj.weight"])
        out.append(("linear_qkv", qkv))
        q = qkv[:, :qs].contiguous().view(T, cfg.num_attention_heads, cfg.head_dim)
        k = qkv[:, qs:qs + kvs].contiguous().view(T, cfg.num_key_value_heads, cfg.head_dim)
        v = qkv[:, qs + kvs:].contiguous().view(T, cfg.num_key_value_heads, cfg.head_dim)
        qn = ops.qk_norm(q, w[p + "self_attn.q_norm.weight"], eps)
        out.append(("qk_norm_q", qn))
        q = ops.apply_rope(qn, positions, model.rope)
        out.append(("rope_q", q))
        k = ops.apply_rope(ops.qk_norm(k, w[p + "self_attn.k_norm.weight"], eps), positions, model.rope)
        out.append(("rope_k", k))
        o = ops.attn_varlen(q, k, v, cu, max_seqlen, model.scale)
        out.append(("attention", o))
        x = ops.linear(o.reshape(T, qs), w[p + "self_attn.o_proj.weight"])
        out.append(("linear_o", x))
        x, r = ops.add_rms_norm(x, r, w[p + "post_attention_layernorm.weight"], eps)
        out.append(("add_rms_norm_x", x))
        out.append(("add_rms_norm_residual", r))
        gu = ops.linear(x, w[p + "mlp.gate_up_proj.weight"])
        out.append(("linear_gate_up", gu))
        sg = ops.swiglu(gu)
        out.append(("swiglu", sg))
        out.append(("linear_down", ops.linear(sg, w[p + "mlp.down_proj.weight"])))
    return [(n, t.detach()) for n, t in out]


def main(argv=None):
    from rlk.models.qwen3 import Qwen3
    from rlk.ops.linear_logp import linear_logp, linear_logp_loss
    from rlk.replay import harness, trainer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="qwen3-1.7b")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    model = harness.build_model(harness.ModelSpec(config=a.config, num_layers=a.layers, seed=0, device="cuda"),
                                "strict")
    reqs = harness.make_requests(a.sequences, (64, 256), (32, 64), model.cfg.vocab_size, seed=1)
    g = torch.Generator().manual_seed(2)
    prompts = [r.prompt for r in reqs]
    resps = [torch.randint(0, model.cfg.vocab_size, (r.max_new_tokens,), generator=g).tolist() for r in reqs]
    out = {"config": a.config, "layers": a.layers, "tie_word_embeddings": model.cfg.tie_word_embeddings,
           "hidden": model.cfg.hidden_size, "vocab": model.cfg.vocab_size}
    # Op by op, layer 0: the actor's path (grad-requiring weights) vs the direct path.
    T = 300
    ids = torch.randint(0, model.cfg.vocab_size, (T,), device="cuda")
    cu = torch.tensor([0, 120, T], dtype=torch.int32, device="cuda")
    positions = torch.cat([torch.arange(120), torch.arange(T - 120)]).to("cuda")
    plain, graded = op_trace(model, ids, positions, cu, 180, False), op_trace(model, ids, positions, cu, 180, True)
    out["ops_layer0"] = []
    for (name, x), (_, y) in zip(plain, graded):
        r = {"op": name, "equal": bool(x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)),
             "nan_direct": int(torch.isnan(x.float()).sum()), "nan_actor": int(torch.isnan(y.float()).sum()),
             "max_abs_diff": float((x.float() - y.float()).abs().nan_to_num(float("inf")).max())}
        out["ops_layer0"].append(r)
        print("op", r, flush=True)
    ref, _, _ = trainer.score(model, prompts, resps)
    out["reference"] = _summary(ref)
    print("reference", out["reference"], flush=True)
    runs = {}
    prev = Qwen3.fused_actor_lm_head
    try:
        for name, fused in (("fused_1", True), ("unfused", False), ("fused_2", True)):
            Qwen3.fused_actor_lm_head = fused
            lp, grads, _ = trainer.score(model, prompts, resps, actor=True)
            torch.cuda.synchronize()
            runs[name] = (lp, grads)
            out[name] = {**_summary(lp), "logp_equals_reference": _same(lp, ref)}
            print(name, out[name], flush=True)
    finally:
        Qwen3.fused_actor_lm_head = prev
    for x, y in (("fused_1", "fused_2"), ("fused_1", "unfused")):
        gx, gy = runs[x][1], runs[y][1]
        out[f"grads_{x}_vs_{y}"] = sorted(k for k in gx if not torch.equal(gx[k].view(torch.uint8), gy[k].view(torch.uint8)))
        print(f"grads {x} vs {y}: {len(out[f'grads_{x}_vs_{y}'])} differ", out[f"grads_{x}_vs_{y}"][:6], flush=True)
    # The op alone on the model's LM-head weight.
    w = model.w["lm_head.weight"]
    T = 600
    h = (torch.randn((T, model.cfg.hidden_size), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
         ).to(torch.bfloat16)
    tg = torch.randint(0, model.cfg.vocab_size, (T,), device="cuda")
    hr, wr = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss, lp = linear_logp_loss(hr, wr, tg, lambda x, lo, hi: -x)
    loss.backward()
    hu, wu = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    lpu = linear_logp(hu, wu, tg).logp
    (-lpu.sum()).backward()
    out["op_alone"] = {"T": T, "logp_equal": bool(torch.equal(lp, lpu.detach())), "logp": _summary([lp]),
                       "d_hidden_equal": bool(torch.equal(hr.grad, hu.grad)),
                       "d_weight_equal": bool(torch.equal(wr.grad, wu.grad))}
    print("op alone", out["op_alone"], flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
