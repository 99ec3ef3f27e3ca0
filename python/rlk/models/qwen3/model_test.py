"""Qwen3 model, both routes: packing/positions logic (native, fp32), strict exactness (bf16,
Triton interpreter on CPU), strict accuracy against the native route, actor determinism.

The strict tests need the rlk ops (gemm, rowops, attention, linear_logp); they fail (never skip)
when those are missing.
"""

import pytest
import torch

from rlk.models.qwen3 import Qwen3, Qwen3Config, random_weights
from rlk.replay import trainer
from rlk.replay.compare import compare_logp
from rlk.testing import assert_bitwise_equal

TINY = Qwen3Config.named("tiny")


def _seqs(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = [(3 + 5 * i) % 19 + 2 for i in range(n)]
    prompts = [torch.randint(0, 256, (p,), generator=g).tolist() for p in lens]
    resps = [torch.randint(0, 256, (2 + i % 5,), generator=g).tolist() for i in range(n)]
    return prompts, resps


def test_native_packed_equals_single_sequences_fp32():
    m = Qwen3(TINY, random_weights(TINY, 0, dtype=torch.float32), "native")
    prompts, resps = _seqs()
    packed, _, _ = trainer.score(m, prompts, resps)
    for i in range(len(prompts)):
        one, _, _ = trainer.score(m, prompts[i:i + 1], resps[i:i + 1])
        torch.testing.assert_close(one[0], packed[i], rtol=0, atol=1e-5)


def test_trainer_logp_host_cu_same_bytes_and_checked():
    """trainer.pack keeps cu_seqlens on the host too; trainer_logp given it reads nothing back and
    gives the bytes of the device-read path; a host_cu that disagrees is refused."""
    from rlk.errors import UnsupportedConfigError

    m = Qwen3(TINY, random_weights(TINY, 0, dtype=torch.float32), "native")
    prompts, resps = _seqs(3)
    pk = trainer.pack(prompts, resps)
    assert pk.host_cu == pk.cu_seqlens.tolist()
    a, _ = m.trainer_logp(pk.ids, pk.cu_seqlens, pk.targets, host_cu=pk.host_cu)
    b, _ = m.trainer_logp(pk.ids, pk.cu_seqlens, pk.targets)
    assert torch.equal(a, b)
    with pytest.raises(UnsupportedConfigError, match="ends at"):
        m.trainer_logp(pk.ids, pk.cu_seqlens, pk.targets, host_cu=pk.host_cu[:-1] + [pk.host_cu[-1] + 1])
    with pytest.raises(UnsupportedConfigError, match="entries"):
        m.trainer_logp(pk.ids, pk.cu_seqlens, pk.targets, host_cu=pk.host_cu[:-1])


def test_native_matches_unpacked_reference_fp32():
    """Positions restart per sequence: a sequence packed behind another gives its own logp."""
    w = random_weights(TINY, 0, dtype=torch.float32)
    m = Qwen3(TINY, w, "native")
    prompts, resps = _seqs(2)
    lp, _, _ = trainer.score(m, prompts, resps, order=[1, 0])
    lp0, _, _ = trainer.score(m, prompts[:1], resps[:1])
    torch.testing.assert_close(lp[0], lp0[0], rtol=0, atol=1e-5)
    assert lp[0].dtype == torch.float32 and bool((lp[0] <= 0).all())


def test_strict_trainer_repeat_and_packing_invariance():
    m = Qwen3(TINY, random_weights(TINY, 0), "strict")
    prompts, resps = _seqs()
    a, _, _ = trainer.score(m, prompts, resps)
    b, _, _ = trainer.score(m, prompts, resps, order=[3, 1, 0, 2], microbatch_tokens=20)
    c = compare_logp(a, b)
    assert c["mismatch_count"] == 0 and c["torch_equal"], c


def test_strict_close_to_native_but_not_equal():
    w = random_weights(TINY, 0)
    prompts, resps = _seqs()
    s, _, _ = trainer.score(Qwen3(TINY, w, "strict"), prompts, resps)
    n, _, _ = trainer.score(Qwen3(TINY, w, "native"), prompts, resps)
    # Tolerance: bf16 activations through 2 layers, different rounding points: 0.1 nats.
    for x, y in zip(s, n):
        torch.testing.assert_close(x, y, rtol=0, atol=0.1)
    assert compare_logp(s, n)["mismatch_count"] > 0, "routes equal: the comparison could not fail"


def test_strict_actor_grads_deterministic():
    m = Qwen3(TINY, random_weights(TINY, 0), "strict")
    prompts, resps = _seqs(2)
    a = trainer.score(m, prompts, resps, actor=True)
    b = trainer.score(m, prompts, resps, actor=True)
    ref, _, _ = trainer.score(m, prompts, resps)
    assert compare_logp(a[0], b[0])["mismatch_count"] == 0
    assert compare_logp(a[0], ref)["mismatch_count"] == 0, "actor logp differs from reference logp"
    assert set(a[1]) == set(m.w) and all(g is not None for g in a[1].values())
    for k in a[1]:
        assert_bitwise_equal(a[1][k], b[1][k], k)
    assert float(a[1]["model.layers.0.self_attn.qkv_proj.weight"].float().abs().sum()) > 0


def test_strict_actor_fused_lm_head_equals_unfused(monkeypatch):
    """The strict actor path forms the LM head's gradients in its forward (ops.logp_loss); every
    weight's gradient and the logp equal the unfused path (linear_logp, then backward) bitwise."""
    from rlk.models.qwen3.routes import StrictOps

    m = Qwen3(TINY, random_weights(TINY, 0), "strict")
    monkeypatch.setattr(Qwen3, "fused_actor_lm_head", True)
    prompts, resps = _seqs(2)
    calls = []
    real = StrictOps.logp_loss
    monkeypatch.setattr(StrictOps, "logp_loss", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    fused = trainer.score(m, prompts, resps, actor=True)
    assert calls, "the fused LM head path did not run"
    monkeypatch.setattr(StrictOps, "logp_loss", None)
    unfused = trainer.score(m, prompts, resps, actor=True)
    assert compare_logp(fused[0], unfused[0])["mismatch_count"] == 0
    for k in fused[1]:
        assert_bitwise_equal(fused[1][k], unfused[1][k], k)


@pytest.mark.gpu
def test_gpu_qwen3_8b_shape_two_layers_trainer_vs_rollout():
    """Qwen3-8B shape (2 of 36 layers), bf16 on the GPU: trainer vs rollout bitwise."""
    from rlk.replay import harness, rollout

    spec = harness.ModelSpec(config="qwen3-8b", num_layers=2, device="cuda")
    reqs = harness.make_requests(8, (64, 600), (4, 64), 151936, seed=0, arrival_spread=8)
    fx, _ = harness.record(spec, reqs, rollout.RolloutConfig(max_batch=6, chunk_size=256))
    rep = harness.check(fx, "strict")
    assert rep["trainer_vs_recorded"]["mismatch_count"] == 0, rep["trainer_vs_recorded"]
    assert rep["rollout_replay_vs_recorded"]["mismatch_count"] == 0


@pytest.mark.parametrize("route", ["strict", "native"])
def test_logp_of_sampled_equals_logp(route):
    """The rollout's one-pass sampling logp (logits + the pass's lse) equals the model's logp:
    bitwise on the strict route (logp.v2: logp = x_target - lse), close on the native route."""
    dt = torch.bfloat16
    m = Qwen3(TINY, random_weights(TINY, 3, dtype=dt), route)
    g = torch.Generator().manual_seed(5)
    h = (torch.randn(7, TINY.hidden_size, generator=g)).to(dt)
    toks = torch.randint(0, TINY.vocab_size, (7,), generator=g)
    logits, stats = m.logits_for_sampling(h)
    assert logits.dtype == torch.float32 and logits.shape == (7, m.w["lm_head.weight"].shape[0])
    got = m.logp_of_sampled(logits, stats, toks)
    want = m.logp(h, toks)
    if route == "strict":
        assert_bitwise_equal(got, want, "one-pass sampled logp vs linear_logp")
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_strict_qk_norm_rope_dispatch_same_bytes(monkeypatch):
    # Fused launch at few tokens without autograd, the two ops per part otherwise: same bytes.
    from rlk.kernels.rowops import launch as L
    from rlk.models.qwen3.routes import StrictOps

    ops = StrictOps()
    T, nq, nk, D = 6, 4, 2, 16
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn((T, (nq + 2 * nk) * D), generator=g).bfloat16()
    qk = qkv[:, : (nq + nk) * D].view(T, nq + nk, D)
    wq, wk = (1 + 0.1 * torch.randn(D, generator=g)).bfloat16(), (1 + 0.1 * torch.randn(D, generator=g)).bfloat16()
    table = ops.rope_table(32, D, 1e6, "cpu")
    pos = torch.arange(T) * 3
    calls = []
    real = L.qk_norm_rope
    monkeypatch.setattr(L, "qk_norm_rope", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        fused = ops.qk_norm_rope(qk, wq, wk, 1e-6, pos, table, nq)
        assert len(calls) == 1
        monkeypatch.setattr(StrictOps, "fused_qk_norm_rope_max_tokens", T - 1)
        parts = ops.qk_norm_rope(qk, wq, wk, 1e-6, pos, table, nq)
        assert len(calls) == 1  # above the bound: the separate ops
    for a, b, what in zip(fused, parts, ("q", "k")):
        assert_bitwise_equal(a, b, f"{what}: fused vs separate ops")


def test_warm_row_counts_cover_each_divisibility_class_in_both_regimes():
    m = Qwen3(TINY, random_weights(TINY, 3), "strict")
    fq = m.ops.fused_qk_norm_rope_max_tokens
    got = m.warm_row_counts(8192)
    assert got == sorted(set(got)) and max(got) == 8192 and min(got) == 1
    for lo, hi in ((1, fq), (fq + 1, 8192)):
        part = [t for t in got if lo <= t <= hi]
        assert any(t % 2 for t in part) and any(t % 2 == 0 and t % 16 for t in part) \
            and any(t % 16 == 0 for t in part), (lo, hi, part)
    assert all(1 <= t <= 10 for t in m.warm_row_counts(10)) and 10 in m.warm_row_counts(10)
    assert m.warm_up_rows(8, counts=[1, 2]) == [1, 2]  # runs the forward (attention zeroed)


@pytest.mark.gpu
def test_gpu_warm_up_rows_leaves_no_row_op_to_compile():
    """After ``warm_up_rows``, forwards at other token counts compile no row-op, logp or
    attention kernel (GEMM variants per M are ``gemm.launch.warm_up``'s and are not counted)."""
    import triton

    cfg = Qwen3Config.named("qwen3-0.6b", num_hidden_layers=2)
    m = Qwen3(cfg, random_weights(cfg, 0, device="cuda"), "strict")
    m.warm_up_rows(600)
    compiled = []
    saved = triton.knobs.runtime.jit_post_compile_hook
    triton.knobs.runtime.jit_post_compile_hook = lambda **kw: compiled.append(str(kw.get("repr", "?")))
    try:
        m.warm_up_rows(600, counts=[5, 40, 77, 129, 200, 257, 300, 599])
        torch.cuda.synchronize()
    finally:
        triton.knobs.runtime.jit_post_compile_hook = saved
    assert [c for c in compiled if "gemm" not in c] == []
