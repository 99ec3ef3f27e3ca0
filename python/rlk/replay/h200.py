"""The H200 replay: Qwen3-8B-shaped model (random bf16 weights), >= 64 sequences, prompts
64-2048 tokens, responses up to 1024, continuous batching with changing composition.

``python -m rlk.replay h200 --out DIR`` writes ``DIR/replay_h200.json`` (the summary:
provenance, model, sequences, compared_elements, mismatch_count, max_abs_diff,
torch_equal, native: {...}, distribution: the fixture's next-token statistics, health_failures)
and ``DIR/fixture/`` (the frozen fixture). Weights: ``calibrated.v1`` (trained-like output
statistics; ``model.weights.calibration`` has the recipe and the measured statistics).
"""

from __future__ import annotations

import json
import os
import time

import torch

from rlk.replay import compare, fixture, harness, health, rollout

FULL = dict(config="qwen3-8b", recipe="calibrated.v1", sequences=64, prompt_range=(64, 2048), response_range=(16, 1024),
            max_batch=48, chunk_size=512, token_budget=2048, arrival_spread=256, microbatch_tokens=16384)
QUICK = dict(FULL, sequences=16, prompt_range=(64, 512), response_range=(8, 128), arrival_spread=32)


def record_frozen(spec, p: dict, out_dir: str, progress=print):
    """Records the strict rollout of workload ``p`` (FULL / QUICK keys) with ``spec``'s model and
    saves the frozen fixture to ``out_dir/fixture``. Returns ``(fixture, RolloutResult, requests,
    RolloutConfig)``; shared by this replay and the megatron-core one."""
    cfg = spec.cfg()
    reqs = harness.make_requests(p["sequences"], p["prompt_range"], p["response_range"], cfg.vocab_size,
                                 seed=0, arrival_spread=p["arrival_spread"])
    rc = rollout.RolloutConfig(block_size=16, max_batch=p["max_batch"], chunk_size=p["chunk_size"],
                               token_budget=p["token_budget"], page_seed=1, sample_seed=2, jitter=0.25)
    progress(f"record: strict rollout of {len(reqs)} requests "
             f"({sum(len(r.prompt) for r in reqs)} prompt tokens, up to {sum(r.max_new_tokens for r in reqs)} new)")
    fx, res = harness.record(spec, reqs, rc, route="strict", progress=progress)
    fx_dir = os.path.join(out_dir, "fixture")
    fixture.save(fx, fx_dir)
    progress(f"rollout: {res.steps} steps, {res.composition_changes} composition changes, "
             f"max batch {max(res.batch_sizes)}, {res.seconds:.1f} s -> {fx_dir}")
    return fx, res, reqs, rc


def run(out_dir: str, layers: int | None = None, quick: bool = False, sequences: int | None = None,
        config: str | None = None, progress=print, native: bool = True) -> dict:
    p = dict(QUICK if quick else FULL)
    if sequences:
        p["sequences"] = sequences
    if config:
        p["config"] = config
    if not torch.cuda.is_available():
        raise RuntimeError("the h200 replay needs a CUDA device")
    os.makedirs(out_dir, exist_ok=True)
    t_all = time.perf_counter()
    spec = harness.ModelSpec(config=p["config"], num_layers=layers, seed=0, device="cuda", dtype="bfloat16",
                             recipe=p["recipe"])
    cfg = spec.cfg()
    progress(f"model {cfg.name}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
             f"heads {cfg.num_attention_heads}/{cfg.num_key_value_heads}x{cfg.head_dim}, vocab {cfg.vocab_size}")
    fx, res, reqs, rc = record_frozen(spec, p, out_dir, progress)
    progress(f"weights {spec.recipe}: {health.summary(fx.meta['distribution'])}")
    strict = harness.check(fx, "strict", replay_rollout=False, microbatch_tokens=p["microbatch_tokens"],
                           progress=progress)
    s = strict["trainer_vs_recorded"]
    progress(f"strict trainer vs rollout: mismatch_count={s['mismatch_count']} of {s['compared_elements']}, "
             f"max_abs_diff={s['max_abs_diff']}, torch_equal={s['torch_equal']} ({strict['trainer_seconds']:.1f} s)")
    nat = None
    if native:
        nat = harness.check(fx, "native", microbatch_tokens=p["microbatch_tokens"], progress=progress)
        nat["native_vs_strict"] = compare.compare_logp(nat["_trainer_logp"], strict["_trainer_logp"], fx.prompt_lens,
                                                       ("native", "strict"))
        n = nat["trainer_vs_rollout"]
        progress(f"native trainer vs native rollout: mismatch_count={n['mismatch_count']} of "
                 f"{n['compared_elements']}, max_abs_diff={n['max_abs_diff']:.3g}")
    summary = harness.headline(strict, nat, {
        "provenance": fx.meta["provenance"],
        "distribution": fx.meta["distribution"],
        "health_failures": health.fixture_failures(fx),
        "model": {"config": cfg.name, "num_hidden_layers": cfg.num_hidden_layers, "vocab_size": cfg.vocab_size,
                  "layers_note": "all layers" if layers is None else f"{layers} of the published layers (for time)",
                  "weights": fx.meta["weights"], "dtype": "bfloat16"},
        "workload": {"sequences": len(reqs), "prompt_range": p["prompt_range"], "response_range": p["response_range"],
                     "prompt_tokens": sum(fx.prompt_lens), "response_tokens": sum(fx.response_lens),
                     "rollout": rc.to_dict(), "rollout_steps": res.steps,
                     "composition_changes": res.composition_changes, "max_batch_seen": max(res.batch_sizes),
                     "trainer_microbatch_tokens": p["microbatch_tokens"]},
        "seconds": {"rollout_strict": res.seconds, "trainer_strict": strict["trainer_seconds"],
                    "rollout_native": nat["rollout_seconds"] if nat else None,
                    "trainer_native": nat["trainer_seconds"] if nat else None,
                    "total": time.perf_counter() - t_all},
        "cuda_graphs": {"graph_captures": res.graph_captures, "graph_replays": res.graph_replays,
                        "padded_steps": res.padded_steps},
        "first_mismatch": s.get("first_mismatch"),
        "command": "python -m rlk.replay h200 --out DIR" + (" --quick" if quick else "")
                   + (f" --layers {layers}" if layers else ""),
    })
    path = os.path.join(out_dir, "replay_h200.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True, default=str)
    progress(f"wrote {path} (total {summary['seconds']['total']:.1f} s)")
    return summary
