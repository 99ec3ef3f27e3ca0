"""Qwen3 dense decoder over rlk ops (strict route) or torch (native route).

``Qwen3Config`` (``config.py``), weights (``weights.py``: seeded random by a named recipe, or
local safetensors, in Hugging Face naming), next-token statistics (``distribution.py``), exact
layout converters (``layouts.py``: fused internal = vLLM, megatron-core interleaved QKV), the two
routes (``routes.py``), the model (``model.py``), the checked-in trained ``tiny`` and
``tiny-hd64`` checkpoints (``trained.py``) and the Hugging Face checkpoint directory writer
(``checkpoint.py``).
"""

from rlk.models.qwen3.config import Qwen3Config
from rlk.models.qwen3.model import Qwen3
from rlk.models.qwen3.trained import trained_path, trained_tiny_path, trained_tiny_weights, trained_weights
from rlk.models.qwen3.weights import load_safetensors, random_weights

__all__ = ["Qwen3Config", "Qwen3", "random_weights", "load_safetensors", "trained_path", "trained_weights",
           "trained_tiny_path", "trained_tiny_weights"]
