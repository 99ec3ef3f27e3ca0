"""Exact weight-layout converters: Hugging Face <-> fused internal (vLLM) <-> megatron-core.

* Internal / vLLM (``model.layers.N.self_attn.qkv_proj.weight``): ``[Q | K | V]`` stacked on
  the output dim, ``[q_size + 2 kv_size, H]``; ``mlp.gate_up_proj.weight = [gate | up]``,
  ``[2F, H]``. The other names are Hugging Face's. ``lm_head.weight`` is always present
  internally (it *is* the embedding tensor when tied).
* megatron-core (local spec, TP=1 full tensors): ``decoder.layers.N.self_attention.linear_qkv``
  is interleaved per query group: for each KV head ``g`` the rows are
  ``[q heads g*r .. g*r+r-1, k_g, v_g]`` (``r = Hq / Hk``, each head ``D`` rows);
  ``mlp.linear_fc1 = [gate | up]``; norms ``input_layernorm``, ``pre_mlp_layernorm``,
  ``self_attention.q_layernorm`` / ``k_layernorm``, ``decoder.final_layernorm``;
  ``embedding.word_embeddings``, ``output_layer`` (absent when tied).

Every converter only slices, concatenates and copies: bytes are preserved exactly.
"""

from __future__ import annotations

import torch

from rlk.models.qwen3.config import Qwen3Config

_HF_SAME = (
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "mlp.down_proj.weight",
)


def hf_to_fused(cfg: Qwen3Config, w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face names -> internal fused layout (vLLM's)."""
    out = {"model.embed_tokens.weight": w["model.embed_tokens.weight"],
           "model.norm.weight": w["model.norm.weight"]}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out[p + "self_attn.qkv_proj.weight"] = torch.cat(
            [w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"], w[p + "self_attn.v_proj.weight"]], 0
        ).contiguous()
        out[p + "mlp.gate_up_proj.weight"] = torch.cat(
            [w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]], 0).contiguous()
        for k in _HF_SAME:
            out[p + k] = w[p + k]
    out["lm_head.weight"] = w["model.embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
    return out


def fused_to_hf(cfg: Qwen3Config, f: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Internal fused layout -> Hugging Face names (``lm_head`` dropped when tied)."""
    q, kv, F = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    out = {"model.embed_tokens.weight": f["model.embed_tokens.weight"], "model.norm.weight": f["model.norm.weight"]}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        qkv = f[p + "self_attn.qkv_proj.weight"]
        out[p + "self_attn.q_proj.weight"] = qkv[:q].contiguous()
        out[p + "self_attn.k_proj.weight"] = qkv[q:q + kv].contiguous()
        out[p + "self_attn.v_proj.weight"] = qkv[q + kv:].contiguous()
        gu = f[p + "mlp.gate_up_proj.weight"]
        out[p + "mlp.gate_proj.weight"] = gu[:F].contiguous()
        out[p + "mlp.up_proj.weight"] = gu[F:].contiguous()
        for k in _HF_SAME:
            out[p + k] = f[p + k]
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = f["lm_head.weight"]
    return out


def qkv_vllm_to_megatron(cfg: Qwen3Config, qkv: torch.Tensor) -> torch.Tensor:
    """``[Q|K|V]`` rows -> megatron's per-group interleave ``[q_g..., k_g, v_g]`` for each g."""
    Hk, r, D = cfg.num_key_value_heads, cfg.group_size, cfg.head_dim
    rest = qkv.shape[1:]
    q = qkv[: cfg.q_size].reshape(Hk, r * D, *rest)
    k = qkv[cfg.q_size: cfg.q_size + cfg.kv_size].reshape(Hk, D, *rest)
    v = qkv[cfg.q_size + cfg.kv_size:].reshape(Hk, D, *rest)
    return torch.cat([q, k, v], 1).reshape(qkv.shape).contiguous()


def qkv_megatron_to_vllm(cfg: Qwen3Config, qkv: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`qkv_vllm_to_megatron`."""
    Hk, r, D = cfg.num_key_value_heads, cfg.group_size, cfg.head_dim
    rest = qkv.shape[1:]
    g = qkv.reshape(Hk, (r + 2) * D, *rest)
    q, k, v = g[:, : r * D], g[:, r * D: (r + 1) * D], g[:, (r + 1) * D:]
    return torch.cat([q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)], 0).contiguous()


_MEG = {
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "mlp.gate_up_proj.weight": "mlp.linear_fc1.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}


def fused_to_megatron(cfg: Qwen3Config, f: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Internal fused layout -> megatron-core GPTModel state dict (local spec, TP=1)."""
    out = {"embedding.word_embeddings.weight": f["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": f["model.norm.weight"]}
    for i in range(cfg.num_hidden_layers):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        out[m + "self_attention.linear_qkv.weight"] = qkv_vllm_to_megatron(cfg, f[p + "self_attn.qkv_proj.weight"])
        for k, mk in _MEG.items():
            out[m + mk] = f[p + k]
    if not cfg.tie_word_embeddings:
        out["output_layer.weight"] = f["lm_head.weight"]
    return out


def megatron_to_fused(cfg: Qwen3Config, m: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """megatron-core state dict (local spec, TP=1) -> internal fused layout."""
    out = {"model.embed_tokens.weight": m["embedding.word_embeddings.weight"],
           "model.norm.weight": m["decoder.final_layernorm.weight"]}
    for i in range(cfg.num_hidden_layers):
        p, mp = f"model.layers.{i}.", f"decoder.layers.{i}."
        out[p + "self_attn.qkv_proj.weight"] = qkv_megatron_to_vllm(cfg, m[mp + "self_attention.linear_qkv.weight"])
        for k, mk in _MEG.items():
            out[p + k] = m[mp + mk]
    out["lm_head.weight"] = m["embedding.word_embeddings.weight"] if cfg.tie_word_embeddings else m["output_layer.weight"]
    return out


def fused_to_vllm(cfg: Qwen3Config, f: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Internal -> vLLM ``Qwen3ForCausalLM`` parameter names (the same layout; lm_head dropped when tied)."""
    out = dict(f)
    if cfg.tie_word_embeddings:
        out.pop("lm_head.weight")
    return out


def vllm_to_fused(cfg: Qwen3Config, v: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = dict(v)
    if cfg.tie_word_embeddings:
        out["lm_head.weight"] = v["model.embed_tokens.weight"]
    return out
