"""The CPU engine check's model, without starting an engine: ``cpu_probe.TINY`` is the named config
``tiny-hd64``, and ``write_tiny_model`` writes the checked-in trained checkpoint by default (random
weights on request), recording which."""

import json
import os

import pytest

from rlk.integrations.vllm import cpu_probe


def test_tiny_is_the_named_config():
    from rlk.models.qwen3 import Qwen3Config
    from rlk.models.qwen3.config import CONFIG_DIR, NAMED

    assert cpu_probe.CONFIG == "tiny-hd64" and cpu_probe.CONFIG in NAMED
    with open(os.path.join(CONFIG_DIR, "tiny-hd64.json")) as f:
        assert cpu_probe.TINY == json.load(f)
    c = Qwen3Config.named("tiny-hd64")
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.vocab_size, c.max_position_embeddings) == (128, 256, 2, 2, 1, 64, 256, 512)
    assert c == Qwen3Config.from_dict(cpu_probe.TINY, name="tiny-hd64")


def test_prompts_are_bytes_of_distinct_lengths():
    assert all(0 <= t < 256 for p in cpu_probe.PROMPTS for t in p)
    assert len({len(p) for p in cpu_probe.PROMPTS}) >= 7 and len(cpu_probe.PROMPTS) == 8  # varlen batch of 8


def _files(d):
    return sorted(os.listdir(d))


def test_write_trained_model_copies_the_checkpoint(tmp_path):
    from rlk.models.qwen3 import trained_path
    from rlk.models.qwen3.weights import file_sha256

    d = cpu_probe.write_tiny_model(str(tmp_path / "m"))  # the default: trained
    src = os.path.join(trained_path("tiny-hd64"), "model.safetensors")
    rec = cpu_probe.weights_record(d)
    assert rec["kind"] == "trained" and rec["config"] == "tiny-hd64", rec
    assert rec["source"] == "python/rlk/models/qwen3/tiny_hd64_trained/model.safetensors", rec
    assert rec["sha256"] == file_sha256(src) and rec["bytes"] == os.path.getsize(src), rec
    with open(os.path.join(d, "config.json")) as f:
        assert json.load(f) == cpu_probe.TINY
    assert {"config.json", "model.safetensors", "tokenizer.json", cpu_probe.WEIGHTS_RECORD} <= set(_files(d))


def test_write_random_model_is_recorded_as_random(tmp_path):
    from rlk.models.qwen3 import Qwen3Config, load_safetensors, trained_path
    from rlk.models.qwen3.weights import file_sha256

    d = cpu_probe.write_tiny_model(str(tmp_path / "m"), weights="random", seed=3)
    rec = cpu_probe.weights_record(d)
    assert rec["kind"] == "random" and rec["seed"] == 3, rec
    assert rec["sha256"] != file_sha256(os.path.join(trained_path("tiny-hd64"), "model.safetensors"))
    cfg = Qwen3Config.from_json(os.path.join(d, "config.json"))
    assert cfg.head_dim == 64 and len(load_safetensors(d, cfg)) == len(load_safetensors(trained_path("tiny-hd64"), cfg))
    with pytest.raises(ValueError, match="weights"):
        cpu_probe.write_tiny_model(str(tmp_path / "x"), weights="zeros")


def test_cli_weights_option():
    assert cpu_probe.parser().parse_args(["--out", "x.json"]).weights == "trained"
    assert cpu_probe.parser().parse_args(["--out", "x.json", "--weights", "random"]).weights == "random"
    with pytest.raises(SystemExit):
        cpu_probe.parser().parse_args(["--out", "x.json", "--weights", "zeros"])
