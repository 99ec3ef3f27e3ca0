"""Seeded random weights are reproducible; local safetensors load exactly; bad shapes raise."""

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.models.qwen3 import Qwen3Config, load_safetensors, random_weights
from rlk.models.qwen3.weights import file_sha256, hf_shapes, save_safetensors, weights_sha256
from rlk.testing import assert_bitwise_equal

TINY = Qwen3Config.named("tiny")


def test_seeded_and_shaped():
    a, b, c = random_weights(TINY, 0), random_weights(TINY, 0), random_weights(TINY, 1)
    assert {k: tuple(v.shape) for k, v in a.items()} == hf_shapes(TINY)
    assert weights_sha256(a) == weights_sha256(b) != weights_sha256(c)
    assert all(v.dtype == torch.bfloat16 for v in a.values())
    # Sane scale: unit-ish projections, norms near 1.
    assert 0.5 < float(a["model.layers.0.self_attn.q_proj.weight"].float().std() * 8) < 2
    assert abs(float(a["model.norm.weight"].float().mean()) - 1) < 0.1


def test_safetensors_round_trip(tmp_path):
    w = random_weights(TINY, 5)
    p = str(tmp_path / "model.safetensors")
    save_safetensors(w, p)
    got = load_safetensors(p, TINY)
    for k in w:
        assert_bitwise_equal(got[k], w[k], k)
    assert file_sha256(p) == file_sha256(p) and len(file_sha256(str(tmp_path))) == 64


def test_misshapen_raises(tmp_path):
    w = random_weights(TINY, 5)
    w["model.norm.weight"] = w["model.norm.weight"][:-1].contiguous()
    p = str(tmp_path / "bad.safetensors")
    save_safetensors(w, p)
    with pytest.raises(UnsupportedConfigError, match="misshapen"):
        load_safetensors(p, TINY)
