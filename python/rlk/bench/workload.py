"""One benchmark arm's frozen work: rollout, old logp, reference logp, actor forward+backward.

Both arms build the same model (same seed, shapes, dtype) and the same requests with the same
forced response tokens, so the work is matched token for token; only the route differs
(``native`` = P/P: cuBLAS, SDPA, torch row ops, materialized logits; ``strict`` = R/R).
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any, Callable

import torch


@dataclasses.dataclass
class WorkloadSpec:
    config: str = "qwen3-8b"
    layers: int | None = 4
    sequences: int = 32
    prompt_range: tuple[int, int] = (128, 512)
    response_range: tuple[int, int] = (64, 256)
    block_size: int = 16
    max_batch: int = 32
    chunk_size: int = 512
    microbatch_tokens: int | None = 8192
    seed: int = 0
    device: str = "cuda"
    # Decode steps as CUDA graphs per batch bucket (None: on for CUDA). The same for both arms.
    rollout_graphs: bool | None = None
    # Forced-token logp inside the padded decode steps (RolloutConfig.step_logp). The same for both arms.
    step_logp: bool = True

    def to_dict(self):
        return dataclasses.asdict(self)


PHASES = ("rollout", "old_logp", "ref_logp", "actor_fwd_bwd")


class Workload:
    def __init__(self, spec: WorkloadSpec, route: str):
        from rlk.replay import harness, rollout

        self.spec, self.route = spec, route
        self._rollout = rollout
        mspec = harness.ModelSpec(config=spec.config, num_layers=spec.layers, seed=spec.seed, device=spec.device)
        self.model = harness.build_model(mspec, route)
        cfg = self.model.cfg
        self.requests = harness.make_requests(spec.sequences, spec.prompt_range, spec.response_range,
                                              cfg.vocab_size, seed=spec.seed + 1)
        rng = random.Random(spec.seed + 2)
        # Frozen response tokens (matched work): every arm decodes exactly these tokens.
        self.forced = [[rng.randrange(cfg.vocab_size) for _ in range(r.max_new_tokens)] for r in self.requests]
        self.prompts = [r.prompt for r in self.requests]
        self.rc = rollout.RolloutConfig(block_size=spec.block_size, max_batch=spec.max_batch,
                                        chunk_size=spec.chunk_size, jitter=0.0, cuda_graphs=spec.rollout_graphs,
                                        step_logp=spec.step_logp)
        self.response_tokens = sum(len(f) for f in self.forced)
        self.total_tokens = self.response_tokens + sum(len(p) for p in self.prompts)

    def phase(self, name: str) -> Callable[[], Any]:
        """The work of one phase as a call: ``rollout`` (forced replay), ``old_logp`` /
        ``ref_logp`` (reference scoring; call under ``torch.no_grad``) or ``actor_fwd_bwd``."""
        from rlk.replay import trainer

        mb = self.spec.microbatch_tokens
        if name == "rollout":
            return lambda: self._rollout.run_rollout(self.model, self.requests, self.rc, forced=self.forced)
        if name in ("old_logp", "ref_logp", "actor_fwd_bwd"):
            actor = name == "actor_fwd_bwd"
            return lambda: trainer.score(self.model, self.prompts, self.forced, actor=actor, microbatch_tokens=mb)
        raise ValueError(f"unknown phase {name!r} (one of {PHASES})")

    @staticmethod
    def timed(fn: Callable[[], Any]):
        """``(fn(), synchronized wall seconds, device seconds between CUDA events or None)``."""
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        sync()
        if torch.cuda.is_available():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t0 = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            b.record()
        sync()
        wall = time.perf_counter() - t0
        dev = a.elapsed_time(b) / 1e3 if torch.cuda.is_available() else None
        return out, wall, dev

    def step(self, check_equality: bool = False) -> dict[str, Any]:
        from rlk.replay import compare

        rec: dict[str, Any] = {}
        res, rec["rollout_s"], rec["rollout_dev_s"] = self.timed(self.phase("rollout"))
        with torch.no_grad():
            (old, _, _), rec["old_logp_s"], rec["old_logp_dev_s"] = self.timed(self.phase("old_logp"))
            (_, _, _), rec["ref_logp_s"], rec["ref_logp_dev_s"] = self.timed(self.phase("ref_logp"))
        (_, grads, _), rec["actor_fwd_bwd_s"], rec["actor_fwd_bwd_dev_s"] = self.timed(self.phase("actor_fwd_bwd"))
        del grads
        rec["step_s"] = sum(rec[f"{p}_s"] for p in PHASES)
        # Reuse variant: the rollout's logp stands in for the old-logp recompute. Allowed only
        # where equality holds on this very run; the caller fails closed otherwise.
        rec["step_reuse_s"] = rec["step_s"] - rec["old_logp_s"]
        if check_equality:
            c = compare.compare_logp(old, res.logp, [len(p) for p in self.prompts], ("old_logp", "rollout"))
            rec["equality"] = {k: c[k] for k in ("compared_elements", "mismatch_count", "max_abs_diff", "torch_equal")}
        return rec
