"""Qwen3 dense model configuration, read from a Hugging Face ``config.json``.

Checked-in configs (``configs/``): ``qwen3-0.6b``, ``qwen3-1.7b``, ``qwen3-4b``, ``qwen3-8b``
(published values), ``tiny`` (the CPU-interpreter test model, head_dim 16) and ``tiny-hd64``
(head_dim 64: the smallest head size vLLM's CPU attention backend takes; the CPU engine check's
model).
"""

from __future__ import annotations

import dataclasses
import json
import os

from rlk.errors import UnsupportedConfigError

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
NAMED = ("tiny", "tiny-hd64", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b")


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    name: str = "custom"

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise UnsupportedConfigError(
                f"num_attention_heads {self.num_attention_heads} not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise UnsupportedConfigError(f"head_dim {self.head_dim} must be even (RoPE)")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, d: dict, name: str = "custom") -> "Qwen3Config":
        if d.get("model_type", "qwen3") != "qwen3":
            raise UnsupportedConfigError(f"model_type {d.get('model_type')!r} is not qwen3")
        if d.get("attention_bias", False):
            raise UnsupportedConfigError("attention_bias=True is not supported (Qwen3 has none)")
        if d.get("use_sliding_window", False):
            raise UnsupportedConfigError("sliding-window attention is not supported")
        if d.get("rope_scaling") not in (None, {}):
            raise UnsupportedConfigError(f"rope_scaling {d['rope_scaling']!r} is not supported")
        if d.get("hidden_act", "silu") != "silu":
            raise UnsupportedConfigError(f"hidden_act {d['hidden_act']!r} is not supported")
        nh = int(d["num_attention_heads"])
        return cls(
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=nh,
            num_key_value_heads=int(d.get("num_key_value_heads", nh)),
            head_dim=int(d.get("head_dim") or d["hidden_size"] // nh),
            vocab_size=int(d["vocab_size"]),
            rope_theta=float(d.get("rope_theta", 1e6)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=int(d.get("max_position_embeddings", 40960)),
            name=name,
        )

    @classmethod
    def from_json(cls, path: str) -> "Qwen3Config":
        with open(path) as f:
            d = json.load(f)
        name = os.path.splitext(os.path.basename(path))[0]
        if name == "config":
            name = os.path.basename(os.path.dirname(os.path.abspath(path))) or "custom"
        return cls.from_dict(d, name=name)

    @classmethod
    def named(cls, name: str, **overrides) -> "Qwen3Config":
        """A checked-in config (``NAMED``), optionally with fields overridden (e.g. fewer layers)."""
        path = os.path.join(CONFIG_DIR, f"{name}.json")
        if not os.path.exists(path):
            raise UnsupportedConfigError(f"unknown config {name!r} (known: {', '.join(NAMED)})")
        cfg = cls.from_json(path)
        return dataclasses.replace(cfg, **overrides) if overrides else cfg

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
