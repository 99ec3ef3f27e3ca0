"""vLLM general plugin (entry point ``vllm.general_plugins: rlk``).

vLLM calls :func:`register` in the main process, the EngineCore and every worker before any
model is built. It

1. applies rlk's environment policy (``rlk.determinism``): without CUDA the Triton CPU
   interpreter must be on before any ``@triton.jit`` decorator of rlk runs; rlk's kernel
   modules are only imported later, when the model class is built, so setting it here is in
   time (checked again at model construction: a wrong order fails closed);
2. registers the strict Qwen3 architecture :data:`ARCH` (lazily, by module path, so the main
   process never imports kernels). Select it with
   ``LLM(model=..., hf_overrides={"architectures": [ARCH]}, **strict_engine_kwargs())``;
3. installs the request gate (:mod:`rlk.integrations.vllm.request_gate`) on vLLM's admission
   check, so a request the strict engine cannot serve exactly is rejected when it is submitted.
"""

from __future__ import annotations

import os

ARCH = "RlkStrictQwen3ForCausalLM"
MODEL_PATH = "rlk.integrations.vllm.model:RlkStrictQwen3ForCausalLM"
# The worker extension of the RL weight sync (vLLM's ``worker_extension_cls``: a dotted
# module.class name; its methods are called by name through ``LLM.collective_rpc``).
WORKER_EXT = "rlk.integrations.vllm.worker_ext.RlkWorkerExtension"

_registered = False


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


def register() -> None:
    """Entry point of ``vllm.general_plugins``; idempotent."""
    global _registered
    from rlk import determinism

    if not _cuda_available() and not determinism.interpreter_active():
        determinism.configure_cpu_interpreter()
    determinism.apply_strict_env()
    if _registered:
        return
    from vllm import ModelRegistry

    from rlk.integrations.vllm import request_gate

    ModelRegistry.register_model(ARCH, MODEL_PATH)
    request_gate.install(ARCH)
    _registered = True


def strict_engine_kwargs(**overrides) -> dict:
    """Engine arguments strict mode needs (``LLM(**strict_engine_kwargs(model=...))``).

    On CUDA: full CUDA graphs for decode batches (``cudagraph_mode="FULL_DECODE_ONLY"``, no
    torch.compile); on CPU: eager. ``hf_overrides`` selects :data:`ARCH`; ``rlk_temperature`` (default 1.0) is the strict
    sampling temperature applied inside rlk's fused LM head. The request gate is installed in
    this process too (:mod:`rlk.integrations.vllm.request_gate`: admission runs in the process
    that submits). ``worker_extension_cls`` adds the RL weight-sync methods to the workers
    (:mod:`rlk.integrations.vllm.worker_ext`).
    """
    from rlk.integrations.vllm import request_gate

    request_gate.install(ARCH)
    temperature = overrides.pop("rlk_temperature", 1.0)
    hf = {"architectures": [ARCH], "rlk_temperature": float(temperature)}
    hf.update(overrides.pop("hf_overrides", {}) or {})
    kw = dict(
        hf_overrides=hf,
        dtype="bfloat16",
        logprobs_mode="raw_logits",
        enable_prefix_caching=False,
        worker_extension_cls=WORKER_EXT,
    )
    if _cuda_available():
        # Full CUDA graphs of decode batches (captured by vLLM per batch bucket), mixed and prefill
        # steps eager; no torch.compile (the graph modes covered: gate.GRAPH_MODES).
        kw.update(enforce_eager=False, compilation_config={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"})
    else:
        kw["enforce_eager"] = True
    kw.update(overrides)
    return kw


MODEL_RUNNER_ENV = "RLK_VLLM_MODEL_RUNNER"
MODEL_RUNNERS = {"v1": "0", "v2": "1"}  # rlk's name -> VLLM_USE_V2_MODEL_RUNNER


def default_model_runner() -> str:
    """The runner a strict engine gets unless told: ``v2`` on a GPU (vLLM 0.26's own default for
    dense models; measured bitwise and faster than V1, and the RL loop's weight sync ran on it),
    ``v1`` on the CPU build (vLLM's CPU build refuses V2: it requires Triton)."""
    return "v2" if _cuda_available() else "v1"


# What every engine process of the benchmarks and the loop runs with: no usage reports, no hub
# access, vLLM's own sampler without FlashInfer (not on the device).
BASE_ENGINE_ENV = {"VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "VLLM_USE_FLASHINFER_SAMPLER": "0"}


def strict_process_env(counters_dir: str, model_runner: str | None = None) -> dict[str, str]:
    """The variables of an engine serving the strict model, set before vLLM starts: rlk's plugin
    only, :func:`worker_env`, the worker counters' folder, and spawned engine processes (rlk's
    kernel modules query the device when imported, and a trainer in the same process may have
    initialized CUDA: a forked engine process cannot re-initialize it)."""
    from rlk.integrations.vllm.counters import ENV_DIR

    env = dict(BASE_ENGINE_ENV, VLLM_PLUGINS="rlk")
    env.update(worker_env(model_runner))
    env[ENV_DIR] = counters_dir
    env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    return env


def worker_env(model_runner: str | None = None) -> dict[str, str]:
    """Environment an engine serving the strict model needs before vLLM starts (strict variables,
    the model runner; on CPU the Triton interpreter). Only the entries that differ from
    ``os.environ`` are returned.

    Model runner: ``model_runner``, else ``$RLK_VLLM_MODEL_RUNNER`` (``v1`` or ``v2``), else
    :func:`default_model_runner`. Both runners are bitwise for the strict path on the GPU (every
    returned logprob equal to both trainers'); Model Runner V2 pads full-graph batches with slots
    -1 and zero sequence lengths, which the strict KV writes and attention skip. The choice is
    forced: ``VLLM_USE_V2_MODEL_RUNNER`` is set either way, so vLLM refuses a configuration the
    runner cannot serve instead of falling back to the other one.
    """
    from rlk import determinism
    from rlk.errors import UnsupportedConfigError

    env = dict(determinism.STRICT_ENV)
    runner = model_runner or os.environ.get(MODEL_RUNNER_ENV) or default_model_runner()
    if runner not in MODEL_RUNNERS:
        raise UnsupportedConfigError(f"{MODEL_RUNNER_ENV}={runner!r}: one of {sorted(MODEL_RUNNERS)}")
    env["VLLM_USE_V2_MODEL_RUNNER"] = MODEL_RUNNERS[runner]
    if not _cuda_available():
        env["TRITON_INTERPRET"] = "1"
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    return {k: v for k, v in env.items() if os.environ.get(k) != v}
