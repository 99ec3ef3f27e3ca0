"""One Hugging Face checkpoint directory for every engine: ``config.json`` + safetensors shards.

vLLM loads such a directory directly; rlk's trainer pattern and the megatron-core adapter load
the same files (:func:`rlk.models.qwen3.load_safetensors`), so every engine computes with the same
bytes. The record returned by :func:`write_hf_dir` (and stored beside the shards as
``rlk_checkpoint.json``) carries the sha256 that reports cite.

Layout written: ``config.json`` (the Hugging Face dict of the config: a checked-in config's own
JSON with the layer count overridden when it differs), ``model-0000i-of-0000N.safetensors``
(tensors in :func:`~rlk.models.qwen3.weights.hf_shapes` order, at most ``shard_bytes`` each) and
``model.safetensors.index.json`` (the standard weight map).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import time

import torch

from rlk.errors import UnsupportedConfigError
from rlk.models.qwen3.config import CONFIG_DIR, Qwen3Config
from rlk.models.qwen3.weights import check_hf_weights, file_sha256, hf_shapes

RECORD = "rlk_checkpoint.json"


def hf_config_dict(cfg: Qwen3Config) -> dict:
    """The Hugging Face ``config.json`` dict of ``cfg`` (architecture ``Qwen3ForCausalLM``)."""
    base = os.path.join(CONFIG_DIR, f"{cfg.name}.json")
    if os.path.exists(base):
        with open(base) as f:
            d = json.load(f)
    else:
        d = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
             "attention_dropout": 0.0, "hidden_act": "silu", "rope_scaling": None, "sliding_window": None,
             "use_sliding_window": False, "torch_dtype": "bfloat16", "use_cache": True}
    d.update(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
             num_hidden_layers=cfg.num_hidden_layers, max_window_layers=cfg.num_hidden_layers,
             num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
             head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, rope_theta=cfg.rope_theta,
             rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_word_embeddings,
             max_position_embeddings=cfg.max_position_embeddings)
    if _core(Qwen3Config.from_dict(d)) != _core(cfg):
        raise UnsupportedConfigError(f"config.json for {cfg.name} does not round-trip")
    return d


def _core(cfg: Qwen3Config) -> dict:
    d = cfg.to_dict()
    d.pop("name")
    return d


def write_hf_dir(cfg: Qwen3Config, weights: dict[str, torch.Tensor], path: str, *,
                 shard_bytes: int = 4 << 30, meta: dict | None = None, progress=print) -> dict:
    """Writes ``weights`` (Hugging Face names, any device) as a checkpoint directory at ``path``.

    Returns the record also written to ``path/rlk_checkpoint.json``: ``sha256`` (of the sorted
    shard hashes, :func:`~rlk.models.qwen3.weights.file_sha256`), ``shards`` (name, bytes,
    sha256), ``bytes``, the seconds spent, and ``meta`` (the caller's: seed, recipe, ...).
    Raises ``UnsupportedConfigError`` when the tensors do not match ``cfg`` or are not bf16.
    """
    from safetensors.torch import save_file

    check_hf_weights(cfg, weights)
    bad = sorted(k for k, t in weights.items() if t.dtype != torch.bfloat16)
    if bad:
        raise UnsupportedConfigError(f"checkpoint tensors must be bf16: {bad[:3]}")
    t0 = time.perf_counter()
    os.makedirs(path, exist_ok=True)
    names = [n for n in hf_shapes(cfg) if n in weights]
    shards, cur, size = [], [], 0
    for n in names:
        nbytes = weights[n].numel() * weights[n].element_size()
        if cur and size + nbytes > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(n)
        size += nbytes
    if cur:
        shards.append(cur)
    files, weight_map = [], {}
    for i, group in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: weights[n].detach().contiguous().cpu() for n in group}, os.path.join(path, fname),
                  metadata={"format": "pt"})
        files.append(fname)
        weight_map.update({n: fname for n in group})
        progress(f"checkpoint: wrote {fname} ({len(group)} tensors)")
    total = sum(os.path.getsize(os.path.join(path, f)) for f in files)
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config_dict(cfg), f, indent=1)
    t_write = time.perf_counter() - t0
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(files))) as ex:
        hashes = list(ex.map(lambda fn: file_sha256(os.path.join(path, fn)), files))
    rec = {"format": "huggingface safetensors", "config": cfg.name, "layers": cfg.num_hidden_layers,
           # file_sha256(path) without reading the shards twice: sha256 of the sorted shard hashes.
           "sha256": hashlib.sha256("".join(h for _, h in sorted(zip(files, hashes))).encode()).hexdigest(),
           "bytes": total,
           "shards": [{"name": f, "bytes": os.path.getsize(os.path.join(path, f)), "sha256": h}
                      for f, h in zip(files, hashes)],
           "write_s": round(t_write, 2), "hash_s": round(time.perf_counter() - t0 - t_write, 2),
           "meta": dict(meta or {})}
    with open(os.path.join(path, RECORD), "w") as f:
        json.dump(rec, f, indent=1)
    return rec


def read_record(path: str) -> dict:
    """The record :func:`write_hf_dir` left in ``path`` (raises when absent)."""
    p = os.path.join(path, RECORD)
    if not os.path.exists(p):
        raise UnsupportedConfigError(f"{path} has no {RECORD} (not written by rlk.models.qwen3.checkpoint)")
    with open(p) as f:
        return json.load(f)
