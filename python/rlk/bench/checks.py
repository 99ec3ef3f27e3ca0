"""The executor-vs-executor paired e2e at the gate's former L5 size: a diagnostic, not a gate check.

The release gate's L5 (profile ``h200``) is the production comparison
(``rlk.integrations.production.checks``: stock vLLM + megatron-core's native trainer against
vLLM + rlk + megatron-core on rlk's spec). This module keeps rlk's own comparison, both arms on
rlk's rollout executor and trainer (``P`` = rlk's native torch route), named as what it is:
:func:`e2e_paired` runs :func:`rlk.bench.e2e.run_e2e` at :data:`L5_ARGS` (Qwen3-8B shapes, 2
layers, 8 sequences, 3 repetitions of 10 measured steps per arm, decode as CUDA graphs) and
:func:`evaluate` applies the same rules the gate applied:

* every strict step's readback compared the old logp with the rollout logp and found no mismatch
  (``equality.compared_elements > 0`` and ``mismatch_count == 0``: all readbacks present);
* the two arms' provenance records differ in the route only (no fallback, same stack);
* at least one pair survived the health envelope; and
* the upper bound of the R/R / P/P 95% interval is at or below the target (0.95).

``L5_ARGS`` / :func:`l5_spec` also size the host-profile and LM-head probes.
"""

from __future__ import annotations

import argparse
import os

from rlk.gate.registry import CheckResult

# The size of the former L5 run: one 10-minute device call holds it (~110 s in docs/results/e2e_h200_2026-12-01_40d2b14.md).
L5_ARGS = dict(layers=2, sequences=8, prompt_range=(64, 256), response_range=(32, 64), max_batch=8,
               reps=3, steps=10, config="qwen3-8b", device=None, rollout_graphs="on", step_logp=True,
               profile=False)


def l5_spec(device: str = "cuda", **overrides):
    """The :class:`rlk.bench.workload.WorkloadSpec` of the L5 size (``overrides`` replace fields:
    smaller sizes for CPU smoke tests, ``step_logp``, ...)."""
    from rlk.bench.workload import WorkloadSpec

    size = {k: L5_ARGS[k] for k in ("config", "layers", "sequences", "prompt_range", "response_range", "max_batch")}
    graphs = {"on": True, "off": False}.get(L5_ARGS["rollout_graphs"]) if device == "cuda" else False
    return WorkloadSpec(**{**size, "rollout_graphs": graphs, **overrides}, device=device)


def evaluate(rep: dict) -> CheckResult:
    """Pass/fail of an e2e report (``rlk.bench.e2e.analyse``'s dict)."""
    from rlk.bench.e2e import TARGET

    eq = rep.get("equality") or {}
    problems = []
    if not eq.get("compared_elements"):
        problems.append("no strict readback compared old logp with rollout logp")
    elif eq.get("mismatch_count"):
        problems.append(f"strict old logp != rollout logp: {eq['mismatch_count']} of {eq['compared_elements']}")
    if rep.get("provenance_differences"):
        problems.append(f"arms differ beyond the route: {rep['provenance_differences']}")
    lo, hi = rep["ratio_ci95"]
    target = rep.get("target", TARGET)
    if hi > target:
        problems.append(f"ratio upper bound {hi:.3f} > target {target}")
    detail = (f"R/R / P/P = {rep['ratio']:.3f} [{lo:.3f}, {hi:.3f}] (target <= {target}); reuse "
              f"{rep.get('ratio_reuse')}; readbacks {eq.get('compared_elements', 0)} elements, "
              f"{eq.get('mismatch_count', 'n/a')} mismatches; {rep.get('steps_compared')} paired steps")
    if problems:
        detail += "; FAILED: " + "; ".join(problems)
    metrics = {"ratio": rep["ratio"], "ratio_ci95": rep["ratio_ci95"], "ratio_reuse": rep.get("ratio_reuse"),
               "phase_ratios": rep.get("phase_ratios"), "equality": eq}
    return CheckResult(not problems, detail, metrics)


def e2e_paired(ctx) -> CheckResult:
    import json

    from rlk.bench import e2e

    out = os.path.join(ctx.out_dir, "e2e")
    args = argparse.Namespace(out=out, **L5_ARGS)
    ctx.progress(f"L5 e2e: {L5_ARGS}")
    e2e.run_e2e(args)
    with open(os.path.join(out, "e2e_h200.json")) as f:
        rep = json.load(f)
    return evaluate(rep)
