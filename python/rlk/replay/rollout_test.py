"""Rollout executor logic (native route, fp32, fast): pages shuffled, batches changing,
frozen-token replay reproducing the recorded logp, agreement with the trainer pattern."""

import dataclasses

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.replay import harness, rollout, trainer
from rlk.replay.compare import compare_logp

SPEC = harness.ModelSpec(dtype="float32")


@pytest.fixture(scope="module")
def recorded():
    reqs = harness.make_requests(8, (3, 20), (2, 12), 256, seed=0, arrival_spread=6)
    m = harness.build_model(SPEC, "native")
    return m, reqs, rollout.run_rollout(m, reqs, rollout.RolloutConfig(), probes=True)


def test_schedule_properties(recorded):
    m, reqs, res = recorded
    assert [len(r) for r in res.responses] == [r.max_new_tokens for r in reqs]
    assert all(0 <= t < 256 for r in res.responses for t in r)
    pages = [p for pt in res.page_tables for p in pt]
    assert pages != sorted(pages), "pages handed out in sequence order"
    assert res.composition_changes >= res.steps // 2
    assert len(set(res.batch_sizes)) >= 3 and max(res.batch_sizes) <= 4
    assert len(set(len(r) for r in res.responses)) >= 4
    # Page tables cover every cached token (prompt + response - 1).
    for r, pt in zip(reqs, res.page_tables):
        assert len(pt) == -(-(len(r.prompt) + r.max_new_tokens - 1) // 16)


def test_forced_replay_equals_recorded_and_trainer_close(recorded):
    m, reqs, res = recorded
    again = rollout.run_rollout(m, reqs, rollout.RolloutConfig(), forced=res.responses)
    assert compare_logp(again.logp, res.logp)["mismatch_count"] == 0
    assert again.responses == res.responses
    tl, _, _ = trainer.score(m, [r.prompt for r in reqs], res.responses)
    for a, b in zip(tl, res.logp):  # fp32 native: same math, other summation orders
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


def test_other_schedules_same_logp_within_tolerance(recorded):
    m, reqs, res = recorded
    for v in (dict(max_batch=1, chunk_size=3, jitter=0.0), dict(max_batch=8, chunk_size=7, page_seed=9, jitter=0.6)):
        r = rollout.run_rollout(m, reqs, dataclasses.replace(rollout.RolloutConfig(), **v), forced=res.responses)
        for a, b in zip(r.logp, res.logp):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


def test_sampling_seeded():
    m = harness.build_model(SPEC, "native")
    reqs = harness.make_requests(3, (3, 9), (2, 5), 256, seed=1)
    a = rollout.run_rollout(m, reqs, rollout.RolloutConfig(sample_seed=5))
    b = rollout.run_rollout(m, reqs, rollout.RolloutConfig(sample_seed=5))
    c = rollout.run_rollout(m, reqs, rollout.RolloutConfig(sample_seed=6))
    assert a.responses == b.responses != c.responses


def test_bad_requests_raise():
    m = harness.build_model(SPEC, "native")
    with pytest.raises(UnsupportedConfigError):
        rollout.run_rollout(m, [rollout.Request(prompt=[], max_new_tokens=2)], rollout.RolloutConfig())
    with pytest.raises(UnsupportedConfigError, match="exhausted"):
        rollout.run_rollout(m, [rollout.Request(prompt=[1] * 40, max_new_tokens=2)],
                            rollout.RolloutConfig(num_blocks=2))


def test_out_of_range_tokens_rejected_on_the_host():
    m = harness.build_model(SPEC, "native")
    with pytest.raises(UnsupportedConfigError, match="token id 256 outside"):
        rollout.run_rollout(m, [rollout.Request(prompt=[1, 256], max_new_tokens=2)], rollout.RolloutConfig())
    with pytest.raises(UnsupportedConfigError, match="token id -1 outside"):
        rollout.run_rollout(m, [rollout.Request(prompt=[1, 2], max_new_tokens=2)], rollout.RolloutConfig(),
                            forced=[[3, -1]])
    with pytest.raises(UnsupportedConfigError, match="outside"):
        trainer.score(m, [[1, 2]], [[999]])
    with pytest.raises(UnsupportedConfigError, match="max_position_embeddings"):
        trainer.score(m, [[1] * m.cfg.max_position_embeddings], [[2]])


def test_host_validated_skips_device_value_checks_and_nests():
    from rlk.kernels.common import device_value_checks_enabled, host_validated
    from rlk.kernels.rowops import launch as rowops

    w = torch.randn(8, 16).bfloat16()
    bad = torch.tensor([1, 9])
    with pytest.raises(UnsupportedConfigError):
        rowops.embedding(bad, w)
    assert device_value_checks_enabled()
    with host_validated():
        with host_validated():
            assert not device_value_checks_enabled()
        assert not device_value_checks_enabled()
        out = rowops.embedding(bad, w)  # caller's responsibility: no check, no sync
        assert out.shape == (2, 16)
    assert device_value_checks_enabled()
    with pytest.raises(UnsupportedConfigError):
        rowops.embedding(bad, w)
