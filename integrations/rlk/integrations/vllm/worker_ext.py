"""vLLM worker extension: RL weight sync by method name, no pickled tensors or functions.

vLLM mixes this class into its worker class when the engine is built with
``worker_extension_cls=plugin.WORKER_EXT`` (a field of vLLM's parallel config, an engine argument in
vLLM 0.26 and 0.32; :func:`rlk.integrations.vllm.plugin.strict_engine_kwargs` sets it). The
trainer side then calls its methods by name with plain arguments (strings and ints), which vLLM's
msgpack serializer carries without ``VLLM_ALLOW_INSECURE_SERIALIZATION``::

    llm.collective_rpc("rlk_load_weights", args=(path, generation))  # -> [fingerprint per worker]

The weights travel as a safetensors file or folder of Hugging Face-named bf16 tensors written
by the sender (safetensors holds raw bytes and a JSON header: nothing is unpickled). The worker
loads them with the strict model's ``rlk_update_weights`` (exact copies into the fused
parameters, stale generations refused) and answers with the fingerprint
(:func:`rlk.rl.sync.fingerprint`) of what the model now holds, over the fused-layout names the
rlk trainer uses (``model.layers.{i}.self_attn.qkv_proj.weight``, ..., ``lm_head.weight`` also
when tied). The sender compares it with its own fingerprint of the weights it sent.

This module imports nothing of rlk's kernels at import time: vLLM resolves the class in each
worker before the model is built, and the kernels must be imported after the plugin has applied
the environment policy (:mod:`rlk.integrations.vllm.plugin`).
"""

from __future__ import annotations

def _strict_model(model):
    if not hasattr(model, "rlk_update_weights") or not hasattr(model, "_fused"):
        from rlk.errors import UnsupportedConfigError

        raise UnsupportedConfigError(f"rlk worker extension: the served model is {type(model).__name__}, not rlk's "
                                     "strict architecture (RlkStrictQwen3ForCausalLM)")
    return model


def held_weights(model) -> dict:
    """The strict model's weights under rlk's fused names (views of its parameters)."""
    return _strict_model(model)._fused()


def load_hf_weights(path: str, model) -> dict:
    """The Hugging Face-named bf16 tensors of a safetensors file or folder, on the model's device,
    checked against the model's config (names, shapes)."""
    from rlk.models.qwen3 import load_safetensors

    dev = next(iter(held_weights(model).values())).device
    return load_safetensors(path, model.rlk_cfg, device="cpu" if dev.type == "cpu" else dev)


class RlkWorkerExtension:
    """Methods vLLM adds to its worker (``collective_rpc`` by name). ``self`` is the worker."""

    def _rlk_model(self):
        return _strict_model(self.get_model())

    def rlk_load_weights(self, path: str, generation: int, kind: str = "sha256") -> str:
        """Loads the safetensors ``path`` as weight ``generation`` (must be newer than the held
        one) and returns the fingerprint of the weights the model now holds."""
        from rlk.rl import sync

        model = self._rlk_model()
        w = load_hf_weights(str(path), model)
        model.rlk_update_weights(list(w.items()), int(generation))
        del w
        return sync.fingerprint(held_weights(model), str(kind))

    def rlk_fingerprint(self, kind: str = "sha256") -> str:
        from rlk.rl import sync

        return sync.fingerprint(held_weights(self._rlk_model()), str(kind))

    def rlk_generation(self) -> int:
        return int(self._rlk_model().rlk_weight_generation)
