"""vLLM worker extension: RL weight sync by method name, no pickled tensors or functions.

vLLM mixes this class into its worker class when the engine is built with
``worker_extension_cls=plugin.WORKER_EXT`` (a field of vLLM's parallel config, an engine argument in
vLLM 0.26 and 0.32; :func:`rlk.integrations.vllm.plugin.strict_engine_kwargs` sets it). The
trainer side then calls its methods by name with plain arguments (strings and ints), which vLLM's
msgpack serializer carries without ``VLLM_ALLOW_INSECURE_SERIALIZATION``::

    llm.collective_rpc("rlk_load_weights", args=(path, generation))  # -> [fingerprint per worker]

The weights travel as a safetensors file or folder of Hugging Face-named bf16 tensors written
by the sender (safetensors holds raw bytes and a JSON header: nothing is unpickled), or, when
the engine runs inside the sender's process (vLLM's in-process engine core, one worker:
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, tensor parallel size 1), as the sender's tensors themselves
(``rlk_load_tensors``: a device-to-device copy, no file, nothing serialized; refused in any other
process). The worker
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

import os


def same_process(sender_pid: int, method: str = "rlk_load_tensors") -> None:
    """Refuses tensors handed over from another process: ``rlk_load_tensors`` takes the sender's
    own tensor objects, which only an engine inside the sender's process receives unserialized
    (an engine core or worker in another process would get copies decoded by vLLM's RPC)."""
    if int(sender_pid) != os.getpid():
        from rlk.errors import UnsupportedConfigError

        raise UnsupportedConfigError(
            f"{method}: the worker runs in process {os.getpid()}, the sender in {sender_pid}: the in-process "
            "transport needs vLLM's engine in the sender's process (VLLM_ENABLE_V1_MULTIPROCESSING=0, tensor "
            "parallel size 1); other engines load a file (rlk_load_weights)")


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

    def rlk_load_tensors(self, weights: dict, generation: int, kind: str = "sha256", sender_pid: int = -1) -> str:
        """As :meth:`rlk_load_weights`, from the sender's Hugging Face-named bf16 tensors handed
        over in this process (``sender_pid``: the caller's ``os.getpid()``; :func:`same_process`):
        checked against the model's config (names, shapes), copied into the fused parameters."""
        from rlk.models.qwen3.weights import check_hf_weights
        from rlk.rl import sync

        same_process(sender_pid)
        model = self._rlk_model()
        w = dict(weights)
        if model.rlk_cfg.tie_word_embeddings:
            w.pop("lm_head.weight", None)
        check_hf_weights(model.rlk_cfg, w)
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
    (the RL loop's native arm: vLLM's own model and kernels; only these sync methods are rlk's).

    Loading: vLLM's in-place reload (``reload_weights(weights_iterator=...)``, which re-runs the
    platform's weight processing) where the worker takes one, else the model's own
    ``load_weights`` (vLLM's loader; Hugging Face names in); :meth:`rlk_fingerprint_basis` names
    the path taken. Fingerprint, over the names the trainer sends: of the parameters the model
    holds, when all are in checkpoint layout (CUDA, unquantized bf16: ``held``). A platform that
    repacks some for its kernels (vLLM's CPU build) keeps no bytes of those to compare; then every
    parameter still in checkpoint layout must equal what was loaded (exactly, in its own dtype),
    and the fingerprint covers the loaded tensors (``loaded``). The weight generation is kept
    here (stock models have none): the initial load is generation 1, and an update must be newer."""

    def _stock_state(self):
        return self.get_model(), int(self.model_config.hf_config.vocab_size)

    def rlk_load_weights(self, path: str, generation: int, kind: str = "sha256", names=None) -> str:
        from safetensors.torch import load_file

        self._rlk_refuse_stale(generation)
        model, _ = self._stock_state()
        dev = next(model.parameters()).device
        return self._rlk_stock_load(load_file(str(path), device=str(dev)), generation, kind, names)

    def rlk_load_tensors(self, weights: dict, generation: int, kind: str = "sha256", sender_pid: int = -1,
                         names=None) -> str:
        """As :meth:`rlk_load_weights`, from the sender's Hugging Face-named tensors handed over in
        this process (``sender_pid``: the caller's ``os.getpid()``; :func:`same_process`)."""
        same_process(sender_pid)
        self._rlk_refuse_stale(generation)
        return self._rlk_stock_load(dict(weights), generation, kind, names)

    def _rlk_refuse_stale(self, generation: int) -> None:
        """Raises before anything is read or loaded unless ``generation`` is newer than the held one."""
        held_gen = self.rlk_generation()
        if int(generation) <= held_gen:
            raise ValueError(f"stale weight generation {generation}: the engine holds {held_gen}")

    def _rlk_stock_load(self, loaded: dict, generation: int, kind: str, names) -> str:
        """Loads Hugging Face-named ``loaded`` as ``generation`` through vLLM's own loader; returns
        the fingerprint (see the class)."""
        import torch

        from rlk.rl import sync

        model, vocab = self._stock_state()
        try:
            self.reload_weights(weights_iterator=iter(list(loaded.items())), is_checkpoint_format=True)
            self._rlk_stock_path = "reload_weights"
        except (AttributeError, TypeError):  # a worker without the in-place reload of this form
            model.load_weights(iter(list(loaded.items())))
            self._rlk_stock_path = "load_weights"
        self._rlk_stock_generation = int(generation)
        if all(p.numel() for p in model.parameters()):
            return self.rlk_fingerprint(kind, names)
        from rlk.models.qwen3.config import Qwen3Config
        from rlk.models.qwen3.layouts import hf_to_fused

        fused = hf_to_fused(Qwen3Config.from_dict(self.model_config.hf_config.to_dict()), loaded)
        held = stock_held_weights(model, vocab)
        checked = 0
        for n, t in fused.items():
            h = held.get(n)
            if h is None or not h.numel() or h.shape != t.shape:
                continue  # repacked by the platform: no checkpoint-layout bytes held
            if not torch.equal(h, t.to(h.dtype)):
                raise ValueError(f"stock vLLM holds other values than it loaded for {n}")
            checked += 1
        self._rlk_stock_checked = (checked, len(fused))
        return sync.fingerprint({n: fused[n] for n in names} if names is not None else fused, str(kind))

    def rlk_fingerprint_basis(self) -> str:
        """``held`` (every parameter in checkpoint layout: its bytes are what the model computes
        with) or ``loaded; K of N compared held`` (the platform repacked some), with the load path."""
        model, _ = self._stock_state()
        path = getattr(self, "_rlk_stock_path", "initial load")
        if all(p.numel() for p in model.parameters()):
            return f"held (via {path})"
        k, n = getattr(self, "_rlk_stock_checked", (0, 0))
        return f"loaded; {k} of {n} tensors compared equal to the held parameters (via {path})"

    def rlk_fingerprint(self, kind: str = "sha256", names=None) -> str:
        from rlk.rl import sync

        model, vocab = self._stock_state()
        if not all(p.numel() for p in model.parameters()):
            raise ValueError("stock vLLM on this platform repacked its weights: no held bytes to fingerprint")
        held = stock_held_weights(model, vocab)
        if names is not None:
            missing = [n for n in names if n not in held]
            if missing:
                raise ValueError(f"stock vLLM model holds no {missing[:4]} ({len(missing)} names)")
            held = {n: held[n] for n in names}
        return sync.fingerprint(held, str(kind))

    def rlk_generation(self) -> int:
        return int(getattr(self, "_rlk_stock_generation", 1))
