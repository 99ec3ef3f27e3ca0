"""The Hugging Face checkpoint directory every engine loads: exact round trip, shards, index,
config, sha256 record; bad input refused."""

import json
import os

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.models.qwen3 import Qwen3Config, load_safetensors, random_weights
from rlk.models.qwen3 import checkpoint
from rlk.models.qwen3.weights import file_sha256
from rlk.testing import assert_bitwise_equal

TINY = Qwen3Config.named("tiny")


def test_round_trip_sharded_with_index_config_and_record(tmp_path):
    w = random_weights(TINY, 3)
    d = str(tmp_path / "ckpt")
    rec = checkpoint.write_hf_dir(TINY, w, d, shard_bytes=64 << 10, meta={"seed": 3}, progress=lambda s: None)
    shards = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    assert len(shards) > 1 and [s["name"] for s in rec["shards"]] == shards
    got = load_safetensors(d, TINY)
    assert set(got) == set(w)
    for k in w:
        assert_bitwise_equal(got[k], w[k], k)
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        index = json.load(f)
    assert set(index["weight_map"]) == set(w) and set(index["weight_map"].values()) == set(shards)
    assert Qwen3Config.from_json(os.path.join(d, "config.json")).to_dict() == {**TINY.to_dict(), "name": "ckpt"}
    # The record's sha256 is file_sha256 of the folder (what reports cite), computed without a re-read.
    assert rec["sha256"] == file_sha256(d) and checkpoint.read_record(d) == rec
    assert rec["meta"] == {"seed": 3} and rec["bytes"] == sum(s["bytes"] for s in rec["shards"])


def test_sha256_changes_with_one_weight_bit(tmp_path):
    w = random_weights(TINY, 3)
    a = checkpoint.write_hf_dir(TINY, w, str(tmp_path / "a"), progress=lambda s: None)
    t = w["model.norm.weight"].clone()
    t.view(torch.int16)[0] ^= 1
    w["model.norm.weight"] = t
    b = checkpoint.write_hf_dir(TINY, w, str(tmp_path / "b"), progress=lambda s: None)
    assert a["sha256"] != b["sha256"]


def test_layer_override_round_trips_in_config(tmp_path):
    import dataclasses

    cfg = dataclasses.replace(TINY, num_hidden_layers=1)
    d = str(tmp_path / "one")
    checkpoint.write_hf_dir(cfg, random_weights(cfg, 0), d, progress=lambda s: None)
    got = Qwen3Config.from_json(os.path.join(d, "config.json"))
    assert got.num_hidden_layers == 1 and got.vocab_size == TINY.vocab_size


def test_refuses_missing_or_non_bf16_tensors(tmp_path):
    w = random_weights(TINY, 3)
    bad = dict(w)
    bad.pop("model.norm.weight")
    with pytest.raises(UnsupportedConfigError, match="missing"):
        checkpoint.write_hf_dir(TINY, bad, str(tmp_path / "x"), progress=lambda s: None)
    w32 = {k: v.float() for k, v in w.items()}
    with pytest.raises(UnsupportedConfigError, match="bf16"):
        checkpoint.write_hf_dir(TINY, w32, str(tmp_path / "y"), progress=lambda s: None)
    with pytest.raises(UnsupportedConfigError, match="rlk_checkpoint.json"):
        checkpoint.read_record(str(tmp_path))
