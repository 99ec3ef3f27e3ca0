"""Qwen3 weights: random with a seed, or loaded from local safetensors (Hugging Face naming).

The Hugging Face names (``model.layers.N.self_attn.q_proj.weight``, ...) are the exchange
format; :mod:`rlk.models.qwen3.layouts` converts them to the fused internal layout (vLLM's:
``qkv_proj = [Q|K|V]``, ``gate_up_proj = [gate|up]``) and to megatron-core's.
No hub downloads: a checkpoint is a local file or folder.
"""

from __future__ import annotations

import glob
import hashlib
import math
import os

import torch

from rlk.errors import UnsupportedConfigError
from rlk.models.qwen3.config import Qwen3Config

LAYER_KEYS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)


def hf_shapes(cfg: Qwen3Config) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor name with its shape (``lm_head`` absent when tied)."""
    H, F, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    out = {"model.embed_tokens.weight": (cfg.vocab_size, H)}
    per = {
        "self_attn.q_proj.weight": (cfg.q_size, H),
        "self_attn.k_proj.weight": (cfg.kv_size, H),
        "self_attn.v_proj.weight": (cfg.kv_size, H),
        "self_attn.o_proj.weight": (H, cfg.q_size),
        "self_attn.q_norm.weight": (D,),
        "self_attn.k_norm.weight": (D,),
        "input_layernorm.weight": (H,),
        "post_attention_layernorm.weight": (H,),
        "mlp.gate_proj.weight": (F, H),
        "mlp.up_proj.weight": (F, H),
        "mlp.down_proj.weight": (H, F),
    }
    for i in range(cfg.num_hidden_layers):
        for k in LAYER_KEYS:
            out[f"model.layers.{i}.{k}"] = per[k]
    out["model.norm.weight"] = (H,)
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, H)
    return out


# Weight recipes (frozen: a change of arithmetic is a new name, as a contract is).
#
# ``plain.v0``: every tensor as drawn below. The output distribution is no trained model's:
# untied LM head N(0, 1/H) gives logits of std ~1 (next-token entropy ~ln V - 0.5, 11.4 nats at
# V = 151936); a tied LM head is the N(0, 1) embedding, logits of std ~sqrt(H) plus the current
# token's own logit ~H (its embedding dominates the residual): entropy ~0, every sampled logp
# exactly 0.0, and a replay comparison of such logp cannot fail.
#
# ``calibrated.v1``: the same draws (same generator, order and values), then a closed-form
# rescale keyed by the config shape, so that every row of logits has std ~LOGIT_BETA * sqrt(2 ln V):
#   untied: ``lm_head *= c``, c = LOGIT_BETA * sqrt(2 ln V)        (logits ~ N(0, c^2) per row)
#   tied:   ``embed_tokens *= TIED_EMBED_RHO / sqrt(H)``, ``model.norm *= c / TIED_EMBED_RHO``
# Why this works: for V iid Gaussian logits of std s, the softmax mass moves from the bulk
# (entropy ~ln V - s^2/2) to the few largest draws at s = sqrt(2 ln V) (the random-energy-model
# transition); just past it the entropy is O(1) nats while a sample still lands outside the top
# few often enough to give logp far below zero (at V = 151936: p1 of sampled logp ~ -12).
# Scaling with sqrt(2 ln V) keeps the statistics in band from V = 256 to 151936. Tied: the
# current token's logit is ~sqrt(H) * (its embedding's share of the final residual) standard
# deviations above the rest; an embedding of row norm TIED_EMBED_RHO (the layers' outputs are
# O(1) per element) makes that share ~RHO / sqrt(H), so the model does not just repeat its
# input (measured: the current token's logit 0.3-0.6 std above the mean, never the top token
# at V = 151936), and the final norm weight carries the logit scale instead. Measured
# statistics per config (entropy 2.1-2.3 nats at V = 151936, 1.7 at V = 256; sampled logp p1
# -7.5 to -11.7, p99 -0.007 to -0.024): ``calibration_stats.json`` (written by the tool
# ``python -m rlk.models.qwen3.calibrate_tune``).
RECIPES = ("calibrated.v1", "plain.v0")
DEFAULT_RECIPE = "calibrated.v1"
LOGIT_BETA = 1.3
TIED_EMBED_RHO = 0.25


def recipe_scales(cfg: Qwen3Config, recipe: str = DEFAULT_RECIPE) -> dict[str, float]:
    """The factors ``recipe`` applies (after ``plain.v0``'s draw, before the cast), by tensor name."""
    if recipe not in RECIPES:
        raise UnsupportedConfigError(f"unknown weight recipe {recipe!r} (known: {', '.join(RECIPES)})")
    if recipe == "plain.v0":
        return {}
    c = LOGIT_BETA * math.sqrt(2.0 * math.log(cfg.vocab_size))
    if not cfg.tie_word_embeddings:
        return {"lm_head.weight": c}
    return {"model.embed_tokens.weight": TIED_EMBED_RHO / math.sqrt(cfg.hidden_size),
            "model.norm.weight": c / TIED_EMBED_RHO}


RECIPE_RULES = {
    "plain.v0": "projections N(0, 1/fan_in), o/down x 1/sqrt(2L), embedding N(0, 1), norms 1 + 0.1 N(0, 1)",
    "calibrated.v1": "plain.v0, then untied: lm_head x c; tied: embed_tokens x rho/sqrt(H), model.norm x c/rho; "
                     "c = beta sqrt(2 ln V)",
}


def calibration_record(cfg: Qwen3Config, recipe: str | None, stats: dict | None = None) -> dict:
    """The ``weights.calibration`` record of reports: recipe name, rule, constants, the factors
    applied to this config, and ``stats`` (next-token statistics measured with these weights,
    :func:`rlk.models.qwen3.distribution.distribution_stats`). ``recipe=None``: a checkpoint."""
    rec: dict = {"recipe": recipe, "stats": stats}
    if recipe is not None:
        rec.update(rule=RECIPE_RULES[recipe], scales=recipe_scales(cfg, recipe),
                   params={} if recipe == "plain.v0" else {"beta": LOGIT_BETA, "rho": TIED_EMBED_RHO})
    return rec


def random_weights(cfg: Qwen3Config, seed: int, dtype=torch.bfloat16, device="cpu",
                   recipe: str = DEFAULT_RECIPE) -> dict[str, torch.Tensor]:
    """Seeded random weights in Hugging Face naming.

    ``plain.v0`` draw: a projection with fan-in ``n`` draws ``N(0, 1/n)`` (unit-variance
    outputs); ``o_proj``/``down_proj`` are further scaled by ``1/sqrt(2 L)`` so the residual
    stream grows slowly; the embedding is ``N(0, 1)``; norm weights are ``1 + 0.1 N(0, 1)`` (not
    all ones, so a wrong norm weight shows). ``recipe`` (``RECIPES``; default
    ``calibrated.v1``) then multiplies a few tensors by the factors of :func:`recipe_scales`
    (see the notes above ``RECIPES``), in fp32 before the one cast to ``dtype``.
    Tensors are drawn in the order of :func:`hf_shapes` from one ``torch.Generator`` on
    ``device`` (the same seed on another device type gives other values: record both).

    Determinism: the same (config, seed, device type, dtype, recipe) gives the same bytes;
    ``plain.v0`` is the bare draw (no factor; its bytes are pinned by calibration_test). Cost: one draw per
    tensor on ``device`` (no loop over the vocabulary; nothing measured at build time).
    """
    scales = recipe_scales(cfg, recipe)
    dev = torch.device(device)
    g = torch.Generator(device=dev)
    g.manual_seed(int(seed))
    resid_scale = 1.0 / math.sqrt(2.0 * cfg.num_hidden_layers)
    out = {}
    for name, shape in hf_shapes(cfg).items():
        t = torch.randn(shape, generator=g, device=dev, dtype=torch.float32)
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            t = 1.0 + 0.1 * t
        elif name != "model.embed_tokens.weight":
            t = t / math.sqrt(shape[1])
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                t = t * resid_scale
        if name in scales:
            t = t * scales[name]
        out[name] = t.to(dtype).contiguous()
    return out


def check_hf_weights(cfg: Qwen3Config, w: dict[str, torch.Tensor]) -> None:
    """Raises ``UnsupportedConfigError`` on a missing, extra or misshapen tensor."""
    want = hf_shapes(cfg)
    missing = sorted(set(want) - set(w))
    extra = sorted(set(w) - set(want) - ({"lm_head.weight"} if cfg.tie_word_embeddings else set()))
    bad = sorted(k for k in want if k in w and tuple(w[k].shape) != want[k])
    if missing or extra or bad:
        raise UnsupportedConfigError(
            f"weights do not match config {cfg.name}: missing {missing[:5]}, extra {extra[:5]}, "
            f"misshapen {[(k, tuple(w[k].shape), want[k]) for k in bad[:5]]}")


def load_safetensors(path: str, cfg: Qwen3Config, dtype=torch.bfloat16, device="cpu") -> dict[str, torch.Tensor]:
    """Loads a local Hugging Face checkpoint (one ``.safetensors`` file or a folder of shards)."""
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]
    if not files:
        raise UnsupportedConfigError(f"no .safetensors files under {path}")
    w = {}
    for f in files:
        w.update(load_file(f, device=str(device)))
    if cfg.tie_word_embeddings:
        w.pop("lm_head.weight", None)
    check_hf_weights(cfg, w)
    return {k: v.to(dtype).contiguous() for k, v in w.items()}


def save_safetensors(w: dict[str, torch.Tensor], path: str) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().cpu() for k, v in w.items()}, path)


def file_sha256(path: str) -> str:
    """sha256 of a checkpoint file, or of the sorted shard hashes of a folder."""
    if os.path.isdir(path):
        parts = [file_sha256(f) for f in sorted(glob.glob(os.path.join(path, "*.safetensors")))]
        return hashlib.sha256("".join(parts).encode()).hexdigest()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def weights_sha256(w: dict[str, torch.Tensor]) -> str:
    """sha256 over names and raw bytes (sorted names); for small models (copies to the host)."""
    h = hashlib.sha256()
    for k in sorted(w):
        t = w[k].detach().contiguous().cpu()
        h.update(k.encode())
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
