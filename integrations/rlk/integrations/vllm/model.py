"""``RlkStrictQwen3ForCausalLM``: vLLM's model seam filled with rlk's Qwen3 (strict route).

Thin adapter: the layer code is ``rlk.models.qwen3.Qwen3._forward`` (the same lines the trainer
pattern runs); this file only

* holds the weights as vLLM parameters in the fused layout (``qkv_proj = [Q|K|V]``,
  ``gate_up_proj = [gate|up]``), loaded by exact copies in :meth:`load_weights`;
* keeps one stock ``Attention`` layer per decoder layer **only** so vLLM allocates and binds
  its paged KV cache; the layer is never called (a tripwire on its ``impl.forward`` counts any
  call, and the counters check fails on it). Attention runs through rlk's ``write_kv`` and
  ``paged`` kernels, reading ``get_forward_context().attn_metadata[layer_name]``
  (``query_start_loc``, ``seq_lens``, ``block_table``, ``slot_mapping``) and ``layer.kv_cache``
  through strided views (:mod:`rlk.integrations.vllm.kv_layout`);
* returns from :meth:`compute_logits` rlk's strict log-probabilities: ``logp.v2``'s logits
  output minus its lse, both at the engine's strict temperature. Column ``v`` of row ``t`` is
  the same fp32 subtraction the kernel performs for target ``v``, so with
  ``logprobs_mode="raw_logits"`` and ``logprobs=0`` the reported logp is rlk's, bit for bit.

Weight generations: every ``load_weights`` bumps ``rlk_weight_generation``; the execution plan
(rlk ``Qwen3`` over the parameter tensors, RoPE table) is keyed by it and rebuilt on change;
:meth:`rlk_update_weights` refuses a generation that is not newer (stale trainer weights).
"""

from __future__ import annotations

import os
from typing import Iterable

import torch
from torch import nn

from rlk.errors import UnsupportedConfigError
from rlk.integrations.vllm import counters as _counters
from rlk.integrations.vllm import admission, kv_layout


class StaleGenerationError(UnsupportedConfigError):
    """A weight update or a step carries an older weight generation than the one loaded."""


class _W(nn.Module):
    def __init__(self, *shape):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(*shape), requires_grad=False)


def _rlk_config(vllm_config):
    from rlk.models.qwen3 import Qwen3Config

    path = os.path.join(str(vllm_config.model_config.model), "config.json")
    if os.path.exists(path):
        return Qwen3Config.from_json(path)
    d = vllm_config.model_config.hf_config.to_dict()
    rp = d.pop("rope_parameters", None) or {}
    if rp:
        if rp.get("rope_type", "default") != "default":
            raise UnsupportedConfigError(f"rope_parameters {rp!r} not supported")
        d.setdefault("rope_theta", rp.get("rope_theta"))
    return Qwen3Config.from_dict(d)


class RlkStrictQwen3ForCausalLM(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        from rlk import determinism

        problems = admission.check_engine_config(vllm_config)
        if problems:
            raise UnsupportedConfigError("rlk strict vLLM: engine config not covered: " + "; ".join(problems))
        from rlk.integrations.vllm import request_gate

        if not request_gate.installed():
            raise UnsupportedConfigError("rlk strict vLLM: the request gate is not installed in this process (the "
                                         "rlk plugin did not run: VLLM_PLUGINS must allow 'rlk')")
        if not torch.cuda.is_available() and not determinism.interpreter_active():
            raise UnsupportedConfigError("rlk strict vLLM: no CUDA and TRITON_INTERPRET is off in this worker "
                                         "(the plugin did not run before the kernels were imported)")
        if not torch.cuda.is_available():
            from rlk.kernels.attention import kernel as _attn_kernel

            if type(_attn_kernel.write_kv_kernel).__name__ != "InterpretedFunction":
                raise UnsupportedConfigError("rlk strict vLLM: rlk kernels were imported before TRITON_INTERPRET=1 "
                                             "was set in this worker (plugin order)")
        from vllm.model_executor.layers.attention import Attention

        cfg = self.rlk_cfg = _rlk_config(vllm_config)
        self.temperature = admission.check_strict_temperature(
            getattr(vllm_config.model_config.hf_config, "rlk_temperature", 1.0))
        H, F, V, D = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
        self.model = nn.Module()
        self.model.embed_tokens = _W(V, H)
        self.model.norm = _W(H)
        self.model.layers = nn.ModuleList()
        pre = f"{prefix}." if prefix else ""
        self._attn = []
        for i in range(cfg.num_hidden_layers):
            layer = nn.Module()
            layer.self_attn = nn.Module()
            layer.self_attn.qkv_proj = _W(cfg.q_size + 2 * cfg.kv_size, H)
            layer.self_attn.o_proj = _W(H, cfg.q_size)
            layer.self_attn.q_norm = _W(D)
            layer.self_attn.k_norm = _W(D)
            layer.self_attn.attn = Attention(
                cfg.num_attention_heads, D, D ** -0.5, num_kv_heads=cfg.num_key_value_heads,
                cache_config=vllm_config.cache_config, quant_config=None,
                prefix=f"{pre}model.layers.{i}.self_attn.attn")
            layer.mlp = nn.Module()
            layer.mlp.gate_up_proj = _W(2 * F, H)
            layer.mlp.down_proj = _W(H, F)
            layer.input_layernorm = _W(H)
            layer.post_attention_layernorm = _W(H)
            self.model.layers.append(layer)
            self._attn.append(layer.self_attn.attn)
        self.lm_head = _W(V, H)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.counters = _counters.Counters({"arch": type(self).__name__, "contracts": {}})
        for a in self._attn:
            _install_tripwire(a, self.counters)
        self.rlk_weight_generation = 0
        self._plan = None
        self._rope = None  # the RoPE table every plan shares (see _get_plan)
        self._max_tokens = int(vllm_config.scheduler_config.max_num_batched_tokens)
        self._max_seqs = int(vllm_config.scheduler_config.max_num_seqs)
        self._warmed = False

    # ---- weights -----------------------------------------------------------------------------
    def _fused(self) -> dict[str, torch.Tensor]:
        w = {n: p.data for n, p in self.named_parameters() if ".attn." not in n}
        w["lm_head.weight"] = self.lm_head.weight.data
        return w

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Exact copies of Hugging Face tensors into the fused parameters; bumps the generation."""
        cfg = self.rlk_cfg
        q, kv, F = cfg.q_size, cfg.kv_size, cfg.intermediate_size
        params = dict(self.named_parameters())
        split = {"q_proj": ("qkv_proj", 0, q), "k_proj": ("qkv_proj", q, q + kv),
                 "v_proj": ("qkv_proj", q + kv, q + 2 * kv),
                 "gate_proj": ("gate_up_proj", 0, F), "up_proj": ("gate_up_proj", F, 2 * F)}
        loaded = set()
        for name, t in weights:
            if name.startswith("lm_head.") and cfg.tie_word_embeddings:
                continue
            parts = name.split(".")
            target, rows = name, None
            if len(parts) >= 2 and parts[-2] in split:
                fused, a, b = split[parts[-2]]
                target, rows = ".".join(parts[:-2] + [fused, parts[-1]]), (a, b)
            if target not in params:
                raise UnsupportedConfigError(f"rlk strict vLLM: unexpected checkpoint tensor {name!r}")
            p = params[target]
            dst = p.data if rows is None else p.data[rows[0]:rows[1]]
            if tuple(dst.shape) != tuple(t.shape) or t.dtype != p.dtype:
                raise UnsupportedConfigError(f"rlk strict vLLM: {name} is {tuple(t.shape)} {t.dtype}, "
                                             f"expected {tuple(dst.shape)} {p.dtype}")
            dst.copy_(t)
            loaded.add(target)
        # Parameters of the stock Attention layers (scales) are never read by the strict path.
        loaded |= {n for n in params if ".attn." in n}
        self.rlk_weight_generation += 1
        self._plan = None
        return loaded

    def rlk_update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], generation: int) -> int:
        """RL weight update: load ``weights`` as ``generation`` (must be newer than the loaded one).

        Raises ``StaleGenerationError`` for an old generation (nothing is loaded). The caller
        resets the prefix cache (KV of older weights) before the next step.
        """
        generation = int(generation)
        if generation <= self.rlk_weight_generation:
            raise StaleGenerationError(f"rlk strict vLLM: weight generation {generation} is stale "
                                       f"(loaded: {self.rlk_weight_generation})")
        self.load_weights(weights)
        self.rlk_weight_generation = generation
        return generation

    def rlk_check_generation(self, expected: int) -> None:
        if int(expected) != self.rlk_weight_generation:
            raise StaleGenerationError(f"rlk strict vLLM: engine holds weight generation "
                                       f"{self.rlk_weight_generation}, caller expects {int(expected)}")

    def _get_plan(self):
        if self._plan is None or self._plan[0] != self.rlk_weight_generation:
            from rlk.models.qwen3 import Qwen3

            # Views of the parameters, no copies. vLLM's CUDA graphs, captured with an earlier plan,
            # read its RoPE table by address: a plan's own table would be freed with the plan at the
            # next weight generation and its memory reused (by a trainer in the same process first),
            # so every plan takes the first plan's table (it depends on the config only), which
            # lives as long as the model.
            m = Qwen3(self.rlk_cfg, self._fused(), "strict", rope=self._rope)
            self._rope = m.rope
            self.counters.meta["contracts"] = dict(m.ops.contracts)
            m.ops = _counters.CountingOps(m.ops, self.counters)
            self._plan = (self.rlk_weight_generation, m)
            if not self._warmed:
                self._warm_up(m)
        return self._plan[1]

    def _warm_up(self, m) -> None:
        """Compiles, before vLLM's warm-up and capture, what serving would otherwise compile while
        it serves (vLLM's dummy runs cover only its capture sizes and the largest batch; the
        engine's JIT monitor reports the rest as latency spikes):

        * every GEMM variant the table picks for 1..max_num_batched_tokens rows, for the four
          projection shapes (``rlk.kernels.gemm.launch.warm_up``);
        * the row ops' specializations of every row-count class (``Qwen3.warm_up_rows``);
        * the logits + lse path at 1..max_num_seqs rows (:func:`logp_row_counts`)."""
        from rlk.kernels.gemm import launch as gemm_launch

        lay = self.model.layers[0]
        for w in (lay.self_attn.qkv_proj.weight, lay.self_attn.o_proj.weight, lay.mlp.gate_up_proj.weight,
                  lay.mlp.down_proj.weight):
            gemm_launch.warm_up(w.data, self._max_tokens)
        self._warmed = True
        from rlk import determinism

        if determinism.interpreter_active():  # nothing is compiled under the interpreter
            return
        m.warm_up_rows(self._max_tokens)
        H = self.rlk_cfg.hidden_size
        with torch.no_grad():
            for T in logp_row_counts(self._max_seqs):
                self._logp_rows(m, torch.zeros(T, H, dtype=torch.bfloat16, device=m.device))

    # ---- vLLM model interface -----------------------------------------------------------------
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self._get_plan().ops.embedding(input_ids.to(torch.int64), self.model.embed_tokens.weight)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        if inputs_embeds is not None or intermediate_tensors is not None:
            raise UnsupportedConfigError("rlk strict vLLM: inputs_embeds / pipeline stages are not supported")
        from vllm.forward_context import get_forward_context

        from rlk.kernels.common import host_validated

        m = self._get_plan()
        md = get_forward_context().attn_metadata
        if md is not None and not isinstance(md, dict):
            raise UnsupportedConfigError("rlk strict vLLM: micro-batched attention metadata is not supported")
        attn = self._attn

        def attn_fn(i, q, k, v):
            if md is None:  # profiling / warm-up run: no KV cache bound; output is discarded
                return torch.zeros_like(q)
            layer = attn[i]
            meta, n = kv_layout.paged_meta(md[layer.layer_name])
            kc, vc = kv_layout.kv_views(layer.kv_cache, type(layer.impl).__name__,
                                        self.rlk_cfg.num_key_value_heads, self.rlk_cfg.head_dim)
            meta.block_size = kc.shape[1]
            m.ops.write_kv(k[:n], v[:n], kc, vc, meta)
            if n == q.shape[0]:
                return m.ops.attn_paged(q, kc, vc, meta, m.scale)
            # A padded batch (CUDA-graph bucket): real rows written in place, padding rows zero.
            out = torch.empty_like(q)
            out[n:].zero_()
            m.ops.attn_paged(q[:n], kc, vc, meta, m.scale, out=out[:n])
            return out

        pos = positions.to(torch.int64)
        # The attention metadata, slots and positions are vLLM's own (its scheduler built them; token
        # ids were range-checked at admission), as for vLLM's own kernels: the launchers' value
        # checks would add host read-backs per launch, which a CUDA graph cannot hold.
        with host_validated():
            h = m._forward(m.w, input_ids.to(torch.int64), pos, attn_fn)
        if md is not None:
            self.counters.flush_throttled()
        return h

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[T, V]`` fp32 log-probabilities of ``logp.v2`` at the strict temperature."""
        out = self._logp_rows(self._get_plan(), hidden_states)
        self.counters.add("logits_logp")
        return out

    def _logp_rows(self, m, hidden_states: torch.Tensor) -> torch.Tensor:
        from rlk.models.qwen3.routes import logp_segmentation
        from rlk.kernels.common import host_validated
        from rlk.kernels.linear_logp import autograd as linear_logp

        dummy = torch.zeros(hidden_states.shape[0], dtype=torch.int64, device=hidden_states.device)
        with host_validated():  # the targets are zeros written here: nothing to check on the device
            out = linear_logp.linear_logp(hidden_states, m.w["lm_head.weight"], dummy, temperature=self.temperature,
                                          return_logits=True,
                                          segmentation=logp_segmentation(self.rlk_cfg.vocab_size))
        # Same fp32 subtraction as the kernel's `logp = x[target] - lse`, for every column.
        return out.logits - out.lse[:, None]


def logp_row_counts(max_rows: int) -> list[int]:
    """Row counts of the logits + lse warm-up: powers of two up to ``max_rows``, each with its
    successor (the schedule's row buckets and Triton's divisibility classes), and ``max_rows``."""
    out, p = {max_rows}, 1
    while p <= max_rows:
        out |= {p, p + 1}
        p *= 2
    return sorted(t for t in out if 1 <= t <= max_rows)


def _install_tripwire(layer, counters) -> None:
    impl = layer.impl
    orig = impl.forward

    def forward(*a, **k):
        counters.add(_counters.STOCK)
        counters.flush()
        return orig(*a, **k)

    impl.forward = forward
