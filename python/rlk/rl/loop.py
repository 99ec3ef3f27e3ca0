"""The RL loop: rollout -> reward -> group advantages -> clipped actor loss -> backward -> Adam ->
weight sync, on the Qwen3 model of one route, with two separate weight copies (trainer, engine).

One step (:func:`run_arm`):

1. **rollout**: the engine (:class:`RolloutEngine`, rlk's replay executor: paged KV cache,
   chunked prefill, continuous batching, seeded sampling) generates ``group_size`` responses per
   prompt and records each sampled token's logp from the same LM-head pass. First it checks that
   it holds the weight generation the trainer sent last.
2. **reward** (:mod:`rlk.rl.task`) and **advantages** (:func:`rlk.rl.grpo.group_advantages`).
3. **actor**: the trainer (:class:`Trainer`) scores prompt + response as packed sequences with
   autograd, the loss being PPO's clipped surrogate with ``ratio = exp(logp_train -
   logp_rollout)``: the rollout logp is the old logp, reused, never recomputed. Strict route: the
   trainer's logp equal the rollout's bitwise (``logp.v2`` and the other contracts), so every
   ratio is exactly 1.0 and ``ratio_not_one`` is 0; native route: the ratio shows the routes'
   drift between the two execution patterns (off-policy noise at unchanged weights).
4. **optimizer**: Adam on fp32 master weights; the bf16 weights the model runs are the masters
   rounded to nearest even.
5. **sync**: the trainer's bf16 weights go into the engine's tensors in place, fingerprinted on
   both sides (:mod:`rlk.rl.sync`); a mismatch raises :class:`rlk.rl.sync.WeightSyncError`.

Every step yields a JSON-able record (rewards, loss, ratio statistics, sync digests, seconds per
phase); :func:`run_arm` returns them with a summary.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Callable

import torch

from rlk.errors import UnsupportedConfigError
from rlk.models.qwen3 import Qwen3, Qwen3Config, random_weights, trained_weights
from rlk.models.qwen3.config import NAMED
from rlk.models.qwen3.layouts import hf_to_fused
from rlk.models.qwen3.routes import ROUTES
from rlk.models.qwen3.trained import TRAINED
from rlk.models.qwen3.weights import DEFAULT_RECIPE, RECIPES
from rlk.replay import rollout, trainer
from rlk.rl import grpo, sync
from rlk.rl.task import TASKS, TargetByteTask, TokenClassTask


TRAINERS = ("rlk", "megatron")
RECOMPUTE = (None, "full", "selective")  # the megatron actor's activation recompute
FINGERPRINT_CHOICES = ("auto",) + sync.FINGERPRINTS


@dataclasses.dataclass
class LoopConfig:
    route: str = "strict"
    steps: int = 3
    # A named config (Qwen3Config NAMED, e.g. "qwen3-8b"): its trained checkpoint when it has one
    # (rlk.models.qwen3.trained.TRAINED) and no recipe is given, else seeded weights of ``recipe``
    # (default: the weights module's DEFAULT_RECIPE) drawn on ``device`` from ``seed``.
    model: str = "tiny"
    recipe: str | None = None
    layers: int | None = None  # seeded weights only: fewer decoder layers than the config's
    task_name: str = "target_byte"  # rlk.rl.task.TASKS (token_class for large vocabularies)
    prompts_per_step: int = 1
    group_size: int = 8  # samples per prompt (GRPO's group)
    response_len: int = 6  # tokens sampled per response
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.99)
    clip_eps: float = 0.2
    adv_eps: float = 1e-6
    target: int = ord("e")  # the task's target byte
    seed: int = 0
    block_size: int = 16
    chunk_size: int = 16
    max_batch: int | None = None  # running requests at most (default: every request of the step)
    jitter: float = 0.25  # probability a ready request is deferred a step (batch composition changes)
    device: str = "cpu"
    # The actor: "rlk" (Trainer below) or "megatron" (megatron-core's GPTModel: rlk's strict spec
    # on the strict route, megatron's local spec on the native one; its adapter sits above this
    # layer, so run_arm receives it as ``make_trainer``).
    trainer: str = "rlk"
    # Adam's fp32 master weights and moments on the host: a Qwen3-8B trainer + engine needs 16
    # bytes per parameter more than one H200 holds with them on the GPU. The rlk trainer offloads
    # all of them (True; one fused CPU Adam per tensor, stepped in turn, the bf16 weights go back
    # to the device); the megatron actor takes True or a fraction of the parameters in (0, 1]
    # (megatron's own CPU offload, rlk.integrations.megatron.offload).
    optimizer_offload: bool | float = False
    # The megatron actor's activation recompute (megatron's own: "full" recomputes every layer in
    # the backward, "selective" the attention core; None saves every activation). Bitwise the
    # same gradients either way (rlk.integrations.megatron.actor); full depth beside vLLM on one
    # GPU needs it.
    recompute: str | None = None
    # The weight sync's fingerprint (rlk.rl.sync): "auto" is sha256 on the CPU, "device" on CUDA.
    fingerprint: str = "auto"

    def check(self) -> None:
        if self.route not in ROUTES:
            raise UnsupportedConfigError(f"route {self.route!r} unknown (known: {', '.join(ROUTES)})")
        if self.model not in NAMED:
            raise UnsupportedConfigError(f"model {self.model!r} unknown (named configs: {', '.join(NAMED)}; trained "
                                         f"checkpoints: {', '.join(TRAINED)})")
        if self.trained() and self.layers is not None:
            raise UnsupportedConfigError(f"model {self.model!r} loads its trained checkpoint: layers apply to seeded "
                                         "weights only (give a recipe)")
        if self.recipe is not None and self.recipe not in RECIPES:
            raise UnsupportedConfigError(f"recipe {self.recipe!r} unknown (known: {', '.join(RECIPES)})")
        if self.layers is not None and self.layers < 1:
            raise UnsupportedConfigError(f"layers must be >= 1 (got {self.layers})")
        if self.task_name not in TASKS:
            raise UnsupportedConfigError(f"task {self.task_name!r} unknown (known: {', '.join(TASKS)})")
        if self.fingerprint not in FINGERPRINT_CHOICES:
            raise UnsupportedConfigError(f"fingerprint {self.fingerprint!r} unknown (known: {', '.join(FINGERPRINT_CHOICES)})")
        off = self.optimizer_offload
        if not (isinstance(off, (bool, int, float)) and 0 <= off <= 1):
            raise UnsupportedConfigError(f"optimizer_offload={off!r}: a bool or a fraction of the parameters in [0, 1]")
        if self.trainer == "rlk" and off not in (0, 1):
            raise UnsupportedConfigError(f"optimizer_offload={off!r}: the rlk trainer offloads all of Adam's state "
                                         "or none (True/False); fractions are megatron's (--trainer megatron)")
        if self.recompute not in RECOMPUTE:
            raise UnsupportedConfigError(f"recompute={self.recompute!r}: one of {RECOMPUTE}")
        if self.recompute is not None and self.trainer != "megatron":
            raise UnsupportedConfigError(f"recompute={self.recompute!r} is the megatron actor's (--trainer megatron); "
                                         "the rlk trainer saves every activation")
        for name in ("steps", "prompts_per_step", "response_len"):
            if getattr(self, name) < 1:
                raise UnsupportedConfigError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.group_size < 2:
            raise UnsupportedConfigError(f"group_size must be >= 2 (got {self.group_size}): GRPO compares samples")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UnsupportedConfigError(f"lr must be a positive number (got {self.lr})")
        if not 0 < self.clip_eps < 1:
            raise UnsupportedConfigError(f"clip_eps must lie in (0, 1) (got {self.clip_eps})")
        if not 0 <= self.jitter < 1:
            raise UnsupportedConfigError(f"jitter must lie in [0, 1) (got {self.jitter})")
        if self.trainer not in TRAINERS:
            raise UnsupportedConfigError(f"trainer {self.trainer!r} unknown (known: {', '.join(TRAINERS)})")

    def task(self):
        return TargetByteTask(target=self.target) if self.task_name == "target_byte" else TokenClassTask()

    def fingerprint_kind(self) -> str:
        if self.fingerprint != "auto":
            return self.fingerprint
        return "device" if torch.device(self.device).type == "cuda" else "sha256"

    def trained(self) -> bool:
        """Whether the model's weights are its trained checkpoint (else seeded)."""
        return self.model in TRAINED and self.recipe is None

    def weights(self) -> tuple[Qwen3Config, dict[str, torch.Tensor]]:
        """``(cfg, Hugging Face bf16 tensors on device)``: the trained checkpoint, or the named
        config's seeded weights (``random_weights(cfg, seed, recipe)``, drawn on the device)."""
        if self.trained():
            return trained_weights(self.model, dtype=torch.bfloat16, device=self.device)
        cfg = Qwen3Config.named(self.model)
        if self.layers is not None:
            cfg = dataclasses.replace(cfg, num_hidden_layers=self.layers)
        return cfg, random_weights(cfg, self.seed, device=self.device, recipe=self.recipe or DEFAULT_RECIPE)

    def describe_model(self) -> str:
        if self.trained():
            return f"the trained {self.model} model"
        layers = f", {self.layers} layers" if self.layers is not None else ""
        return f"{self.model} shapes{layers}, seeded {self.recipe or DEFAULT_RECIPE} weights"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LoopConfig":
        """The config an arm's record holds (``to_dict``, read back from JSON): betas as a tuple,
        keys this version does not know left out."""
        d = dict(d)
        d["betas"] = tuple(d.get("betas", cls.betas))
        return cls(**{k: v for k, v in d.items() if k in {f.name for f in dataclasses.fields(cls)}})


@dataclasses.dataclass
class Hooks:
    """Seams for fault injection (tests): ``transport(src, dst)`` replaces the in-place weight copy
    of every sync; ``after_sync(generation, engine)`` runs after every verified sync, the initial
    one (generation 0) included."""

    transport: Callable[[dict, dict], None] | None = None
    after_sync: Callable[[int, "RolloutEngine"], None] | None = None


def _clone_weights(w: dict[str, torch.Tensor], device, zero: bool = False) -> dict[str, torch.Tensor]:
    """Own copies of ``w`` on ``device``; tensors shared between names (tied embeddings) stay shared."""
    memo: dict[int, torch.Tensor] = {}
    out = {}
    for k, t in w.items():
        if id(t) not in memo:
            memo[id(t)] = torch.zeros_like(t, device=device) if zero else t.detach().to(device).clone()
        out[k] = memo[id(t)]
    return out


def actor_batch(vocab_size: int, prompts: list[list[int]], responses: list[list[int]], old_logp: list[torch.Tensor],
                adv: torch.Tensor, clip_eps: float, device="cpu"):
    """The actor's packed batch (host tensors, :func:`rlk.replay.trainer.pack`) and its GRPO
    per-token loss (``token_loss(logp_rows, lo, hi)`` over the packed rows, tensors on ``device``):
    each response row gets its sequence's old logp and advantage; normalized by the batch's
    response tokens."""
    rollout.check_tokens(vocab_size, prompts, responses)
    pk = trainer.pack(prompts, responses, device="cpu")
    old_rows = trainer.response_rows(pk, old_logp)
    adv_rows = trainer.response_rows(pk, [torch.full((len(r),), float(adv[i])) for i, r in enumerate(responses)])
    n_tokens = sum(pk.response_lens)
    fn = grpo.token_loss_fn(old_rows.to(device), adv_rows.to(device), pk.loss_mask.to(device), clip_eps, n_tokens)
    return pk, fn


class Trainer:
    """The actor: a Qwen3 model of ``route`` over bf16 weights, fp32 master weights, Adam.

    ``lc.optimizer_offload``: the masters and Adam's moments live on the host, one fused CPU Adam
    per tensor (Adam is elementwise: the same update as one optimizer over all of them); each
    step moves one tensor's gradient to the host at a time, so the host holds the masters and
    moments (12 bytes per parameter) plus one fp32 gradient."""

    def __init__(self, cfg, fused: dict[str, torch.Tensor], route: str, lc: LoopConfig):
        self.model = Qwen3(cfg, _clone_weights(fused, lc.device), route=route)
        # Trainable names: the tied LM head is the embedding (one tensor, one master).
        self.names = [k for k in self.model.w if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
        self.offload = bool(lc.optimizer_offload)
        hyper = dict(lr=lc.lr, betas=tuple(lc.betas), eps=1e-8)
        if self.offload:
            self.master = {k: torch.nn.Parameter(self.model.w[k].detach().to("cpu").float()) for k in self.names}
            self.opts = {k: torch.optim.Adam([p], fused=True, **hyper) for k, p in self.master.items()}
        else:
            self.master = {k: torch.nn.Parameter(self.model.w[k].detach().float().clone()) for k in self.names}
            self.opt = torch.optim.Adam(list(self.master.values()), **hyper)
        self.generation = 0  # optimizer steps taken
        self.clip_eps = lc.clip_eps
        self.route = route

    def describe(self) -> dict:
        """The actor in the loop's report (the native route's is a stand-in for megatron's)."""
        what = "rlk's strict kernels" if self.route == "strict" else "rlk's torch route (a stand-in)"
        return {"name": f"rlk trainer ({what})", "trainer": "rlk", "route": self.route}

    @property
    def w(self) -> dict[str, torch.Tensor]:
        return self.model.w

    def actor(self, prompts: list[list[int]], responses: list[list[int]], old_logp: list[torch.Tensor],
              adv: torch.Tensor) -> tuple[list[torch.Tensor], dict, float]:
        """Forward + backward of the clipped loss; returns (trainer logp per sequence, grads, loss).

        ``old_logp``: the rollout's logp per sequence (reused as the old policy's); ``adv``: ``[N]``
        per-sequence advantages. One packed batch (the tiny loop needs no micro-batches)."""
        from rlk.kernels.common import host_validated

        dev = self.model.device
        pk, fn = actor_batch(self.model.cfg.vocab_size, prompts, responses, old_logp, adv, self.clip_eps, dev)
        with host_validated():
            lp, grads = self.model.trainer_logp(pk.ids.to(dev), pk.cu_seqlens.to(dev), pk.targets.to(dev), actor=True,
                                                host_cu=pk.host_cu, token_loss=fn)
        with torch.no_grad():
            loss = float(fn(lp, 0, pk.ids.shape[0]).sum())
        return trainer.response_logp(pk, lp, len(prompts)), grads, loss

    def apply(self, grads: dict[str, torch.Tensor]) -> float:
        """One Adam step on the masters from ``grads`` (the model's bf16 gradients, widened to
        fp32), then the bf16 weights rewritten in place; returns the gradient's global 2-norm."""
        missing = [k for k in self.names if k not in grads or grads[k] is None]
        if missing:
            raise UnsupportedConfigError(f"no gradient for {missing[:3]} (the actor pass did not reach them)")
        # The norm (and the NaN / Inf check) before any master moves: a bad gradient changes nothing.
        sq = 0.0
        for k in self.names:
            g = grads[k].detach().double().view(-1)
            sq += float(torch.dot(g, g))
            del g
        if not math.isfinite(sq):
            raise UnsupportedConfigError("gradient holds NaN or Inf")
        with torch.no_grad():
            if self.offload:
                for k, p in self.master.items():
                    p.grad = grads[k].detach().to("cpu").float()
                    self.opts[k].step()
                    p.grad = None
                    # fp32 -> bf16 on the host (round to nearest even, as on the device), then in place.
                    self.model.w[k].copy_(p.detach().to(torch.bfloat16))
            else:
                for k, p in self.master.items():
                    p.grad = grads[k].detach().float()
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
                for k in self.names:
                    self.model.w[k].copy_(self.master[k])  # fp32 -> bf16: round to nearest even
        self.generation += 1
        return math.sqrt(sq)


class RolloutEngine:
    """The rollout side: a Qwen3 model of ``route`` over its own weight tensors, driven by rlk's
    replay executor (:func:`rlk.replay.rollout.run_rollout`). Starts with zero weights: the
    loop's first sync loads the trainer's."""

    def __init__(self, cfg, fused: dict[str, torch.Tensor], route: str, lc: LoopConfig):
        self.model = Qwen3(cfg, _clone_weights(fused, lc.device, zero=True), route=route)
        self.weight_generation: int | None = None
        self.lc = lc

    @property
    def w(self) -> dict[str, torch.Tensor]:
        return self.model.w

    def describe(self) -> dict:
        """The engine in the report (every rollout engine offers it; see :func:`run_arm`)."""
        return {"name": "rlk executor", "what": "rlk.replay.rollout.run_rollout (rlk's test harness), "
                f"route {self.model.route}"}

    def generate(self, prompts: list[list[int]], step: int) -> rollout.RolloutResult:
        lc = self.lc
        reqs = [rollout.Request(prompt=p, max_new_tokens=lc.response_len) for p in prompts]
        # Seeds differ per step (fresh samples) and are fixed per (seed, step) (a rerun repeats them).
        rc = rollout.RolloutConfig(block_size=lc.block_size, chunk_size=lc.chunk_size,
                                   max_batch=lc.max_batch or len(reqs), jitter=lc.jitter,
                                   sample_seed=1_000_003 * lc.seed + 2 * step + 1,
                                   page_seed=1_000_003 * lc.seed + 2 * step + 2,
                                   jitter_seed=1_000_003 * lc.seed + step + 3)
        return rollout.run_rollout(self.model, reqs, rc)


def _sync(trainer_: Trainer, engine: RolloutEngine, hooks: Hooks, kind: str = "sha256") -> dict:
    if hasattr(engine, "receive"):
        # An engine whose weights live elsewhere brings its own transport (sync.sync_remote).
        if hooks.transport is not None:
            raise UnsupportedConfigError("hooks.transport replaces the in-place copy of the in-process engine; "
                                         f"{type(engine).__name__} has its own transport (receive)")
        # The engine's processes load the new weights onto the same device (a transient second
        # copy): the trainer's cached, unused blocks go back to the device first.
        _release_memory()
        rec = sync.sync_remote(trainer_.w, engine, trainer_.generation, kind=kind)
    else:
        rec = sync.sync_weights(trainer_.w, engine, trainer_.generation, hooks.transport, kind=kind)
    if hooks.after_sync is not None:
        hooks.after_sync(trainer_.generation, engine)
    return {k: rec[k] for k in ("generation", "fingerprint", "sha256_trainer", "sha256_rollout", "match", "seconds")}


def run_arm(lc: LoopConfig, hooks: Hooks | None = None, on_step: Callable[[dict], None] | None = None,
            make_trainer: Callable | None = None, make_engine: Callable | None = None) -> dict:
    """Runs ``lc.steps`` RL steps on ``lc.route``; returns ``{"route", "config", "task", "initial_sync",
    "steps": [record per step], "summary"}`` (JSON-able). ``on_step(record)`` sees each record as it
    is made. Raises :class:`rlk.rl.sync.WeightSyncError` on a fingerprint mismatch or stale weights.

    ``make_trainer(cfg, fused, route, lc)``: the actor when ``lc.trainer`` is not ``"rlk"`` (e.g.
    ``rlk.integrations.megatron.rl_trainer.RLTrainer``); it offers :class:`Trainer`'s ``w``,
    ``generation``, ``actor(...)`` and ``apply(grads)``.

    ``make_engine(cfg, fused, route, lc)``: the rollout engine instead of :class:`RolloutEngine`
    (e.g. ``rlk.integrations.vllm.rl_engine.VllmRolloutEngine``); it offers ``weight_generation``,
    ``generate(prompts, step)`` (a result with ``responses``, ``logp``, ``entropy`` or None,
    ``steps``, ``composition_changes``) and either ``w`` (in-place sync) or
    ``receive(weights, generation, kind) -> held fingerprint`` (its own transport)."""
    lc.check()
    if (lc.trainer == "rlk") != (make_trainer is None):
        raise UnsupportedConfigError(f"trainer {lc.trainer!r} with make_trainer={make_trainer!r}: the rlk trainer "
                                     "takes none, any other trainer needs its factory")
    hooks = hooks or Hooks()
    task = lc.task()
    cfg, hf = lc.weights()
    task.check(cfg.vocab_size)
    if lc.response_len + max(len(p) for p in task.prompts) > cfg.max_position_embeddings:
        raise UnsupportedConfigError(f"prompt + {lc.response_len} response tokens exceed max_position_embeddings "
                                     f"{cfg.max_position_embeddings}")
    fused = hf_to_fused(cfg, hf)
    del hf
    t0 = time.perf_counter()
    actor = (make_trainer or Trainer)(cfg, fused, lc.route, lc)
    engine = (make_engine or RolloutEngine)(cfg, fused, lc.route, lc)
    del fused  # both sides hold their own copies
    try:
        return _run_steps(lc, hooks, on_step, task, cfg, actor, engine, time.perf_counter() - t0)
    finally:
        if hasattr(engine, "close"):  # an engine in other processes (vLLM) frees its GPU memory now
            engine.close()


def _run_steps(lc: LoopConfig, hooks: Hooks, on_step, task, cfg, actor, engine, setup_s: float) -> dict:
    """:func:`run_arm`'s steps, once the trainer and the engine exist."""
    kind = lc.fingerprint_kind()
    initial = _sync(actor, engine, hooks, kind)
    records = []
    for step in range(lc.steps):
        sec: dict[str, float] = {}
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t_step = time.perf_counter()

        t0 = time.perf_counter()
        sync.check_generation(engine, actor.generation)
        base = task.step_prompts(step, lc.prompts_per_step)
        prompts = [p for p in base for _ in range(lc.group_size)]  # a group = consecutive samples of one prompt
        res = engine.generate(prompts, step)
        sec["rollout"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        rewards = task.rewards(res.responses)
        sec["reward"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        adv = grpo.group_advantages(rewards, lc.group_size, lc.adv_eps)
        sec["advantage"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        train_lp, grads, loss = actor.actor(prompts, res.responses, res.logp, adv)
        ratio = grpo.ratio_stats(train_lp, res.logp, lc.clip_eps)
        sec["actor_fwd_bwd"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        grad_norm = actor.apply(grads)
        del grads  # applied: not held through the sync and the next rollout
        sec["optimizer"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        sync_rec = _sync(actor, engine, hooks, kind)
        sec["sync"] = time.perf_counter() - t0
        sec["step"] = time.perf_counter() - t_step

        rec = {
            "route": lc.route, "step": step, "generation": actor.generation,
            "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            "reward_min": float(rewards.min()), "reward_max": float(rewards.max()),
            # Diversity of the samples: GRPO learns nothing from a group whose samples are all alike.
            "distinct_responses": len({tuple(r) for r in res.responses}),
            # NaN where the engine reports no entropy (vLLM returns the sampled token's logp only).
            "entropy_mean": (float(torch.cat([e.float().cpu() for e in res.entropy]).mean())
                             if getattr(res, "entropy", None) is not None else float("nan")),
            "loss": loss, "grad_norm": grad_norm,
            "old_logp": "rollout (reused, not recomputed)",
            **ratio,
            "sync": sync_rec,
            "rollout": {"sequences": len(prompts), "engine_steps": res.steps,
                        "composition_changes": res.composition_changes},
            "sample": _sample_text(res.responses[0]),
            "seconds": {k: round(v, 4) for k, v in sec.items()},
            "memory": _memory(),
        }
        records.append(rec)
        if on_step is not None:
            on_step(rec)
    return {"route": lc.route, "config": lc.to_dict(), "task": task.to_dict(), "initial_sync": initial,
            "engine": engine.describe() if hasattr(engine, "describe") else {"name": type(engine).__name__},
            "actor": actor.describe() if hasattr(actor, "describe") else {"name": type(actor).__name__},
            "model": {"what": lc.describe_model(), "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
                      "vocab": cfg.vocab_size, "parameters": _n_params(actor.w),
                      "setup_seconds": round(setup_s, 3)},
            "steps": records, "summary": summarize(records)}


def _sample_text(tokens: list[int]) -> str:
    """A response for the record: its bytes (byte vocabularies), else its first 16 token ids."""
    if all(0 <= t < 256 for t in tokens):
        return bytes(tokens).decode("latin-1")
    return " ".join(map(str, tokens[:16])) + (" ..." if len(tokens) > 16 else "")


def _n_params(w: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() for t in {id(t): t for t in w.values()}.values())


def summarize(records: list[dict]) -> dict:
    """Totals and trends of an arm's step records."""
    if not records:
        return {"steps": 0}
    rewards = [r["reward_mean"] for r in records]
    k = max(1, min(3, len(rewards) // 2))
    seconds = {p: round(sum(r["seconds"][p] for r in records), 3) for p in records[0]["seconds"]}
    return {
        "steps": len(records),
        "tokens": sum(r["tokens"] for r in records),
        "ratio_not_one": sum(r["ratio_not_one"] for r in records),
        "logp_mismatch": sum(r["logp_mismatch"] for r in records),
        "steps_with_ratio_not_one": sum(r["ratio_not_one"] > 0 for r in records),
        "abs_dev_max": max(r.get("abs_dev", {}).get("max", 0.0) for r in records),
        # A mismatch raises before a record exists: the initial sync and one per step were verified.
        "syncs_verified": 1 + sum(r["sync"]["match"] for r in records),
        "reward_first": rewards[0], "reward_last": rewards[-1],
        # Mean reward of the last k steps minus that of the first k (k = min(3, steps // 2), at least 1).
        "reward_gain": sum(rewards[-k:]) / k - sum(rewards[:k]) / k, "reward_gain_window": k,
        "seconds": seconds,
    }


def output_paths(out_dir: str, device: str = "cpu", tag: str | None = None) -> dict[str, str]:
    """Files a run writes under ``out_dir``: ``rl_loop_<tag>.json`` (every arm's config, step
    records and summary, the provenance record), ``.png`` beside it and ``steps.jsonl`` (one
    step record per line, as the steps run). ``tag`` defaults to the device type (``cpu``,
    ``cuda``)."""
    kind = tag or str(device).split(":")[0]
    return {"json": os.path.join(out_dir, f"rl_loop_{kind}.json"), "png": os.path.join(out_dir, f"rl_loop_{kind}.png"),
            "jsonl": os.path.join(out_dir, "steps.jsonl")}


def strict_failures(arm: dict) -> list[str]:
    """What breaks the strict arm's promise in ``arm`` (a :func:`run_arm` result): a token whose
    ratio is not exactly 1.0 or whose logp bits differ, a step without response tokens, an
    unverified sync, or fewer steps than configured."""
    out = []
    for r in arm["steps"]:
        if r["ratio_not_one"] or r["logp_mismatch"]:
            out.append(f"step {r['step']}: ratio_not_one {r['ratio_not_one']}, logp_mismatch {r['logp_mismatch']} "
                       f"of {r['tokens']} tokens (|ratio-1| max {r.get('abs_dev', {}).get('max')})")
        if not r["tokens"]:
            out.append(f"step {r['step']}: no response tokens compared")
        if not r["sync"]["match"] or r["sync"]["sha256_trainer"] != r["sync"]["sha256_rollout"]:
            out.append(f"step {r['step']}: weight sync not verified")
    if len(arm["steps"]) != arm["config"]["steps"]:
        out.append(f"{len(arm['steps'])} of {arm['config']['steps']} steps ran")
    return out


def run_and_report(lc: LoopConfig, routes: list[str], out_dir: str, on_step: Callable[[dict], None] | None = None,
                   hooks: Hooks | None = None, make_trainer: Callable | None = None, tag: str | None = None,
                   make_engine: Callable | None = None) -> dict:
    """Runs one arm per route of ``routes`` (config ``lc`` with the route replaced), writes
    :func:`output_paths`' files and returns the report (``arms``, ``passed``, ``failures``, ``files``).

    ``passed``: the strict arm (when run) has no :func:`strict_failures`. A sync mismatch raises
    before any report is written (:class:`rlk.rl.sync.WeightSyncError`)."""
    from rlk.rl import report as rep

    for r in routes:
        if r not in ROUTES:
            raise UnsupportedConfigError(f"route {r!r} unknown (known: {', '.join(ROUTES)})")
    paths = output_paths(out_dir, lc.device, tag)
    os.makedirs(out_dir, exist_ok=True)
    arms = {}
    with open(paths["jsonl"], "w") as jl:
        def record(rec):
            jl.write(json.dumps(rec, sort_keys=True) + "\n")
            jl.flush()
            if on_step is not None:
                on_step(rec)

        for route in routes:
            arms[route] = run_arm(dataclasses.replace(lc, route=route), hooks=hooks, on_step=record,
                                  make_trainer=make_trainer, make_engine=make_engine)
            _release_memory()  # the arm's trainer, engine and optimizer state go before the next arm
    failures = strict_failures(arms["strict"]) if "strict" in arms else []
    report = {"arms": arms, "routes": list(routes), "passed": not failures, "failures": failures,
              "provenance": _provenance(lc, routes)}
    png = rep.plot(arms, paths["png"], title=rep.title_of(lc, arms), reward_rule=lc.task().reward_rule())
    report["files"] = {"json": paths["json"], "jsonl": paths["jsonl"],
                       "png": png or "not written: matplotlib is not importable"}
    rep.write_json(report, paths["json"])
    return report


def _memory() -> dict:
    """Peak GPU memory of the step (CUDA only) and the process's peak resident host memory."""
    import resource

    out = {"host_peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 3)}
    if torch.cuda.is_available():
        out["gpu_peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 3)
        out["gpu_peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2 ** 30, 3)
    return out


def replot(json_path: str, png_path: str | None = None) -> str | None:
    """Draws the PNG of a written report again (``rl_loop_<tag>.json`` -> ``.png`` beside it)."""
    from rlk.rl import report as rep

    with open(json_path) as f:
        report = json.load(f)
    arms = report["arms"]
    lc = LoopConfig.from_dict(next(iter(arms.values()))["config"])
    return rep.plot(arms, png_path or os.path.splitext(json_path)[0] + ".png", title=rep.title_of(lc, arms),
                    reward_rule=lc.task().reward_rule())


def _release_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _provenance(lc: LoopConfig, routes) -> dict:
    """The capability record (strict route's when it ran); recorded, never invented."""
    try:
        from rlk.provenance import capability_record

        return capability_record(route="strict" if "strict" in routes else "native",
                                 extra={"pattern": "rl_loop", "model": lc.describe_model(), "routes": list(routes)})
    except Exception as e:
        return {"error": f"capability_record unavailable: {type(e).__name__}: {e}"}
