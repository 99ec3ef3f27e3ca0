"""Paired P/P vs R/R benchmark on frozen replay (the performance gate).

    python -m rlk.bench e2e --out DIR [--reps 3] [--steps 3] [--layers 4] [--sequences 32]

Method (declared up front, applied by code):
* The arms alternate P, R, P, R, ... each in its own process; ``--reps`` independent pairs.
* Warm-up rule: the first step of every process is excluded (compilation, allocator growth).
* Each later step is timed per phase with CUDA events and synchronized wall time; the step total
  is the sum of the phases' wall times.
* Pairing: step j of the P process of repetition i pairs with step j of the R process of i.
  Ratio = median R/R step / median P/P step over kept pairs, with a paired-bootstrap 95%
  interval; p95 step time per arm.
* Health: copy bandwidth and GPU state probed in each process before its steps; a pair outside
  the envelope of ``rlk.bench.health`` is rejected and listed.
* Reuse variant: R/R step without the old-logp recompute, allowed only if in the same run the
  strict old logp equals the rollout logp bitwise (checked on every step's data); fails closed.
* Profiled runs (``--profile``) are separate processes and never feed the ratio.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from rlk.bench import health, report, stats
from rlk.bench.workload import PHASES

TARGET = 0.95


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_arm(args) -> int:
    """Child process: one arm, ``steps + 1`` steps (the first is warm-up), JSON to ``--json``."""
    import torch

    from rlk import determinism, provenance
    from rlk.bench.workload import Workload, WorkloadSpec

    determinism.apply_strict_env()
    spec = WorkloadSpec(**json.loads(args.spec))
    hp = health.probe()
    wl = Workload(spec, args.route)
    steps = []
    for j in range(args.steps + 1):
        rec = wl.step(check_equality=(args.route == "strict"))
        rec["warmup"] = j == 0
        rec["step"] = j
        steps.append(rec)
        _say(f"{args.route} step {j}{' (warm-up)' if j == 0 else ''}: {rec['step_s'] * 1e3:.1f} ms "
             + " ".join(f"{p}={rec[p + '_s'] * 1e3:.1f}" for p in PHASES))
    out = {
        "route": args.route,
        "spec": spec.to_dict(),
        "tokens": {"response": wl.response_tokens, "total": wl.total_tokens},
        "health": hp,
        "steps": steps,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "provenance": provenance.capability_record(route=args.route, extra={"bench": "e2e", "spec": spec.to_dict()}),
    }
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2, default=str)
    return 0


def _spawn(route: str, spec: dict, steps: int, path: str) -> dict:
    cmd = [sys.executable, "-m", "rlk.bench", "arm", "--route", route, "--steps", str(steps),
           "--spec", json.dumps(spec), "--json", path]
    subprocess.run(cmd, check=True)
    with open(path) as f:
        return json.load(f)


def analyse(arms: list[tuple[dict, dict]], target: float = TARGET) -> tuple[dict, list[dict]]:
    """Pairs (native, strict) per repetition -> report dict and flat per-step rows."""
    from rlk.provenance import differences

    reasons = health.reject_pairs([{"native": n["health"], "strict": s["health"]} for n, s in arms])
    nat, strc, reuse, rows = [], [], [], []
    equality = {"compared_elements": 0, "mismatch_count": 0}
    phase = {"native": {p: [] for p in PHASES}, "strict": {p: [] for p in PHASES}}
    for i, ((n, s), why) in enumerate(zip(arms, reasons)):
        for arm in (n, s):
            for st in arm["steps"]:
                rows.append({"rep": i, "route": arm["route"], "rejected": bool(why),
                             **{k: v for k, v in st.items() if not isinstance(v, dict)}})
        if why:
            continue
        ns = [st for st in n["steps"] if not st["warmup"]]
        ss = [st for st in s["steps"] if not st["warmup"]]
        for a, b in zip(ns, ss):
            nat.append(a["step_s"])
            strc.append(b["step_s"])
            reuse.append(b["step_reuse_s"])
            for p in PHASES:
                phase["native"][p].append(a[f"{p}_s"])
                phase["strict"][p].append(b[f"{p}_s"])
        for b in s["steps"]:
            eq = b.get("equality") or {}
            equality["compared_elements"] += eq.get("compared_elements", 0)
            equality["mismatch_count"] += eq.get("mismatch_count", 0)
    if not nat:
        raise RuntimeError("every pair was rejected by the health envelope; no ratio")
    r, lo, hi = stats.paired_bootstrap_ratio(strc, nat)
    rep = {
        "title": f"rlk e2e frozen replay: R/R vs P/P ({arms[0][0]['spec']['config']}, "
                 f"{arms[0][0]['spec']['layers']} layers, {arms[0][0]['spec']['sequences']} sequences)",
        "target": target,
        "method": __doc__.split("Method")[1].strip() if __doc__ else "",
        "spec": arms[0][0]["spec"],
        "tokens": arms[0][0]["tokens"],
        "pairs": len(arms), "pairs_rejected": [w for w in reasons if w],
        "steps_compared": len(nat),
        "ratio": r, "ratio_ci95": [lo, hi],
        "p95_step_s": {"native": stats.percentile(nat, 95), "strict": stats.percentile(strc, 95)},
        "phase_medians_s": {a: {p: stats.median(v) for p, v in phase[a].items()} for a in phase},
        "phase_ratios": {p: stats.median(phase["strict"][p]) / stats.median(phase["native"][p]) for p in PHASES},
        "tokens_per_s": {
            a: {"rollout": arms[0][0]["tokens"]["response"] / stats.median(phase[a]["rollout"]),
                "ref_logp": arms[0][0]["tokens"]["total"] / stats.median(phase[a]["ref_logp"]),
                "actor_fwd_bwd": arms[0][0]["tokens"]["total"] / stats.median(phase[a]["actor_fwd_bwd"])}
            for a in phase},
        "equality": equality,
        "provenance": {"native": arms[0][0]["provenance"], "strict": arms[0][1]["provenance"]},
        "provenance_differences": differences(arms[0][0]["provenance"], arms[0][1]["provenance"],
                                              ignore=("route",)),
    }
    if equality["compared_elements"] > 0 and equality["mismatch_count"] == 0:
        rr, rlo, rhi = stats.paired_bootstrap_ratio(reuse, nat)
        rep.update(ratio_reuse=rr, ratio_reuse_ci95=[rlo, rhi])
    else:  # fail closed: no reuse figure without proven equality in this run
        rep.update(ratio_reuse=None, ratio_reuse_ci95=None,
                   reuse_refused="strict old logp != rollout logp in this run (or not compared)")
    rep["passed"] = hi <= target
    return rep, rows


def run_e2e(args) -> int:
    import torch

    from rlk.bench.workload import WorkloadSpec

    if getattr(args, "device", None) is None:  # every caller (CLI, the gate's L5 check) gets the default
        args.device = "cuda" if torch.cuda.is_available() else "cpu"

    spec = WorkloadSpec(layers=args.layers, sequences=args.sequences, config=args.config,
                        prompt_range=tuple(args.prompt_range), response_range=tuple(args.response_range),
                        max_batch=args.max_batch, device=args.device,
                        rollout_graphs={"auto": None, "on": True, "off": False}[getattr(args, "rollout_graphs", "auto")],
                        step_logp=bool(getattr(args, "step_logp", True)),
                        ).to_dict()
    os.makedirs(args.out, exist_ok=True)
    arms = []
    for i in range(args.reps):
        pair = []
        for route in ("native", "strict"):
            _say(f"repetition {i + 1}/{args.reps}: {route} arm")
            pair.append(_spawn(route, spec, args.steps, os.path.join(args.out, f"arm_{i}_{route}.json")))
        arms.append(tuple(pair))
    rep, rows = analyse(arms)
    paths = report.write_all(args.out, rep, rows, "e2e_h200")
    _say(f"ratio R/R / P/P = {rep['ratio']:.3f} [{rep['ratio_ci95'][0]:.3f}, {rep['ratio_ci95'][1]:.3f}] "
         f"(target <= {TARGET}); reuse: {rep.get('ratio_reuse')}; reports: {paths}")
    if args.profile:
        from rlk.bench import attribution

        attribution.run(spec, args.out)
    return 0 if rep["passed"] else 1
