"""vLLM as the RL loop's rollout engine (:func:`rlk.rl.loop.run_arm`'s ``make_engine``): with
rlk's strict plugin on the strict route, stock vLLM on the native route.

:class:`VllmRolloutEngine` serves the strict architecture (``RlkStrictQwen3ForCausalLM``), or for
the native route stock vLLM's own Qwen3 (no rlk model code: vLLM's model, kernels and
sampler; only the weight-sync methods of its workers are rlk's, ``logprobs_mode`` its default: the log-softmax of the raw logits), in a vLLM ``LLM``
and offers what the loop needs of a rollout engine: ``generate(prompts, step)``
(responses, each sampled token's logp as vLLM reports it: with ``logprobs_mode="raw_logits"`` and
``logprobs=0`` the value rlk's fused LM head computed, fp32) and ``receive(weights, generation,
kind)``, the weight sync's transport (:func:`rlk.rl.sync.sync_remote`): the trainer's fused
weights are written in Hugging Face naming (:func:`rlk.models.qwen3.layouts.fused_to_hf`) to a
safetensors file, and the workers load it through the worker extension
(:mod:`rlk.integrations.vllm.worker_ext`) called by name with ``collective_rpc``: a path and a
generation go over vLLM's RPC, never a pickled tensor or function. Each worker answers with the
fingerprint of the weights it holds; the loop compares it with the trainer's.

Weight generations: vLLM's initial load is the strict model's generation 1 and every update must
be newer, so trainer generation ``g`` is engine generation ``base + 1 + g`` (``base``: the
generation the engine held when this object was made; an engine can serve several runs).

Transport (``transport``): ``file`` (the default) as above; ``inproc`` builds vLLM's engine core
and its one worker inside the loop's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, tensor
parallel size 1) and hands the workers the trainer's tensors themselves by name
(``rlk_load_tensors``: a device-to-device copy, no file, no serialization; the worker refuses
tensors from another process). The engine then starts from vLLM's dummy weights
(``load_format="dummy"``: no checkpoint is written or read) and the loop's initial verified sync
loads the trainer's. On one GPU this removes the file round trip of every step (a 16 GB
safetensors file each way at Qwen3-8B's full depth). vLLM's own weight-transfer engines do not
serve this case: its CUDA IPC backend carries the handles pickled (ray or HTTP;
``VLLM_ALLOW_INSECURE_SERIALIZATION``), which rlk never unpickles, and NCCL needs two processes
on distinct GPUs. An in-process engine caches vLLM's environment for the process (vLLM's
``enable_envs_cache``): run one in-process engine per process (``ci/h200_vllm.sh`` runs each arm
in its own).

The native route's weight sync uses :class:`~rlk.integrations.vllm.worker_ext.StockWorkerExtension`
(vLLM's own ``load_weights``; the fingerprint over the names the trainer sends, since vLLM's
parameter names and row layouts are rlk's fused ones). The loop's native *trainer* is rlk's
torch route (a stand-in) unless the loop runs ``--trainer megatron`` (megatron-core's local spec).
vLLM reports no sampling entropy
(``entropy`` is None; the loop records NaN).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from typing import Callable

import torch

from rlk import determinism
from rlk.errors import UnsupportedConfigError


@dataclasses.dataclass
class VllmRolloutResult:
    responses: list[list[int]]
    logp: list[torch.Tensor]  # per request: fp32 logp of each sampled token
    entropy: None  # not reported by vLLM
    steps: int  # engine steps are vLLM's own: the number of generate calls (1)
    composition_changes: int  # not observed from outside the engine: 0
    seconds: float


def request_seed(seed: int, step: int, i: int) -> int:
    """The sampling seed of request ``i`` of ``step``: fixed per (seed, step, request), so a rerun
    repeats the samples and the samples of a group differ."""
    return (1_000_003 * seed + 7919 * step + i) % (2 ** 31 - 1)


def engine_env(workdir: str) -> dict[str, str]:
    """The variables an engine this module builds needs (the engine bench's rlk arm's:
    :func:`rlk.integrations.vllm.plugin.strict_process_env`), its worker counters under ``workdir``."""
    from rlk.integrations.vllm.plugin import strict_process_env

    return strict_process_env(os.path.join(workdir, "counters"))


ROUTES = ("strict", "native")
TRANSPORTS = ("file", "inproc")
INPROC_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # engine core and worker in this process


def stock_engine_kwargs(**overrides) -> dict:
    """Engine arguments of the native route's stock vLLM: its defaults (torch.compile and CUDA
    graphs on the GPU, its attention backend and sampler), bf16, no prefix caching (as the strict
    engine), and the stock worker extension for the weight sync."""
    from rlk.integrations.vllm.worker_ext import STOCK_WORKER_EXT

    kw = dict(dtype="bfloat16", enable_prefix_caching=False, worker_extension_cls=STOCK_WORKER_EXT)
    kw.update(overrides)
    return kw


def stock_env() -> tuple[dict[str, str], list[str]]:
    """(variables to set, variables to unset) while a stock engine starts: no plugin (rlk's model
    and kernels stay out of its processes), spawned engine processes (the trainer has initialized
    CUDA), none of the strict variables a strict arm of the same process exported. On a CPU the
    interpreter and device variables stay (the CPU build needs ``VLLM_TARGET_DEVICE``)."""
    from rlk.integrations.vllm.counters import ENV_DIR
    from rlk.integrations.vllm.plugin import BASE_ENGINE_ENV

    put = dict(BASE_ENGINE_ENV, VLLM_PLUGINS="", VLLM_WORKER_MULTIPROC_METHOD="spawn")
    drop = [*determinism.STRICT_ENV, "VLLM_USE_V2_MODEL_RUNNER", ENV_DIR]
    return put, drop


def write_model_dir(path: str, cfg, fused: dict[str, torch.Tensor] | None) -> str:
    """config.json (``cfg`` as a Hugging Face Qwen3 config), model.safetensors (``fused`` in HF
    naming, bf16; none when ``fused`` is None: an engine on dummy weights) and a word-level
    tokenizer (``t<i>`` = token ``i``) into ``path``."""
    from rlk.models.qwen3.layouts import fused_to_hf
    from rlk.models.qwen3.weights import save_safetensors

    os.makedirs(path, exist_ok=True)
    d = {k: v for k, v in cfg.to_dict().items() if k != "name"}
    d.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", torch_dtype="bfloat16")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f, indent=1)
    if fused is not None:
        save_safetensors(fused_to_hf(cfg, fused), os.path.join(path, "model.safetensors"))
    _write_tokenizer(path, cfg.vocab_size)
    return path


def _write_tokenizer(path: str, vocab: int) -> None:
    # The loop works on token ids; vLLM still loads a tokenizer (word-level, as cpu_probe's).
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2").save_pretrained(path)


class VllmRolloutEngine:
    """The loop's rollout engine on vLLM: rlk's strict plugin on the strict route, stock vLLM on
    the native route.

    Args:
      cfg, fused, route, lc: as :class:`rlk.rl.loop.RolloutEngine` (``fused``: the initial weights,
        written into the engine's checkpoint when ``llm`` is None).
      llm: an engine already built for ``route`` (:func:`rlk.integrations.vllm.plugin.strict_engine_kwargs`
        or :func:`stock_engine_kwargs`, worker extension included) serving ``cfg``; None builds one
        on ``workdir``. :meth:`close` shuts down only an engine built here.
      workdir: where the checkpoint and the sync files go (default: a new temporary folder, removed
        by :meth:`close`).
      transport: ``file`` or ``inproc`` (see the module): how the sync's weights reach the workers.
        ``inproc`` with ``llm`` given: that engine must run in this process.
      before_rpc: ``before_rpc(path)`` (file) or ``before_rpc(tensors)`` (inproc: the dict of
        Hugging Face-named tensors about to be handed over) runs before the workers load them
        (fault injection in tests).
      engine_kwargs: more ``LLM`` arguments when ``llm`` is None.
    """

    def __init__(self, cfg, fused: dict[str, torch.Tensor], route: str, lc, llm=None, workdir: str | None = None,
                 before_rpc: Callable | None = None, transport: str = "file", **engine_kwargs):
        if route not in ROUTES:
            raise UnsupportedConfigError(f"vLLM rollout engine: route {route!r}: one of {ROUTES} (strict: rlk's "
                                         "plugin; native: stock vLLM)")
        if transport not in TRANSPORTS:
            raise UnsupportedConfigError(f"vLLM rollout engine: transport {transport!r}: one of {TRANSPORTS} "
                                         "(file: a safetensors file per sync; inproc: the engine in this process, "
                                         "tensors handed over)")
        if transport == "inproc" and int(engine_kwargs.get("tensor_parallel_size", 1)) != 1:
            raise UnsupportedConfigError("vLLM rollout engine: transport inproc serves one worker in this process "
                                         f"(tensor_parallel_size 1, got {engine_kwargs['tensor_parallel_size']})")
        self.cfg, self.lc, self.before_rpc, self.route = cfg, lc, before_rpc, route
        self.transport = transport
        self.workdir = workdir or tempfile.mkdtemp(prefix="rlk-vllm-rl-")
        self.owns_engine = llm is None  # built here: close() shuts it down
        self.owns_workdir = workdir is None  # a temporary folder (checkpoint, sync files): close() removes it
        if llm is None:
            from vllm import LLM

            inproc = transport == "inproc"
            env = INPROC_ENV if inproc else {}
            # In process, the loop's initial verified sync loads the weights: no checkpoint file.
            model_dir = write_model_dir(os.path.join(self.workdir, "model"), cfg, None if inproc else fused)
            n = lc.prompts_per_step * lc.group_size
            kw = dict(model=model_dir, tokenizer=model_dir, seed=lc.seed, max_num_seqs=lc.max_batch or n,
                      max_model_len=min(cfg.max_position_embeddings, 4096))
            if inproc:
                kw["load_format"] = "dummy"
            kw.update(engine_kwargs)
            if route == "strict":
                from rlk.integrations.vllm.plugin import strict_engine_kwargs

                # The engine's processes inherit this environment: set before vLLM reads it.
                determinism.export(dict(engine_env(self.workdir), **env))
                built = strict_engine_kwargs(**kw)
                llm = LLM(**built)
            else:
                built = stock_engine_kwargs(**kw)
                put, drop = stock_env()
                with determinism.scoped(dict(put, **env), drop):
                    llm = LLM(**built)  # only while the engine's processes start (or, in process, it starts)
            self.kwargs = {k: v for k, v in built.items() if isinstance(v, (str, int, float, bool, dict))}
        else:
            self.kwargs = {}
        self.llm = llm
        self.base = self._one("rlk_generation")
        self.weight_generation: int | None = None  # set by the loop's sync (rlk.rl.sync.sync_remote)

    # ---- RPCs ---------------------------------------------------------------------------------
    def _one(self, method: str, *args):
        """``collective_rpc`` by name with plain arguments; every worker must answer the same."""
        out = self.llm.collective_rpc(method, args=args)
        if not out or any(o != out[0] for o in out):
            raise UnsupportedConfigError(f"vLLM workers answer {method} differently: {out}")
        return out[0]

    def describe(self) -> dict:
        """The engine in the loop's report: vLLM's version, rlk's strict plugin, the arguments this
        object built it with (none when it was given an engine)."""
        import vllm

        vc = getattr(getattr(self.llm, "llm_engine", None), "vllm_config", None)
        v2 = None if vc is None else bool(getattr(vc, "use_v2_model_runner", False))  # which runner served
        if self.route == "strict":
            return {"name": "vLLM + rlk strict plugin", "vllm_version": getattr(vllm, "__version__", None),
                    "architecture": "RlkStrictQwen3ForCausalLM", "engine_kwargs": self.kwargs,
                    "use_v2_model_runner": v2, "transport": self.transport}
        return {"name": "stock vLLM", "vllm_version": getattr(vllm, "__version__", None),
                "architecture": "Qwen3ForCausalLM", "engine_kwargs": self.kwargs, "use_v2_model_runner": v2,
                "transport": self.transport,
                # held: the parameters' bytes; loaded: what the worker read (a platform that
                # repacks weights, vLLM's CPU build, keeps no checkpoint-layout copy).
                "fingerprint_basis": getattr(self, "fingerprint_basis", None)}

    def engine_generation(self, generation: int) -> int:
        return self.base + 1 + int(generation)

    def receive(self, weights: dict[str, torch.Tensor], generation: int, kind: str = "sha256") -> str:
        """The transport of :func:`rlk.rl.sync.sync_remote`: ``weights`` (fused names) to a
        safetensors file in HF naming (``inproc``: the HF-named views of ``weights`` themselves),
        loaded by every worker as the engine generation of ``generation``; returns the workers'
        fingerprint of what they hold."""
        from rlk.models.qwen3.layouts import fused_to_hf
        from rlk.models.qwen3.weights import save_safetensors

        if self.transport == "inproc":
            hf = fused_to_hf(self.cfg, weights)
            if self.before_rpc is not None:
                self.before_rpc(hf)
            args = (hf, self.engine_generation(generation), kind, os.getpid())
            if self.route == "native":  # the stock worker fingerprints the names the trainer sent
                args += (sorted(weights),)
            held = self._one("rlk_load_tensors", *args)
            del hf, args
            if self.route == "native":
                self.fingerprint_basis = self._one("rlk_fingerprint_basis")
            self.llm.reset_prefix_cache()
            return held
        d = os.path.join(self.workdir, "sync")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        path = os.path.join(d, "model.safetensors")
        save_safetensors(fused_to_hf(self.cfg, weights), path)
        if self.before_rpc is not None:
            self.before_rpc(path)
        args = (path, self.engine_generation(generation), kind)
        if self.route == "native":  # the stock worker fingerprints the names the trainer sent
            args += (sorted(weights),)
        held = self._one("rlk_load_weights", *args)
        if self.route == "native":
            self.fingerprint_basis = self._one("rlk_fingerprint_basis")
        self.llm.reset_prefix_cache()  # no KV of older weights (prefix caching is off in strict mode anyway)
        shutil.rmtree(d, ignore_errors=True)
        return held

    def close(self) -> None:
        """Shuts down an engine this object built (its processes and GPU memory go before the
        loop's next arm starts another); an engine it was given stays up."""
        if not self.owns_engine or self.llm is None:
            return
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def fingerprint(self, kind: str = "sha256") -> str:
        return self._one("rlk_fingerprint", kind)

    # ---- rollout ------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], step: int) -> VllmRolloutResult:
        from vllm import SamplingParams

        lc = self.lc
        if self.weight_generation is None:
            raise UnsupportedConfigError("vLLM rollout engine: no verified weight sync yet")
        held = self._one("rlk_generation")
        if held != self.engine_generation(self.weight_generation):
            from rlk.rl.sync import WeightSyncError

            raise WeightSyncError(f"vLLM workers hold engine generation {held}, expected "
                                  f"{self.engine_generation(self.weight_generation)} (trainer generation "
                                  f"{self.weight_generation})")
        t0 = time.perf_counter()
        sps = [SamplingParams(temperature=1.0, max_tokens=lc.response_len, ignore_eos=True, logprobs=0,
                              seed=request_seed(lc.seed, step, i))
               for i in range(len(prompts))]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sps, use_tqdm=False)
        responses, logp = [], []
        for o in outs:
            c = o.outputs[0]
            toks = list(c.token_ids)
            if len(toks) != lc.response_len or c.logprobs is None or len(c.logprobs) != len(toks):
                raise UnsupportedConfigError(f"vLLM returned {len(toks)} tokens / "
                                             f"{None if c.logprobs is None else len(c.logprobs)} logprobs, "
                                             f"expected {lc.response_len}")
            vals = torch.tensor([d[t].logprob for t, d in zip(toks, c.logprobs)], dtype=torch.float64)
            lp = vals.to(torch.float32)
            if not torch.equal(lp.to(torch.float64), vals):  # the engine's fp32 values, widened exactly
                raise UnsupportedConfigError("vLLM logprobs are not fp32 values (logprobs_mode / plugin not in effect)")
            responses.append(toks)
            logp.append(lp)
        return VllmRolloutResult(responses=responses, logp=logp, entropy=None, steps=1, composition_changes=0,
                                 seconds=time.perf_counter() - t0)


def make_engine(**kw) -> Callable:
    """A ``make_engine`` for :func:`rlk.rl.loop.run_arm` building :class:`VllmRolloutEngine` with ``kw``."""
    return lambda cfg, fused, route, lc: VllmRolloutEngine(cfg, fused, route, lc, **kw)
