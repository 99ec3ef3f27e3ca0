"""Attribution of device time to named kernels per phase (torch.profiler), for the e2e report.

A profiled process runs one warm-up step unprofiled, then each phase under its own profiler, and
sorts every device kernel into a category by its name. It reports per phase and route: time per
category, the share attributed to named categories (target >= 95%), launches per generated token
(rollout), and device idle time (phase wall time minus kernel time; one stream). Profiled runs
never feed the headline ratio.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

CATEGORIES = (
    ("logp", r"logp|log_softmax|logsumexp|softmax|cross_entropy|\blse\b|_lse|lse_|fwd_stats|(?<!attn_)merge_kernel|bwd_grad|"
             r"grad_from_logits|(?<!_)scale_kernel"),
    # Not FlashAttention: FA3's kernels are CUTLASS device kernels ("cutlass::device_kernel<flash::
    # FlashAttnFwdSm90...>") and its split-KV ones say "splitkv".
    ("gemm", r"^(?!.*(flash|fmha)).*(gemm|matmul|_mm_|sm90_xmma|nvjet|cutlass|cublas|splitk|_linear)"),
    ("attention", r"attn|attention|flash|fmha|sdpa|_paged|prefill|decode|bwd_dkdv|bwd_dq|bwd_delta"),
    ("norm", r"rms|norm|fold_partials"),
    ("rope", r"rope|rotary"),
    ("swiglu", r"swiglu|silu|sigmoid|act_and_mul"),
    ("sampling", r"sample|gumbel|topk|top_k|argmax|penalt|temperature"),
    ("embedding", r"embed|index_select|gather"),
    ("copy", r"copy|memcpy|memset|cat_|catarray|fill|scatter|index|write_kv|reshape_and_cache"),
    ("elementwise", r"elementwise|vectorized|reduce_kernel|unrolled"),
)


def categorize(name: str) -> str:
    low = name.lower()
    for cat, pat in CATEGORIES:
        if re.search(pat, low):
            return cat
    return "other"


def kernel_times(prof) -> tuple[dict[str, float], int, float]:
    """(device microseconds per category, kernel launches, total device microseconds) of a
    finished ``torch.profiler.profile``: its CUDA kernel events sorted by :func:`categorize`."""
    per_cat: dict[str, float] = {}
    launches, total = 0, 0.0
    for evt in prof.events():
        dt = getattr(evt, "device_type", None)
        if dt is None or "CUDA" not in str(dt):
            continue
        us = getattr(evt, "device_time", None) or getattr(evt, "cuda_time", 0.0) or 0.0
        if us <= 0:
            continue
        launches += 1
        total += us
        c = categorize(evt.name)
        per_cat[c] = per_cat.get(c, 0.0) + us
    return per_cat, launches, total


def profile_arm(spec: dict, route: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rlk.bench.workload import PHASES, Workload, WorkloadSpec

    wl = Workload(WorkloadSpec(**spec), route)
    wl.step()  # warm-up, unprofiled
    out = {}
    from rlk.replay import trainer

    mb = wl.spec.microbatch_tokens
    runs = {
        "rollout": lambda: wl._rollout.run_rollout(wl.model, wl.requests, wl.rc, forced=wl.forced),
        "ref_logp": lambda: trainer.score(wl.model, wl.prompts, wl.forced, actor=False, microbatch_tokens=mb),
        "actor_fwd_bwd": lambda: trainer.score(wl.model, wl.prompts, wl.forced, actor=True, microbatch_tokens=mb),
    }
    for ph, fn in runs.items():
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            if ph == "ref_logp":
                with torch.no_grad():
                    fn()
            else:
                fn()
            torch.cuda.synchronize()
            wall_us = (time.perf_counter() - t0) * 1e6
        per_cat, launches, total = kernel_times(prof)
        named = sum(v for k, v in per_cat.items() if k != "other")
        out[ph] = {
            "device_us": total, "wall_us": wall_us, "idle_us": max(0.0, wall_us - total),
            "launches": launches, "per_category_us": per_cat,
            "attributed_share": named / total if total else 0.0,
            "top_other": sorted(((e.key, e.device_time_total if hasattr(e, "device_time_total") else 0.0)
                                 for e in prof.key_averages() if categorize(e.key) == "other"),
                                key=lambda kv: -kv[1])[:8],
        }
        if ph == "rollout":
            out[ph]["launches_per_generated_token"] = launches / max(1, wl.response_tokens)
    return out


def run(spec: dict, out_dir: str) -> dict:
    """Profiles both arms, each in its own process; writes ``attribution.json``."""
    res = {}
    for route in ("native", "strict"):
        path = os.path.join(out_dir, f"attribution_{route}.json")
        subprocess.run([sys.executable, "-m", "rlk.bench.attribution", route, json.dumps(spec), path], check=True)
        with open(path) as f:
            res[route] = json.load(f)
    with open(os.path.join(out_dir, "attribution.json"), "w") as f:
        json.dump(res, f, indent=2)
    for route, phases in res.items():
        for ph, d in phases.items():
            print(f"{route:7} {ph:14} device {d['device_us'] / 1e3:8.2f} ms  idle {d['idle_us'] / 1e3:8.2f} ms  "
                  f"attributed {d['attributed_share']:.1%}  launches {d['launches']}  "
                  + " ".join(f"{k}={v / 1e3:.2f}" for k, v in sorted(d["per_category_us"].items(), key=lambda kv: -kv[1])))
    return res


if __name__ == "__main__":
    route, spec, path = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    from rlk import determinism

    determinism.apply_strict_env()
    with open(path, "w") as f:
        json.dump(profile_arm(spec, route), f, indent=2, default=str)
