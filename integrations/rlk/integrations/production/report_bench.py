"""The report of :mod:`rlk.integrations.production.bench` (``bench report``): ``.json``, ``.md``,
``.png`` next to each other.

    python -m rlk.integrations.production.bench report --results R [R2 ...] --out docs/results/e2e_production_h200.json

Method: a pair is the two arm files ``pair<i>_pp.json`` / ``pair<i>_rr.json`` of one results
folder. Its ratio is RR total / PP total (total = rollout generate + the trainer phases that ran;
engine start and model load excluded). ``ratio`` is the median of the per-pair ratios and
``ratio_ci95`` its percentile bootstrap over pairs (``rlk.bench.stats.bootstrap_median``: the
process pair is the unit, not the step). A pair whose trainer-side health probe falls outside
``rlk.bench.health``'s envelope (copy bandwidth, SM clock) is listed under ``rejected_pairs``
and left out; every pair of one arm must carry the same provenance (versions, bundle, checkpoint,
capability fingerprint), or the report refuses. Targets: ``rr_pp_upper_ci_le_0.95`` (the interval's
upper end at most 0.95) and ``rr_logp_mismatches_zero`` (every R/R arm compared its rollout logp
with the actor forward and found no differing token). Fewer than :data:`MIN_PAIRS` pairs are
reported (``complete: false``), not refused.
"""

from __future__ import annotations

import json
import os
import time

MIN_PAIRS = 5
TARGET = 0.95
N_BOOT = 10000


def load_pairs(dirs: list[str]) -> tuple[list[dict], list[str]]:
    """(complete pairs ``{"dir", "index", "pp", "rr"}`` in folder and index order, files of
    incomplete pairs)."""
    from rlk.integrations.production import records

    pairs, lone = [], []
    for d in dirs:
        found: dict[int, dict] = {}
        for i, arms in records.arm_files(d).items():
            for arm, path in arms.items():
                with open(path) as f:
                    found.setdefault(i, {})[arm] = json.load(f)
        for i in sorted(found):
            if set(found[i]) == {"pp", "rr"}:
                pairs.append({"dir": d, "index": i, **found[i]})
            else:
                lone += [os.path.join(d, f"pair{i}_{arm}.json") for arm in found[i]]
    return pairs, lone


def _same(values: list, what: str):
    if len(set(json.dumps(v, sort_keys=True) for v in values)) != 1:
        raise SystemExit(f"report: the pairs differ in {what}: {values}")
    return values[0]


def _arm_summary(recs: list[dict]) -> dict:
    from rlk.bench import stats

    totals = [r["total_s"] for r in recs]
    phases = {}
    for ph in recs[0]["phases"]:
        secs = [r["phases"][ph] for r in recs]
        tokens = recs[0]["spec"]["response_tokens" if ph == "rollout_generate" else "packed_tokens"]
        med = stats.median(secs)
        phases[ph] = {"median_s": round(med, 4), "tokens": tokens, "tok_per_s": round(tokens / med, 1) if med else None,
                      "seconds": secs}
    memory = {}
    for r in recs:
        for ph, v in r["train"]["phases"].items():
            if "peak_allocated_gib" in v:
                memory[ph] = max(memory.get(ph, 0.0), v["peak_allocated_gib"])
    tr = recs[0]["train"]
    arm = recs[0].get("arm", "?")
    return {"total_median_s": round(stats.median(totals), 4), "total_p95_s": round(stats.percentile(totals, 95), 4),
            "totals_s": totals, "phases": phases, "peak_allocated_gib": memory,
            "engine_start_s": [r["rollout"]["engine_start_s"] for r in recs],
            "model_load_s": [r["train"]["model_load_s"] for r in recs],
            "trainer": tr["trainer"], "old_logp_source": tr["old_logp_source"],
            "rollout_vs_trainer_logp": [r["train"].get("rollout_vs_trainer_logp") for r in recs],
            "health": {k: [_round(_health(r).get(k)) for r in recs] for k in ("copy_tbps", "sm_clock_mhz", "temperature_c")},
            "provenance": _same([_provenance(r) for r in recs], f"{arm} provenance (every pair must run one stack)")}


def _round(v):
    return round(v, 3) if isinstance(v, float) else v


def _health(rec: dict) -> dict:
    """The trainer process's health probe (``rlk.bench.health.probe``); {} in records without one."""
    return (rec.get("train") or {}).get("health") or {}


def _provenance(rec: dict) -> dict:
    """What must be equal across the pairs of one arm: versions, bundle, checkpoint, the engine's
    compile modes and the trainer's capability fingerprint (kernel sources, tuning tables,
    contracts, toolchain, device)."""
    roll, tr = rec["rollout"], rec["train"]
    return {"vllm": roll.get("vllm_version"), "vllm_arm": roll.get("vllm_arm"),
            "megatron-core": tr["versions"].get("megatron-core"),
            "torch": tr["versions"].get("torch"), "triton": tr["versions"].get("triton"),
            "rollout_torch": roll.get("versions", {}).get("torch"),
            "gpu": tr["versions"].get("gpu"), "cuda": tr["versions"].get("cuda"),
            "bundle_sha256": roll.get("bundle_sha256"),
            "checkpoint_sha256": tr.get("checkpoint_sha256"),
            "cudagraph_mode": roll.get("cudagraph_mode"),
            "compilation_mode": roll.get("compilation_mode"),
            "fingerprint": (tr.get("provenance") or {}).get("fingerprint")}


def _phase_attribution(rec: dict) -> dict:
    """One profiled phase in one shape: the rollout's (vLLM's trace: ``device_s`` by category,
    ``gpu_busy_s``, ``host_idle_s``) or the trainer's (``device_s_by_category``, ``device_s``)."""
    if "device_s_by_category" in rec:
        return {"device_s": rec["device_s"], "host_idle_s": rec["host_idle_s"], "by_category": rec["device_s_by_category"]}
    return {"device_s": rec.get("gpu_busy_s", 0.0), "host_idle_s": rec.get("host_idle_s", 0.0),
            "by_category": dict(rec.get("device_s") or {})}


def attribution(pairs: list[dict]) -> dict | None:
    """Where the time of each arm goes, from the pairs run with ``--profile`` (medians over those
    pairs): per phase device seconds per kernel category and host idle, and per category the
    R/R - P/P difference summed over the counted phases (P/P's old logp included). None when no
    pair was profiled."""
    from rlk.bench import stats

    prof = [p for p in pairs if p["pp"].get("attribution") and p["rr"].get("attribution")]
    if not prof:
        return None
    out: dict = {"pairs_profiled": len(prof), "arms": {}}
    totals: dict = {}
    for arm in ("pp", "rr"):
        phases = {}
        for ph in prof[0][arm]["attribution"]:
            recs = [_phase_attribution(p[arm]["attribution"][ph]) for p in prof if ph in p[arm]["attribution"]]
            cats = sorted({c for r in recs for c in r["by_category"]})
            phases[ph] = {"device_s": round(stats.median([r["device_s"] for r in recs]), 4),
                          "host_idle_s": round(stats.median([r["host_idle_s"] for r in recs]), 4),
                          "by_category": {c: round(stats.median([r["by_category"].get(c, 0.0) for r in recs]), 4)
                                          for c in cats}}
        out["arms"][arm] = phases
        t = totals.setdefault(arm, {})
        for ph in phases.values():
            for c, v in ph["by_category"].items():
                t[c] = t.get(c, 0.0) + v
            t["host idle"] = t.get("host idle", 0.0) + ph["host_idle_s"]
    keys = sorted(set(totals["pp"]) | set(totals["rr"]), key=lambda k: -(totals["rr"].get(k, 0) - totals["pp"].get(k, 0)))
    out["summed_over_phases_s"] = {k: {"pp": round(totals["pp"].get(k, 0.0), 4), "rr": round(totals["rr"].get(k, 0.0), 4),
                                       "rr_minus_pp": round(totals["rr"].get(k, 0.0) - totals["pp"].get(k, 0.0), 4)}
                                   for k in keys}
    return out


def summarize(pairs: list[dict], lone: list[str] | None = None) -> dict:
    """The report's record (module docstring) from complete pairs."""
    from rlk.bench import health, stats

    if not pairs:
        raise SystemExit("report: no complete pair (pair<i>_pp.json + pair<i>_rr.json) in the results folders")
    spec = _same([{k: p[a]["spec"][k] for k in ("layers", "sequences", "workload", "response_tokens", "micro_tokens",
                                                "recompute")} for p in pairs for a in ("pp", "rr")],
                 "layers / sequences / workload / micro-batching")
    _same([sorted(p[a]["phases"]) for p in pairs for a in ("pp",)], "P/P phases")
    _same([sorted(p[a]["phases"]) for p in pairs for a in ("rr",)], "R/R phases")
    reasons = health.reject_pairs([{a: _health(p[a]) for a in ("pp", "rr")} for p in pairs], arms=("pp", "rr"))
    rejected = [{"dir": p["dir"], "pair": p["index"], "reason": why} for p, why in zip(pairs, reasons) if why]
    pairs = [p for p, why in zip(pairs, reasons) if not why]
    if not pairs:
        raise SystemExit(f"report: every pair was rejected by the health envelope: {rejected}")
    per_pair = []
    for p in pairs:
        pp, rr = p["pp"]["total_s"], p["rr"]["total_s"]
        per_pair.append({"dir": p["dir"], "pair": p["index"], "order": (p["rr"].get("pair") or {}).get("order"),
                         "pp_total_s": pp, "rr_total_s": rr, "ratio": round(rr / pp, 4)})
    ratios = [x["ratio"] for x in per_pair]
    med, lo, hi = stats.bootstrap_median(ratios, n_boot=N_BOOT, seed=0)
    mism = [p["rr"].get("logp_mismatches") for p in pairs]
    rep = {"what": "paired P/P vs R/R on the production stack: vLLM rollout + megatron-core trainer, one GPU",
           "pairs": len(pairs), "complete": len(pairs) >= MIN_PAIRS, "min_pairs": MIN_PAIRS,
           "ratio": round(med, 4), "ratio_ci95": [round(lo, 4), round(hi, 4)],
           "ratio_definition": "median over process pairs of RR total / PP total; 95% percentile bootstrap over "
                               f"pairs ({N_BOOT} resamples, seed 0)",
           "total_definition": "rollout generate + old_logp (pp) + ref_logp + actor_fwd_bwd (+ optimizer when run); "
                               "engine start and model load excluded",
           "per_pair": per_pair, "logp_mismatches": mism,
           "targets": {"rr_pp_upper_ci_le_0.95": hi <= TARGET,
                       "rr_logp_mismatches_zero": all(m == 0 for m in mism)},
           "spec": spec, "arms": {a: _arm_summary([p[a] for p in pairs]) for a in ("pp", "rr")},
           "reference_policy": pairs[0]["rr"]["train"].get("reference_policy"),
           "advantages": pairs[0]["rr"]["train"].get("advantages"),
           "optimizer": pairs[0]["rr"]["train"].get("optimizer", "timed as a phase"),
           "rejected_pairs": rejected, "health_envelope": {"bandwidth_tolerance": health.BANDWIDTH_TOLERANCE,
                                                           "clock_floor": health.CLOCK_FLOOR},
           "incomplete_pair_files": lone or [], "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    att = attribution(pairs)
    if att:
        rep["attribution"] = att
    if not rep["complete"]:
        rep["note"] = (f"{len(pairs)} of the {MIN_PAIRS} pairs the method asks for"
                       + (f" ({len(rejected)} more rejected by the health envelope)" if rejected else "")
                       + ": the interval is not yet meaningful")
    return rep


def markdown(rep: dict, command: str) -> str:
    pp, rr = rep["arms"]["pp"], rep["arms"]["rr"]
    s = rep["spec"]
    lines = [f"# P/P vs R/R on the production stack ({pp['provenance'].get('gpu') or 'device not recorded'})", "",
             f"`{command}`, generated {rep['generated']}.", "",
             f"{rep['pairs']} process pairs" + ("" if rep["complete"] else f" (**incomplete**: {rep['note']})") +
             f"; workload {s['workload']} ({s['sequences']} sequences, {s['response_tokens']} response tokens), "
             f"{s['layers']} layers, micro-batches <= {s['micro_tokens']} tokens, recompute {s['recompute']}.", "",
             f"**RR / PP = {rep['ratio']}** (95% CI over pairs {rep['ratio_ci95'][0]} - {rep['ratio_ci95'][1]}); "
             f"targets: {json.dumps(rep['targets'])}; R/R logp mismatches per pair: {rep['logp_mismatches']}.", "",
             "| phase | P/P s | P/P tok/s | R/R s | R/R tok/s |", "| --- | --- | --- | --- | --- |"]
    for ph in ("rollout_generate", "old_logp", "ref_logp", "actor_fwd_bwd", "optimizer"):
        if ph in pp["phases"] or ph in rr["phases"]:
            cell = lambda arm: (f"{arm['phases'][ph]['median_s']:.3f} | {arm['phases'][ph]['tok_per_s']}"  # noqa: E731
                                if ph in arm["phases"] else "- | -")
            lines.append(f"| {ph} | {cell(pp)} | {cell(rr)} |")
    lines.append(f"| **total** (median / p95) | {pp['total_median_s']:.3f} / {pp['total_p95_s']:.3f} | | "
                 f"{rr['total_median_s']:.3f} / {rr['total_p95_s']:.3f} | |")
    lines += ["", "Peak allocated GiB per trainer phase: P/P " + json.dumps(pp["peak_allocated_gib"]) + "; R/R " +
              json.dumps(rr["peak_allocated_gib"]) + ".", "",
              f"- P/P trainer: {pp['trainer']}; old logp {pp['old_logp_source']}.",
              f"- R/R trainer: {rr['trainer']}; old logp {rr['old_logp_source']}.",
              f"- Reference: {rep['reference_policy']}. Advantages: {rep['advantages']}.",
              f"- Optimizer: {json.dumps(rep['optimizer'])}.",
              "- Provenance P/P: " + json.dumps(pp["provenance"]),
              "- Provenance R/R: " + json.dumps(rr["provenance"]),
              f"- Health (trainer process, before the model loads; copy TB/s, SM MHz): P/P {_health_cell(pp)}; "
              f"R/R {_health_cell(rr)}; pairs rejected by the envelope: "
              f"{json.dumps(rep['rejected_pairs']) if rep['rejected_pairs'] else 'none'}.",
              "",
              "| pair | order | P/P s | R/R s | RR/PP |", "| --- | --- | --- | --- | --- |"]
    for x in rep["per_pair"]:
        lines.append(f"| {x['pair']} | {','.join(x['order'] or [])} | {x['pp_total_s']:.3f} | {x['rr_total_s']:.3f} | "
                     f"{x['ratio']} |")
    att = rep.get("attribution")
    if att:
        lines += ["", f"Attribution (profiled repeats of every phase, {att['pairs_profiled']} pair(s), not counted in "
                      "the totals): device seconds per kernel category summed over the phases, and host idle.", "",
                  "| category | P/P s | R/R s | R/R - P/P |", "| --- | --- | --- | --- |"]
        for k, v in att["summed_over_phases_s"].items():
            lines.append(f"| {k} | {v['pp']:.4f} | {v['rr']:.4f} | {v['rr_minus_pp']:+.4f} |")
    return "\n".join(lines) + "\n"


def _health_cell(arm: dict) -> str:
    probed = {k: arm["health"][k] for k in ("copy_tbps", "sm_clock_mhz")}
    return json.dumps(probed) if any(v is not None for vals in probed.values() for v in vals) else "not probed"


def plot(rep: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    phases = [ph for ph in ("rollout_generate", "old_logp", "ref_logp", "actor_fwd_bwd", "optimizer")
              if any(ph in rep["arms"][a]["phases"] for a in ("pp", "rr"))]
    for x, arm in enumerate(("pp", "rr")):
        bottom = 0.0
        for k, ph in enumerate(phases):
            v = rep["arms"][arm]["phases"].get(ph, {}).get("median_s", 0.0)
            ax1.bar(x, v, bottom=bottom, color=f"C{k}", label=ph if x == 0 else None)
            bottom += v
    ax1.set_xticks([0, 1], ["P/P", "R/R"])
    ax1.set_ylabel("seconds (median over pairs)")
    ax1.set_title("phases per arm")
    ax1.legend(fontsize=8)
    r = [x["ratio"] for x in rep["per_pair"]]
    ax2.plot(range(len(r)), r, "o", label="pair RR/PP")
    ax2.axhline(rep["ratio"], color="k", label=f"median {rep['ratio']}")
    ax2.axhspan(*rep["ratio_ci95"], color="k", alpha=0.1, label="95% CI over pairs")
    ax2.axhline(TARGET, color="r", ls="--", label=f"target {TARGET}")
    ax2.set_xticks(range(len(r)), [str(x["pair"]) for x in rep["per_pair"]])
    ax2.set_xlabel("pair")
    ax2.set_title(f"RR / PP per pair ({rep['pairs']} pairs" + ("" if rep["complete"] else ", incomplete") + ")")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(dirs: list[str], out: str) -> dict:
    """Writes ``out`` (JSON), ``<stem>.md`` and ``<stem>.png``; returns the record."""
    import sys

    pairs, lone = load_pairs(dirs)
    rep = summarize(pairs, lone)
    command = "python -m rlk.integrations.production.bench report --results " + " ".join(dirs) + f" --out {out}"
    rep["command"] = command
    stem = os.path.splitext(out)[0]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    try:
        plot(rep, stem + ".png")
    except Exception as e:  # the numbers are still written
        rep["png_error"] = f"{type(e).__name__}: {e}"
        print(f"report: no plot ({rep['png_error']})", file=sys.stderr)
    with open(out, "w") as f:
        json.dump(rep, f, indent=1)
        f.write("\n")
    with open(stem + ".md", "w") as f:
        f.write(markdown(rep, command))
    return rep
