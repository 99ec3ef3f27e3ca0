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
import statistics

TARGET_VS_STOCK = 0.95


def _load(path):
    with open(path) as f:
        return json.load(f)


def build(results) -> dict:
    """The report of one results folder or several (``results``: a path or a list of paths).

    Several folders are process-level repetitions of the same arms on the same checkpoint (each
    arm ran in a fresh process per folder): tokens/s per arm and workload is the median over the
    folders that ran it (``per_process`` lists each), and the ratios are ratios of medians. A
    folder given as ``DIR:arm[,arm]`` contributes only those arms (``results_dirs`` names them). The
    comparison with the trainers, the statistics and the attribution come from the folders that
    hold them. Raises ``ValueError`` when the folders' checkpoints differ.
    """
    entries = [results] if isinstance(results, str) else list(results)
    dirs, only = [], []
    for e in entries:
        d, want = split_entry(e)
        dirs.append(d)
        only.append(want)
    reps = []
    for d, want in zip(dirs, only):
        arms_d = {}
        for p in sorted(glob.glob(os.path.join(d, "arm_*.json"))):
            a = _load(p)
            if want is None or a["arm"] in want:
                arms_d[a["arm"]] = a
        if want is not None and set(want) - set(arms_d):
            raise ValueError(f"{d}: no arm_<arm>.json for {sorted(set(want) - set(arms_d))}")
        reps.append(arms_d)
    cmp, ck, cmp_dir = {}, {}, None
    for d, want in zip(dirs, only):
        cp, kp = os.path.join(d, "compare.json"), os.path.join(d, "checkpoint.json")
        # A filtered folder lends arms only: its comparison scored tokens of arms left out.
        if os.path.exists(cp) and not cmp and want is None:
            cmp, cmp_dir = _load(cp), _label(d, want)
        if os.path.exists(kp):
            k = _load(kp)
            if ck and k.get("sha256") != ck.get("sha256"):
                raise ValueError(f"results folders hold different checkpoints: {ck.get('sha256')} vs {k.get('sha256')}")
            ck = ck or k
    bundles = {a.get("provenance", {}).get("extra", {}).get("bundle_sha256")
               for r in reps for a in r.values() if isinstance(a.get("provenance"), dict)} - {None}
    if len(bundles) > 1:
        raise ValueError(f"results folders ran different vLLM bundles: {sorted(bundles)}")
    arms = {}  # the first record of each arm: its engine settings and provenance
    for arms_d in reps:
        for a, rec in arms_d.items():
            arms.setdefault(a, rec)
    attribution = {}  # each arm's from the first folder whose record has one (a profiled process)
    for arms_d in reps:
        for a, rec in arms_d.items():
            if rec.get("attribution"):
                attribution.setdefault(a, rec["attribution"])
    names = sorted({w for arms_d in reps for a in arms_d.values() for w in a["workloads"]})
    per = {}
    for w in names:
        runs = {a: [r[a]["workloads"][w]["tok_per_s"] for r in reps if a in r and w in r[a]["workloads"]]
                for a in arms}
        row = {a: round(statistics.median(v), 1) for a, v in runs.items() if v}
        any_arm = next(a for a in arms.values() if w in a["workloads"])["workloads"][w]
        row.update(sequences=any_arm["sequences"], response_tokens=any_arm["response_tokens"],
                   prompt_tokens=any_arm["prompt_tokens"], per_process={a: v for a, v in runs.items() if v})
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
        "bitwise_from": cmp_dir,
        "distribution": cmp.get("distribution"),
        "megatron_error": cmp.get("megatron_error"),
        "engine": {a: {k: arms[a].get(k) for k in ("vllm_version", "use_v2_model_runner", "engine_start_s",
                                                   "warmup_s", "cudagraph_mode", "compilation_mode", "env")}
                   for a in arms},
        "rlk_worker_counters": (arms.get("rlk") or {}).get("worker_counters"),
        "attribution": attribution,
        "checkpoint": {k: ck.get(k) for k in ("sha256", "bytes", "config", "layers", "meta")} if ck else None,
        "bundle_sha256": next((a["provenance"].get("extra", {}).get("bundle_sha256") for a in arms.values()
                               if isinstance(a.get("provenance"), dict)), None),
        "provenance": {a: arms[a].get("provenance") for a in arms},
        "raw": [{a: r[a]["workloads"] for a in r} for r in reps],
        "results_dirs": [_label(d, want) for d, want in zip(dirs, only)],
    }


def split_entry(entry: str) -> tuple[str, list[str] | None]:
    """``DIR`` (every arm in it) or ``DIR:arm[,arm]`` (only those arms: e.g. an arm measured by an
    earlier call on the same checkpoint and bundle, named in the report as such)."""
    if os.path.isdir(entry):  # a folder whose name holds ':' is a folder, not a filter
        return entry, None
    d, sep, arms = entry.rpartition(":")
    if not sep or os.sep in arms:
        return entry, None
    want = [a for a in arms.split(",") if a]
    if not want:
        raise ValueError(f"{entry}: no arm named after ':'")
    return d, want


def _label(d: str, want) -> str:
    """A folder's name in the report: its base name; a filtered folder also its parent and arms."""
    d = os.path.normpath(os.path.abspath(d))
    if want is None:
        return os.path.basename(d)
    return f"{os.path.basename(os.path.dirname(d))}/{os.path.basename(d)}:{','.join(want)}"


def _runner(v2) -> str:
    """vLLM's model runner from an arm record's ``use_v2_model_runner`` (absent in older records)."""
    return "unknown" if v2 is None else ("V2" if v2 else "V1")


def markdown(rep: dict) -> str:
    lines = ["# vLLM on the GPU: stock, batch-invariant, rlk strict plugin", "",
             "Written by `python -m rlk.integrations.vllm.engine_bench report`; tokens/s of responses: "
             "per process, the median of 3 runs for W0 and one run otherwise; over processes, the median "
             f"({len(rep['results_dirs'])} results folders: {', '.join(rep['results_dirs'])}).", "",
             "| workload | seqs | response tokens | stock | batch_invariant | rlk | rlk / stock | rlk / batch_invariant |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for w, r in rep["workloads"].items():
        lines.append(f"| {w} | {r['sequences']} | {r['response_tokens']} | {r.get('stock', '-')} | "
                     f"{r.get('batch_invariant', '-')} | {r.get('rlk', '-')} | {r.get('rlk_vs_stock_tok_per_s', '-')} | "
                     f"{r.get('rlk_vs_batch_invariant_tok_per_s', '-')} |")
    lines += ["", "Returned logprob vs trainer logp of the same tokens (raw fp32 bytes; the tokens of "
              f"results folder {rep.get('bitwise_from')}):", "",
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
        what = sorted({a["what"] for a in att.values() if a.get("what")})
        lines += ["", "Attribution (one profiled generate per arm" + (f": {'; '.join(what)}" if what else "")
                  + "; seconds of device time per kernel class, host idle = kernel span minus busy time):", "",
                  "| arm | wall | span | host idle | " + " | ".join(classes) + " |",
                  "| --- | --- | --- | --- | " + " | ".join("---" for _ in classes) + " |"]
        for arm, a in att.items():
            lines.append(f"| {arm} | {a.get('wall_s')} | {a.get('span_s')} | {a.get('host_idle_s')} | "
                         + " | ".join(str(a.get("device_s", {}).get(c, 0)) for c in classes) + " |")
    lines += ["", f"Targets: `{json.dumps(rep['targets'])}`", ""]
    ck = rep.get("checkpoint") or {}
    lines.append(f"Checkpoint sha256 `{ck.get('sha256')}`; vLLM bundle sha256 `{rep.get('bundle_sha256')}`.")
    lines += ["", "Model runner: " + ", ".join(f"{a} {_runner(e.get('use_v2_model_runner'))}"
                                               for a, e in sorted(rep["engine"].items())) + "."]
    return "\n".join(lines) + "\n"


def write(results, out: str) -> dict:
    rep = build(results)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(rep, f, indent=1, default=str)
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(markdown(rep))
    return rep
