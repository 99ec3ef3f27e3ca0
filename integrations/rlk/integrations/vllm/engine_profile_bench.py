"""Where a vLLM arm's time goes: device time per kernel class and host idle, from the worker's
torch.profiler trace (vLLM's ``profiler_config``; ``LLM.start_profile`` / ``stop_profile``).

Kernel classes: those of the e2e attribution (:data:`rlk.bench.attribution.CATEGORIES`, first
match of the lower-case kernel name wins): logp (LM head + log-softmax, rlk's linear_logp and the
samplers' logprob kernels), GEMM, attention, norm, RoPE, SwiGLU (silu-and-mul), sampling,
embedding, copies, elementwise, other. ``host_idle_s``: the
span from the first to the last GPU kernel minus the union of kernel intervals (the GPU waited
for the host).
"""

from __future__ import annotations

import glob
import gzip
import json
import os

from rlk.bench.attribution import categorize

TOP_KERNELS = 40  # kernel names listed per trace, by device time
NAME_CHARS = 160


def classify(name: str) -> str:
    """The kernel class of ``name``: the categories of the e2e attribution
    (:func:`rlk.bench.attribution.categorize`), one classifier for every report."""
    return categorize(name)


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
    by_name: dict[str, list] = {}
    for e in ks:
        rec = by_name.setdefault(e.get("name", ""), [0, 0.0])
        rec[0] += 1
        rec[1] += float(e["dur"])
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]
    return {"kernels": len(ks), "span_s": round(span / 1e6, 6), "gpu_busy_s": round(busy / 1e6, 6),
            "host_idle_s": round((span - busy) / 1e6, 6),
            "device_s": {k: round(v / 1e6, 6) for k, v in sorted(per.items(), key=lambda kv: -kv[1])},
            "device_frac": {k: round(v / total, 4) for k, v in sorted(per.items(), key=lambda kv: -kv[1])},
            # The kernels that take the most device time, by name (cut to NAME_CHARS), with their class.
            "top_kernels": [{"name": n[:NAME_CHARS], "class": classify(n), "calls": c, "seconds": round(t / 1e6, 6),
                             "mean_us": round(t / c, 2)} for n, (c, t) in top]}


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
