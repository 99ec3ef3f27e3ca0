"""Offline tool (never imported by the library): measures the next-token statistics of the weight
recipes and writes ``calibration_stats.json`` beside this file.

    python -m rlk.models.qwen3.calibrate_tune [--out PATH] [--configs tiny qwen3-8b ...] [--device cpu]

For every config: the recipe's weights (seed 0) on the native route, 4 random prompts x 64
tokens, :func:`rlk.models.qwen3.distribution.measure`. Rows: each published config at one layer
and its full vocabulary (151936), ``tiny`` at its own depth and vocabulary, and ``--deep``
configs at all their layers. The constants it measured are ``weights.LOGIT_BETA`` and
``weights.TIED_EMBED_RHO``; a row records both, and ``calibration_test`` checks the file agrees
with the code. On CPU a one-layer Qwen3-8B row takes about a minute and 7 GB of memory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import torch

from rlk.models.qwen3 import Qwen3, Qwen3Config
from rlk.models.qwen3 import weights as W
from rlk.models.qwen3.distribution import measure, random_prompts

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calibration_stats.json")


def measure_row(name: str, recipe: str, layers: int | None, device: str, say=print) -> dict:
    cfg = Qwen3Config.named(name, **({"num_hidden_layers": layers} if layers else {}))
    t0 = time.perf_counter()
    w = W.random_weights(cfg, 0, device=device, recipe=recipe)
    model = Qwen3(cfg, w, "native")
    stats = measure(model, random_prompts(cfg.vocab_size, 4, 64, seed=0), seed=0)
    row = {"config": name, "recipe": recipe, "num_hidden_layers": cfg.num_hidden_layers,
           "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
           "tie_word_embeddings": cfg.tie_word_embeddings, "scales": W.recipe_scales(cfg, recipe),
           "stats": stats, "seconds": round(time.perf_counter() - t0, 1)}
    say(f"{name:11s} L={cfg.num_hidden_layers:2d} V={cfg.vocab_size} tied={int(cfg.tie_word_embeddings)} "
        f"{recipe:13s} entropy {stats['entropy_mean']:.3f} logp mean {stats['logp_mean']:.3f} "
        f"p1 {stats['logp_p1']:.2f} p50 {stats['logp_p50']:.3f} p99 {stats['logp_p99']:.4f} "
        f"zero {stats['frac_logp_zero']:.3f} ({row['seconds']} s)")
    del model, w
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlk.models.qwen3.calibrate_tune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--configs", nargs="+", default=["tiny", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"])
    p.add_argument("--deep", nargs="*", default=["qwen3-0.6b"], help="configs also measured at all layers")
    p.add_argument("--recipes", nargs="+", default=list(W.RECIPES))
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    rows = []
    for name in a.configs:
        for recipe in a.recipes:
            rows.append(measure_row(name, recipe, None if name == "tiny" else 1, a.device))
    for name in a.deep:
        rows.append(measure_row(name, "calibrated.v1", None, a.device))
    rec = {
        "format": "rlk.weights.calibration_stats.v1",
        "what": "next-token statistics of random_weights(cfg, seed=0, recipe=...) on the native route: "
                "4 random prompts x 64 tokens (distribution.random_prompts seed 0), one seeded sample "
                "per position after the first (distribution.measure)",
        "command": " ".join(["python -m rlk.models.qwen3.calibrate_tune", *(sys.argv[1:] if argv is None else argv)]),
        "date": datetime.date.today().isoformat(),
        "host": {"machine": platform.machine(), "device": a.device, "torch": torch.__version__},
        "recipes": {"calibrated.v1": {"beta": W.LOGIT_BETA, "rho": W.TIED_EMBED_RHO}, "plain.v0": {}},
        "rules": W.RECIPE_RULES,
        "measurements": rows,
    }
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
