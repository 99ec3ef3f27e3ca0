"""The RL loop over rlk's model: GRPO on a synthetic, checkable task, strict and native routes.

    python -m rlk.rl --route both --steps 12 --out out/rl      # ~5 min on a 2-core CPU (strict arm)
    python -m rlk.rl --route native --steps 12 --out out/rl    # seconds

One step: the rollout engine (rlk's replay executor over the model's own weight copy) samples
``group_size`` responses per prompt and records each sampled token's logp; the reward is the
fraction of response bytes equal to the target byte (:mod:`rlk.rl.task`); GRPO advantages
``(r - mean) / (std + eps)`` within each group (:mod:`rlk.rl.grpo`); the actor loss is PPO's
clipped surrogate with ``ratio = exp(logp_train - logp_rollout)``, the rollout logp reused as the
old logp (no recompute); backward through the route's ops, Adam on fp32 master weights; the bf16
weights go into the engine in place, sha256-fingerprinted on both sides (:mod:`rlk.rl.sync`: a
mismatch or a stale generation aborts with :class:`rlk.rl.sync.WeightSyncError`).

* **strict**: every ratio must be exactly 1.0 and every trainer logp bitwise the rollout's, at
  every step; ``ratio_not_one`` and ``logp_mismatch`` count the tokens that are not (the latter is
  stricter: a logp difference below half an ulp of 1.0 still gives ratio 1.0).
* **native**: the ratio's spread per step (min, max, and the mean, p01, p50, p99 and max of
  ``|ratio - 1|``): the drift between the native route's two execution patterns.

Outputs (:func:`rlk.rl.loop.run_and_report`): one JSON line per step (stdout and
``steps.jsonl``), ``rl_loop_cpu.json`` (every step record per arm, summaries, provenance) and
``rl_loop_cpu.png`` (reward and ratio statistics per arm). The release gate's ``L5 rl.loop``
(profile ``cpu``, :mod:`rlk.rl.checks`) runs 3 strict steps and a native arm and fails on any
ratio that is not 1.0, any logp bit that differs, or any unverified sync.

Modules: ``task`` (prompts, reward), ``grpo`` (advantages, loss, ratio statistics), ``sync``
(fingerprinted weight sync), ``loop`` (trainer, engine, the loop, reports), ``report`` (JSON,
PNG), ``checks`` (gate), ``__main__`` (command line).
"""
