"""Release-gate check of ladder L5 on profile ``cpu``: the short integrated RL loop.

``L5:rl.loop`` runs :func:`rlk.rl.loop.run_and_report` on the trained ``tiny`` model for
``GATE_STEPS`` GRPO steps on both routes (rlk's replay executor as the rollout engine, rlk's
trainer pattern as the actor, Adam, fingerprinted weight sync after every step) and fails when

* any token of any strict step has an importance ratio ``exp(logp_train - logp_rollout)`` other
  than exactly 1.0, or trainer and rollout logp differ in any bit (``ratio_not_one``,
  ``logp_mismatch``); the rollout logp is the old logp (reused, no recompute);
* a weight sync's fingerprints differ (the loop raises :class:`rlk.rl.sync.WeightSyncError`) or a
  step rolls out with a stale weight generation;
* the comparison could not have failed: the strict arm compared no tokens, or the **probe**
  (:func:`discrimination_probe`: one more native-route step whose rollout engine, after its
  verified first sync, holds one changed final-norm weight) reported no token with a ratio other
  than 1.

The native arm's own drift (trainer vs rollout logp over its steps) is reported, not required: it
depends on the machine's torch kernels. On CPUs whose bf16 GEMMs are batch invariant at the tiny
model's widths (e.g. oneDNN on AMX: 0 of 144 tokens differ) the native route agrees bit for bit,
while elsewhere it drifts (375 of 576 tokens in ``docs/results/rl_loop_cpu.json``); the probe
makes the gate's discrimination independent of that.

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


def discrimination_probe(**loop_kw) -> dict:
    """The arm record (:func:`rlk.rl.loop.run_arm`) of one native-route loop step (``loop_kw``:
    :class:`rlk.rl.loop.LoopConfig` fields; route and steps are the probe's) whose engine, after the verified initial sync, holds ``model.norm.weight[0] * 1.5 +
    0.25`` while the trainer keeps the synced value: every rollout logp then comes from other
    weights, and a loop whose comparison works reports ``ratio_not_one > 0``."""
    from rlk.rl import loop

    def change_one_weight(generation, engine):
        if generation == 0:
            w = engine.w["model.norm.weight"]
            w[0] = w[0] * 1.5 + 0.25

    lc = loop.LoopConfig(**{**loop_kw, "route": "native", "steps": 1})
    return loop.run_arm(lc, hooks=loop.Hooks(after_sync=change_one_weight))


def evaluate(report: dict, probe: dict | None) -> CheckResult:
    """The gate verdict of a :func:`rlk.rl.loop.run_and_report` report of both routes and the
    :func:`discrimination_probe` arm (None: not run)."""
    failures = list(report["failures"])
    strict, native = report["arms"].get("strict"), report["arms"].get("native")
    if strict is None:
        failures.append("the strict arm did not run")
    elif not strict["summary"].get("tokens"):
        failures.append("strict arm compared no tokens")
    if native is None:
        failures.append("the native arm did not run")
    p = probe["summary"] if probe is not None else {}
    if probe is None:
        failures.append("the discrimination probe did not run")
    elif not p.get("ratio_not_one"):
        failures.append(f"not discriminating: an engine holding a changed weight gave no ratio != 1 over "
                        f"{p.get('tokens')} tokens")
    s = strict["summary"] if strict else {}
    n = native["summary"] if native else {}
    detail = (f"strict: {s.get('steps')} steps, ratio_not_one {s.get('ratio_not_one')} and logp_mismatch "
              f"{s.get('logp_mismatch')} of {s.get('tokens')} tokens, {s.get('syncs_verified')} weight syncs verified "
              f"(sha256 both sides), reward {s.get('reward_first', float('nan')):.3f} -> "
              f"{s.get('reward_last', float('nan')):.3f}; native: ratio_not_one {n.get('ratio_not_one')} of "
              f"{n.get('tokens')} tokens, |ratio-1| max {n.get('abs_dev_max', float('nan')):.3g}"
              f"{' (this machine: native kernels agree bit for bit)' if n and n.get('logp_mismatch') == 0 else ''}"
              f"; probe (engine weight changed): ratio_not_one {p.get('ratio_not_one')} of {p.get('tokens')} tokens")
    metrics = {"strict": s, "native": n, "probe": p, "reward_first": s.get("reward_first"), "reward_last": s.get("reward_last"),
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
    probe = discrimination_probe(**GATE_LOOP)
    ctx.progress(f"  probe (engine weight changed after sync): ratio_not_one {probe['summary']['ratio_not_one']} "
                 f"of {probe['summary']['tokens']} tokens")
    return evaluate(report, probe)
