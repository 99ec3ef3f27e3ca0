"""Bitwise invariance of ``logp.v2``: shard count, logits on/off, rows across T and order,
run to run (forward and backward).

Under the CPU interpreter these show the tiling/merge logic is invariant (the same property holds
or fails on GPU for the same reasons, but GPU bits are only shown by the ``gpu`` cases).
"""

import pytest
import torch

from rlk.kernels.linear_logp import launch
from rlk.kernels.linear_logp.linear_logp_test import CPU_SEG, make
from rlk.kernels.linear_logp.autograd import linear_logp, merge_segment_stats, segment_stats
from rlk.testing import assert_bitwise_equal

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def sharded(h, w, tg, vocab_real, n_shards, seg, temperature=1.0, entropy=False):
    """Splits the vocabulary into n equal shards in one process; 'all_gather' = a Python list."""
    V = w.shape[0]
    assert V % n_shards == 0
    vl = V // n_shards
    stats = [segment_stats(h, w[r * vl:(r + 1) * vl], tg, r * vl, vocab_real, temperature, entropy,
                           segmentation=seg)[0] for r in range(n_shards)]
    return merge_segment_stats(stats)


@pytest.mark.parametrize("seg,counts", [((64, 32), (2, 4, 8)), ((128, 48), (2, 4))])
def test_shard_count_invariance(seg, counts):
    h, w, tg = make(7, 64, 512, 500, seed=4)  # last shard holds padding columns 500..511
    ref = linear_logp(h, w, tg, 0, 500, 0.8, return_entropy=True, segmentation=seg)
    for n in counts:
        logp, lse, ent = sharded(h, w, tg, 500, n, seg, 0.8, entropy=True)
        assert_bitwise_equal(logp, ref.logp, f"logp, {n} shards, seg {seg}")
        assert_bitwise_equal(lse, ref.lse, f"lse, {n} shards, seg {seg}")
        assert_bitwise_equal(ent, ref.entropy, f"entropy, {n} shards, seg {seg}")


@pytest.mark.parametrize("unroll", [2, 3, 7, 32])
def test_merge_unroll_is_bit_neutral(monkeypatch, unroll):
    """merge_kernel walks UNROLL segments per trip; per row the same operations in the same order
    and exact no-op padding segments on the last trip: every unroll gives the bytes of unroll=1
    (no padding), with S = 16 segments (a partial last trip for 3, 7 and 32). Every logit is
    negative, so a padding segment that entered the max as anything but -inf would show."""
    h, w, tg = make(9, 64, 512, 500, seed=6)
    h, w = h.abs(), -w.abs()
    stats = [segment_stats(h, w, tg, 0, 500, 0.8, True, segmentation=(64, 32))[0]]
    assert stats[0].m.shape[0] == 16 and bool((stats[0].m < 0).all())
    _assert_unroll_neutral(monkeypatch, "MERGE_UNROLL_CPU", stats, unroll, "S=16")


def _assert_unroll_neutral(monkeypatch, attr, stats, unroll, label):
    """merge_segment_stats(stats) with schedule.<attr> = unroll gives the bytes of unroll 1."""
    from rlk.kernels.linear_logp import schedule

    monkeypatch.setattr(schedule, attr, 1)
    ref = merge_segment_stats(stats)
    monkeypatch.setattr(schedule, attr, unroll)
    for out, a, b in zip(("logp", "lse", "entropy"), merge_segment_stats(stats), ref):
        assert_bitwise_equal(a, b, f"{out}, unroll {unroll}, {label}")


def test_shard_with_only_padding_columns():
    # vocab_real 300 of 512: shards 3 (384..447 part padding) and 4.. fully padding at 8 shards.
    h, w, tg = make(3, 64, 512, 300, seed=5)
    ref = linear_logp(h, w, tg, 0, 300, segmentation=CPU_SEG)
    logp, lse, _ = sharded(h, w, tg, 300, 8, CPU_SEG)
    assert_bitwise_equal(logp, ref.logp, "logp with all-padding shards")
    assert_bitwise_equal(lse, ref.lse, "lse with all-padding shards")


def test_logits_on_off_invariance():
    h, w, tg = make(17, 64, 257, 250, seed=6)
    a = linear_logp(h, w, tg, 0, 250, 0.7, return_entropy=True, segmentation=CPU_SEG)
    b = linear_logp(h, w, tg, 0, 250, 0.7, return_entropy=True, return_logits=True, segmentation=CPU_SEG)
    c = linear_logp(h, w, tg, 0, 250, 0.7, segmentation=CPU_SEG)
    for name in ("logp", "lse", "entropy"):
        assert_bitwise_equal(getattr(b, name), getattr(a, name), f"{name} with logits on")
    assert_bitwise_equal(c.logp, a.logp, "logp with entropy off")
    assert_bitwise_equal(c.lse, a.lse, "lse with entropy off")


def test_rows_invariant_across_T_and_order():
    h, w, tg = make(17, 64, 257, 250, seed=7)
    full = linear_logp(h, w, tg, 0, 250, segmentation=CPU_SEG, return_entropy=True)
    for k in (1, 2, 3, 7):
        part = linear_logp(h[:k].contiguous(), w, tg[:k].contiguous(), 0, 250, segmentation=CPU_SEG,
                           return_entropy=True)
        assert_bitwise_equal(part.logp, full.logp[:k], f"logp rows[:{k}] of 17")
        assert_bitwise_equal(part.entropy, full.entropy[:k], f"entropy rows[:{k}] of 17")
    perm = torch.randperm(17, generator=torch.Generator().manual_seed(0))
    p = linear_logp(h[perm].contiguous(), w, tg[perm].contiguous(), 0, 250, segmentation=CPU_SEG)
    assert_bitwise_equal(p.logp, full.logp[perm], "permuted rows")
    # Padding rows appended (other tokens): the original rows keep their bytes.
    h2 = torch.cat([h, torch.randn(5, 64).bfloat16()])
    t2 = torch.cat([tg, torch.zeros(5, dtype=torch.long)])
    assert_bitwise_equal(linear_logp(h2, w, t2, 0, 250, segmentation=CPU_SEG).logp[:17], full.logp, "padded batch")


def test_forward_run_to_run():
    h, w, tg = make(17, 64, 257, 250, seed=8)
    a = launch.linear_logp_fwd(h, w, tg, 0, 250, 0.9, True, True, CPU_SEG)
    b = launch.linear_logp_fwd(h, w, tg, 0, 250, 0.9, True, True, CPU_SEG)
    for x, y, name in zip(a, b, ("logp", "lse", "entropy", "logits")):
        assert_bitwise_equal(x, y, f"{name} run to run")


def test_backward_run_to_run_and_dhidden_rows_invariant():
    h, w, tg = make(17, 64, 257, 250, seed=9)
    lse = launch.linear_logp_fwd(h, w, tg, 0, 250, segmentation=CPU_SEG)[1]
    dl = torch.randn(17, generator=torch.Generator().manual_seed(1))
    dh1, dw1 = launch.linear_logp_bwd(h, w, tg, lse, dl, 0, 250)
    dh2, dw2 = launch.linear_logp_bwd(h, w, tg, lse, dl, 0, 250)
    assert_bitwise_equal(dh1, dh2, "d_hidden run to run")
    assert_bitwise_equal(dw1, dw2, "d_weight run to run")
    dh3, _ = launch.linear_logp_bwd(h[:3].contiguous(), w, tg[:3].contiguous(), lse[:3].contiguous(),
                                    dl[:3].contiguous(), 0, 250)
    assert_bitwise_equal(dh3, dh1[:3], "d_hidden rows[:3] of 17")


def test_backward_schedule_fields_are_bit_neutral(monkeypatch):
    """Vocab chunk size (1, 2 or 5 chunks), TMA descriptors vs pointer loads and program grouping
    leave d_hidden / d_weight and the forward statistics byte-identical."""
    from rlk.kernels.linear_logp import contract, schedule

    h, w, tg = make(19, 64, 300, 290, seed=11)
    lse = launch.linear_logp_fwd(h, w, tg, 0, 290, segmentation=CPU_SEG)[1]
    dl = torch.randn(19, generator=torch.Generator().manual_seed(2))
    ref = launch.linear_logp_bwd(h, w, tg, lse, dl, 0, 290)
    for cap in (128, None):
        monkeypatch.setitem(contract.CPU_TABLE, "V_CHUNK_MAX", cap)
        got = launch.linear_logp_bwd(h, w, tg, lse, dl, 0, 290)
        assert_bitwise_equal(got[0], ref[0], f"d_hidden, V_CHUNK_MAX={cap}")
        assert_bitwise_equal(got[1], ref[1], f"d_weight, V_CHUNK_MAX={cap}")
    with schedule.override("gemm", TMA=0, GROUP_M=1), schedule.override("bwd_grad", TMA=0):
        got = launch.linear_logp_bwd(h, w, tg, lse, dl, 0, 290)
    assert_bitwise_equal(got[0], ref[0], "d_hidden, pointer loads")
    assert_bitwise_equal(got[1], ref[1], "d_weight, pointer loads")
    fwd = launch.linear_logp_fwd(h, w, tg, 0, 290, segmentation=CPU_SEG)
    with schedule.override("fwd", TMA=0, GROUP_T=1):
        ptr = launch.linear_logp_fwd(h, w, tg, 0, 290, segmentation=CPU_SEG)
    assert_bitwise_equal(ptr[0], fwd[0], "logp, pointer loads")
    assert_bitwise_equal(ptr[1], fwd[1], "lse, pointer loads")


# ----------------------------------------------------------------------------------------------
# GPU (H200): Qwen3-8B vocabulary 151936 (151669 real), H 4096, default segmentation (18992, 256).

@pytest.mark.gpu
def test_gpu_shard_count_invariance_qwen3():
    h, w, tg = make(64, 4096, 151936, 151669, device="cuda", seed=10)
    ref = linear_logp(h, w, tg, 0, 151669, 0.7, return_entropy=True)
    for n in (2, 4, 8):
        logp, lse, ent = sharded(h, w, tg, 151669, n, None, 0.7, entropy=True)
        assert_bitwise_equal(logp, ref.logp, f"logp TP{n}")
        assert_bitwise_equal(lse, ref.lse, f"lse TP{n}")
        assert_bitwise_equal(ent, ref.entropy, f"entropy TP{n}")


@pytest.mark.gpu
@pytest.mark.parametrize("unroll", [7, 8, 16])
def test_gpu_merge_unroll_is_bit_neutral(monkeypatch, unroll):
    """GPU bits of merge_kernel: unroll 7, 8 and the default 16 give unroll 1's bytes (with
    entropy) for Qwen3's vocabulary at TP1 and TP4 (600 segments: a partial last trip for 7 and
    16) and for a 37984-column vocabulary (150 segments: a partial last trip for all three)."""
    h, w, tg = make(300, 4096, 151936, 151669, device="cuda", seed=12)
    vl = 151936 // 4
    cases = {"TP1": [segment_stats(h, w, tg, 0, 151669, 0.7, True)[0]],
             "TP4": [segment_stats(h, w[r * vl:(r + 1) * vl], tg, r * vl, 151669, 0.7, True)[0] for r in range(4)],
             "V37984": [segment_stats(h, w[:vl], tg % vl, 0, vl, 0.7, True)[0]]}
    assert sum(st.m.shape[0] for st in cases["TP1"]) == 600 and cases["V37984"][0].m.shape[0] == 150
    for name, stats in cases.items():
        _assert_unroll_neutral(monkeypatch, "MERGE_UNROLL", stats, unroll, name)


@pytest.mark.gpu
@pytest.mark.parametrize("V,vocab_real", [(37984, 37984), (151936, 151669)])
def test_gpu_rows_logits_run_to_run(V, vocab_real):
    h, w, tg = make(1000, 4096, V, vocab_real, device="cuda", seed=11)
    full = linear_logp(h, w, tg, 0, vocab_real, return_entropy=True)
    again = linear_logp(h, w, tg, 0, vocab_real, return_entropy=True, return_logits=True)
    assert_bitwise_equal(again.logp, full.logp, "logits on/off")
    assert_bitwise_equal(again.lse, full.lse, "logits on/off (lse)")
    # k <= 64 runs the one-warpgroup decode tile (config.fwd_entry), k > 64 the 128-row tile.
    for k in (1, 2, 3, 8, 63, 64, 65, 127, 128, 129, 255):
        part = linear_logp(h[:k].contiguous(), w, tg[:k].contiguous(), 0, vocab_real)
        assert_bitwise_equal(part.logp, full.logp[:k], f"rows[:{k}] of 1000")


def test_decode_tile_selection(monkeypatch):
    """fwd_entry: T <= DECODE_T_MAX gets the one-warpgroup tile (64 rows, 4 warps, DECODE_STAGES);
    larger T and tables without the field keep the table's tile; a table whose tile is not two
    64-row warpgroups cannot declare it."""
    from rlk.errors import UnsupportedConfigError
    from rlk.kernels.linear_logp import contract, schedule

    tab = {"fwd": {"BLOCK_T": 128, "BLOCK_V": 256, "num_warps": 8, "num_stages": 3, "DECODE_T_MAX": 64,
                   "DECODE_STAGES": 4}}
    assert schedule.fwd_entry(tab, 1) == {**tab["fwd"], "BLOCK_T": 64, "num_warps": 4, "num_stages": 4}
    assert schedule.fwd_entry(tab, 64)["BLOCK_T"] == 64
    assert schedule.fwd_entry(tab, 65) is tab["fwd"]
    assert schedule.fwd_entry({"fwd": {**tab["fwd"], "DECODE_T_MAX": 0}}, 1)["BLOCK_T"] == 128
    assert schedule.fwd_entry(contract.CPU_TABLE, 1) is contract.CPU_TABLE["fwd"]
    sm90 = contract.load_table("sm_90")
    assert sm90["fwd"]["DECODE_T_MAX"] == 64
    assert "DECODE_T_MAX" not in str(contract.bit_table(sm90))  # a schedule field: not in the hash
    bad = {**sm90, "fwd": {**sm90["fwd"], "BLOCK_T": 64, "num_warps": 4}}
    from rlk.kernels import common

    monkeypatch.setattr(common, "load_table", lambda op, arch: bad)  # the file read gives `bad`
    contract.load_table.cache_clear()
    try:
        with pytest.raises(UnsupportedConfigError, match="two 64-row"):
            contract.load_table("sm_90")
    finally:
        monkeypatch.undo()
        contract.load_table.cache_clear()


@pytest.mark.gpu
def test_gpu_backward_run_to_run():
    h, w, tg = make(1000, 4096, 37984, 37984, device="cuda", seed=12)
    lse = launch.linear_logp_fwd(h, w, tg)[1]
    dl = torch.randn(1000, device="cuda")
    dh1, dw1 = launch.linear_logp_bwd(h, w, tg, lse, dl)
    dh2, dw2 = launch.linear_logp_bwd(h, w, tg, lse, dl)
    assert_bitwise_equal(dh1, dh2, "d_hidden run to run")
    assert_bitwise_equal(dw1, dw2, "d_weight run to run")
    dh3, _ = launch.linear_logp_bwd(h[:130].contiguous(), w, tg[:130].contiguous(), lse[:130].contiguous(),
                                    dl[:130].contiguous())
    assert_bitwise_equal(dh3, dh1[:130], "d_hidden rows[:130] of 1000")
