"""Release-gate checks of the replay ladder levels (profiles ``cpu`` and ``h200``).

* L1 ``replay.repeat``: the trainer pattern twice (reference logp bitwise equal), the actor
  pattern twice (logp and every gradient bitwise equal), the rollout replayed on the frozen
  tokens equal to the recorded rollout logp, and "graph vs eager": the frozen-token rollout with
  decode steps padded to batch buckets and replayed as CUDA graphs (on CPU, where there are no
  graphs: the padded buckets run eagerly, and the detail says so) equal to the recorded
  (unpadded, eager) rollout logp, once with the forced-token logp inside the steps
  (``RolloutConfig.step_logp``, the default) and once with the eager LM head after each step.
* L2 ``replay.shape_invariance``: the trainer with another packing order and micro-batching,
  and the rollout with other batch caps, chunk sizes, page layouts and no jitter, all bitwise
  equal to the recorded logp.
* L4 ``replay.engine``: trainer pattern vs rollout pattern on a frozen fixture: mismatch_count 0;
  the native route's figures reported beside it. Discrimination: on the same fixture the native
  trainer must differ from the strict trainer and from the native rollout (a fixture or route on
  which they are equal is "not discriminating": the comparison could not have failed); the
  counts are in the result.

Every check first applies the fixture's distribution health rule (:mod:`rlk.replay.health`:
entropy, sampled logp exactly 0.0, NaN/Inf) and fails closed on a degenerate fixture, naming the
statistic, before any comparison. Fixtures use the ``calibrated.v1`` weight recipe.

``cpu``: the tiny model under the Triton interpreter, on the recipe's random weights and (L4
``replay.engine_trained``) on the checked-in trained ``tiny`` checkpoint. ``h200``: Qwen3-8B shape for L4 (all 36
layers, 64 sequences: :mod:`rlk.replay.h200`), Qwen3-1.7B shape (28 layers) for L1/L2.
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch

from rlk.gate.registry import CheckResult, register_check
from rlk.replay import health
from rlk.testing.asserts import first_difference

_FIXTURES: dict = {}


def _params(profile: str) -> dict:
    if profile == "cpu":
        return dict(config="tiny", device="cpu", sequences=8, prompt_range=(3, 20), response_range=(2, 12),
                    block_size=16, max_batch=4, chunk_size=16, arrival_spread=6, microbatch=24,
                    variants=[dict(max_batch=2, chunk_size=5, page_seed=11, jitter=0.0),
                              dict(max_batch=8, chunk_size=7, page_seed=12, jitter=0.5, token_budget=9)])
    return dict(config="qwen3-1.7b", device="cuda", sequences=16, prompt_range=(64, 700), response_range=(8, 96),
                block_size=16, max_batch=12, chunk_size=512, arrival_spread=24, microbatch=2048,
                variants=[dict(max_batch=3, chunk_size=64, page_seed=11, jitter=0.0),
                          dict(max_batch=16, chunk_size=200, page_seed=12, jitter=0.5, token_budget=300)])


def _fixture(profile: str, progress, weights: str = "random"):
    """The recorded strict fixture of ``profile`` (built once per process and ``weights``):
    ``"random"`` (the recipe's seeded weights) or ``"trained"`` (the checked-in trained ``tiny``
    checkpoint, :func:`rlk.models.qwen3.trained_tiny_path`; cpu profile)."""
    from rlk.replay import harness, rollout

    key = (profile, weights)
    if key not in _FIXTURES:
        p = _params(profile)
        if weights == "trained":
            from rlk.models.qwen3 import trained_tiny_path

            spec = harness.ModelSpec(config=p["config"], seed=None, device=p["device"],
                                     checkpoint=trained_tiny_path())
        else:
            spec = harness.ModelSpec(config=p["config"], seed=0, device=p["device"])
        reqs = harness.make_requests(p["sequences"], p["prompt_range"], p["response_range"], spec.cfg().vocab_size,
                                     seed=0, arrival_spread=p["arrival_spread"])
        # Recorded eagerly, unpadded: the reference of L1's "graph vs eager" (L2/L4 replay the same way).
        rc = rollout.RolloutConfig(block_size=p["block_size"], max_batch=p["max_batch"], chunk_size=p["chunk_size"],
                                   cuda_graphs=False, pad_decode=False)
        progress(f"replay[{profile}]: recording {len(reqs)} sequences on {spec.config} ({weights} weights)")
        fx, res = harness.record(spec, reqs, rc, route="strict", progress=progress)
        _FIXTURES[key] = (fx, res, p)
    return _FIXTURES[key]


def _degenerate(fx, level: str) -> CheckResult | None:
    """A failing result when the fixture's distribution is degenerate (fail closed), else None."""
    bad = health.fixture_failures(fx)
    if not bad:
        return None
    return CheckResult(False, f"{level}: degenerate fixture: " + "; ".join(bad),
                       {"distribution": health.fixture_stats(fx), "health_failures": bad})


def discrimination_failures(native_vs_rollout: dict | None, native_vs_strict: dict | None) -> list[str]:
    """L4's requirement that the comparison could fail: the native trainer differs from the
    native rollout and from the strict trainer on the same fixture (``compare_logp`` dicts)."""
    out = []
    for name, c in (("native trainer vs native rollout", native_vs_rollout),
                    ("native trainer vs strict trainer", native_vs_strict)):
        if not c or not c.get("compared_elements"):
            out.append(f"not discriminating: {name} not compared")
        elif c["mismatch_count"] == 0:
            out.append(f"not discriminating: {name} equal over {c['compared_elements']} elements")
    return out


def _save(ctx, name, obj):
    os.makedirs(ctx.out_dir, exist_ok=True)
    path = os.path.join(ctx.out_dir, name)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
    return path


def _eq_lists(a, b):
    from rlk.replay.compare import compare_logp

    return compare_logp(a, b)


@register_check("L4", "replay.engine", profiles=("cpu", "h200"))
def replay_engine(ctx) -> CheckResult:
    if ctx.profile == "h200":
        from rlk.replay import h200

        s = h200.run(os.path.join(ctx.out_dir, "replay_h200"), progress=ctx.progress)
        nat = s.get("native", {})
        failures = health.failures(s.get("distribution"), s["model"]["vocab_size"])
        exact = s["mismatch_count"] == 0 and s["max_abs_diff"] == 0 and s["torch_equal"]
        if not (exact and s["compared_elements"] > 0):
            failures.append(f"strict trainer vs rollout: {s['mismatch_count']} of {s['compared_elements']} differ")
        failures += discrimination_failures(nat or None, nat.get("vs_strict"))
        detail = (f"Qwen3-8B shape: mismatch_count={s['mismatch_count']} of {s['compared_elements']}, "
                  f"native trainer vs rollout: {nat.get('mismatch_count')} differ, native vs strict: "
                  f"{(nat.get('vs_strict') or {}).get('mismatch_count')} differ; "
                  f"{health.summary(s.get('distribution'))}")
        return CheckResult(not failures, f"{'; '.join(failures)} ({detail})" if failures else detail,
                           {"strict": s, "native": nat, "distribution": s.get("distribution")})
    return _l4_cpu(ctx, "random")


@register_check("L4", "replay.engine_trained", profiles=("cpu",))
def replay_engine_trained(ctx) -> CheckResult:
    """L4 on the checked-in trained ``tiny`` model (a trained model's distribution, not a recipe's)."""
    return _l4_cpu(ctx, "trained")


def _l4_cpu(ctx, weights: str) -> CheckResult:
    from rlk.replay import compare, fixture, harness

    fx, res, p = _fixture(ctx.profile, ctx.progress, weights)
    suffix = "" if weights == "random" else f"_{weights}"
    fixture.save(fx, os.path.join(ctx.out_dir, f"replay_fixture{suffix}"))
    bad = _degenerate(fx, "L4")
    if bad is not None:
        return bad
    strict = harness.check(fx, "strict", progress=ctx.progress)
    native = harness.check(fx, "native", progress=ctx.progress)
    native["native_vs_strict"] = compare.compare_logp(native["_trainer_logp"], strict["_trainer_logp"])
    summary = harness.headline(strict, native, {"rollout_steps": res.steps,
                                                "composition_changes": res.composition_changes,
                                                "distribution": fx.meta["distribution"]})
    summary["weights"] = fx.meta["weights"]
    _save(ctx, f"replay_l4{suffix}.json", {"strict": harness.public(strict), "native": harness.public(native),
                                           "summary": summary})
    t = strict["trainer_vs_recorded"]
    n_lens = len(set(fx.response_lens)), len(set(fx.prompt_lens))
    failures = []
    if t["mismatch_count"] or not t["torch_equal"] or t["compared_elements"] == 0:
        failures.append(f"strict trainer vs rollout: {t['mismatch_count']} of {t['compared_elements']} differ")
    if strict["trainer_vs_rollout"]["mismatch_count"]:
        failures.append("strict trainer vs replayed rollout differ")
    failures += discrimination_failures(native["trainer_vs_rollout"], native["native_vs_strict"])
    if len(fx.prompts) < 8 or min(n_lens) < 2:
        failures.append("fixture too uniform")
    n = native["trainer_vs_rollout"]
    detail = (f"strict: mismatch_count={t['mismatch_count']} of {t['compared_elements']} over {len(fx.prompts)} "
              f"sequences; native trainer vs rollout: {n['mismatch_count']} differ (max {n['max_abs_diff']:.3g}); "
              f"native vs strict: {native['native_vs_strict']['mismatch_count']} differ; "
              f"{health.summary(fx.meta['distribution'])}")
    return CheckResult(not failures, "; ".join(failures) or detail, summary)


@register_check("L1", "replay.repeat", profiles=("cpu", "h200"))
def replay_repeat(ctx) -> CheckResult:
    from rlk.replay import harness, rollout, trainer

    fx, res, p = _fixture(ctx.profile, ctx.progress)
    bad = _degenerate(fx, "L1")
    if bad is not None:
        return bad
    model = harness.build_model(harness.spec_of(fx), "strict")
    failures, metrics = [], {}
    a, _, _ = trainer.score(model, fx.prompts, fx.responses)
    b, _, _ = trainer.score(model, fx.prompts, fx.responses)
    metrics["trainer_repeat"] = _eq_lists(a, b)
    if metrics["trainer_repeat"]["mismatch_count"]:
        failures.append("trainer logp differs run to run")
    # Actor (autograd) twice: a subset of sequences keeps the backward affordable.
    k = min(4, len(fx.prompts))
    ga = trainer.score(model, fx.prompts[:k], fx.responses[:k], actor=True)
    gb = trainer.score(model, fx.prompts[:k], fx.responses[:k], actor=True)
    metrics["actor_logp_repeat"] = _eq_lists(ga[0], gb[0])
    bad = [n for n in ga[1] if first_difference(ga[1][n], gb[1][n]) is not None]
    metrics["actor_grads"] = {"tensors": len(ga[1]), "differing": bad}
    if bad or metrics["actor_logp_repeat"]["mismatch_count"]:
        failures.append(f"actor logp/grads differ run to run: {bad[:3]}")
    if metrics["actor_logp_repeat"]["mismatch_count"] == 0 and _eq_lists(ga[0], a[:k])["mismatch_count"]:
        failures.append("actor logp differs from reference logp")
    rep = rollout.run_rollout(model, harness.requests_of(fx), rollout.RolloutConfig(**fx.meta["rollout"]),
                              forced=fx.responses)
    metrics["rollout_repeat"] = _eq_lists(rep.logp, fx.rollout_logp)
    if metrics["rollout_repeat"]["mismatch_count"]:
        failures.append("rollout replay differs from the recorded rollout")
    # Graph vs eager: decode steps padded to buckets, as CUDA graphs where there is a GPU; with
    # the forced-token logp inside the steps (step_logp, the default) and with the eager LM head.
    on_gpu = model.device.type == "cuda"
    base = dataclasses.replace(rollout.RolloutConfig(**fx.meta["rollout"]), cuda_graphs=on_gpu, pad_decode=True)
    hows = []
    for key, step_logp in (("graph_vs_eager", True), ("graph_vs_eager_eager_logp", False)):
        gr = rollout.run_rollout(model, harness.requests_of(fx), dataclasses.replace(base, step_logp=step_logp),
                                 forced=fx.responses)
        m = _eq_lists(gr.logp, fx.rollout_logp)
        m.update(cuda_graphs=on_gpu, step_logp=step_logp, graph_captures=gr.graph_captures,
                 graph_replays=gr.graph_replays, bucket_steps=gr.bucket_steps, padded_steps=gr.padded_steps,
                 over_bucket_steps=gr.over_bucket_steps, steps=gr.steps)
        metrics[key] = m
        label = f"graph vs eager (step_logp {'on' if step_logp else 'off'})"
        if on_gpu:
            how = f"CUDA graphs exercised: {gr.graph_captures} captures, {gr.graph_replays} replays, " \
                  f"{gr.padded_steps} padded steps"
            if gr.graph_replays == 0:
                failures.append(f"{label}: no decode step ran as a CUDA graph")
        else:
            how = f"CUDA graphs not exercised (no GPU); padded buckets eager: {gr.padded_steps} padded steps"
        if gr.padded_steps == 0:
            failures.append(f"{label}: no decode step was padded (the comparison shows nothing)")
        if m["mismatch_count"] or m["compared_elements"] == 0:
            failures.append(f"{label}: {m['mismatch_count']} of {m['compared_elements']} logp differ ({how})")
        hows.append(f"step_logp {'on' if step_logp else 'off'}: {how}")
    how = "; ".join(hows)
    _save(ctx, "replay_l1.json", metrics)
    n = sum(m["compared_elements"] for m in metrics.values() if isinstance(m, dict) and "compared_elements" in m)
    return CheckResult(not failures, "; ".join(failures) or f"bitwise equal over {n} logp elements and "
                       f"{len(ga[1])} gradient tensors; graph vs eager: {how}", metrics)


@register_check("L2", "replay.shape_invariance", profiles=("cpu", "h200"))
def replay_shape_invariance(ctx) -> CheckResult:
    from rlk.replay import harness, rollout, trainer

    fx, res, p = _fixture(ctx.profile, ctx.progress)
    bad = _degenerate(fx, "L2")
    if bad is not None:
        return bad
    model = harness.build_model(harness.spec_of(fx), "strict")
    failures, metrics = [], {}
    n = len(fx.prompts)
    order = list(reversed(range(n)))
    lp, _, _ = trainer.score(model, fx.prompts, fx.responses, order=order, microbatch_tokens=p["microbatch"])
    metrics["trainer_reordered_microbatched"] = _eq_lists(lp, fx.rollout_logp)
    for i, v in enumerate(p["variants"]):
        rc = dataclasses.replace(rollout.RolloutConfig(**fx.meta["rollout"]), **v)
        r = rollout.run_rollout(model, harness.requests_of(fx), rc, forced=fx.responses)
        m = _eq_lists(r.logp, fx.rollout_logp)
        m.update(rollout=v, steps=r.steps, max_batch_seen=max(r.batch_sizes), composition_changes=r.composition_changes)
        metrics[f"rollout_variant_{i}"] = m
    for k, m in metrics.items():
        if m["mismatch_count"] or m["compared_elements"] == 0:
            failures.append(f"{k}: {m['mismatch_count']} of {m['compared_elements']} differ")
    _save(ctx, "replay_l2.json", metrics)
    total = sum(m["compared_elements"] for m in metrics.values())
    return CheckResult(not failures, "; ".join(failures) or
                       f"bitwise equal over {total} logp elements (packing order, micro-batches, batch caps, "
                       f"chunk sizes, page layouts)", metrics)
