"""Exact weight conversion Hugging Face <-> megatron-core (this provider's GPTModel), per TP rank.

Full (TP=1) layouts come from :mod:`rlk.models.qwen3.layouts` (``hf_to_fused`` ->
``fused_to_megatron`` and back). Per-rank shards follow megatron-core's TP layout:

| tensor | rank r holds |
| --- | --- |
| ``embedding.word_embeddings``, ``output_layer`` | rows ``[r V/tp, (r+1) V/tp)`` |
| ``linear_qkv`` (interleaved per query group) | rows of groups ``[r G/tp, (r+1) G/tp)`` (contiguous) |
| ``linear_fc1`` (``stride=2``) | ``[gate_r | up_r]``: rows r of gate, then rows r of up |
| ``linear_proj``, ``linear_fc2`` | columns ``[r K/tp, (r+1) K/tp)`` |
| norms | the full vector (replicated) |

Every function only slices, concatenates and copies: bytes are preserved exactly (round trip
tested bitwise).
"""

from __future__ import annotations

import torch

from rlk.errors import UnsupportedConfigError
from rlk.models.qwen3.config import Qwen3Config
from rlk.models.qwen3.layouts import fused_to_hf, fused_to_megatron, hf_to_fused, megatron_to_fused


def _kind(name: str) -> str:
    if name in ("embedding.word_embeddings.weight", "output_layer.weight") or name.endswith("linear_qkv.weight"):
        return "rows"
    if name.endswith("linear_fc1.weight"):
        return "fc1"
    if name.endswith("linear_proj.weight") or name.endswith("linear_fc2.weight"):
        return "cols"
    return "replicated"


def shard(cfg: Qwen3Config, full: dict[str, torch.Tensor], tp: int, rank: int) -> dict[str, torch.Tensor]:
    """A full megatron state dict -> rank ``rank``'s shard at TP=``tp`` (contiguous copies)."""
    if cfg.num_key_value_heads % tp or cfg.intermediate_size % tp or cfg.vocab_size % tp:
        raise UnsupportedConfigError(f"TP={tp} must divide num_key_value_heads, intermediate_size and vocab_size")
    out = {}
    for k, t in full.items():
        kind = _kind(k)
        if kind == "rows":
            out[k] = t.chunk(tp, 0)[rank].contiguous()
        elif kind == "cols":
            out[k] = t.chunk(tp, 1)[rank].contiguous()
        elif kind == "fc1":
            g, u = t.chunk(2, 0)
            out[k] = torch.cat([g.chunk(tp, 0)[rank], u.chunk(tp, 0)[rank]], 0).contiguous()
        else:
            out[k] = t
    return out


def unshard(cfg: Qwen3Config, shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Rank-ordered shards -> the full megatron state dict (inverse of :func:`shard`)."""
    tp = len(shards)
    out = {}
    for k in shards[0]:
        parts = [s[k] for s in shards]
        kind = _kind(k)
        if kind == "rows":
            out[k] = torch.cat(parts, 0).contiguous()
        elif kind == "cols":
            out[k] = torch.cat(parts, 1).contiguous()
        elif kind == "fc1":
            gs = [p.chunk(2, 0) for p in parts]
            out[k] = torch.cat([g for g, _ in gs] + [u for _, u in gs], 0).contiguous()
        else:
            for r in range(1, tp):
                if not torch.equal(parts[r].view(torch.uint8) if parts[r].dtype == torch.bfloat16 else parts[r],
                                   parts[0].view(torch.uint8) if parts[0].dtype == torch.bfloat16 else parts[0]):
                    raise UnsupportedConfigError(f"unshard: replicated tensor {k} differs on rank {r}")
            out[k] = parts[0]
    return out


def hf_to_megatron(cfg: Qwen3Config, hf: dict[str, torch.Tensor], tp: int = 1, rank: int = 0) -> dict[str, torch.Tensor]:
    """Hugging Face Qwen3 tensors -> this provider's GPTModel state dict for ``rank`` at TP=``tp``."""
    return shard(cfg, fused_to_megatron(cfg, hf_to_fused(cfg, hf)), tp, rank)


def megatron_to_hf(cfg: Qwen3Config, shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Rank-ordered GPTModel state dicts -> Hugging Face Qwen3 tensors."""
    return fused_to_hf(cfg, megatron_to_fused(cfg, unshard(cfg, shards)))


def load_into(model: torch.nn.Module, sd: dict[str, torch.Tensor]) -> None:
    """Copies ``sd`` into ``model``'s parameters exactly; every parameter must be covered and
    every tensor used, with equal shape and dtype (fail closed)."""
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(sd))
    extra = sorted(set(sd) - set(params))
    if missing or extra:
        raise UnsupportedConfigError(f"load_into: missing {missing}, unexpected {extra}")
    with torch.no_grad():
        for k, p in params.items():
            t = sd[k]
            if t.shape != p.shape or t.dtype != p.dtype:
                raise UnsupportedConfigError(f"load_into: {k} is {tuple(t.shape)} {t.dtype}, "
                                             f"the model wants {tuple(p.shape)} {p.dtype}")
            p.copy_(t)


def state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters (detached clones), by name."""
    return {k: p.detach().clone() for k, p in model.named_parameters()}
