"""Weight recipes: ``plain.v0`` keeps its bytes; ``calibrated.v1`` gives trained-like next-token
statistics (entropy in [1, 3] nats, a wide sampled-logp spread, no logp exactly 0.0) for tied
and untied configs, while ``plain.v0`` on a tied config is degenerate (the check can fail)."""

import dataclasses
import json
import math
import os

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.models.qwen3 import Qwen3, Qwen3Config, random_weights
from rlk.models.qwen3 import weights as W
from rlk.models.qwen3.distribution import distribution_stats, measure, random_prompts, row_entropy
from rlk.models.qwen3.weights import weights_sha256

TINY = Qwen3Config.named("tiny")
BAND = (1.0, 3.0)

# sha256 (weights_sha256) of random_weights(..., recipe="plain.v0"), the bare draw: pinned, so
# that fixtures recorded with plain.v0 weights stay reproducible.
PLAIN_GOLDEN = {
    ("tiny", False, 0, "bfloat16"): "d027b2b6727430675420ac682365cee133f38d4f31ddc53cf7fdb99146b9e0a3",
    ("tiny", True, 7, "bfloat16"): "9070988501cee1010a59960ef8db7f8d0b9fff8bdbadf2fdccb6a896f06ce689",
    ("tiny", False, 0, "float32"): "dc811b149359b06fb07fdb266d4abf763023fb060a5ca40479b789676e36558e",
}


@pytest.mark.parametrize("key", sorted(PLAIN_GOLDEN), ids=lambda k: f"{k[0]}-tied{int(k[1])}-seed{k[2]}-{k[3]}")
def test_plain_v0_bytes_unchanged(key):
    name, tied, seed, dt = key
    cfg = Qwen3Config.named(name, tie_word_embeddings=tied)
    assert weights_sha256(random_weights(cfg, seed, dtype=getattr(torch, dt), recipe="plain.v0")) == PLAIN_GOLDEN[key]


@pytest.mark.parametrize("tied", [False, True])
def test_calibrated_rescales_only_its_tensors(tied):
    cfg = dataclasses.replace(TINY, tie_word_embeddings=tied)
    plain = random_weights(cfg, 3, dtype=torch.float32, recipe="plain.v0")
    cal = random_weights(cfg, 3, dtype=torch.float32, recipe="calibrated.v1")
    scales = W.recipe_scales(cfg, "calibrated.v1")
    assert set(scales) == ({"model.embed_tokens.weight", "model.norm.weight"} if tied else {"lm_head.weight"})
    c = W.LOGIT_BETA * math.sqrt(2 * math.log(cfg.vocab_size))
    want_scales = ({"model.embed_tokens.weight": W.TIED_EMBED_RHO / math.sqrt(cfg.hidden_size),
                    "model.norm.weight": c / W.TIED_EMBED_RHO} if tied else {"lm_head.weight": c})
    assert scales == pytest.approx(want_scales)
    for k, v in plain.items():
        want = v * scales[k] if k in scales else v
        assert torch.equal(cal[k], want), k  # fp32: the scale is one exact-enough multiply of the same draw
    assert weights_sha256(random_weights(cfg, 3, recipe="calibrated.v1")) == \
        weights_sha256(random_weights(cfg, 3, recipe="calibrated.v1"))


def test_unknown_recipe_raises():
    with pytest.raises(UnsupportedConfigError, match="unknown weight recipe"):
        random_weights(TINY, 0, recipe="calibrated.v0")


def test_distribution_stats_definition():
    ent = torch.tensor([0.5, 1.5, float("nan")])
    lp = torch.tensor([0.0, -1.0, -3.0, float("-inf")])
    s = distribution_stats([ent], [lp[:2], lp[2:]])
    assert s["rows"] == 4 and s["nonfinite"] == 2 and s["entropy_mean"] == 1.0
    assert s["frac_logp_zero"] == 0.25 and s["logp_mean"] == pytest.approx(-4 / 3)
    assert s["logp_p1"] <= s["logp_p50"] <= s["logp_p99"] <= 0.0
    x = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(row_entropy(x), torch.tensor([math.log(4), 0.0]), atol=1e-6)


# The CPU-sized subset of each shape: the published hidden/heads/intermediate/tie, one layer
# (tiny: both), and a 4096-token vocabulary (tiny: its own 256); 4 random prompts x 32 tokens.
SHAPES = {"tiny": {}, "qwen3-0.6b": dict(num_hidden_layers=1, vocab_size=4096),
          "qwen3-4b": dict(num_hidden_layers=1, vocab_size=4096),
          "qwen3-8b": dict(num_hidden_layers=1, vocab_size=4096)}


def _stats(name, recipe, **over):
    cfg = Qwen3Config.named(name, **{**SHAPES[name], **over})
    m = Qwen3(cfg, random_weights(cfg, 0, recipe=recipe), "native")
    return cfg, measure(m, random_prompts(cfg.vocab_size, 4, 32, seed=0), seed=0)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_calibrated_statistics_in_band(name):
    cfg, s = _stats(name, "calibrated.v1")
    msg = json.dumps(s, sort_keys=True)
    assert BAND[0] <= s["entropy_mean"] <= BAND[1], msg
    assert s["nonfinite"] == 0 and s["frac_logp_zero"] == 0.0, msg
    # A spread: some samples near certain, some deep in the tail.
    assert s["logp_p99"] > -0.1 and s["logp_p1"] < -4.0 and s["logp_std"] > 1.0, msg
    assert s["entropy_p90"] - s["entropy_p10"] > 1.0, msg


def test_plain_tied_is_degenerate_and_calibrated_is_not():
    """plain.v0 tied is degenerate: the current token's own logit wins, every sampled logp is 0.0."""
    _, plain = _stats("qwen3-0.6b", "plain.v0")
    assert plain["entropy_mean"] < 0.1 and plain["frac_logp_zero"] > 0.9, plain
    _, cal = _stats("qwen3-0.6b", "calibrated.v1")
    assert cal["entropy_mean"] > 1.0 and cal["frac_logp_zero"] == 0.0, cal


def test_checked_in_measurements_match_the_code():
    """calibration_stats.json (written by ``python -m rlk.models.qwen3.calibrate_tune``) was measured
    with the constants in the code, and its calibrated.v1 rows are in band, plain.v0 tied not."""
    path = os.path.join(os.path.dirname(os.path.abspath(W.__file__)), "calibration_stats.json")
    with open(path) as f:
        rec = json.load(f)
    assert rec["recipes"]["calibrated.v1"] == {"beta": W.LOGIT_BETA, "rho": W.TIED_EMBED_RHO}
    rows = rec["measurements"]
    assert {r["config"] for r in rows if r["recipe"] == "calibrated.v1"} >= {"tiny", "qwen3-0.6b", "qwen3-4b",
                                                                           "qwen3-8b"}
    for r in rows:
        if r["recipe"] == "calibrated.v1":
            assert BAND[0] <= r["stats"]["entropy_mean"] <= BAND[1], r
        elif r["tie_word_embeddings"]:
            assert r["stats"]["frac_logp_zero"] > 0.9, r


@pytest.mark.gpu
def test_gpu_qwen3_8b_all_layers_in_band():
    """The headline shape on the GPU: 36 layers, vocabulary 151936; weights built fast."""
    import time

    cfg = Qwen3Config.named("qwen3-8b")
    t0 = time.perf_counter()
    w = random_weights(cfg, 0, device="cuda", recipe="calibrated.v1")
    torch.cuda.synchronize()
    built = time.perf_counter() - t0
    s = measure(Qwen3(cfg, w, "native"), random_prompts(cfg.vocab_size, 4, 250, seed=0), seed=0)
    assert BAND[0] <= s["entropy_mean"] <= BAND[1] and s["frac_logp_zero"] < 0.01 and s["nonfinite"] == 0, s
    assert built < 60, built
