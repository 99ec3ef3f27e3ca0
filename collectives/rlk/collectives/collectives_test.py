"""ar.v1 / rs.v1 / ag.v1 on gloo (2 and 4 processes): bitwise vs the reference and across ranks.

Each multi-process case spawns fresh processes (``rlk.collectives.harness``); a rank compares
its own outputs with the single-process reference, the test compares hashes across ranks.
"""

import pytest
import torch

from rlk.collectives import fold_rank_order, reference
from rlk.collectives.harness import run_world
from rlk.errors import UnsupportedConfigError
from rlk.testing import assert_bitwise_equal

SC = "rlk.collectives.scenarios:"
MiB16_FP32 = 4 * 1024 * 1024  # 16 MiB of fp32


def _ok(results):
    for r in results:
        assert r["ok"], f"rank {r['rank']}: {r.get('error_type')}: {r.get('error')}\n{r.get('traceback', r.get('log', ''))}"
    return [r["result"] for r in results]


def _same_across_ranks(results, keys=("ar", "ag")):
    rows0 = results[0]["rows"]
    for res in results[1:]:
        for a, b in zip(rows0, res["rows"]):
            for k in keys:
                assert a[k] == b[k], f"{k} differs across ranks for {a['dtype']} n={a['numel']}"


def test_fold_matches_reference_single_process():
    # The local fold (torch) against the numpy spec, bf16 and fp32, N = 1..5.
    from rlk.collectives.scenarios import order_sensitive_input

    for dtype in (torch.bfloat16, torch.float32):
        for n in (1, 2, 3, 5):
            xs = [order_sensitive_input(7, r, 4099, dtype) for r in range(n)]
            for out_dtype in (dtype, torch.bfloat16):
                got = fold_rank_order(torch.stack(xs), out_dtype)
                assert_bitwise_equal(got, reference.fixed_order_sum(xs, out_dtype), f"{dtype} n={n}")


def test_default_stats_merge_is_logp_v2s():
    # Without merge_fn, merge_logsumexp_stats merges with the linear-logp kernel's own merge (the
    # function rlk.kernels.linear_logp.autograd re-exports), never a stand-in.
    from rlk.collectives import api
    from rlk.kernels.linear_logp import autograd as linear_logp

    assert api._segment_merge() is linear_logp.merge_segment_stats


def test_fold_order_is_visible():
    # Can fail: with 3+ ranks a permuted order gives other bits on these inputs.
    from rlk.collectives.scenarios import order_sensitive_input

    xs = [order_sensitive_input(1, r, 4099, torch.float32) for r in range(4)]
    fwd = fold_rank_order(torch.stack(xs), torch.float32)
    rev = fold_rank_order(torch.stack(xs[::-1]), torch.float32)
    assert not torch.equal(fwd, rev)


def test_signed_zero_is_identity():
    # Non-owning ranks contribute -0.0: the owner's bytes (including -0.0) pass through.
    owner = torch.tensor([-0.0, 0.0, 1.5, -2.25], dtype=torch.bfloat16)
    filler = torch.full_like(owner, -0.0)
    for pos in range(3):
        xs = [filler] * 3
        xs = xs[:pos] + [owner] + xs[pos + 1:]
        assert_bitwise_equal(fold_rank_order(torch.stack(xs), torch.bfloat16), owner, f"owner at {pos}")


def test_unsupported_dtype_raises_before_transport():
    from rlk.collectives import all_reduce

    with pytest.raises(UnsupportedConfigError, match="float16"):
        all_reduce(torch.ones(3, dtype=torch.float16))
    with pytest.raises(UnsupportedConfigError, match="int64"):
        all_reduce(torch.ones(3, dtype=torch.int64))


def test_world2_sizes_bf16_fp32():
    res = _ok(run_world(SC + "collectives_bitwise", 2, {"sizes": [1, 2, 3, 1000, 65537], "with_out_dtype": True}))
    _same_across_ranks(res)
    assert len(res[0]["rows"]) == 10


def test_world4_sizes_16mib_and_stats_merge():
    cases = [["bf16", 1], ["bf16", 7], ["bf16", 4099], ["fp32", 3], ["fp32", 262147], ["fp32", MiB16_FP32]]
    res = _ok(run_world(SC + "collectives_bitwise", 4, {"cases": cases, "with_out_dtype": True, "merge": True},
                        deadline_s=120))
    _same_across_ranks(res)
    # The inputs are order sensitive: a reversed rank order would give other bits.
    assert res[0]["order_sensitive_cases"] >= 3
    assert len({(r["merge"]["m"], r["merge"]["s"]) for r in res}) == 1
