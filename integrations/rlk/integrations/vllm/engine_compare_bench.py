"""The trainers' side of :mod:`rlk.integrations.vllm.engine_bench`: every arm's generated tokens
scored by rlk's trainer pattern (strict route, packed varlen) and by megatron-core's GPTModel on
rlk's spec, compared with the engine's returned logprobs as raw fp32 bytes; the checkpoint's
next-token statistics and each arm's sampled-logp statistics.

    python -m rlk.integrations.vllm.engine_bench compare --dir CKPT --arms R/arm_*.json --out R/compare.json
"""

from __future__ import annotations

import json
import os
import time


def compare_logp(engine: list, trainer: list) -> dict:
    """Bitwise comparison of per-request logp (engine: float64 values that must be exact fp32)."""
    import torch

    n = bad = 0
    first, max_abs = None, 0.0
    for i, (e, t) in enumerate(zip(engine, trainer)):
        e32 = e.to(torch.float32)
        if not torch.equal(e32.to(torch.float64), e):
            raise AssertionError(f"request {i}: engine logp are not fp32 values")
        t = t.to(torch.float32).cpu()
        if e32.shape != t.shape:
            raise AssertionError(f"request {i}: {tuple(e32.shape)} vs {tuple(t.shape)}")
        neq = e32.view(torch.int32) != t.view(torch.int32)
        n += e32.numel()
        bad += int(neq.sum())
        if neq.any():
            max_abs = max(max_abs, float((e32.double() - t.double()).abs().max()))
            if first is None:
                j = int(torch.nonzero(neq)[0])
                first = {"request": i, "token": j, "engine": float(e32[j]), "trainer": float(t[j])}
    return {"compared_elements": n, "mismatch_count": bad, "max_abs_diff": max_abs, "torch_equal": bad == 0,
            "first_mismatch": first}


def sampled_logp_stats(lp) -> dict:
    """Statistics of the engine's sampled-token logp (one flat tensor), computed by
    :func:`rlk.models.qwen3.distribution.distribution_stats` (one definition for every report):
    mean, std, p1, p50, p99, the fraction exactly 0.0 and the count of non-finite values."""
    from rlk.models.qwen3.distribution import distribution_stats

    s = distribution_stats([], lp)
    return {"n": s["rows"], "mean": s["logp_mean"], "std": s["logp_std"], "p1": s["logp_p1"], "p50": s["logp_p50"],
            "p99": s["logp_p99"], "frac_logp_zero": s["frac_logp_zero"], "non_finite": s["nonfinite"]}


def _split(flat, lens):
    out, o = [], 0
    for r in lens:
        out.append(flat[o:o + r])
        o += r
    return out


def compare(model_dir: str, arm_files: list[str], out: str, microbatch_tokens: int = 32768,
            megatron: bool = True, *, workload, say=print) -> dict:
    """``workload(name, vocab)`` and ``say(msg)`` are engine_bench's (passed in, so that this
    step does not import the benchmark that imports it)."""
    import torch
    from safetensors.torch import load_file

    from rlk.models.qwen3 import Qwen3, Qwen3Config, load_safetensors
    from rlk.models.qwen3.layouts import hf_to_fused
    from rlk.replay import trainer

    cfg = Qwen3Config.from_json(os.path.join(model_dir, "config.json"))
    t0 = time.perf_counter()
    fused = hf_to_fused(cfg, load_safetensors(model_dir, cfg, device="cuda"))
    model = Qwen3(cfg, fused, "strict")
    say(f"trainer model loaded in {time.perf_counter() - t0:.1f} s")
    mg = None
    res = {"trainers": ["rlk trainer pattern (rlk.replay.trainer.score, strict route)"], "arms": {}}
    from rlk.models.qwen3.distribution import measure, random_prompts

    # The checkpoint's next-token statistics, computed as the weight recipes' are (weights.calibration).
    res["distribution"] = measure(model, random_prompts(cfg.vocab_size, 4, 64, seed=0), seed=0)
    say(f"checkpoint distribution: {json.dumps(res['distribution'])}")
    if megatron:
        try:
            from rlk.integrations.megatron import replay_probe as mreplay

            res["megatron_core_version"] = mreplay.megatron_version()
            mg = mreplay.build_megatron(cfg, fused, "cuda")
            res["trainers"].append(f"megatron-core {res['megatron_core_version']} GPTModel, rlk strict spec, TP=1")
        except Exception as e:
            res["megatron_error"] = f"{type(e).__name__}: {e}"
            say(f"megatron-core trainer unavailable: {res['megatron_error']}")
    for path in arm_files:
        with open(path) as f:
            arm = json.load(f)
        tens = load_file(os.path.splitext(path)[0] + ".safetensors")
        name = arm["arm"]
        res["arms"][name] = {}
        for w in arm["workloads"]:
            prompts, lens = workload(w, cfg.vocab_size)
            toks = _split(tens[f"{w}.tokens"].tolist(), lens)
            elp = _split(tens[f"{w}.logp"], lens)
            t1 = time.perf_counter()
            tl, _, _ = trainer.score(model, prompts, toks, microbatch_tokens=microbatch_tokens)
            r = {"rlk_trainer": compare_logp(elp, tl), "rlk_trainer_s": round(time.perf_counter() - t1, 2),
                 "sampled_logp": sampled_logp_stats(tens[f"{w}.logp"])}
            if mg is not None:
                from rlk.integrations.megatron import replay_probe as mreplay

                ml, ms, _ = mreplay.megatron_score(mg, cfg, prompts, toks, microbatch_tokens, "cuda")
                r["megatron"] = compare_logp(elp, ml)
                r["megatron_vs_rlk_trainer"] = compare_logp([t.double().cpu() for t in tl], ml)
                r["megatron_s"] = round(ms, 2)
            res["arms"][name][w] = r
            say(f"compare {name} {w}: rlk trainer mismatches {r['rlk_trainer']['mismatch_count']} of "
                f"{r['rlk_trainer']['compared_elements']} (max {r['rlk_trainer']['max_abs_diff']:.3g})"
                + (f"; megatron {r['megatron']['mismatch_count']}" if "megatron" in r else ""))
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    return res
