"""Release-gate check of ladder L5 on profile ``cpu``: the short integrated RL loop.

``L5:rl.loop`` runs :func:`rlk.rl.loop.run_and_report` on the trained ``tiny`` model for
``GATE_STEPS`` GRPO steps on both routes (rlk's replay executor as the rollout engine, rlk's
trainer pattern as the actor, Adam, fingerprinted weight sync after every step) and fails when

* any token of any strict step has an importance ratio ``exp(logp_train - logp_rollout)`` other
  than exactly 1.0, or trainer and rollout logp differ in any bit (``ratio_not_one``,
  ``logp_mismatch``); the rollout logp is the old logp (reused, no recompute);
* a weight sync's fingerprints differ (the loop raises :class:`rlk.rl.sync.WeightSyncError`) or a
  step rolls out with a stale weight generation;
* the comparison could not have failed: the native arm's trainer and rollout logp must differ
  somewhere over its steps (as L4's discrimination rule), or the strict arm compared no tokens.

The reward trend is reported (metrics ``reward_*``), not gated: a 3-step run is too short to
require it; ``python -m rlk.rl --min-reward-gain`` gates it on longer runs.
"""

from __future__ import annotations

import os

from rlk.gate.registry import CheckResult, register_check

GATE_STEPS = 3
# Gate size: one prompt x 8 samples x 4 tokens per step (about 19 s per strict step under the
# Triton interpreter on a 2-core machine, 58 s for the check; the native arm takes about a second).
GATE_LOOP = dict(steps=GATE_STEPS, prompts_per_step=1, group_size=8, response_len=4, lr=3e-3, seed=0)


def evaluate(report: dict) -> CheckResult:
    """The gate verdict of a :func:`rlk.rl.loop.run_and_report` report of both routes."""
    failures = list(report["failures"])
    strict, native = report["arms"].get("strict"), report["arms"].get("native")
    if strict is None:
        failures.append("the strict arm did not run")
    elif not strict["summary"].get("tokens"):
        failures.append("strict arm compared no tokens")
    if native is None:
        failures.append("the native arm did not run (discrimination unproven)")
    elif native["summary"]["logp_mismatch"] == 0:
        failures.append(f"not discriminating: native trainer and rollout logp equal over "
                        f"{native['summary']['tokens']} tokens")
    s = strict["summary"] if strict else {}
    n = native["summary"] if native else {}
    detail = (f"strict: {s.get('steps')} steps, ratio_not_one {s.get('ratio_not_one')} and logp_mismatch "
              f"{s.get('logp_mismatch')} of {s.get('tokens')} tokens, {s.get('syncs_verified')} weight syncs verified "
              f"(sha256 both sides), reward {s.get('reward_first', float('nan')):.3f} -> "
              f"{s.get('reward_last', float('nan')):.3f}; native: ratio_not_one {n.get('ratio_not_one')} of "
              f"{n.get('tokens')} tokens, |ratio-1| max {n.get('abs_dev_max', float('nan')):.3g}")
    metrics = {"strict": s, "native": n, "reward_first": s.get("reward_first"), "reward_last": s.get("reward_last"),
               "reward_gain": s.get("reward_gain"), "files": report.get("files")}
    return CheckResult(not failures, f"{'; '.join(failures)} ({detail})" if failures else detail, metrics)


@register_check("L5", "rl.loop", profiles=("cpu",))
def rl_loop(ctx) -> CheckResult:
    from rlk.rl import loop
    from rlk.rl.report import step_line

    lc = loop.LoopConfig(**GATE_LOOP)
    ctx.progress(f"L5 rl.loop: {GATE_LOOP}, routes strict and native")
    report = loop.run_and_report(lc, ["strict", "native"], os.path.join(ctx.out_dir, "rl_loop"),
                                 on_step=lambda rec: ctx.progress("  " + step_line(rec)))
    return evaluate(report)
