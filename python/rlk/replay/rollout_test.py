"""Rollout executor logic (native route, fp32, fast): pages shuffled, batches changing,
frozen-token replay reproducing the recorded logp, agreement with the trainer pattern; decode
steps padded to batch buckets (strict route: bitwise equal to unpadded) and, on GPU, CUDA graphs
vs eager."""

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
        out = rowops.embedding_kernel(bad, w)  # caller's responsibility: no check, no sync
        assert out.shape == (2, 16) and bool(torch.isnan(out[1].float()).all())
        # The embedding's own route there is the index_select copy: a bad id fails as it does.
        with pytest.raises(IndexError):
            rowops.embedding(bad, w)
    assert device_value_checks_enabled()
    with pytest.raises(UnsupportedConfigError):
        rowops.embedding(bad, w)


# ---- decode steps at bucket shapes (padding rows) and CUDA graphs -------------------------------
def _count_kv_allocs(m):
    calls = []
    orig = m.new_kv_cache

    def counted(*a, **k):
        calls.append(a)
        return orig(*a, **k)

    m.new_kv_cache = counted
    return calls


def test_padded_decode_strict_bitwise_equal_to_unpadded():
    # Strict route (bf16, interpreter); max_batch 3 is no bucket size, so decode steps of 3 are
    # padded to 4 (and steps of 1 and 2 run at exact bucket sizes).
    m = harness.build_model(harness.ModelSpec(), "strict")
    reqs = harness.make_requests(5, (3, 12), (3, 8), 256, seed=3, arrival_spread=2)
    # step_logp off: padding alone (the eager LM head on the real rows); step_logp has its own test.
    rc = rollout.RolloutConfig(max_batch=3, jitter=0.0, cuda_graphs=False, pad_decode=False, step_logp=False)
    a = rollout.run_rollout(m, reqs, rc)
    assert a.bucket_steps == a.padded_steps == a.graph_replays == 0
    calls = _count_kv_allocs(m)
    b = rollout.run_rollout(m, reqs, dataclasses.replace(rc, pad_decode=True), forced=a.responses)
    assert len(calls) == 1
    assert b.padded_steps > 0 and b.bucket_steps > b.padded_steps and b.over_bucket_steps == 0
    assert b.graph_captures == b.graph_replays == 0  # CPU: padded buckets run eagerly
    assert b.responses == a.responses
    for x, y in zip(b.logp, a.logp):
        assert torch.equal(x, y), (x, y)


def test_step_logp_forced_replay_bitwise_equal():
    """RolloutConfig.step_logp: padded decode steps of a forced replay give every row's logp of its
    forced token inside the step (all rows of a decode step sample); strict: the same bytes as the
    eager per-step LM head on the real rows (logp.v2 rows do not depend on the row count)."""
    m = harness.build_model(harness.ModelSpec(), "strict")
    reqs = harness.make_requests(5, (3, 12), (3, 8), 256, seed=3, arrival_spread=2)
    rc = rollout.RolloutConfig(max_batch=3, jitter=0.0, cuda_graphs=False, pad_decode=True, step_logp=False)
    a = rollout.run_rollout(m, reqs, rc)
    calls = []
    real_logp = m.logp
    m.logp = lambda h, t: calls.append(h.shape[0]) or real_logp(h, t)
    try:
        b = rollout.run_rollout(m, reqs, dataclasses.replace(rc, step_logp=True), forced=a.responses)
    finally:
        del m.logp
    assert b.padded_steps > 0 and b.responses == a.responses
    assert 4 in calls, "no padded step computed its logp at the bucket's row count"
    for x, y in zip(b.logp, a.logp):
        assert torch.equal(x, y), (x, y)
    # Without forced tokens the flag changes nothing (sampling needs the logits on the host).
    c = rollout.run_rollout(m, reqs, dataclasses.replace(rc, step_logp=True))
    assert c.responses == a.responses and all(torch.equal(x, y) for x, y in zip(c.logp, a.logp))
    # One-token prefill chunks: a padded step may hold a row whose prompt is unfinished (it does
    # not sample) before one that finishes its prompt; such steps keep the eager path.
    r1 = [rollout.Request(prompt=list(range(1, 1 + p)), max_new_tokens=3) for p in (3, 6, 4)]
    rc1 = rollout.RolloutConfig(max_batch=3, chunk_size=1, jitter=0.0, cuda_graphs=False, pad_decode=True,
                                step_logp=False)
    ref = rollout.run_rollout(m, r1, rc1)
    d = rollout.run_rollout(m, r1, dataclasses.replace(rc1, step_logp=True), forced=ref.responses)
    for x, y in zip(d.logp, ref.logp):
        assert torch.equal(x, y), (x, y)
    assert rollout.RolloutConfig().step_logp, "step_logp is on by default (RolloutConfig.step_logp says why)"


def test_padded_decode_native_finite_and_close(recorded):
    m, reqs, res = recorded
    rc = rollout.RolloutConfig(pad_decode=True)
    r = rollout.run_rollout(m, reqs, rc, forced=res.responses)
    assert r.padded_steps > 0 and r.graph_replays == 0
    for a, b in zip(r.logp, res.logp):  # fp32 native: keys gathered over the full width
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    # Decode steps above the largest bucket run eagerly, unpadded, and are counted.
    r2 = rollout.run_rollout(m, reqs, dataclasses.replace(rc, decode_buckets=(1, 2)), forced=res.responses)
    assert r2.over_bucket_steps > 0 and r2.bucket_steps > 0
    for a, b in zip(r2.logp, res.logp):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


@pytest.mark.parametrize("route", ["native", "strict"])
def test_padding_rows_touch_no_cache_slot_and_give_zero_attention(route):
    from rlk.replay import decode_graphs

    m = harness.build_model(harness.ModelSpec(), route)
    kv = m.new_kv_cache(4, 16)
    for kc, vc in kv:  # a cache full of distinct finite values
        kc.copy_(torch.randn(kc.shape)), vc.copy_(torch.randn(vc.shape))
    before = [(kc.clone(), vc.clone()) for kc, vc in kv]
    # Two real decode rows (kv lengths 5 and 17, pages [2] and [0, 3]) padded to 4 rows.
    host = decode_graphs.pad_decode_inputs([7, 9], [4, 16], [2 * 16 + 4, 3 * 16 + 0], [5, 17], [[2], [0, 3]],
                                           bucket=4, width=3)
    assert host.slot_mapping.tolist() == [36, 48, -1, -1] and host.seq_lens_kv.tolist() == [5, 17, 0, 0]
    outs = {}
    ops = m.ops
    orig_attn = ops.attn_paged

    def spy(q, kc, vc, meta, scale):
        o = orig_attn(q, kc, vc, meta, scale)
        outs.setdefault("attn", []).append(o.clone())
        return o

    ops.attn_paged = spy
    try:
        from rlk.kernels.common import host_validated

        with host_validated():
            hidden = m.rollout_step(host.ids, host.positions, kv, host.meta(m.device, 16))
    finally:
        del ops.attn_paged
    assert torch.isfinite(hidden).all()
    for o in outs["attn"]:
        assert torch.isfinite(o).all() and not o[2:].any(), "padding rows must give attention output 0"
    for (kc, vc), (k0, v0) in zip(kv, before):
        for c, c0 in ((kc, k0), (vc, v0)):
            f, f0 = c.view(-1, *c.shape[2:]), c0.view(-1, *c0.shape[2:])
            changed = sorted(set(torch.nonzero((f != f0).flatten(1).any(1)).flatten().tolist()))
            assert changed == [36, 48], changed


def test_decode_mode():
    cpu = torch.device("cpu")
    assert rollout.decode_mode(rollout.RolloutConfig(), cpu)[:2] == (False, False)
    assert rollout.decode_mode(rollout.RolloutConfig(pad_decode=True), cpu)[:2] == (False, True)
    assert rollout.decode_mode(rollout.RolloutConfig(cuda_graphs=True), torch.device("cuda"))[:2] == (True, True)
    assert rollout.decode_mode(rollout.RolloutConfig(), torch.device("cuda"))[:2] == (True, True)
    assert rollout.decode_mode(rollout.RolloutConfig(pad_decode=True), cpu, probes=True)[:2] == (False, False)
    with pytest.raises(UnsupportedConfigError, match="CUDA device"):
        rollout.decode_mode(rollout.RolloutConfig(cuda_graphs=True), cpu)
    with pytest.raises(UnsupportedConfigError, match="pad_decode"):
        rollout.decode_mode(rollout.RolloutConfig(cuda_graphs=True, pad_decode=False), torch.device("cuda"))
    with pytest.raises(UnsupportedConfigError, match="increasing"):
        rollout.decode_mode(rollout.RolloutConfig(pad_decode=True, decode_buckets=(4, 2)), cpu)
    # Buckets survive a JSON round trip of the config (a fixture stores them as a list).
    assert rollout.decode_mode(rollout.RolloutConfig(pad_decode=True, decode_buckets=[1, 3]), cpu)[2] == (1, 3)


def test_probes_force_eager(recorded):
    m, reqs, res = recorded
    r = rollout.run_rollout(m, reqs, rollout.RolloutConfig(pad_decode=True), forced=res.responses, probes=True)
    assert r.bucket_steps == r.padded_steps == 0 and r.probes is not None


@pytest.mark.gpu
@pytest.mark.parametrize("config,layers", [("tiny", None), ("qwen3-0.6b", 2)])
def test_gpu_cuda_graphs_equal_eager(config, layers):
    spec = harness.ModelSpec(config=config, num_layers=layers, device="cuda")
    m = harness.build_model(spec, "strict")
    vocab = m.cfg.vocab_size
    reqs = harness.make_requests(11, (3, 70), (4, 40), vocab, seed=5, arrival_spread=4)
    eager = rollout.RolloutConfig(max_batch=11, chunk_size=32, cuda_graphs=False, pad_decode=False, step_logp=False)
    a = rollout.run_rollout(m, reqs, eager)
    calls = _count_kv_allocs(m)
    g = rollout.run_rollout(m, reqs, dataclasses.replace(eager, cuda_graphs=True, pad_decode=True),
                            forced=a.responses)
    assert len(calls) == 1
    assert g.graph_replays > 0 and g.graph_captures >= 1 and g.padded_steps > 0
    assert g.graph_replays == g.bucket_steps and g.graph_captures <= len(set(g.batch_sizes))
    for x, y in zip(g.logp, a.logp):
        assert torch.equal(x, y), (x, y)
    # Forced replay with the logp inside the graphs (step_logp): the same bytes.
    gl = rollout.run_rollout(m, reqs, dataclasses.replace(eager, cuda_graphs=True, pad_decode=True, step_logp=True),
                             forced=a.responses)
    assert gl.graph_replays > 0 and gl.graph_captures > 0  # graphs with targets were captured
    for x, y in zip(gl.logp, a.logp):
        assert torch.equal(x, y), (x, y)
    # Sampling with graphs gives the eager tokens too (logits of the real rows only).
    s = rollout.run_rollout(m, reqs, dataclasses.replace(eager, cuda_graphs=True, pad_decode=True))
    assert s.responses == a.responses and all(torch.equal(x, y) for x, y in zip(s.logp, a.logp))
    # Native route: runs under graphs without NaN (no bitwise claim).
    n = harness.build_model(spec, "native")
    ng = rollout.run_rollout(n, reqs, dataclasses.replace(eager, cuda_graphs=True, pad_decode=True),
                             forced=a.responses)
    ne = rollout.run_rollout(n, reqs, eager, forced=a.responses)
    assert ng.graph_replays > 0
    for x, y in zip(ng.logp, ne.logp):
        assert torch.isfinite(x).all()
        torch.testing.assert_close(x, y, rtol=0, atol=0.25)
