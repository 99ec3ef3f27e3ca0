"""Frozen replay with the megatron-core trainer on CPU (tiny Qwen3, 4 sequences, Triton
interpreter): ``replay.run`` records a strict rollout fixture, the strict megatron-core GPTModel
re-scores it packed in micro-batches, and its selected-token logp equals the recorded rollout logp
bit for bit (and rlk's own strict trainer's), while the native arm differs (so the comparison can
fail). The JSON names the trainer engine and version.

megatron-core 0.19.2 is required: with ``CI`` set this FAILS when it is missing (install it with
``ci/setup_megatron.sh``); locally it skips with that reason. Under the interpreter this shows the
routing and the fixed orders, not a GPU bf16 property.
"""

import importlib.metadata
import json
import os

import pytest


from rlk.integrations.megatron.testing import require_megatron as _megatron  # noqa: E402


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    _megatron()
    from rlk.integrations.megatron import replay_probe as replay

    out = str(tmp_path_factory.mktemp("replay_megatron"))
    s = replay.run(out, config="tiny", sequences=4, device="cpu", progress=lambda m: None)
    return out, s


def test_megatron_trainer_equals_recorded_rollout(summary):
    _, s = summary
    assert s["sequences"] == 4 and s["compared_elements"] == s["workload"]["response_tokens"] > 0
    assert s["mismatch_count"] == 0 and s["max_abs_diff"] == 0 and s["torch_equal"], s.get("first_mismatch")
    assert s["trainer"]["microbatches"] >= 2  # micro-batching exercised (40-token budget)
    assert s["trainer"]["weights_check"]["equals_fixture"]
    assert s["rlk_trainer"]["vs_rollout"]["mismatch_count"] == 0
    assert s["rlk_trainer"]["megatron_vs_rlk_trainer"]["mismatch_count"] == 0
    assert s["forward_audit"]["passed"], s["forward_audit"]


def test_native_arm_differs(summary):
    _, s = summary
    n = s["native"]
    assert n["compared_elements"] == s["compared_elements"]
    assert n["mismatch_count"] > 0 and not n["torch_equal"]
    assert n["vs_megatron_strict"]["mismatch_count"] > 0
    assert "no native megatron-core arm" in n["note"]


def test_json_names_engine_and_version(summary):
    out, s = summary
    with open(os.path.join(out, "replay_megatron_h200.json")) as f:
        j = json.load(f)
    ver = importlib.metadata.version("megatron-core")
    assert j["trainer_engine"] == "megatron-core" and j["megatron_core_version"] == ver
    assert j["provenance"]["extra"]["trainer_engine"] == "megatron-core"
    assert j["provenance"]["extra"]["megatron_core_version"] == ver
    assert j["model"]["config"] == "tiny" and j["model"]["weights"]["seed"] == 0
    for k in ("compared_elements", "mismatch_count", "max_abs_diff", "torch_equal", "seconds", "command", "native"):
        assert k in j
    assert os.path.exists(os.path.join(out, "fixture", "fixture.safetensors"))


def test_microbatches_whole_sequences():
    from rlk.integrations.megatron.replay_probe import microbatches

    assert microbatches([10, 20, 15, 50, 5], 40) == [[0, 1], [2], [3], [4]]
    assert microbatches([10, 20], None) == [[0, 1]]


@pytest.mark.gpu
def test_gpu_h200_quick(tmp_path):
    _megatron()
    from rlk.integrations.megatron import replay_probe as replay

    s = replay.run(str(tmp_path), layers=2, quick=True, sequences=8, device="cuda")
    assert s["mismatch_count"] == 0 and s["max_abs_diff"] == 0 and s["torch_equal"], s.get("first_mismatch")
    assert s["rlk_trainer"]["megatron_vs_rlk_trainer"]["mismatch_count"] == 0
    assert s["native"]["compared_elements"] == s["compared_elements"]
