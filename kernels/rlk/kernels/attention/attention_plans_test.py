"""Host launch plans of the attention launchers (``rlk.kernels.plans``): a plan hit launches what
the full path launches.

Each case runs the full path with plans off, then the miss that stores the plans, then the hits,
and compares the bytes. Inputs that differ from a stored plan's only in strides, values (with the
value checks on), or a schedule override must not take that plan.
"""

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.kernels import plans
from rlk.kernels.attention import launch, schedule
from rlk.kernels.attention import testing as T
from rlk.testing import assert_bitwise_equal

SEG_C = "attn.seg128.v2"  # 128-position segments: a 192-slot cache splits decode in two


@pytest.fixture(autouse=True)
def fresh_plans():
    prev = plans.set_enabled(True)
    launch._PLANS.clear()
    yield
    launch._PLANS.clear()
    plans.set_enabled(prev)


def _three_ways(fn):
    """fn() with plans off, with plans on (misses), and again (hits only)."""
    plans.set_enabled(False)
    off = fn()
    plans.set_enabled(True)
    miss = fn()
    before = dict(launch._PLANS.stats)
    hit = fn()
    assert launch._PLANS.stats["misses"] == before["misses"], "a repeated call missed its plan"
    assert launch._PLANS.stats["hits"] > before["hits"], "the repeated call did not use a plan"
    return off, miss, hit


def _same(ref, got, what):
    for r, g, name in zip(ref, got, ("out", "lse")):
        assert_bitwise_equal(g, r, f"{what}: {name}")


def test_prefill_plan_hit_equals_full_path():
    q, k, v, cu = T.packed([5, 70, 33], 4, 2, 16, seed=1)
    off, miss, hit = _three_ways(lambda: launch.prefill(q, k, v, cu, 70, 0.25, validate=False))
    _same(off, miss, "prefill, plan stored")
    _same(off, hit, "prefill, plan hit")


@pytest.mark.parametrize("chunk", [1, 4])  # decode (split-KV + merge: 192 slots, 128 per segment), chunks
def test_paged_plan_hit_equals_full_path(chunk):
    lens = [7, 70]
    q, k, v, cu = T.packed(lens, 4, 2, 16, seed=2)
    kc, vc, bt = T.paged_cache(k, v, cu, 16, seed=2, capacity_pages=12)

    def run():
        if chunk == 1:
            return T.decode_rows(q, cu, kc, vc, bt, [6, 9, 76], 0.25, max_seqlen_q=1, validate=False,
                                 contract=SEG_C)
        return T.chunked_prefill(q, cu, kc, vc, bt, chunk, 0.25, max_seqlen_q=chunk, validate=False,
                                 contract=SEG_C)

    off, miss, hit = _three_ways(run)
    _same(off, miss, f"paged chunk={chunk}, plans stored")
    _same(off, hit, f"paged chunk={chunk}, plan hits")


def test_strided_input_does_not_take_the_contiguous_plan():
    """Same dtype, shape and values, other strides (q read from the upper half of a wider
    buffer): its own plan, same bytes."""
    q, k, v, cu = T.packed([5, 70], 4, 2, 16, seed=3)
    wide = torch.zeros(q.shape[0], q.shape[1], 2 * q.shape[2], dtype=q.dtype)
    wide[..., 16:] = q
    ref = launch.prefill(q, k, v, cu, 70, 0.25, validate=False)
    got = launch.prefill(wide[..., 16:], k, v, cu, 70, 0.25, validate=False)
    _same(ref, got, "strided q")
    assert len(launch._PLANS) == 2


def test_checks_still_run():
    """Bad metadata has no plan (the full path's checks raise); with the value checks on no plan
    is used, so bad values raise even when a plan exists for the same metadata."""
    q, k, v, cu = T.packed([4], 2, 1, 16)
    launch.prefill(q, k, v, cu, 4, 0.3, validate=False)  # stores a plan
    with pytest.raises(UnsupportedConfigError, match="dtype"):
        launch.prefill(q.float(), k.float(), v.float(), cu, 4, 0.3, validate=False)
    with pytest.raises(UnsupportedConfigError, match="scale"):
        launch.prefill(q, k, v, cu, 4, float("nan"), validate=False)
    with pytest.raises(UnsupportedConfigError, match="end at"):  # same metadata as the plan's
        launch.prefill(q, k, v, torch.tensor([0, 3], dtype=torch.int32), 4, 0.3, validate=True)
    kc = torch.zeros(2, 16, 1, 16, dtype=torch.bfloat16)
    args = (q[:1], kc, kc, torch.tensor([[0]], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32))
    launch.paged(*args, torch.tensor([1], dtype=torch.int32), 0.3, max_seqlen_q=1, validate=False)
    with pytest.raises(UnsupportedConfigError, match="capacity"):
        launch.paged(*args, torch.tensor([17], dtype=torch.int32), 0.3, max_seqlen_q=1, validate=True)
    with pytest.raises(UnsupportedConfigError, match="max_seqlen_q"):
        launch.paged(*args, torch.tensor([1], dtype=torch.int32), 0.3, validate=False)


def test_schedule_override_bypasses_plans():
    q, k, v, cu = T.packed([5, 40], 4, 2, 16, seed=4)
    ref = launch.prefill(q, k, v, cu, 40, 0.25, validate=False)
    with schedule.override("prefill", BLOCK_M=16):
        before = dict(launch._PLANS.stats)
        got = launch.prefill(q, k, v, cu, 40, 0.25, validate=False)
        assert launch._PLANS.stats == before, "a plan was looked up under a schedule override"
    _same(ref, got, "BLOCK_M=16 (bit-neutral)")


def test_key_types_and_bound():
    class Sub(torch.Tensor):
        pass

    t = torch.zeros(2, 3)
    assert plans.key("k", (t,), (1,)) is not None
    assert plans.key("k", (t.as_subclass(Sub),), (1,)) is None
    assert plans.key("k", (t,), (torch.tensor(1.0),)) is None
    assert len({plans.key("k", (t,), (s,)) for s in (1, 1.0, True)}) == 3
    assert plans.key("k", (t,), ()) != plans.key("k", (t.t(),), ())  # strides
    cache = plans.PlanCache("test", max_entries=4)
    for i in range(9):
        cache.put(i, "plan")
        assert len(cache) <= 4


@pytest.mark.gpu
def test_gpu_plan_hits_equal_full_path():
    """Qwen3-8B TP4 heads (8 q / 2 kv, head_dim 128): prefill and split-KV paged decode, plan hits
    against plans off, bitwise, on the GPU's own schedule table."""
    lens = [1000, 37]
    q, k, v, cu = T.packed(lens, 8, 2, 128, device="cuda", seed=5)
    pre = lambda: launch.prefill(q, k, v, cu, 1000, 128 ** -0.5, validate=False)  # noqa: E731
    pre_off, miss, hit = _three_ways(pre)
    _same(pre_off, hit, "gpu prefill")
    kc, vc, bt = T.paged_cache(k, v, cu, 16, seed=5, capacity_pages=128)
    off, miss, hit = _three_ways(lambda: T.decode_rows(q, cu, kc, vc, bt, [999, 1000, 1036], 128 ** -0.5,
                                                       max_seqlen_q=1, validate=False))
    _same(off, hit, "gpu paged decode")
    # Launch sites (on by default; set on here whatever the process setting): the plans'
    # repeated launches without Triton's binder.
    from rlk.kernels import launcher

    prev = launcher.set_sites_enabled(True)
    try:
        before = launcher.STATS["site_hits"]
        for _ in range(3):
            _same(pre_off, pre(), "gpu prefill, launch sites")
            _same(off, T.decode_rows(q, cu, kc, vc, bt, [999, 1000, 1036], 128 ** -0.5, max_seqlen_q=1,
                                     validate=False), "gpu paged decode, launch sites")
        assert launcher.STATS["site_hits"] > before, "no launch site was used"
    finally:
        launcher.set_sites_enabled(prev)
