"""The rollout half of one arm of :mod:`rlk.integrations.production.bench` (``bench rollout``):
one vLLM engine, one workload, in a process of its own.

    python -m rlk.integrations.production.bench rollout --arm pp|rr --dir CKPT --out R/x_rollout.json \\
        [--workload W1]

pp runs vLLM arm ``stock`` and rr arm ``rlk`` of :mod:`rlk.integrations.vllm.engine_bench`, with
its engine arguments (``engine_kwargs``), environment (``arm_env``, exported through
``rlk.determinism.export`` before vLLM is imported, rlk's strict variables removed for stock),
workloads (``workload``) and output checks (``_outputs``). ``SamplingParams(temperature=1,
max_tokens=r, ignore_eos=True, logprobs=0, detokenize=False)`` per request (engine_bench's). One
untimed generate of the workload (warm-up), then the timed one (``torch.cuda.synchronize``
around it); engine start is recorded but not counted. Prompts, generated tokens and the returned
logprobs (float64 of vLLM's values; rr's are fp32 values, ``logprobs_mode="raw_logits"``) go to
``<out stem>.safetensors`` (:func:`rlk.integrations.production.records.save_rollout`).
"""

from __future__ import annotations

import os
import time


def say(msg: str) -> None:
    print(f"[rollout {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def check_args(arm: str, model_dir: str, workload: str) -> None:
    """Refuses a bad arm, workload or checkpoint folder before vLLM is imported."""
    from rlk.integrations.production.records import ARMS
    from rlk.integrations.vllm.engine_bench import WORKLOADS

    if arm not in ARMS:
        raise SystemExit(f"--arm {arm!r}: one of {ARMS}")
    if workload not in WORKLOADS:
        raise SystemExit(f"--workload {workload!r}: one of {sorted(WORKLOADS)}")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise SystemExit(f"--dir {model_dir!r} holds no config.json (write it with engine_bench prepare)")


def run_rollout(arm: str, model_dir: str, out: str, workload: str = "W1", profile: bool = False) -> dict:
    """The rollout half (module docstring); with ``profile``, one more generate of the workload
    after the timed one runs under vLLM's torch profiler and the record gets ``attribution``
    (:func:`rlk.integrations.vllm.engine_profile_bench.attribution_from_dir`), never counted."""
    check_args(arm, model_dir, workload)
    from rlk.integrations.production import records
    from rlk.integrations.vllm import engine_bench as eb

    varm = records.VLLM_ARM[arm]
    counters_dir = records.stem(out) + "_counters"
    eb.enter_arm_env(varm, counters_dir)  # before vLLM is imported / EngineCore spawned
    import importlib.metadata

    import torch

    from rlk.models.qwen3 import Qwen3Config

    cfg = Qwen3Config.from_json(os.path.join(model_dir, "config.json"))
    kw = eb.engine_kwargs(varm, model_dir)
    trace_dir = records.stem(out) + "_trace"
    llm, start_s = eb.start_engine(kw, f"{arm}: vLLM {varm}", trace_dir if profile else None)
    prompts, lens = eb.workload(workload, cfg.vocab_size)
    sps = eb.sampling_params(lens)
    reqs = [{"prompt_token_ids": p} for p in prompts]
    t0 = time.perf_counter()
    llm.generate(reqs, sps, use_tqdm=False)
    warm_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(reqs, sps, use_tqdm=False)
    torch.cuda.synchronize()
    gen_s = time.perf_counter() - t0
    toks, lps = eb._outputs(outs, lens)
    n_tok = sum(lens)
    say(f"[{arm}] {workload}: {len(prompts)} seqs, {n_tok} tokens in {gen_s:.2f} s ({n_tok / gen_s:.0f} tok/s; "
        f"untimed warm-up {warm_s:.2f} s)")
    attribution = eb.profiled_generate(llm, prompts, sps, trace_dir) if profile else None
    kw.pop("profiler_config", None)
    vc = llm.llm_engine.vllm_config
    rec = {"arm": arm, "vllm_arm": varm, "workload": workload, "sequences": len(prompts), "response_tokens": n_tok,
           "prompt_tokens": sum(map(len, prompts)), "engine_start_s": round(start_s, 2),
           "warmup_generate_s": round(warm_s, 4), "generate_s": round(gen_s, 4), "tok_per_s": round(n_tok / gen_s, 1),
           "engine_kwargs": kw, "vllm_version": importlib.metadata.version("vllm"),
           "cudagraph_mode": str(vc.compilation_config.cudagraph_mode),
           "compilation_mode": str(vc.compilation_config.mode),
           "bundle_sha256": os.environ.get("RLK_VLLM_BUNDLE_SHA256"),
           "env": {k: v for k, v in eb.arm_env(varm, counters_dir).items() if k.startswith(("VLLM", "RLK"))},
           "versions": _versions()}
    if attribution is not None:
        rec["attribution"] = attribution
    if varm == "rlk":
        from rlk.integrations.vllm import counters

        rec["worker_counters"] = counters.check(counters.read(counters_dir))
    responses, o = [], 0
    flat = toks.tolist()
    for r in lens:
        responses.append(flat[o:o + r])
        o += r
    records.save_rollout(out, prompts, responses, lps)
    rec["provenance"] = eb._provenance(varm, rec)
    records.write_json(out, rec)
    return rec


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for name in ("vllm", "torch", "triton"):
        try:
            out[name] = metadata.version(name)
        except Exception as e:  # recorded, never invented
            out[name] = repr(e)
    return out
