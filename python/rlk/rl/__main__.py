"""``python -m rlk.rl --route strict|native|both --steps N --out DIR``: the GRPO loop.

The trained tiny model on the CPU by default; on a GPU at Qwen3-8B shapes, e.g. (H200)::

    python -m rlk.rl --device cuda --model qwen3-8b --task token_class --optimizer-offload
        --prompts 4 --group-size 8 --response-len 128 --lr 1e-4 --steps 6 --tag h200 --out DIR

(one command line).
Prints one JSON line per step on stdout (also ``DIR/steps.jsonl``), a progress bar on stderr,
and writes ``DIR/rl_loop_<tag>.json`` and ``DIR/rl_loop_<tag>.png`` (tag: ``--tag``, else the
device type).
Exit status 0 when the strict arm (if run) had every importance ratio exactly 1.0, every logp
bitwise equal to the rollout's and every weight sync verified; 1 otherwise. ``--min-reward-gain
G`` also fails a strict arm whose reward gain (mean of the last k steps minus the first k) is below
``G``. A fingerprint mismatch aborts with the diagnostic (status 2).

``--trainer megatron``: the actor is megatron-core's GPTModel (``rlk.integrations.megatron.rl_trainer.RLTrainer``:
megatron's DDP with fp32 main_grad buffers, its no-pipelining schedule and DistributedOptimizer
Adam), on rlk's strict spec for the strict route and on megatron's local spec (torch varlen
attention, cuBLAS) for the native route; the rollout engine is unchanged. With ``--engine vllm
--route both`` the two arms are the production pair in a loop: vLLM + rlk's plugin with megatron on
rlk's spec, stock vLLM with megatron's native spec.

``--engine vllm``: the rollout engine is vLLM (``rlk.integrations.vllm.rl_engine.VllmRolloutEngine``;
run with the vLLM venv's python), serving rlk's strict plugin on the strict route and stock vLLM's
Qwen3 on the native route (its trainer: rlk's torch route, a stand-in, unless ``--trainer
megatron``); the
weight sync writes a safetensors file and the workers load it through ``collective_rpc`` by
method name, answering with the fingerprint of what they hold. On one GPU the trainer shares the
device with vLLM: ``--engine-memory`` sets vLLM's share (``gpu_memory_utilization``).
``--engine-transport inproc`` runs vLLM's engine core and worker in the loop's process and hands
the workers the trainer's tensors themselves (no file, nothing serialized; the engine starts on
dummy weights and the initial verified sync loads the trainer's); one route per process (vLLM
caches its environment in the process), tensor parallel size 1.

``--merge A.json,B.json --out DIR [--tag T]``: one report (JSON + PNG) of arms that ran in separate
processes, e.g. the strict and the native arm of the 8B loop (one device call each); refused when
the arms' settings, model, device or toolchain differ (``rlk.rl.merge.merge_reports``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time


def _setup_env():
    import torch

    from rlk import determinism

    if not torch.cuda.is_available():
        determinism.configure_cpu_interpreter()  # before any kernel module is imported
    determinism.apply_strict_env()


def _parser() -> argparse.ArgumentParser:
    from rlk.rl.loop import LoopConfig

    d = LoopConfig()
    p = argparse.ArgumentParser(prog="python -m rlk.rl", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--route", choices=("strict", "native", "both"), default="both")
    p.add_argument("--trainer", choices=("rlk", "megatron"), default="rlk",
                   help="the actor: rlk's own trainer, or megatron-core's GPTModel (megatron's DDP, schedule and "
                        "Adam) on rlk's strict spec (strict route) or megatron's local spec (native route)")
    p.add_argument("--engine", choices=("rlk", "vllm"), default="rlk",
                   help="the rollout engine: rlk's replay executor, or vLLM (strict route: with rlk's strict "
                        "plugin; native route: stock vLLM; needs vLLM installed)")
    p.add_argument("--engine-memory", type=float, default=None, metavar="FRACTION",
                   help="--engine vllm: vLLM's gpu_memory_utilization (the share of the GPU vLLM takes for "
                        "weights and KV cache); leave room for the trainer on the same GPU")
    p.add_argument("--engine-transport", choices=("file", "inproc"), default=None,
                   help="--engine vllm: how each weight sync reaches vLLM's workers: a safetensors file loaded by "
                        "name (default: file), or the trainer's tensors handed over to an engine running in this "
                        "process (inproc: one route per process)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--out", help="report folder (required unless --replot)")
    p.add_argument("--replot", metavar="REPORT_JSON", help="only draw the PNG of a written report again")
    p.add_argument("--merge", metavar="A.json,B.json",
                   help="write one report of the arms of these reports (separate processes) to --out")
    p.add_argument("--model", default=d.model,
                   help="a named config (Qwen3Config NAMED, e.g. qwen3-8b): its trained checkpoint when it "
                        "has one (tiny, tiny-hd64) and no --recipe is given, else seeded weights")
    p.add_argument("--recipe", default=None, help="seeded weights of this recipe (default for models without a "
                                                  "trained checkpoint: calibrated.v1)")
    p.add_argument("--layers", type=int, default=None, help="named config: decoder layers (default: all)")
    p.add_argument("--task", default=d.task_name, choices=("target_byte", "token_class"),
                   help="target_byte: fraction of one byte (byte vocabularies); token_class: fraction of "
                        "even token ids (large vocabularies)")
    p.add_argument("--recompute", choices=("full", "selective"), default=None,
                   help="--trainer megatron: megatron's activation recompute (full: every layer; selective: the "
                        "attention core); bitwise the same gradients, less activation memory")
    p.add_argument("--optimizer-offload", nargs="?", type=float, const=1.0, default=0.0, metavar="FRACTION",
                   help="Adam's fp32 masters and moments on the host (a Qwen3-8B trainer and engine do not fit one "
                        "H200 with them on the GPU): all of them (no value; the rlk trainer offloads all or none), "
                        "or, with --trainer megatron, the FRACTION of the parameters megatron's CPU offload takes")
    p.add_argument("--fingerprint", default=d.fingerprint, choices=("auto", "sha256", "device"),
                   help="weight-sync fingerprint: auto = sha256 on the host for CPU runs, device on CUDA")
    p.add_argument("--tag", default=None, help="report name rl_loop_<tag>.json (default: the device type)")
    p.add_argument("--prompts", type=int, default=d.prompts_per_step, help="prompts per step")
    p.add_argument("--group-size", type=int, default=d.group_size, help="samples per prompt")
    p.add_argument("--response-len", type=int, default=d.response_len, help="tokens per response")
    p.add_argument("--lr", type=float, default=d.lr, help="Adam learning rate")
    p.add_argument("--clip-eps", type=float, default=d.clip_eps)
    p.add_argument("--target", default=chr(d.target), help="target byte of the task (one character)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--jitter", type=float, default=d.jitter, help="rollout scheduler's deferral probability")
    p.add_argument("--device", default=d.device)
    p.add_argument("--min-reward-gain", type=float, default=None,
                   help="also fail when the strict arm's reward gain is below this")
    p.add_argument("--quiet", action="store_true", help="no per-step JSON lines on stdout")
    return p


def _progress(steps: int):
    """(update(rec), close()) of one progress bar per arm (``steps`` each): tqdm when importable,
    plain lines on stderr otherwise."""
    from rlk.rl.report import step_line

    try:
        from tqdm import tqdm
    except ImportError:
        return (lambda rec: print(step_line(rec), file=sys.stderr, flush=True)), (lambda: None)
    bars: dict = {}

    def update(rec):
        if rec["route"] not in bars:
            for b in bars.values():
                b.close()
            bars[rec["route"]] = tqdm(total=steps, file=sys.stderr, unit="step", desc=rec["route"],
                                      dynamic_ncols=True)
        bar = bars[rec["route"]]
        bar.set_postfix_str(f"reward {rec['reward_mean']:.3f} ratio_not_one {rec['ratio_not_one']}")
        bar.update(1)

    def close():
        for b in bars.values():
            b.close()

    return update, close


def _offload(fraction: float) -> bool | float:
    """``--optimizer-offload``'s value for LoopConfig: none and all as bools (the rlk trainer's
    switch), anything else as given (LoopConfig.check refuses what is out of range)."""
    return fraction == 1.0 if fraction in (0.0, 1.0) else fraction


def engine_kwargs(a, parser) -> dict:
    """vLLM engine arguments from the command line (``--engine-memory``, ``--engine-transport``)."""
    kw = {}
    for flag, value in (("--engine-transport", a.engine_transport), ("--engine-memory", a.engine_memory)):
        if value is not None and a.engine != "vllm":
            parser.error(f"{flag} applies to --engine vllm")
    if a.engine_transport is not None:
        if a.engine_transport == "inproc" and a.route == "both":
            parser.error("--engine-transport inproc runs one route per process (vLLM caches its environment in "
                         "the process): --route strict or --route native, then --merge the reports")
        kw["transport"] = a.engine_transport
    if a.engine_memory is not None:
        if not 0.0 < a.engine_memory <= 1.0:
            parser.error(f"--engine-memory must lie in (0, 1] (got {a.engine_memory})")
        kw["gpu_memory_utilization"] = a.engine_memory
    return kw


def main(argv=None) -> int:
    parser = _parser()
    a = parser.parse_args(argv)
    if a.replot:
        from rlk.rl.loop import replot

        print(replot(a.replot) or "not drawn: matplotlib is not importable", file=sys.stderr)
        return 0
    if not a.out:
        parser.error("--out is required")
    if a.merge:
        from rlk.errors import UnsupportedConfigError
        from rlk.rl.merge import merge_reports

        try:
            report = merge_reports([p for p in a.merge.split(",") if p], a.out, tag=a.tag)
        except (UnsupportedConfigError, OSError, ValueError) as e:
            parser.error(str(e))
        print(f"merged {', '.join(report['routes'])}: passed {report['passed']}; {report['files']}", file=sys.stderr)
        return 0 if report["passed"] else 1
    if len(a.target) != 1 or ord(a.target) > 255:
        parser.error(f"--target must be one byte-valued character (got {a.target!r})")
    _setup_env()
    from rlk.errors import UnsupportedConfigError
    from rlk.rl import loop, sync
    lc = loop.LoopConfig(steps=a.steps, model=a.model, prompts_per_step=a.prompts, group_size=a.group_size,
                         response_len=a.response_len, lr=a.lr, clip_eps=a.clip_eps, target=ord(a.target),
                         seed=a.seed, jitter=a.jitter, device=a.device, trainer=a.trainer, recipe=a.recipe,
                         layers=a.layers, task_name=a.task, optimizer_offload=_offload(a.optimizer_offload),
                         recompute=a.recompute, fingerprint=a.fingerprint)
    routes = ["strict", "native"] if a.route == "both" else [a.route]
    make_trainer = None
    if a.trainer == "megatron":
        from rlk.integrations.megatron.rl_trainer import RLTrainer

        make_trainer = RLTrainer
    make_engine = None
    ekw = engine_kwargs(a, parser)  # refuses engine options without --engine vllm
    if a.engine == "vllm":
        # strict: vLLM + rlk's plugin; native: stock vLLM. Each engine sets the environment its
        # processes start with (rlk.integrations.vllm.rl_engine).
        from rlk.integrations.vllm.rl_engine import make_engine as vllm_engine

        make_engine = vllm_engine(**ekw)
    try:
        for r in routes:
            dataclasses.replace(lc, route=r).check()  # bad arguments fail before any work
    except UnsupportedConfigError as e:
        parser.error(str(e))
    update, close = _progress(a.steps)

    def on_step(rec):
        if not a.quiet:
            print(json.dumps(rec, sort_keys=True), flush=True)
        update(rec)

    t0 = time.perf_counter()
    try:
        report = loop.run_and_report(lc, routes, a.out, on_step=on_step, make_trainer=make_trainer, tag=a.tag,
                                     make_engine=make_engine)
    except sync.WeightSyncError as e:
        close()
        print(f"ABORT: {e}", file=sys.stderr)
        return 2
    close()
    failures = list(report["failures"])
    for route, arm in report["arms"].items():
        s = arm["summary"]
        print(f"{route}: {s['steps']} steps, reward {s['reward_first']:.3f} -> {s['reward_last']:.3f} (gain "
              f"{s['reward_gain']:+.3f} over windows of {s['reward_gain_window']}), ratio_not_one {s['ratio_not_one']} "
              f"of {s['tokens']} tokens, logp_mismatch {s['logp_mismatch']}, |ratio-1| max {s['abs_dev_max']:.3g}, "
              f"seconds {s['seconds']}", file=sys.stderr)
        if route == "strict" and a.min_reward_gain is not None and s["reward_gain"] < a.min_reward_gain:
            failures.append(f"strict reward gain {s['reward_gain']:.3f} < {a.min_reward_gain}")
    verdict = "PASSED" if not failures else "FAILED: " + "; ".join(failures)
    if "strict" not in routes:
        verdict += " (native arm only: the strict checks did not run)"
    print(f"{verdict} in {time.perf_counter() - t0:.1f} s; reports: {report['files']}", file=sys.stderr)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
