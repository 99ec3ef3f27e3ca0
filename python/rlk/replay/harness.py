"""Frozen-token replay: record a fixture with the rollout pattern, re-check it with both patterns.

* :func:`record`: the rollout pattern generates responses (seeded sampling) and records the
  selected-token logp; the result is a :class:`~rlk.replay.fixture.Fixture`.
* :func:`check`: loads the fixture's model, re-scores prompt + response with the trainer
  pattern, replays the rollout with the frozen tokens (same schedule), and compares bitwise:
  ``trainer_vs_rollout`` (ladder L4) and ``rollout_replay_vs_recorded`` (L1, repeat exactness).
  With ``route="native"`` the same is done on the native route (its figures show that the
  comparison can fail); ``native_vs_strict`` compares the routes' trainer logp.
"""

from __future__ import annotations

import dataclasses
import random
import time

import torch

from rlk.models.qwen3 import Qwen3, Qwen3Config, load_safetensors, random_weights
from rlk.models.qwen3.distribution import distribution_stats
from rlk.models.qwen3.weights import DEFAULT_RECIPE, calibration_record
from rlk.models.qwen3.routes import StrictOps
from rlk.replay import compare, rollout, trainer
from rlk.replay.fixture import Fixture


@dataclasses.dataclass
class ModelSpec:
    config: str = "tiny"  # a checked-in name or a path to config.json
    num_layers: int | None = None  # override (fewer layers for time; stated in reports)
    seed: int | None = 0  # random weights
    checkpoint: str | None = None  # local safetensors file or folder instead of random weights
    device: str = "cpu"
    dtype: str = "bfloat16"
    # Random weights' recipe (rlk.models.qwen3.weights.RECIPES): calibrated.v1 gives trained-like
    # output statistics; plain.v0 is the recipe of fixtures recorded before recipes existed.
    recipe: str = DEFAULT_RECIPE

    def cfg(self) -> Qwen3Config:
        c = Qwen3Config.from_json(self.config) if self.config.endswith(".json") else Qwen3Config.named(self.config)
        return dataclasses.replace(c, num_hidden_layers=self.num_layers) if self.num_layers else c

    def to_dict(self):
        return dataclasses.asdict(self)


_WEIGHTS_CACHE: dict = {}


def build_model(spec: ModelSpec, route: str = "strict") -> Qwen3:
    """The model of ``spec`` on ``route``; weights are built once per spec and shared by routes."""
    key = tuple(sorted(spec.to_dict().items()))
    if key not in _WEIGHTS_CACHE:
        _WEIGHTS_CACHE.clear()  # keep at most one model's weights alive
        cfg = spec.cfg()
        dt = getattr(torch, spec.dtype)
        if spec.checkpoint:
            w = load_safetensors(spec.checkpoint, cfg, dtype=dt, device=spec.device)
        else:
            w = random_weights(cfg, spec.seed, dtype=dt, device=spec.device, recipe=spec.recipe)
        from rlk.models.qwen3.layouts import hf_to_fused

        _WEIGHTS_CACHE[key] = (cfg, hf_to_fused(cfg, w))
    cfg, fw = _WEIGHTS_CACHE[key]
    return Qwen3(cfg, fw, route=route)


def weights_record(spec: ModelSpec, model: Qwen3, stats: dict | None = None) -> dict:
    """How the weights were made; ``calibration``: the recipe (random weights), its factors and
    the next-token statistics ``stats`` measured with them (``distribution_stats``)."""
    rec = {"kind": "checkpoint" if spec.checkpoint else "random", "generated_on": model.device.type,
           "dtype": spec.dtype}
    rec["calibration"] = calibration_record(model.cfg, None if spec.checkpoint else spec.recipe, stats)
    if spec.checkpoint:
        from rlk.models.qwen3.weights import file_sha256

        rec.update(path=spec.checkpoint, sha256=file_sha256(spec.checkpoint))
    else:
        rec["seed"] = spec.seed
        if sum(t.numel() for t in model.w.values()) < 50_000_000:
            from rlk.models.qwen3.layouts import fused_to_hf
            from rlk.models.qwen3.weights import weights_sha256

            rec["sha256_hf"] = weights_sha256(fused_to_hf(model.cfg, model.w))
    return rec


def make_requests(n: int, prompt_range: tuple[int, int], response_range: tuple[int, int], vocab: int,
                  seed: int = 0, arrival_spread: int = 0) -> list[rollout.Request]:
    """``n`` requests with seeded random prompts and lengths (inclusive ranges); arrival steps
    drawn from ``0..arrival_spread``. Lengths span both range ends when ``n >= 2``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = prompt_range[0] if i == 0 else prompt_range[1] if i == 1 else rng.randint(*prompt_range)
        r = response_range[1] if i == 0 else response_range[0] if i == 1 else rng.randint(*response_range)
        out.append(rollout.Request(prompt=[rng.randrange(vocab) for _ in range(p)], max_new_tokens=r,
                                   arrival_step=rng.randint(0, arrival_spread) if arrival_spread else 0))
    return out


def _provenance(route, extra):
    try:
        from rlk.provenance import capability_record

        return capability_record(route=route, contract_ids=None, extra=extra)
    except Exception as e:  # provenance is recorded, never invented
        import triton

        return {"error": f"capability_record unavailable: {type(e).__name__}: {e}",
                "torch": torch.__version__, "triton": triton.__version__,
                "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def record(spec: ModelSpec, requests: list[rollout.Request], rc: rollout.RolloutConfig, route: str = "strict",
           progress=None) -> tuple[Fixture, rollout.RolloutResult]:
    model = build_model(spec, route)
    res = rollout.run_rollout(model, requests, rc, progress=progress)
    # The fixture's distribution health: entropy of every sampled row and the sampled logp.
    dist = distribution_stats(res.entropy, res.logp)
    meta = {
        "model": {"spec": spec.to_dict(), "config": model.cfg.to_dict()},
        "weights": weights_record(spec, model, dist),
        "distribution": dist,
        "rollout": rc.to_dict(),
        "route": route,
        "contracts": dict(model.ops.contracts),
        "logp_segmentation": getattr(model.ops, "logp_segmentation", None),
        "steps": res.steps, "composition_changes": res.composition_changes,
        "max_batch_seen": max(res.batch_sizes), "rollout_seconds": res.seconds,
        "graph_replays": res.graph_replays, "padded_steps": res.padded_steps,
        "provenance": _provenance(route, {"model": model.cfg.name, "pattern": "rollout",
                                          "weights_recipe": None if spec.checkpoint else spec.recipe}),
    }
    fx = Fixture(prompts=[r.prompt for r in requests], responses=res.responses,
                 arrival_steps=[r.arrival_step for r in requests], page_tables=res.page_tables,
                 rollout_logp=res.logp, meta=meta)
    return fx, res


def spec_of(fx: Fixture, device: str | None = None) -> ModelSpec:
    """The fixture's model spec; a fixture whose spec names no recipe is ``plain.v0``."""
    d = dict(fx.meta["model"]["spec"])
    d.setdefault("recipe", "plain.v0")
    if device:
        d["device"] = device
    return ModelSpec(**d)


def requests_of(fx: Fixture) -> list[rollout.Request]:
    return [rollout.Request(prompt=p, max_new_tokens=len(r), arrival_step=a)
            for p, r, a in zip(fx.prompts, fx.responses, fx.arrival_steps)]


def check(fx: Fixture, route: str = "strict", *, rc: rollout.RolloutConfig | None = None, device=None,
          replay_rollout=True, actor=False, microbatch_tokens=None, localize=False, progress=None) -> dict:
    """Runs both patterns on the frozen tokens and compares (see the module docstring)."""
    spec = spec_of(fx, device)
    model = build_model(spec, route)
    rc = rc or rollout.RolloutConfig(**fx.meta["rollout"])
    say = progress or (lambda s: None)
    out: dict = {"route": route, "sequences": len(fx.prompts), "response_tokens": sum(fx.response_lens)}
    say(f"[{route}] trainer pattern over {len(fx.prompts)} sequences")
    tprobes = [] if localize else None
    tl, grads, ts = trainer.score(model, fx.prompts, fx.responses, actor=actor,
                                  microbatch_tokens=microbatch_tokens, probes=tprobes)
    out["trainer_seconds"] = ts
    if fx.meta.get("route") == route:
        out["trainer_vs_recorded"] = compare.compare_logp(tl, fx.rollout_logp, fx.prompt_lens, ("trainer", "rollout"))
    if replay_rollout:
        say(f"[{route}] rollout pattern (frozen tokens) over {len(fx.prompts)} sequences")
        res = rollout.run_rollout(model, requests_of(fx), rc, forced=fx.responses, probes=localize, progress=progress)
        out["rollout_seconds"] = res.seconds
        out["rollout_steps"] = res.steps
        out["composition_changes"] = res.composition_changes
        out["trainer_vs_rollout"] = compare.compare_logp(tl, res.logp, fx.prompt_lens, ("trainer", "rollout"))
        if fx.meta.get("route") == route:
            out["rollout_replay_vs_recorded"] = compare.compare_logp(res.logp, fx.rollout_logp, fx.prompt_lens,
                                                                     ("replay", "recorded"))
        if localize and out["trainer_vs_rollout"]["mismatch_count"]:
            out["localized"] = compare.localize(tprobes, res.probes, fx.prompt_lens, fx.response_lens)
    out["_trainer_logp"] = tl
    out["_grads"] = grads
    return out


def public(report: dict) -> dict:
    """The report without tensors (JSON-able)."""
    return {k: v for k, v in report.items() if not k.startswith("_")}


def headline(strict: dict, native: dict | None, extra: dict | None = None) -> dict:
    """The replay summary: L4 figures for strict, and the same under ``native``."""
    s = strict.get("trainer_vs_recorded") or strict["trainer_vs_rollout"]
    out = {k: s[k] for k in ("sequences", "compared_elements", "mismatch_count", "max_abs_diff", "torch_equal")}
    out["contracts"] = dict(StrictOps.contracts)
    if native is not None:
        n = native["trainer_vs_rollout"]
        out["native"] = {k: n[k] for k in ("compared_elements", "mismatch_count", "max_abs_diff", "torch_equal")}
        if "native_vs_strict" in native:
            out["native"]["vs_strict"] = native["native_vs_strict"]
    out.update(extra or {})
    return out


def now():
    return time.perf_counter()
