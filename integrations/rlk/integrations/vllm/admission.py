"""Fail-closed checks of the vLLM adapter: request gate and engine-config validation.

Pure Python over duck-typed vLLM objects (``SamplingParams``, ``VllmConfig``), so the rules are
unit-tested without an engine. The request gate runs at vLLM's admission check
(``SamplingParams.verify``, wrapped by :mod:`rlk.integrations.vllm.request_gate`), so a request
is rejected when it is added.

Contract covered: the selected-token logp reported by the engine is ``logp.v2``'s value at the
engine's strict temperature (applied inside the fused LM head). Anything that changes the
distribution after ``compute_logits`` (penalties, truncation, bias, a second temperature) or asks
for other logprob values is outside the contract and is rejected, never silently served.
"""

from __future__ import annotations

import math

from rlk.errors import UnsupportedConfigError

# Request temperatures the gate accepts: 1.0 (the sampler leaves the strict distribution alone)
# and 0 (greedy: argmax of the same log-probs).
ACCEPTED_TEMPERATURES = (0.0, 1.0)

# SamplingParams field -> its neutral value (anything else changes the sampled distribution).
_NEUTRAL = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "top_p": 1.0,
    "min_p": 0.0,
}


def check_sampling_params(sp, strict_temperature: float = 1.0) -> None:
    """Raises ``UnsupportedConfigError`` when ``sp`` asks for something ``logp.v2`` does not cover.

    Args:
      sp: a ``vllm.SamplingParams`` (or any object with the same attributes).
      strict_temperature: the engine's temperature, applied inside rlk's fused LM head.
    """
    problems = []
    for name, neutral in _NEUTRAL.items():
        v = getattr(sp, name, neutral)
        if v is not None and float(v) != neutral:
            problems.append(f"{name}={v} (must be {neutral})")
    top_k = getattr(sp, "top_k", None)
    if top_k not in (None, 0, -1):
        problems.append(f"top_k={top_k} (must be 0/-1: no truncation)")
    t = float(getattr(sp, "temperature", 1.0))
    if t not in ACCEPTED_TEMPERATURES:
        problems.append(
            f"temperature={t}: the engine samples at its strict temperature {strict_temperature}, "
            "applied inside rlk's logp.v2; requests pass temperature=1.0 (or 0 for greedy)")
    lp = getattr(sp, "logprobs", None)
    if lp != 0:
        problems.append(f"logprobs={lp} (must be 0: only the selected token's logp is covered)")
    plp = getattr(sp, "prompt_logprobs", None)
    if plp not in (None,):
        problems.append(f"prompt_logprobs={plp} (must be None)")
    if getattr(sp, "logit_bias", None):
        problems.append("logit_bias is set (must be empty)")
    if getattr(sp, "allowed_token_ids", None):
        problems.append("allowed_token_ids is set (must be empty)")
    if getattr(sp, "bad_words", None):
        problems.append("bad_words is set (must be empty)")
    if getattr(sp, "structured_outputs", None) is not None or getattr(sp, "guided_decoding", None) is not None:
        problems.append("structured/guided decoding is set (masks the distribution)")
    mt = getattr(sp, "min_tokens", 0) or 0
    if mt:
        # Until min_tokens, vLLM sets the logits of every stop token to -inf before sampling, the
        # EOS id included even with ignore_eos=True (SamplingParams.update_from_generation_config
        # adds it to all_stop_token_ids "to support min_tokens", after this check runs): the
        # sampled distribution is then not the one the returned logp describes.
        problems.append(f"min_tokens={mt} (must be 0: vLLM masks the stop tokens, EOS included even with "
                        "ignore_eos=True, until min_tokens; for fixed lengths pass ignore_eos=True and max_tokens)")
    if getattr(sp, "logits_processors", None):
        problems.append("per-request logits_processors are set")
    if problems:
        raise UnsupportedConfigError("rlk strict vLLM: request rejected: " + "; ".join(problems))


def check_strict_temperature(t) -> float:
    t = float(t)
    if not (math.isfinite(t) and t > 0):
        raise UnsupportedConfigError(f"rlk strict vLLM: strict temperature must be finite and > 0, got {t}")
    return t


def _get(obj, path, default=None):
    for p in path.split("."):
        if obj is None:
            return default
        obj = getattr(obj, p, None)
    return default if obj is None else obj


def check_engine_config(vllm_config) -> list[str]:
    """Reasons the engine config breaks strict arithmetic (empty list when all is well).

    Checked: bf16 model dtype (rlk's strict kernels are bf16), no quantization, no speculative
    decoding, ``logprobs_mode == "raw_logits"`` (the values leave ``compute_logits`` untouched),
    execution mode (:func:`graph_problems`: eager, or full CUDA graphs of uniform decode batches
    only), TP = PP = 1 (NCCL TP is not verified), no LoRA, no prefix-cache-sharing of KV from a
    different weight generation is possible (the cache is reset on weight updates by the caller).
    """
    import torch

    out = []
    mc = _get(vllm_config, "model_config")
    dtype = _get(mc, "dtype")
    if dtype is not None and dtype != torch.bfloat16:
        out.append(f"dtype {dtype} (strict kernels need torch.bfloat16)")
    q = _get(mc, "quantization")
    if q not in (None, "", "none"):
        out.append(f"quantization={q!r} (not covered by any contract)")
    if _get(vllm_config, "quant_config") is not None:
        out.append("a quant_config is set")
    if _get(vllm_config, "speculative_config") is not None:
        out.append("speculative decoding is on (draft/verify changes the sampling path)")
    mode = _get(mc, "logprobs_mode")
    if mode is not None and str(getattr(mode, "value", mode)) != "raw_logits":
        out.append(f"logprobs_mode={mode!r} (needs 'raw_logits' so the reported logp is rlk's)")
    if _get(mc, "enforce_eager") is False:
        out += graph_problems(_get(vllm_config, "compilation_config"), cuda=torch.cuda.is_available())
    if _get(vllm_config, "lora_config") is not None:
        out.append("LoRA is on")
    pc = _get(vllm_config, "parallel_config")
    tp = _get(pc, "tensor_parallel_size", 1)
    pp = _get(pc, "pipeline_parallel_size", 1)
    if tp != 1 or pp != 1:
        out.append(f"tensor_parallel_size={tp}, pipeline_parallel_size={pp} (only 1 is verified)")
    return out


# cudagraph modes the strict model can run under: no graphs, or full graphs of uniform decode
# batches (one query per request: every shape fixed by the batch bucket, lengths read on the
# device). Mixed and prefill batches run eagerly: the forward reads host values of the step's
# metadata (max_query_len, num_actual_tokens) that a captured mixed-batch graph would bake in.
GRAPH_MODES = ("NONE", "FULL_DECODE_ONLY")


def graph_problems(compilation_config, cuda: bool) -> list[str]:
    """Reasons a non-eager engine config is not covered (``enforce_eager=False``).

    Covered on CUDA: compilation mode NONE (no torch.compile / Inductor passes over the model)
    with ``cudagraph_mode`` in :data:`GRAPH_MODES`. On CPU every non-eager mode is refused (vLLM's
    CPU path compiles the model with torch.compile; not verified).
    """
    if not cuda:
        return ["enforce_eager=False on CPU (torch.compile of the model is not verified)"]
    out = []
    mode = _get(compilation_config, "mode")
    if mode is not None and int(getattr(mode, "value", mode)) != 0:
        out.append(f"compilation mode {getattr(mode, 'name', mode)} (needs NONE: "
                   "strict_engine_kwargs sets compilation_config={'mode': 0, ...})")
    cg = _get(compilation_config, "cudagraph_mode")
    name = getattr(cg, "name", None if cg is None else str(cg))
    if name is not None and name not in GRAPH_MODES:
        out.append(f"cudagraph_mode {name} (covered: {', '.join(GRAPH_MODES)}; mixed/prefill graphs would "
                   "bake one step's host metadata into the graph)")
    return out
