"""``vllm_h200.{json,md}`` from an :mod:`~rlk.integrations.vllm.engine_bench` results folder.

Inputs (written by the bench, never edited): ``arm_<arm>.json`` per arm, ``compare.json`` (the
trainers' comparison), ``checkpoint.json`` (the checkpoint record). Per workload the JSON has
``stock``, ``batch_invariant`` and ``rlk`` tokens/s, ``rlk_vs_stock_tok_per_s`` and
``rlk_vs_batch_invariant_tok_per_s``; ``targets`` says which target holds (rlk >= 0.95x stock on
every workload; rlk faster than the batch-invariant mode); ``bitwise`` holds each arm's
comparison with each trainer (rlk's arm must show 0 mismatches).
"""

from __future__ import annotations

import glob
import json
import os

TARGET_VS_STOCK = 0.95


def _load(path):
    with open(path) as f:
        return json.load(f)


def build(results: str) -> dict:
    arms = {}
    for p in sorted(glob.glob(os.path.join(results, "arm_*.json"))):
        a = _load(p)
        arms[a["arm"]] = a
    cmp_path = os.path.join(results, "compare.json")
    cmp = _load(cmp_path) if os.path.exists(cmp_path) else {}
    ck_path = os.path.join(results, "checkpoint.json")
    ck = _load(ck_path) if os.path.exists(ck_path) else {}
    names = sorted({w for a in arms.values() for w in a["workloads"]})
    per = {}
    for w in names:
        row = {a: arms[a]["workloads"][w]["tok_per_s"] for a in arms if w in arms[a]["workloads"]}
        any_arm = next(a for a in arms.values() if w in a["workloads"])["workloads"][w]
        row.update(sequences=any_arm["sequences"], response_tokens=any_arm["response_tokens"],
                   prompt_tokens=any_arm["prompt_tokens"])
        if "rlk" in row and "stock" in row:
            row["rlk_vs_stock_tok_per_s"] = round(row["rlk"] / row["stock"], 4)
        if "rlk" in row and "batch_invariant" in row:
            row["rlk_vs_batch_invariant_tok_per_s"] = round(row["rlk"] / row["batch_invariant"], 4)
        per[w] = row
    targets = {}
    if per and all("rlk_vs_stock_tok_per_s" in r for r in per.values()) and per:
        targets["rlk_ge_0.95x_stock"] = all(r["rlk_vs_stock_tok_per_s"] >= TARGET_VS_STOCK for r in per.values())
    if all("rlk_vs_batch_invariant_tok_per_s" in r for r in per.values()) and per:
        targets["rlk_faster_than_batch_invariant"] = all(r["rlk_vs_batch_invariant_tok_per_s"] > 1.0
                                                         for r in per.values())
    bitwise = {}
    for arm, ws in (cmp.get("arms") or {}).items():
        bitwise[arm] = {}
        for w, r in ws.items():
            bitwise[arm][w] = {k: {f: r[k][f] for f in ("compared_elements", "mismatch_count", "max_abs_diff",
                                                        "torch_equal")}
                               for k in ("rlk_trainer", "megatron", "megatron_vs_rlk_trainer") if k in r}
            if "sampled_logp" in r:
                bitwise[arm][w]["sampled_logp"] = r["sampled_logp"]
    if "rlk" in bitwise:
        rl = bitwise["rlk"]
        targets["rlk_bitwise_rlk_trainer"] = all(r["rlk_trainer"]["mismatch_count"] == 0 for r in rl.values())
        if all("megatron" in r for r in rl.values()):
            targets["rlk_bitwise_megatron"] = all(r["megatron"]["mismatch_count"] == 0 for r in rl.values())
    return {
        "what": "vLLM arms on one GPU, same checkpoint and requests: stock, batch_invariant (VLLM_BATCH_INVARIANT=1), "
                "rlk (strict plugin, full CUDA graphs of decode batches)",
        "workloads": per,
        "targets": targets,
        "bitwise": bitwise,
        "trainers": cmp.get("trainers"),
        "distribution": cmp.get("distribution"),
        "megatron_error": cmp.get("megatron_error"),
        "engine": {a: {k: arms[a].get(k) for k in ("vllm_version", "engine_start_s", "warmup_s", "cudagraph_mode",
                                                   "compilation_mode", "env")} for a in arms},
        "rlk_worker_counters": (arms.get("rlk") or {}).get("worker_counters"),
        "attribution": {a: arms[a]["attribution"] for a in arms if arms[a].get("attribution")},
        "checkpoint": {k: ck.get(k) for k in ("sha256", "bytes", "config", "layers", "meta")} if ck else None,
        "bundle_sha256": next((a["provenance"].get("extra", {}).get("bundle_sha256") for a in arms.values()
                               if isinstance(a.get("provenance"), dict)), None),
        "provenance": {a: arms[a].get("provenance") for a in arms},
        "raw": {a: arms[a]["workloads"] for a in arms},
    }


def markdown(rep: dict) -> str:
    lines = ["# vLLM on the GPU: stock, batch-invariant, rlk strict plugin", "",
             "Written by `python -m rlk.integrations.vllm.engine_bench report`; tokens/s of responses "
             "(median of 3 runs for W0, one run otherwise).", "",
             "| workload | seqs | response tokens | stock | batch_invariant | rlk | rlk / stock | rlk / batch_invariant |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for w, r in rep["workloads"].items():
        lines.append(f"| {w} | {r['sequences']} | {r['response_tokens']} | {r.get('stock', '-')} | "
                     f"{r.get('batch_invariant', '-')} | {r.get('rlk', '-')} | {r.get('rlk_vs_stock_tok_per_s', '-')} | "
                     f"{r.get('rlk_vs_batch_invariant_tok_per_s', '-')} |")
    lines += ["", "Returned logprob vs trainer logp of the same tokens (raw fp32 bytes):", "",
              "| arm | workload | trainer | compared | mismatches | max abs diff |", "| --- | --- | --- | --- | --- | --- |"]
    for arm, ws in rep["bitwise"].items():
        for w, r in ws.items():
            for k, v in r.items():
                if k == "sampled_logp":
                    continue
                lines.append(f"| {arm} | {w} | {k} | {v['compared_elements']} | {v['mismatch_count']} | "
                             f"{v['max_abs_diff']:.3g} |")
    att = rep.get("attribution") or {}
    if att:
        classes = sorted({c for a in att.values() for c in a.get("device_s", {})})
        lines += ["", "Attribution (one profiled generate per arm; seconds of device time per kernel class, "
                      "host idle = kernel span minus busy time):", "",
                  "| arm | wall | span | host idle | " + " | ".join(classes) + " |",
                  "| --- | --- | --- | --- | " + " | ".join("---" for _ in classes) + " |"]
        for arm, a in att.items():
            lines.append(f"| {arm} | {a.get('wall_s')} | {a.get('span_s')} | {a.get('host_idle_s')} | "
                         + " | ".join(str(a.get("device_s", {}).get(c, 0)) for c in classes) + " |")
    lines += ["", f"Targets: `{json.dumps(rep['targets'])}`", ""]
    ck = rep.get("checkpoint") or {}
    lines.append(f"Checkpoint sha256 `{ck.get('sha256')}`; vLLM bundle sha256 `{rep.get('bundle_sha256')}`.")
    return "\n".join(lines) + "\n"


def write(results: str, out: str) -> dict:
    rep = build(results)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(rep, f, indent=1, default=str)
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(markdown(rep))
    return rep
