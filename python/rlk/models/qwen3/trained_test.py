"""The checked-in trained checkpoints (``tiny``, ``tiny-hd64``): load into rlk's model, are the
files their records name, and have a healthy next-token distribution (random weights do not)."""

import json
import os
import shutil

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.models import train_tiny_tune as tt
from rlk.models.qwen3 import (Qwen3, Qwen3Config, random_weights, trained_path, trained_tiny_path, trained_tiny_weights,
                              trained_weights)
from rlk.models.qwen3.config import CONFIG_DIR
from rlk.models.qwen3.trained import TRAINED, trained_stem
from rlk.models.qwen3.weights import file_sha256, load_safetensors

CKPT = os.path.join(trained_tiny_path(), "model.safetensors")


@pytest.fixture(scope="module", params=TRAINED)
def name(request):
    return request.param


@pytest.fixture(scope="module")
def record(name):
    with open(tt.outputs(name)[1]) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def trained(name):
    return trained_weights(name)


def test_paths_and_tiny_accessors():
    assert tt.outputs("tiny") == (tt.CHECKPOINT_DIR, tt.RESULTS_JSON, tt.RESULTS_JSON[:-len(".json")] + ".png")
    assert trained_tiny_path() == trained_path("tiny") == os.path.dirname(CKPT)
    assert os.path.basename(trained_path("tiny-hd64")) == trained_stem("tiny-hd64") == "tiny_hd64_trained"
    assert tt.outputs("tiny-hd64", "/o") == ("/o/tiny_hd64_trained", "/o/tiny_hd64_trained.json",
                                             "/o/tiny_hd64_trained.png")
    with pytest.raises(UnsupportedConfigError, match="no trained checkpoint"):
        trained_path("qwen3-8b")
    cfg, w = trained_tiny_weights()
    cfg2, w2 = trained_weights("tiny")
    assert cfg == cfg2 and all(torch.equal(w[k], w2[k]) for k in w)


def _text():
    # Python source that ships with rlk (any English/Python text will do for a loose band).
    parts = []
    for name in ("model.py", "routes.py"):
        with open(os.path.join(os.path.dirname(CKPT), "..", name), "rb") as f:
            parts.append(f.read())
    return b"".join(parts)


def _stats(weights, name="tiny"):
    cfg = Qwen3Config.named(name)
    return tt.distribution_stats(Qwen3(cfg, weights, "native"), _text(), windows_n=4, prompts=4, new_tokens=48)


def test_loads_into_rlk_model(name, trained):
    cfg, w = trained
    assert cfg.name == name
    assert {k: tuple(v.shape) for k, v in w.items()} == {k: tuple(v.shape) for k, v in random_weights(cfg, 0).items()}
    assert all(v.dtype == torch.bfloat16 for v in w.values())
    with open(os.path.join(trained_path(name), "config.json")) as f, open(os.path.join(CONFIG_DIR, f"{name}.json")) as g:
        assert json.load(f) == json.load(g)
    x = torch.tensor(list(b"def main():\n    return 0\n"))
    cu = torch.tensor([0, x.numel() - 1], dtype=torch.int32)
    lp = Qwen3(cfg, w, "native").trainer_logp(x[:-1], cu, x[1:])[0]
    assert torch.isfinite(lp).all() and float(-lp.mean()) < 3.0, lp


def test_sha256_matches_record(name, record, tmp_path):
    rec = record["checkpoint"]
    ckpt = os.path.join(trained_path(name), "model.safetensors")
    assert record["config"] == name
    assert os.path.samefile(os.path.join(os.path.dirname(tt.RESULTS_JSON), "..", "..", rec["path"]), ckpt)
    assert file_sha256(ckpt) == rec["sha256"]
    assert os.path.getsize(ckpt) == rec["bytes"]
    # One flipped byte in a copy changes the hash (the check can fail).
    bad = tmp_path / "model.safetensors"
    shutil.copyfile(ckpt, bad)
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0x01
    bad.write_bytes(bytes(data))
    assert file_sha256(str(bad)) != rec["sha256"]


def test_record_is_complete_and_healthy(record):
    assert record["corpus"]["name"] == tt.CORPUS_NAME and len(record["corpus"]["sha256"]) == 64
    assert record["corpus"]["python"] and record["command"].startswith("python -m rlk.models.train_tiny")
    assert record["losses"]["val_fp32"] < 0.5 * torch.log(torch.tensor(256.0)).item()
    assert tt.healthy(record["entropy"]) == [] and record["healthy"] == "yes"


def test_distribution_in_healthy_band(name, trained):
    stats = _stats(trained[1], name)
    assert tt.healthy(stats) == [], stats


@pytest.mark.parametrize("cfg_name", TRAINED)
def test_random_weights_fail_the_band(cfg_name):
    cfg = Qwen3Config.named(cfg_name)
    # Untrained weights of the plain recipe (the calibrated recipe is in band by design).
    bad = tt.healthy(_stats(random_weights(cfg, 0, recipe="plain.v0"), cfg_name))
    assert any("entropy_mean" in b for b in bad), bad


def test_strict_route_agrees_with_native(trained):
    cfg, w = trained
    x = torch.tensor(list(b"import os\n\ndef path(p):\n    return os.path.join(p, 'x')\n"[:33]))
    cu = torch.tensor([0, 32], dtype=torch.int32)
    strict = Qwen3(cfg, w, "strict").trainer_logp(x[:-1], cu, x[1:])[0]
    native = Qwen3(cfg, w, "native").trainer_logp(x[:-1], cu, x[1:])[0]
    fp32 = Qwen3(cfg, {k: v.float() for k, v in w.items()}, "native").trainer_logp(x[:-1], cu, x[1:])[0]
    # Both bf16 routes round activations differently; per token they sit within bf16 noise of the
    # fp32 forward (up to ~0.35 nats on the 32,768 recorded validation tokens), on average closer.
    for lp in (strict, native):
        torch.testing.assert_close(lp, fp32, rtol=0, atol=0.25)
        assert abs(float(lp.mean() - fp32.mean())) < 0.02


def test_misshapen_checkpoint_refused(tmp_path):
    from rlk.models.qwen3.weights import save_safetensors

    cfg, w = trained_tiny_weights()
    w = dict(w)
    w["lm_head.weight"] = w["lm_head.weight"][:128]
    save_safetensors(w, str(tmp_path / "model.safetensors"))
    with pytest.raises(UnsupportedConfigError, match="misshapen"):
        load_safetensors(str(tmp_path), cfg)
