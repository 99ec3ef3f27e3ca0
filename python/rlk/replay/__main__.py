"""``python -m rlk.replay {record,check,h200}``.

  record --config tiny --seed 0 --sequences 8 --out DIR      rollout pattern -> frozen fixture
  check  --fixture DIR [--route strict|native|both] [--diag DIR]   trainer + rollout replay, compare
  h200   --out DIR [--layers N] [--quick]                    Qwen3-8B-shaped replay -> replay_h200.json

Exit status: 0 when the strict route's mismatch_count is 0 everywhere and the fixture's
distribution is healthy (rlk.replay.health: entropy, sampled logp exactly 0.0, NaN/Inf), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from rlk.models.qwen3.weights import DEFAULT_RECIPE, RECIPES


def _setup_env():
    import torch

    from rlk import determinism

    if not torch.cuda.is_available():
        determinism.configure_cpu_interpreter()  # before any kernel module is imported
    determinism.apply_strict_env()


def _say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cmd_record(a) -> int:
    from rlk.replay import fixture, harness, health, rollout

    spec = harness.ModelSpec(config=a.config, num_layers=a.layers, seed=a.seed, checkpoint=a.checkpoint,
                             device=a.device, dtype=a.dtype, recipe=a.recipe)
    cfg = spec.cfg()
    reqs = harness.make_requests(a.sequences, tuple(a.prompt_range), tuple(a.response_range), cfg.vocab_size,
                                 seed=a.data_seed, arrival_spread=a.arrival_spread)
    rc = rollout.RolloutConfig(block_size=a.block_size, max_batch=a.max_batch, chunk_size=a.chunk_size,
                               page_seed=a.page_seed, sample_seed=a.sample_seed, step_logp=a.step_logp)
    fx, res = harness.record(spec, reqs, rc, route=a.route, progress=_say)
    st, js = fixture.save(fx, a.out)
    _say(f"recorded {len(reqs)} sequences, {sum(fx.response_lens)} response tokens, {res.steps} steps "
         f"({res.composition_changes} composition changes) in {res.seconds:.1f} s -> {st}, {js}")
    _say(f"distribution: {health.summary(fx.meta['distribution'])}")
    for f in health.fixture_failures(fx):
        _say(f"DEGENERATE fixture: {f}")
    return 0


def cmd_check(a) -> int:
    from rlk.replay import compare, fixture, harness, health

    fx = fixture.load(a.fixture)
    degenerate = health.fixture_failures(fx)
    _say(f"distribution: {health.summary(health.fixture_stats(fx))}")
    for f in degenerate:
        _say(f"DEGENERATE fixture (a comparison on it cannot show much): {f}")
    routes = ["strict", "native"] if a.route == "both" else [a.route]
    reports, bad = {}, False
    for r in routes:
        rep = harness.check(fx, r, device=a.device, localize=a.localize, microbatch_tokens=a.microbatch_tokens,
                            progress=_say)
        reports[r] = rep
        for key in ("trainer_vs_recorded", "trainer_vs_rollout", "rollout_replay_vs_recorded"):
            if key in rep:
                c = rep[key]
                _say(f"[{r}] {key}: mismatch_count={c['mismatch_count']} of {c['compared_elements']}, "
                     f"max_abs_diff={c['max_abs_diff']:.3g}, torch_equal={c['torch_equal']}")
                if r == "strict" and c["mismatch_count"]:
                    bad = True
    if "strict" in reports and "native" in reports:
        reports["native"]["native_vs_strict"] = compare.compare_logp(
            reports["native"]["_trainer_logp"], reports["strict"]["_trainer_logp"], fx.prompt_lens, ("native", "strict"))
    out = {r: harness.public(v) for r, v in reports.items()}
    out["health_failures"] = degenerate
    if a.diag:
        p = compare.write_diagnostic(os.path.join(a.diag, "replay_check.json"), out)
        _say(f"report -> {p}")
    elif bad:
        p = compare.write_diagnostic(os.path.join(os.path.dirname(os.path.abspath(a.fixture)), "replay_diag.json"), out)
        _say(f"MISMATCH: diagnostic -> {p}")
    return 1 if bad or degenerate else 0


def cmd_h200(a) -> int:
    from rlk.replay import h200

    summary = h200.run(out_dir=a.out, layers=a.layers, quick=a.quick, sequences=a.sequences, progress=_say)
    return 0 if summary["mismatch_count"] == 0 and not summary["health_failures"] else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlk.replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--config", default="tiny")
    r.add_argument("--layers", type=int, default=None)
    r.add_argument("--seed", type=int, default=0, help="weight seed")
    r.add_argument("--checkpoint", default=None, help="local safetensors file/folder instead of random weights")
    r.add_argument("--recipe", default=DEFAULT_RECIPE, choices=RECIPES,
                   help="random weights' recipe (rlk.models.qwen3.weights; plain.v0: the pre-calibration one)")
    r.add_argument("--device", default="cuda" if _cuda() else "cpu")
    r.add_argument("--dtype", default="bfloat16")
    r.add_argument("--route", default="strict", choices=["strict", "native"])
    r.add_argument("--sequences", type=int, default=8)
    r.add_argument("--prompt-range", type=int, nargs=2, default=[3, 20])
    r.add_argument("--response-range", type=int, nargs=2, default=[2, 12])
    r.add_argument("--arrival-spread", type=int, default=6)
    r.add_argument("--data-seed", type=int, default=0)
    r.add_argument("--block-size", type=int, default=16)
    r.add_argument("--max-batch", type=int, default=4)
    r.add_argument("--chunk-size", type=int, default=16)
    r.add_argument("--page-seed", type=int, default=1)
    r.add_argument("--sample-seed", type=int, default=2)
    r.add_argument("--step-logp", action=argparse.BooleanOptionalAction, default=True,
                   help="RolloutConfig.step_logp, saved in the fixture: forced replays of it (check) compute "
                        "the logp inside the padded decode steps (default) or with the eager LM head")
    r.add_argument("--out", required=True)
    c = sub.add_parser("check")
    c.add_argument("--fixture", required=True)
    c.add_argument("--route", default="both", choices=["strict", "native", "both"])
    c.add_argument("--device", default=None)
    c.add_argument("--localize", action="store_true", help="layer probes on a trainer/rollout mismatch")
    c.add_argument("--microbatch-tokens", type=int, default=None)
    c.add_argument("--diag", default=None, help="folder for replay_check.json")
    h = sub.add_parser("h200")
    h.add_argument("--out", required=True)
    h.add_argument("--layers", type=int, default=None, help="default: all 36 of Qwen3-8B")
    h.add_argument("--sequences", type=int, default=64)
    h.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    _setup_env()
    return {"record": cmd_record, "check": cmd_check, "h200": cmd_h200}[a.cmd](a)


def _cuda():
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
