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


STOCK_WORKER_EXT = "rlk.integrations.vllm.worker_ext.StockWorkerExtension"
_TIED = ("lm_head.weight", "model.embed_tokens.weight")


def stock_held_weights(model, vocab: int) -> dict:
    """A stock vLLM Qwen3 model's weights under rlk's fused names: vLLM's own parameter names
    (``qkv_proj`` = [Q|K|V] rows, ``gate_up_proj`` = [gate|up] rows, as rlk's fused layout),
    embedding rows past the vocabulary (vLLM pads it) cut off, and ``lm_head.weight`` the embedding
    when the two are tied (rlk's trainer names both)."""
    held = {}
    for name, p in model.named_parameters():
        t = p.detach()
        if name in _TIED and t.shape[0] > vocab:
            t = t[:vocab]
        held[name] = t
    if _TIED[0] not in held and _TIED[1] in held:
        held[_TIED[0]] = held[_TIED[1]]
    return held


class StockWorkerExtension:
    """The weight-sync methods of :class:`RlkWorkerExtension` for **stock** vLLM serving Qwen3
    (the RL loop's native arm: vLLM as its users run it, no rlk code in the model).

    Loading: vLLM's in-place reload (``reload_weights(weights_iterator=...)``, which re-runs the
    platform's weight processing) where the worker offers it, else the model's own
    ``load_weights`` (vLLM's loader; Hugging Face names in). Fingerprint: over the names the
    trainer sends, of the parameters the model holds when they are in checkpoint layout (CUDA,
    unquantized bf16); a platform that repacks them for its kernels (vLLM's CPU build) leaves no
    held bytes to compare, and the fingerprint then covers the tensors the worker loaded
    (:meth:`rlk_fingerprint_basis` says which). The weight generation is kept here (stock models
    have none): the initial load is generation 1, and an update must be newer."""

    def _stock_state(self):
        return self.get_model(), int(self.model_config.hf_config.vocab_size)

    def rlk_load_weights(self, path: str, generation: int, kind: str = "sha256", names=None) -> str:
        import inspect

        from safetensors.torch import load_file

        from rlk.rl import sync

        held_gen = self.rlk_generation()
        if int(generation) <= held_gen:
            raise ValueError(f"stale weight generation {generation}: the engine holds {held_gen}")
        model, vocab = self._stock_state()
        dev = next(model.parameters()).device
        loaded = load_file(str(path), device=str(dev))
        runner = getattr(self, "model_runner", None)
        reload = getattr(runner, "reload_weights", None)
        if reload is not None and "weights_iterator" in inspect.signature(reload).parameters:
            self.reload_weights(weights_iterator=iter(list(loaded.items())), is_checkpoint_format=True)
        else:
            model.load_weights(iter(list(loaded.items())))
        self._rlk_stock_generation = int(generation)
        if self.rlk_fingerprint_basis() == "held":
            return self.rlk_fingerprint(kind, names)
        from rlk.models.qwen3.config import Qwen3Config
        from rlk.models.qwen3.layouts import hf_to_fused

        cfg = Qwen3Config.from_dict(self.model_config.hf_config.to_dict())
        fused = hf_to_fused(cfg, loaded)
        return sync.fingerprint({n: fused[n] for n in names} if names is not None else fused, str(kind))

    def rlk_fingerprint_basis(self) -> str:
        """``held`` when every parameter is in checkpoint layout (its bytes are what the model
        computes with), ``loaded`` when the platform repacked some (empty placeholders remain)."""
        model, _ = self._stock_state()
        return "held" if all(p.numel() for p in model.parameters()) else "loaded"

    def rlk_fingerprint(self, kind: str = "sha256", names=None) -> str:
        from rlk.rl import sync

        if self.rlk_fingerprint_basis() != "held":
            raise ValueError("stock vLLM on this platform repacked its weights: no held bytes to fingerprint")
        model, vocab = self._stock_state()
        held = stock_held_weights(model, vocab)
        if names is not None:
            missing = [n for n in names if n not in held]
            if missing:
                raise ValueError(f"stock vLLM model holds no {missing[:4]} ({len(missing)} names)")
            held = {n: held[n] for n in names}
        return sync.fingerprint(held, str(kind))

    def rlk_generation(self) -> int:
        return int(getattr(self, "_rlk_stock_generation", 1))
