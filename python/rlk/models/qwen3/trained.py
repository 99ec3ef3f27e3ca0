"""The checked-in trained ``tiny`` checkpoint: a byte-level model with a realistic next-token
distribution for CPU tests (random weights give a nearly uniform one).

Trained by ``python -m rlk.models.train_tiny`` (corpus, command, losses, entropy statistics and
sha256 in ``docs/results/tiny_trained.json``). The folder holds ``model.safetensors`` (bf16,
Hugging Face names) and ``config.json`` (a copy of ``configs/tiny.json``).
"""

from __future__ import annotations

import os

import torch

from rlk.models.qwen3.config import Qwen3Config

TRAINED_TINY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_trained")


def trained_tiny_path() -> str:
    """Folder of the trained tiny checkpoint; pass it to ``load_safetensors(path, cfg)`` or as
    ``rlk.replay.harness.ModelSpec(config="tiny", checkpoint=path)``."""
    return TRAINED_TINY_DIR


def trained_tiny_weights(dtype=torch.bfloat16, device="cpu") -> tuple[Qwen3Config, dict[str, torch.Tensor]]:
    """``(cfg, weights)``: the ``tiny`` config and the trained weights in Hugging Face naming
    (``Qwen3(cfg, weights, route)`` converts them to the fused layout)."""
    from rlk.models.qwen3.weights import load_safetensors

    cfg = Qwen3Config.named("tiny")
    return cfg, load_safetensors(TRAINED_TINY_DIR, cfg, dtype=dtype, device=device)
