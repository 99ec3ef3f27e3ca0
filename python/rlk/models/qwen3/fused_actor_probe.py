"""GPU probe: the strict actor with the fused LM head + loss path vs the unfused path.

    python -m rlk.models.qwen3.fused_actor_probe --config qwen3-1.7b --layers 2 --out probe.json

First the forward sublayer by sublayer (``sublayer_trace``: the model's own probes) through the
actor's path (grad-requiring weights: custom ops) and the direct path. Then
``trainer.score(actor=True)`` with ``Qwen3.fused_actor_lm_head`` on, off, on again, and the
forward-only (reference) score; reports per run the logp's NaN / zero / positive counts and
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


def sublayer_trace(model, ids, positions, cu, max_seqlen, grad: bool) -> list:
    """The strict forward's per-layer attention and MLP outputs and the final hidden (the model's
    own ``probes``), with weights as grad-requiring leaves (the actor's custom-op / autograd path)
    or plain (the direct path): [(name, tensor)]."""
    w = {k: (t.detach().clone().requires_grad_(True) if grad else t) for k, t in model.w.items()}
    probes: dict = {}
    with torch.set_grad_enabled(grad):
        model._forward(w, ids, positions,
                       lambda i, q, k, v: model.ops.attn_varlen(q, k, v, cu, max_seqlen, model.scale), probes)
    out = []
    for i, (a, m) in enumerate(zip(probes["attn_out"], probes["mlp_out"])):
        out += [(f"layer{i}.attn_out", a), (f"layer{i}.mlp_out", m)]
    return out + [("final", probes["final"])]


def main(argv=None):
    from rlk.models.qwen3 import Qwen3
    from rlk.kernels.linear_logp.autograd import linear_logp, linear_logp_loss
    from rlk.replay import harness, trainer
    from rlk.replay.compare import compare_logp

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
    # Sublayer by sublayer: the actor's path (grad-requiring weights) vs the direct path.
    T = 300
    ids = torch.randint(0, model.cfg.vocab_size, (T,), device="cuda")
    cu = torch.tensor([0, 120, T], dtype=torch.int32, device="cuda")
    positions = torch.cat([torch.arange(120), torch.arange(T - 120)]).to("cuda")
    plain = sublayer_trace(model, ids, positions, cu, 180, False)
    graded = sublayer_trace(model, ids, positions, cu, 180, True)
    out["sublayers"] = []
    for (name, x), (_, y) in zip(plain, graded):
        r = {"sublayer": name, "equal": bool(x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)),
             "nan_direct": int(torch.isnan(x.float()).sum()), "nan_actor": int(torch.isnan(y.float()).sum()),
             "max_abs_diff": float((x.float() - y.float()).abs().nan_to_num(float("inf")).max())}
        out["sublayers"].append(r)
        print("sublayer", r, flush=True)
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
            out[name] = {**_summary(lp), "logp_equals_reference": compare_logp(lp, ref)["mismatch_count"] == 0}
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
