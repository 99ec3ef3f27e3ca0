"""Three vLLM arms on one GPU, same checkpoint, same requests: stock vLLM, vLLM's batch-invariant
mode, and vLLM + rlk's strict plugin; tokens/s of each, and every returned logprob against the
trainers' logp of the same tokens.

    python -m rlk.integrations.vllm.engine_bench prepare --dir CKPT [--config qwen3-8b] [--seed 0]
    python -m rlk.integrations.vllm.engine_bench arm --arm stock|batch_invariant|rlk --dir CKPT \\
        --out R/arm_<arm>.json [--workloads W0,W1,W2]
    python -m rlk.integrations.vllm.engine_bench compare --dir CKPT --arms R/arm_*.json --out R/compare.json
    python -m rlk.integrations.vllm.engine_bench report --results R --out docs/results/vllm_h200.json

``prepare`` writes the seeded bf16 weights (:func:`rlk.models.qwen3.random_weights`, recipe named
in the record) as one Hugging Face directory (:mod:`rlk.models.qwen3.checkpoint`); every arm and
both trainers load those files. Each ``arm`` runs in its own process (the batch-invariant switch
is an environment variable read when vLLM is imported; each engine owns the GPU): engine start,
one short warm-up generate, then the workloads in order. Warm-up rule, the same for every arm:
each workload first runs ``warmup_runs`` times untimed (first-use compilations: Triton kernels
of batch shapes the engine's own warm-up did not meet, torch.compile shapes, allocator growth),
then its timed runs, each from submission to the last output (``LLM.generate``),
``SamplingParams(temperature=1, max_tokens=r, ignore_eos=True, logprobs=0, detokenize=False)``
(no ``min_tokens``: it masks EOS, ignore_eos or not, and rlk's request gate refuses it). Returned token ids and logprobs of the first timed run go to
``<out>.safetensors``.

Arms (engine arguments in :func:`engine_kwargs`):
* ``stock``: vLLM's defaults (torch.compile, CUDA graphs, its FlashAttention backend, its sampler),
  ``logprobs_mode`` default (``raw_logprobs``).
* ``batch_invariant``: the same with ``VLLM_BATCH_INVARIANT=1`` (vLLM's own deterministic mode).
* ``rlk``: ``strict_engine_kwargs``: the strict Qwen3 class, full CUDA graphs of decode batches,
  ``logprobs_mode="raw_logits"`` (the values leave ``compute_logits`` as rlk's ``logp.v2``).

``compare`` (:mod:`rlk.integrations.vllm.engine_compare_bench`) scores every arm's tokens with rlk's
trainer pattern (strict route, packed varlen) and, when megatron-core is importable, with
megatron-core's GPTModel on rlk's spec, and compares the raw fp32 bytes. Workloads (:data:`WORKLOADS`): prompt ids and lengths from
``rlk.replay.harness.make_requests(seed=1)``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

WORKLOADS = {
    "W0": dict(n=16, prompt=(64, 512), response=(64, 256)),
    "W1": dict(n=64, prompt=(64, 1024), response=(64, 1024)),
    "W2": dict(n=256, prompt=(64, 1024), response=(64, 1024)),
}
ARMS = ("stock", "batch_invariant", "rlk")
# The profiled generate (attribution), after the timed ones: a workload's prompts with its own
# response lengths (tokens None) or with ``tokens`` each.
PROFILE = {"workload": "W0", "tokens": None}
MAX_MODEL_LEN = 2048  # longest prompt + response of every workload
MAX_NUM_SEQS = 256  # the largest workload fits one batch; the same for every arm
SEED = 1


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def profile_requests(prompts: list[list[int]], lens: list[int], tokens: int | None = None,
                     prompt_len: int | None = None) -> tuple[list[list[int]], list[int], str]:
    """The profiled generate's (prompts, response lengths, description): ``tokens`` response tokens
    each (else the workload's own), prompts cut to their first ``prompt_len`` tokens (else whole;
    short prompts make a decode-heavy trace, as a long RL rollout is)."""
    if tokens is not None and tokens < 1:
        raise SystemExit("--profile-tokens must be >= 1")
    if prompt_len is not None and prompt_len < 1:
        raise SystemExit("--profile-prompt-len must be >= 1")
    if tokens is not None:
        lens = [tokens] * len(prompts)
    if prompt_len is not None:
        prompts = [p[:prompt_len] for p in prompts]
    what = ("prompts" + (f" cut to {prompt_len} tokens" if prompt_len is not None else "") + ", "
            + (f"{tokens} tokens each" if tokens is not None else "its own response lengths") + ", profiled")
    return prompts, list(lens), what


def workload(name: str, vocab: int) -> tuple[list[list[int]], list[int]]:
    """(prompts, response lengths) of workload ``name``."""
    from rlk.replay.harness import make_requests

    w = WORKLOADS[name]
    reqs = make_requests(w["n"], w["prompt"], w["response"], vocab, seed=SEED)
    return [r.prompt for r in reqs], [r.max_new_tokens for r in reqs]


# ---- prepare --------------------------------------------------------------------------------------
IDENTITY = ("generator", "seed", "device", "config", "layers", "recipe")  # what makes two checkpoints the same


def prepare(model_dir: str, config: str, seed: int, layers: int | None = None, recipe: str | None = None,
            device: str = "cuda") -> dict:
    """Writes the checkpoint directory; reused when its record has the same :data:`IDENTITY` fields
    (generator, seed, device, config, layers, recipe; timings and the like may differ)."""
    import dataclasses

    import torch

    from rlk.models.qwen3 import Qwen3Config, random_weights
    from rlk.models.qwen3 import checkpoint

    cfg = Qwen3Config.named(config)
    if layers:
        cfg = dataclasses.replace(cfg, num_hidden_layers=layers)
    meta = {"generator": "rlk.models.qwen3.random_weights", "seed": seed, "device": device, "config": config,
            "layers": cfg.num_hidden_layers}
    kw = {}
    if recipe:
        kw["recipe"] = recipe
        meta["recipe"] = recipe
    try:
        rec = checkpoint.read_record(model_dir)
    except Exception:  # no record: write one
        rec = None
    if rec is not None and all(rec.get("meta", {}).get(k) == meta.get(k) for k in IDENTITY):
        say(f"checkpoint {model_dir} exists ({rec['sha256'][:12]}): reused")
        return rec
    t0 = time.perf_counter()
    w = random_weights(cfg, seed, device=device, **kw)
    if device == "cuda":
        torch.cuda.synchronize()
    meta["generate_s"] = round(time.perf_counter() - t0, 2)
    if recipe:
        from rlk.models.qwen3.weights import calibration_record

        meta["calibration"] = calibration_record(cfg, recipe)
    rec = checkpoint.write_hf_dir(cfg, w, model_dir, meta=meta, progress=say)
    say(f"checkpoint {model_dir}: {rec['bytes'] / 1e9:.1f} GB, sha256 {rec['sha256'][:12]}, "
        f"write {rec['write_s']} s, hash {rec['hash_s']} s")
    return rec


# ---- one arm --------------------------------------------------------------------------------------
def arm_env(arm: str, counters_dir: str, model_runner: str | None = None) -> dict[str, str]:
    """Variables of one arm's processes. Only the rlk arm loads rlk's plugin (``VLLM_PLUGINS``): the
    baselines run vLLM as its users do, with no rlk code and no strict environment."""
    from rlk.integrations.vllm.plugin import BASE_ENGINE_ENV, strict_process_env

    if arm == "rlk":
        return strict_process_env(counters_dir, model_runner)
    env = dict(BASE_ENGINE_ENV, VLLM_PLUGINS="")
    if arm == "batch_invariant":
        env["VLLM_BATCH_INVARIANT"] = "1"
    return env


def engine_kwargs(arm: str, model_dir: str, eager: bool = False) -> dict:
    """Engine arguments of ``arm``; ``eager`` (rlk only, a diagnostic) turns CUDA graphs off."""
    common = dict(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=MAX_MODEL_LEN,
                  max_num_seqs=MAX_NUM_SEQS, gpu_memory_utilization=0.85, enable_prefix_caching=False, seed=0)
    if arm == "rlk":
        from rlk.integrations.vllm.plugin import strict_engine_kwargs

        kw = strict_engine_kwargs(**common)
        if eager:
            kw.pop("compilation_config", None)
            kw["enforce_eager"] = True
        return kw
    if eager:
        raise SystemExit("--eager is a diagnostic of the rlk arm; the baselines run with vLLM's defaults")
    return common


def enter_arm_env(arm: str, counters_dir: str, model_runner: str | None = None) -> None:
    """This process's environment for ``arm``, before vLLM is imported or EngineCore spawned: a
    baseline drops rlk's strict variables, every arm exports :func:`arm_env`."""
    from rlk import determinism

    if arm != "rlk":
        determinism.unset(determinism.STRICT_ENV)
    determinism.export(arm_env(arm, counters_dir, model_runner))


def sampling_params(lens: list[int]) -> list:
    """The module's per-request ``SamplingParams``: exactly ``r`` tokens each (``ignore_eos`` and
    ``max_tokens``; no ``min_tokens``, which masks EOS and which rlk's request gate refuses),
    sampled-token logprobs on, temperature 1."""
    from vllm import SamplingParams

    return [SamplingParams(temperature=1.0, max_tokens=r, ignore_eos=True, logprobs=0, detokenize=False)
            for r in lens]


def start_engine(kw: dict, label: str, trace_dir: str | None = None):
    """``(LLM(**kw), engine start seconds)``; with ``trace_dir`` the engine's torch profiler is
    armed (inactive until :func:`profiled_generate`). ``kw`` gains the profiler arguments."""
    from vllm import LLM

    if trace_dir:
        from rlk.integrations.vllm import engine_profile_bench

        kw.update(engine_profile_bench.profiler_kwargs(trace_dir))
    say(f"[{label}] engine start: {json.dumps({k: v for k, v in kw.items() if k != 'model'}, default=str)}")
    t0 = time.perf_counter()
    llm = LLM(**kw)
    start_s = time.perf_counter() - t0
    say(f"[{label}] engine ready in {start_s:.1f} s")
    return llm, start_s


def profiled_generate(llm, prompts: list[list[int]], sps: list, trace_dir: str) -> dict:
    """One generate under the engine's profiler: the attribution of its trace
    (:func:`rlk.integrations.vllm.engine_profile_bench.attribution_from_dir`) and its wall time."""
    from rlk.integrations.vllm import engine_profile_bench

    llm.start_profile()
    t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts], sps, use_tqdm=False)
    wall = time.perf_counter() - t0
    llm.stop_profile()
    return dict(engine_profile_bench.attribution_from_dir(trace_dir), wall_s=round(wall, 4))


def _outputs(outs, lens):
    """(flat token ids, flat logprobs as float64) of one generate call, lengths checked."""
    import torch

    toks, lps = [], []
    for i, (o, r) in enumerate(zip(outs, lens)):
        c = o.outputs[0]
        ids = list(c.token_ids)
        if len(ids) != r:
            raise RuntimeError(f"request {i}: {len(ids)} tokens generated, {r} asked (ignore_eos, max_tokens)")
        if c.logprobs is None or len(c.logprobs) != r:
            raise RuntimeError(f"request {i}: logprobs missing ({None if c.logprobs is None else len(c.logprobs)})")
        toks += ids
        lps += [c.logprobs[j][t].logprob for j, t in enumerate(ids)]
    return torch.tensor(toks, dtype=torch.int32), torch.tensor(lps, dtype=torch.float64)


def runner_suffix(arm: str, v2: bool) -> str:
    """The rlk arm's name suffix when its engine ran the model runner that is not the platform's
    default (``_mrv1`` / ``_mrv2``), so that the report's ``rlk`` is always the default runner."""
    from rlk.integrations.vllm.plugin import default_model_runner

    ran = "v2" if v2 else "v1"
    return f"_mr{ran}" if arm == "rlk" and ran != default_model_runner() else ""


def run_arm(arm: str, model_dir: str, out: str, workloads: list[str], w0_reps: int = 3, eager: bool = False,
            profile: bool = False, warmup_runs: int = 1, profile_workload: str | None = None,
            profile_tokens: int | None = None, model_runner: str | None = None,
            profile_prompt_len: int | None = None) -> dict:
    """One engine, every workload in order; writes ``out`` (JSON) and ``<out>.safetensors``.

    ``warmup_runs``: untimed runs of each workload before its timed ones (the module's rule).

    ``profile``: after the timed workloads, one generate runs under vLLM's torch profiler (armed
    at engine start, inactive until then) and the record gets ``attribution``
    (:mod:`rlk.integrations.vllm.engine_profile_bench`): workload ``profile_workload`` with its own
    response lengths, or ``profile_tokens`` each (defaults: :data:`PROFILE`), its prompts cut to
    ``profile_prompt_len`` tokens when given (:func:`profile_requests`).

    ``model_runner`` (rlk arm only): ``v1`` or ``v2`` serves the strict model on that vLLM model
    runner instead of the platform's default (``plugin.worker_env``: V2 on a GPU). Every record
    says which runner ran (``use_v2_model_runner``, read from the engine's config); an rlk arm on
    the runner that is not the default is recorded as ``rlk_mrv1`` / ``rlk_mrv2``
    (:func:`runner_suffix`)."""
    if arm not in ARMS:
        raise SystemExit(f"--arm {arm!r}: one of {ARMS}")
    if model_runner is not None:
        from rlk.integrations.vllm.plugin import MODEL_RUNNERS

        if arm != "rlk" or model_runner not in MODEL_RUNNERS:
            raise SystemExit(f"--model-runner {model_runner!r}: {sorted(MODEL_RUNNERS)}, rlk arm only (the "
                             "baselines run vLLM's own choice)")
    profile_workload = profile_workload or PROFILE["workload"]
    profile_tokens = profile_tokens if profile_tokens is not None else PROFILE["tokens"]
    if profile_workload not in WORKLOADS:
        raise SystemExit(f"--profile-workload {profile_workload!r}: one of {sorted(WORKLOADS)}")
    profile_requests([], [], profile_tokens, profile_prompt_len)  # refused before the engine starts
    counters_dir = os.path.splitext(out)[0] + "_counters"
    enter_arm_env(arm, counters_dir, model_runner)
    import importlib.metadata

    import torch
    from safetensors.torch import save_file
    from vllm import SamplingParams

    from rlk.models.qwen3 import Qwen3Config

    cfg = Qwen3Config.from_json(os.path.join(model_dir, "config.json"))
    kw = engine_kwargs(arm, model_dir, eager)
    trace_dir = os.path.splitext(out)[0] + "_trace"
    llm, start_s = start_engine(kw, arm, trace_dir if profile else None)
    vc = llm.llm_engine.vllm_config
    v2 = bool(getattr(vc, "use_v2_model_runner", False))
    rec = {"arm": arm + ("_eager" if eager else "") + runner_suffix(arm, v2),
           "engine_start_s": round(start_s, 2), "engine_kwargs": {k: v for k, v in kw.items()},
           "vllm_version": importlib.metadata.version("vllm"), "use_v2_model_runner": v2,
           "cudagraph_mode": str(vc.compilation_config.cudagraph_mode),
           "compilation_mode": str(vc.compilation_config.mode),
           "env": {k: v for k, v in arm_env(arm, counters_dir, model_runner).items() if k.startswith(("VLLM", "RLK"))},
           "warmup_runs_per_workload": warmup_runs, "workloads": {}}
    warm = [list(range(100 + i, 164 + i)) for i in range(4)]
    t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in warm],
                 SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, logprobs=0, detokenize=False),
                 use_tqdm=False)
    rec["warmup_s"] = round(time.perf_counter() - t0, 2)
    tensors = {}
    for w in workloads:
        prompts, lens = workload(w, cfg.vocab_size)
        sps = sampling_params(lens)
        reps = w0_reps if w == "W0" else 1
        warm_s = []
        for _ in range(warmup_runs):
            t0 = time.perf_counter()
            llm.generate([{"prompt_token_ids": p} for p in prompts], sps, use_tqdm=False)
            warm_s.append(round(time.perf_counter() - t0, 4))
        times = []
        for k in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sps, use_tqdm=False)
            times.append(time.perf_counter() - t0)
            toks, lps = _outputs(outs, lens)
            if k == 0:  # the first repetition's tokens are the ones compared
                tensors[f"{w}.tokens"], tensors[f"{w}.logp"] = toks, lps
        n_tok = sum(lens)
        med = sorted(times)[len(times) // 2]
        rec["workloads"][w] = {"sequences": len(prompts), "response_tokens": n_tok, "prompt_tokens":
                               sum(map(len, prompts)), "warmup_seconds": warm_s,
                               "seconds": [round(t, 4) for t in times],
                               "median_s": round(med, 4), "tok_per_s": round(n_tok / med, 1)}
        say(f"[{arm}] {w}: {len(prompts)} seqs, {n_tok} tokens, {med:.2f} s -> {n_tok / med:.0f} tok/s "
            f"(reps {[round(t, 2) for t in times]}, untimed warm-up {warm_s})")
    if profile:
        prompts, lens, what = profile_requests(*workload(profile_workload, cfg.vocab_size), profile_tokens,
                                               profile_prompt_len)
        what = f"{profile_workload} {what}"
        rec["attribution"] = dict(profiled_generate(llm, prompts, sampling_params(lens), trace_dir),
                                  workload=profile_workload, response_tokens=sum(lens), what=what)
        say(f"[{arm}] attribution: {json.dumps(rec['attribution'])}")
    if arm == "rlk":
        from rlk.integrations.vllm import counters

        rec["worker_counters"] = counters.check(counters.read(counters_dir))
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.splitext(out)[0] + ".safetensors")
    rec["provenance"] = _provenance(arm, rec)
    with open(out, "w") as f:
        json.dump(rec, f, indent=1, default=str)
    return rec


def _provenance(arm: str, rec: dict) -> dict:
    extra = {"engine": f"vllm {rec.get('vllm_version')}", "arm": arm,
             "bundle_sha256": os.environ.get("RLK_VLLM_BUNDLE_SHA256")}
    try:
        from rlk import provenance

        ids = sorted(set((rec.get("worker_counters") or {}).get("contracts", {}).values())) or None
        return provenance.capability_record(route="strict" if arm == "rlk" else "native", contract_ids=ids,
                                            extra=extra)
    except Exception as e:  # recorded, never invented
        import torch

        return {"error": f"capability_record failed: {type(e).__name__}: {e}", "torch": torch.__version__,
                "extra": extra}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--dir", required=True)
    p.add_argument("--config", default="qwen3-8b")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--recipe", default=None)
    a_ = sub.add_parser("arm")
    a_.add_argument("--arm", required=True, choices=ARMS)
    a_.add_argument("--dir", required=True)
    a_.add_argument("--out", required=True)
    a_.add_argument("--workloads", default="W0,W1,W2")
    a_.add_argument("--w0-reps", type=int, default=3)
    a_.add_argument("--warmup-runs", type=int, default=1, help="untimed runs of each workload before its timed ones")
    a_.add_argument("--eager", action="store_true", help="rlk arm without CUDA graphs (diagnostic)")
    a_.add_argument("--model-runner", default=None, choices=["v1", "v2"],
                    help="rlk arm: vLLM's model runner for the strict model (default: v2 on a GPU, v1 on the CPU build; "
                         "an arm on the other one is recorded as rlk_mrv1 / rlk_mrv2)")
    a_.add_argument("--profile", action="store_true", help="attribution: one profiled generate after the timed ones")
    a_.add_argument("--profile-workload", default=None, help=f"the profiled workload (default {PROFILE['workload']})")
    a_.add_argument("--profile-tokens", type=int, default=None,
                    help="response tokens per sequence of the profiled generate (default: the workload's own)")
    a_.add_argument("--profile-prompt-len", type=int, default=None,
                    help="cut the profiled generate's prompts to this many tokens (a decode-heavy trace)")
    c = sub.add_parser("compare")
    c.add_argument("--dir", required=True)
    c.add_argument("--arms", nargs="+", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--no-megatron", action="store_true")
    r = sub.add_parser("report")
    r.add_argument("--results", required=True, nargs="+",
                   help="results folders; several = process-level repetitions (medians over them)")
    r.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "prepare":
        prepare(a.dir, a.config, a.seed, a.layers, a.recipe)
    elif a.cmd == "arm":
        if a.warmup_runs < 0 or a.w0_reps < 1:
            raise SystemExit("--warmup-runs must be >= 0 and --w0-reps >= 1")
        run_arm(a.arm, a.dir, a.out, [w for w in a.workloads.split(",") if w], a.w0_reps, a.eager, a.profile,
                a.warmup_runs, a.profile_workload, a.profile_tokens, a.model_runner, a.profile_prompt_len)
    elif a.cmd == "compare":
        from rlk.integrations.vllm import engine_compare_bench

        engine_compare_bench.compare(a.dir, a.arms, a.out, megatron=not a.no_megatron, workload=workload,
                                     say=say)
    else:
        from rlk.integrations.vllm import engine_report_bench

        engine_report_bench.write(a.results, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
