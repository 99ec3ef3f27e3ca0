"""The proof on CPU: tiny Qwen3 (bf16, Triton interpreter), >= 8 sequences with different prompt
and response lengths; the strict trainer pattern equals the strict rollout pattern bit for bit,
while the native route differs (so the comparison can fail). Needs the rlk ops: fails without."""

import json
import os

import pytest

from rlk.replay import __main__ as cli
from rlk.replay import compare, fixture, harness, rollout


@pytest.fixture(scope="module")
def strict_fixture():
    reqs = harness.make_requests(8, (3, 20), (2, 12), 256, seed=0, arrival_spread=6)
    fx, res = harness.record(harness.ModelSpec(), reqs, rollout.RolloutConfig(), route="strict")
    return fx, res


def test_strict_trainer_equals_rollout(strict_fixture):
    fx, res = strict_fixture
    assert len(set(fx.prompt_lens)) >= 4 and len(set(fx.response_lens)) >= 4
    assert res.composition_changes >= res.steps // 2
    rep = harness.check(fx, "strict", replay_rollout=False)
    c = rep["trainer_vs_recorded"]
    assert c["compared_elements"] == sum(fx.response_lens) > 0
    assert c["mismatch_count"] == 0 and c["max_abs_diff"] == 0 and c["torch_equal"], c


def test_native_differs(strict_fixture):
    fx, _ = strict_fixture
    strict = harness.check(fx, "strict", replay_rollout=False)
    native = harness.check(fx, "native", replay_rollout=False)
    c = compare.compare_logp(native["_trainer_logp"], strict["_trainer_logp"])
    assert c["mismatch_count"] > 0 and not c["torch_equal"]


def test_cli_record_check(tmp_path, capsys):
    out = str(tmp_path / "fx")
    assert cli.main(["record", "--out", out, "--sequences", "3", "--max-batch", "2",
                     "--prompt-range", "3", "9", "--response-range", "2", "4"]) == 0
    fx = fixture.load(out)
    assert fx.meta["contracts"]["attention"] == "attn.v2" and "provenance" in fx.meta
    assert fx.meta["weights"]["seed"] == 0 and len(fx.meta["weights"]["sha256_hf"]) == 64
    assert cli.main(["check", "--fixture", out, "--route", "both", "--diag", str(tmp_path)]) == 0
    rep = json.load(open(os.path.join(str(tmp_path), "replay_check.json")))
    assert rep["strict"]["trainer_vs_recorded"]["mismatch_count"] == 0
    assert rep["strict"]["rollout_replay_vs_recorded"]["mismatch_count"] == 0
    assert rep["native"]["native_vs_strict"]["mismatch_count"] > 0


def test_checks_registered():
    from rlk.gate.registry import checks_for
    import rlk.replay.checks  # noqa: F401

    for profile in ("cpu", "h200"):
        got = {(c.level, c.name) for c in checks_for(profile)}
        assert {("L1", "replay.repeat"), ("L2", "replay.shape_invariance"), ("L4", "replay.engine")} <= got


@pytest.mark.gpu
def test_gpu_h200_quick(tmp_path):
    from rlk.replay import h200

    s = h200.run(str(tmp_path), layers=4, quick=True)
    assert s["mismatch_count"] == 0 and s["max_abs_diff"] == 0 and s["torch_equal"]
    assert s["native"]["compared_elements"] == s["compared_elements"]
