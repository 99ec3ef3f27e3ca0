"""Where a vLLM arm's time goes: device time per kernel class and host idle, from the worker's
torch.profiler trace (vLLM's ``profiler_config``; ``LLM.start_profile`` / ``stop_profile``).

Kernel classes (:data:`CLASSES`, first match of the kernel name, lower case, wins): GEMM (cuBLAS,
CUTLASS and rlk's strict GEMM), attention (FlashAttention and rlk's paged / write_kv / merge
kernels), norms, RoPE, activation (SwiGLU / silu-and-mul), LM head + logp (rlk's linear_logp),
sampling (vLLM's sampler and softmax-type kernels), copies / fills, other. ``host_idle_s``: the
span from the first to the last GPU kernel minus the union of kernel intervals (the GPU waited
for the host).
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re

CLASSES = (
    ("attention", r"flash|fmha|attn|paged|write_kv|merge_kernel|reshape_and_cache"),
    ("lm_head_logp", r"linear_logp|logp"),
    ("gemm", r"gemm|matmul|cutlass|xmma|nvjet|cublas|sm90_|_mm_|wgmma"),
    ("norm", r"rms|norm"),
    ("rope", r"rotary|rope"),
    ("activation", r"silu|swiglu|act_and_mul|gelu"),
    ("sampling", r"sample|gumbel|topk|top_k|softmax|argmax|logprob|sort|penalt|temperature"),
    ("copy_fill", r"copy|fill|memset|memcpy|cat|index|gather|scatter|embedding"),
)


def classify(name: str) -> str:
    n = name.lower()
    for cls, pat in CLASSES:
        if re.search(pat, n):
            return cls
    return "other"


def profiler_kwargs(trace_dir: str) -> dict:
    """Engine keyword arguments that arm the torch profiler (inactive until ``start_profile``)."""
    return {"profiler_config": {"profiler": "torch", "torch_profiler_dir": os.path.abspath(trace_dir),
                                "torch_profiler_with_stack": False, "torch_profiler_use_gzip": True,
                                "torch_profiler_dump_cuda_time_total": False}}


def _events(path: str) -> list:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data.get("traceEvents", data) if isinstance(data, dict) else data


def attribution(events: list) -> dict:
    """Seconds per kernel class, host idle and span of the GPU kernels in ``events`` (Chrome
    trace events; ``cat == "kernel"``, ``ts``/``dur`` in microseconds)."""
    ks = [e for e in events if isinstance(e, dict) and e.get("cat") == "kernel" and "dur" in e]
    if not ks:
        return {"kernels": 0}
    per: dict[str, float] = {}
    for e in ks:
        c = classify(e.get("name", ""))
        per[c] = per.get(c, 0.0) + float(e["dur"])
    iv = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ks)
    busy, cur_s, cur_e = 0.0, iv[0][0], iv[0][1]
    for s, e in iv[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = iv[-1][1] - iv[0][0]
    total = sum(per.values())
    return {"kernels": len(ks), "span_s": round(span / 1e6, 6), "gpu_busy_s": round(busy / 1e6, 6),
            "host_idle_s": round((span - busy) / 1e6, 6),
            "device_s": {k: round(v / 1e6, 6) for k, v in sorted(per.items(), key=lambda kv: -kv[1])},
            "device_frac": {k: round(v / total, 4) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}}


def attribution_from_dir(trace_dir: str) -> dict:
    """:func:`attribution` of the trace in ``trace_dir`` that holds the most GPU kernels (the
    worker's; the front end's trace has none)."""
    best, best_n = None, -1
    for p in sorted(glob.glob(os.path.join(trace_dir, "**", "*.json*"), recursive=True)):
        try:
            a = attribution(_events(p))
        except (OSError, ValueError) as e:
            a = {"kernels": 0, "error": f"{type(e).__name__}: {e}"}
        if a["kernels"] > best_n:
            best, best_n = dict(a, trace=os.path.basename(p)), a["kernels"]
    return best or {"kernels": 0, "error": f"no trace under {trace_dir}"}
