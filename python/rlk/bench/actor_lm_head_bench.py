"""Actor-phase benchmark: the strict actor's LM head fused (logp + loss, 3 GEMM-equivalents) or
unfused (logp, then autograd: 4), against the native actor, on the L5 workload.

    python -m rlk.bench.actor_lm_head_bench --out actor_lm_head_h200.json [--rounds 7]

One process, one strict and one native model (the L5 size: ``rlk.bench.checks.L5_ARGS``), the
same frozen prompts and responses. Each round times ``trainer.score(actor=True)`` once per arm in
the order native, strict unfused, strict fused (CUDA-synchronized wall time, as the e2e phases);
the first round is warm-up and dropped. Reports medians, ratios (strict / native, fused /
unfused) and whether the fused arm's logp and every gradient equal the unfused arm's bitwise.
This decides ``Qwen3.fused_actor_lm_head``'s default; the release gate's L5 remains the
end-to-end judge. GPU only; not for CI.
"""

from __future__ import annotations

import argparse
import json
import statistics


def run(rounds: int, device: str = "cuda", **overrides) -> dict:
    """``overrides`` replace L5 sizes (``config``, ``layers``, ``sequences``, ...: CPU smoke tests)."""
    import torch

    from rlk import provenance
    from rlk.bench.checks import l5_spec
    from rlk.bench.workload import Workload

    spec = l5_spec(device, **overrides)
    arms = {"native": Workload(spec, "native"), "strict": Workload(spec, "strict")}

    def actor(route, fused=None):
        wl = arms[route]
        if fused is not None:
            wl.model.fused_actor_lm_head = fused
        return wl.phase("actor_fwd_bwd")()

    plan = {"native": lambda: actor("native"), "strict_unfused": lambda: actor("strict", False),
            "strict_fused": lambda: actor("strict", True)}
    times: dict = {k: [] for k in plan}
    last: dict = {}
    for r in range(rounds + 1):
        for name, fn in plan.items():
            out, s, _ = Workload.timed(fn)  # synchronized wall time, as the e2e phases
            if r:
                times[name].append(s * 1e3)
            if name != "native":
                last[name] = out
            del out
        print(f"round {r}{' (warm-up)' if r == 0 else ''}: "
              + " ".join(f"{k}={v[-1]:.2f}ms" for k, v in times.items() if v and r), flush=True)
    (lp_u, g_u, _), (lp_f, g_f, _) = last["strict_unfused"], last["strict_fused"]
    logp_equal = all(torch.equal(a, b) for a, b in zip(lp_u, lp_f))
    grads_differ = sorted(k for k in g_u if not torch.equal(g_u[k].view(torch.uint8), g_f[k].view(torch.uint8)))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "provenance": provenance.capability_record(route="strict", extra={"bench": "actor_lm_head",
                                                                          "spec": spec.to_dict()}),
        "rounds": rounds, "tokens": arms["strict"].total_tokens,
        "median_ms": med, "rounds_ms": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "ratio_unfused_vs_native": med["strict_unfused"] / med["native"],
        "ratio_fused_vs_native": med["strict_fused"] / med["native"],
        "ratio_fused_vs_unfused": med["strict_fused"] / med["strict_unfused"],
        "fused_logp_equals_unfused": logp_equal, "fused_grads_differing": grads_differ,
    }


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=7, help="measured rounds (one warm-up round is added)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only for smoke runs (tiny --config)")
    ap.add_argument("--config", default=None, help="model config (default: the L5 size's)")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--sequences", type=int, default=None)
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("actor_lm_head_bench needs a GPU (or --device cpu with a tiny --config)")
    over = {k: getattr(a, k) for k in ("config", "layers", "sequences") if getattr(a, k) is not None}
    res = run(a.rounds, a.device, **over)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(json.dumps({k: v for k, v in res.items() if k not in ("provenance", "rounds_ms")}, indent=1, default=str))
    ok = res["fused_logp_equals_unfused"] and not res["fused_grads_differing"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
