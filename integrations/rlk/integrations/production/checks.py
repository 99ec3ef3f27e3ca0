"""Release-gate check of ladder L5 (profile ``h200``): P/P vs R/R on the production stack.

``L5:e2e.production`` runs :mod:`rlk.integrations.production.bench` at a size that fits one
10-minute device call while keeping the issue's floor: Qwen3-8B shapes at full depth (36
layers), workload W1 (64 sequences, responses up to 1024 tokens), ``PAIRS`` process pairs of a
stock-vLLM + native-megatron arm and a vLLM+rlk + megatron-on-rlk arm. It passes only when

* every pair completed (both arm files, the R/R arm's bitwise check included);
* R/R's rollout logp equalled its actor forward's logp for every token of every pair
  (``logp_mismatches == 0``); and
* the upper bound of the RR / PP interval over pairs is at or below :data:`TARGET` (with one or two
  pairs the "interval" is the pairs' range: the gate is then stricter than the 5-pair report).

It needs vLLM and megatron-core (the H200 bundle: run the gate under
``eval "$(bash ci/vllm_bundle.sh env)"``); without them it fails and says so. The checkpoint is
written once by :func:`rlk.integrations.vllm.engine_bench.prepare` (reused when present, under
``$RLK_VLLM_DIR/ckpt`` or the gate's output folder). The pairs live in ``<gate out>/production``
and complete pairs there are skipped, like every ``pairs`` run: pairs run into that folder
beforehand by ``bench pairs`` (the same tree and machine, several calls) are the ones L5 judges
(``ci/h200_vllm.sh``: ``PROD_RESULTS``, ``GATE_ENV``). rlk's executor-vs-executor e2e
(``python -m rlk.bench``) stays a diagnostic outside the gate.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from rlk.gate.registry import CheckResult, register_check

TARGET = 0.95
# One pair takes about 4.5 minutes on the H200 (two vLLM engine starts, two 16 GB model loads);
# RLK_GATE_L5_PAIRS raises it when several calls are spent on the gate.
PAIRS = 1
L5_ARGS = dict(workload="W1", micro_tokens=16384, recompute="full", config="qwen3-8b", seed=0,
               recipe="calibrated.v1")


def evaluate(rep: dict, pairs_wanted: int) -> CheckResult:
    """Pass/fail of a production report (``report_bench.summarize``'s dict)."""
    problems = []
    if rep.get("pairs", 0) < pairs_wanted:
        problems.append(f"{rep.get('pairs', 0)} of {pairs_wanted} pairs completed")
    if rep.get("incomplete_pair_files"):
        problems.append(f"pairs with one arm only: {rep['incomplete_pair_files']}")
    mism = rep.get("logp_mismatches") or []
    if not mism or any(m != 0 for m in mism):
        problems.append(f"R/R rollout logp != actor logp: mismatches per pair {mism}")
    lo, hi = rep["ratio_ci95"]
    if hi > TARGET:
        problems.append(f"RR / PP upper bound {hi:.3f} > target {TARGET}")
    spec = rep.get("spec") or {}
    detail = (f"RR / PP = {rep['ratio']:.3f} [{lo:.3f}, {hi:.3f}] over {rep.get('pairs')} pair(s) (target <= "
              f"{TARGET}); {spec.get('layers')} layers, {spec.get('sequences')} sequences, workload "
              f"{spec.get('workload')}; R/R logp mismatches {mism}")
    if problems:
        detail += "; FAILED: " + "; ".join(problems)
    return CheckResult(not problems, detail, {"ratio": rep["ratio"], "ratio_ci95": rep["ratio_ci95"],
                                              "pairs": rep.get("pairs"), "logp_mismatches": mism, "spec": spec})


def _missing_engines() -> list[str]:
    return [m for m in ("vllm", "megatron.core") if importlib.util.find_spec(m.split(".")[0]) is None
            or importlib.util.find_spec(m) is None]


@register_check("L5", "e2e.production", profiles=("h200",))
def e2e_production(ctx) -> CheckResult:
    missing = _missing_engines()
    if missing:
        return CheckResult(False, f"L5 needs {', '.join(missing)} importable (the H200 vLLM bundle: "
                                  "eval \"$(bash ci/vllm_bundle.sh env)\" before the gate)")
    import json

    n = int(os.environ.get("RLK_GATE_L5_PAIRS", PAIRS))
    a = L5_ARGS
    ckpt = os.path.join(os.environ.get("RLK_VLLM_DIR") or ctx.out_dir, "ckpt")
    results = os.path.join(ctx.out_dir, "production")
    out = os.path.join(results, "e2e_production_h200.json")
    # The benches are tools (the layer rule keeps them out of library imports): run their CLIs.
    steps = [
        ("checkpoint", ["-m", "rlk.integrations.vllm.engine_bench", "prepare", "--dir", ckpt, "--config", a["config"],
                        "--seed", str(a["seed"]), "--recipe", a["recipe"]]),
        (f"{n} pair(s)", ["-m", "rlk.integrations.production.bench", "pairs", "--dir", ckpt, "--results", results,
                          "--n", str(n), "--workload", a["workload"], "--micro-tokens", str(a["micro_tokens"]),
                          "--recompute", a["recompute"]]),
        ("report", ["-m", "rlk.integrations.production.bench", "report", "--results", results, "--out", out]),
    ]
    for what, args in steps:
        ctx.progress(f"L5 production, {what}: python {' '.join(args)}")
        p = subprocess.run([sys.executable] + args)
        if p.returncode != 0:
            why = " (3: R/R failed closed on a logp mismatch)" if p.returncode == 3 else ""
            return CheckResult(False, f"L5 production, {what}: exit status {p.returncode}{why}; files under {results}")
    with open(out) as f:
        rep = json.load(f)
    return evaluate(rep, n)
