"""Checked-in Qwen3 configs carry the published values; unsupported configs raise."""

import json
import os

import pytest

from rlk.errors import UnsupportedConfigError
from rlk.models.qwen3.config import CONFIG_DIR, NAMED, Qwen3Config

PUBLISHED = {  # hidden, ffn, layers, q heads, kv heads, tied
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, True),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, True),
    "qwen3-4b": (2560, 9728, 36, 32, 8, True),
    "qwen3-8b": (4096, 12288, 36, 32, 8, False),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_values(name):
    c = Qwen3Config.named(name)
    h, f, l, nq, nk, tie = PUBLISHED[name]
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.tie_word_embeddings) == (h, f, l, nq, nk, tie)
    assert (c.head_dim, c.vocab_size, c.rope_theta, c.rms_norm_eps, c.max_position_embeddings) == \
        (128, 151936, 1e6, 1e-6, 40960)
    assert c.name == name


def test_tiny_and_overrides():
    c = Qwen3Config.named("tiny")
    assert (c.hidden_size, c.num_hidden_layers, c.q_size, c.kv_size, c.group_size) == (64, 2, 64, 32, 2)
    h = Qwen3Config.named("tiny-hd64")  # vLLM's CPU attention backend needs head_dim >= 64
    assert (h.hidden_size, h.num_hidden_layers, h.head_dim, h.q_size, h.kv_size, h.intermediate_size,
            h.vocab_size, h.max_position_embeddings, h.name) == (128, 2, 64, 128, 64, 256, 256, 512, "tiny-hd64")
    assert Qwen3Config.named("qwen3-8b", num_hidden_layers=4).num_hidden_layers == 4
    assert set(NAMED) == {os.path.splitext(f)[0] for f in os.listdir(CONFIG_DIR)}


@pytest.mark.parametrize("bad", [{"attention_bias": True}, {"use_sliding_window": True},
                                 {"rope_scaling": {"type": "yarn"}}, {"model_type": "llama"},
                                 {"num_key_value_heads": 3}])
def test_unsupported_raise(tmp_path, bad):
    with open(os.path.join(CONFIG_DIR, "tiny.json")) as f:
        d = json.load(f)
    d.update(bad)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(d))
    with pytest.raises(UnsupportedConfigError):
        Qwen3Config.from_json(str(p))
