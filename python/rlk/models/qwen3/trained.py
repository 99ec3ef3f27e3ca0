"""Checked-in trained checkpoints of the small configs: byte-level models with a realistic
next-token distribution for CPU tests (random weights give a nearly uniform one).

Trained by ``python -m rlk.models.train_tiny_tune --config NAME`` (corpus, command, losses, entropy
statistics and sha256 in ``docs/results/<stem>.json``, where ``<stem>`` is
:func:`trained_stem`). Each folder holds ``model.safetensors`` (bf16, Hugging Face names) and
``config.json`` (a copy of ``configs/<name>.json``).

* ``tiny`` (head_dim 16): ``tiny_trained/``, the fixture of the CPU replay and ladder tests.
* ``tiny-hd64`` (head_dim 64): ``tiny_hd64_trained/``, the model of the vLLM CPU engine check
  (the engine's CPU attention backend needs head_dim >= 64).
"""

from __future__ import annotations

import os

import torch

from rlk.errors import UnsupportedConfigError
from rlk.models.qwen3.config import Qwen3Config

_HERE = os.path.dirname(os.path.abspath(__file__))
TRAINED = ("tiny", "tiny-hd64")


def trained_stem(name: str) -> str:
    """File stem of config ``name``'s trained outputs: ``tiny`` -> ``tiny_trained``,
    ``tiny-hd64`` -> ``tiny_hd64_trained`` (checkpoint folder; record ``docs/results/<stem>.json``)."""
    return name.replace("-", "_") + "_trained"


def trained_path(name: str = "tiny") -> str:
    """Folder of the trained checkpoint of named config ``name`` (one of ``TRAINED``); pass it to
    ``load_safetensors(path, cfg)`` or as ``rlk.replay.harness.ModelSpec(config=name, checkpoint=path)``."""
    if name not in TRAINED:
        raise UnsupportedConfigError(f"no trained checkpoint for config {name!r} (trained: {', '.join(TRAINED)})")
    return os.path.join(_HERE, trained_stem(name))


def trained_weights(name: str = "tiny", dtype=torch.bfloat16,
                    device="cpu") -> tuple[Qwen3Config, dict[str, torch.Tensor]]:
    """``(cfg, weights)``: named config ``name`` and its trained weights in Hugging Face naming
    (``Qwen3(cfg, weights, route)`` converts them to the fused layout)."""
    from rlk.models.qwen3.weights import load_safetensors

    cfg = Qwen3Config.named(name)
    return cfg, load_safetensors(trained_path(name), cfg, dtype=dtype, device=device)


TRAINED_TINY_DIR = trained_path("tiny")


def trained_tiny_path() -> str:
    """Folder of the trained ``tiny`` checkpoint (``trained_path("tiny")``)."""
    return trained_path("tiny")


def trained_tiny_weights(dtype=torch.bfloat16, device="cpu") -> tuple[Qwen3Config, dict[str, torch.Tensor]]:
    """``trained_weights("tiny", dtype, device)``."""
    return trained_weights("tiny", dtype=dtype, device=device)
