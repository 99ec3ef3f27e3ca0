"""Contract gemm.bf16.v2 (opt-in; v1 stays the default): fixed segments of 16 chunks of 64, the
segment count a function of K only.

CPU runs use Triton's interpreter (fp64 chunk sums, see ``reference.reference_segmented``): they
check that the contract ID selects v2's segmentation, that v2 rows are batch invariant in every
schedule, and that they equal the v2 reference bit for bit, padded last segments included. They say
nothing about the GPU's MMA (the ``gpu`` test repeats invariance at a Qwen3-8B shape on the H200).
"""

from __future__ import annotations

import json

import pytest
import torch

from rlk import contracts
from rlk.errors import UnsupportedConfigError
from rlk.kernels.gemm import contract, gemm, launch
from rlk.kernels.gemm import schedule as gemm_schedule
from rlk.kernels.gemm.reference import reference_segmented, reference_v2
from rlk.testing import assert_bitwise_equal
from rlk.testing.shapes import QWEN3_8B_GEMMS

DEV = "cuda" if torch.cuda.is_available() else "cpu"
V1, V2 = contract.CONTRACT_ID, contract.CONTRACT_ID_V2
# (K, N): 1 segment; 2 segments whose second holds 1 real chunk + 15 padded; 2 full segments with a
# ragged last chunk (K = 2000); 3 segments, the last padded (33 chunks). Odd N throughout.
V2_KN = [(1024, 63), (1088, 97), (2000, 33), (2112, 33)]
V2_IDS = [f"K{k}-N{n}-seg{-(-k // 1024)}" for k, n in V2_KN]


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16).to(DEV)


@pytest.mark.parametrize("K,N", V2_KN, ids=V2_IDS)
def test_v2_rows_invariant_and_equal_reference(K, N):
    """Row i has the same fp32 bytes alone (M = 1), inside M = 3, 17, 40 calls, in the decode and
    the prefill schedule; and those bytes are the v2 reference's."""
    x, w = _rand(40, K, seed=K), _rand(N, K, seed=N)
    full = gemm(x, w, out_dtype=torch.float32, schedule="prefill", contract=V2)
    assert_bitwise_equal(full, reference_v2(x, w, torch.float32), f"v2 vs reference K={K} N={N}")
    for m in (3, 17, 40):
        for sched in ("decode", "prefill"):
            y = gemm(x[:m], w, out_dtype=torch.float32, schedule=sched, contract=V2)
            assert_bitwise_equal(y, full[:m], f"v2 K={K} N={N} M={m} {sched}")
    for i in (0, 2, 16, 39):
        for sched in ("decode", "prefill"):
            y = gemm(x[i:i + 1], w, out_dtype=torch.float32, schedule=sched, contract=V2)
            assert_bitwise_equal(y, full[i:i + 1], f"v2 K={K} N={N} row {i} alone, {sched}")


@pytest.mark.parametrize("K,N", [(1088, 97), (2112, 33)], ids=["seg2_padded", "seg3_padded"])
def test_v2_bf16_geometries_and_load_paths_equal_reference(K, N):
    """bf16 outputs (one RNE rounding) of every decode / prefill variant equal the reference:
    FLAT, PERSISTENT and TMA (whose boxes lie wholly past K in the padded chunks: zero fill)."""
    x, w = _rand(17, K, seed=3), _rand(N, K, seed=4)
    ref = reference_v2(x, w)
    geoms = [("decode", None), ("decode", dict(BLOCK_M=16, BLOCK_N=16, num_warps=8)),
             ("prefill", dict(BLOCK_M=16, BLOCK_N=32, GROUP_M=1, FLAT=0, PERSISTENT=0, TMA=0)),
             ("prefill", dict(BLOCK_M=16, BLOCK_N=64, GROUP_M=2, FLAT=1, PERSISTENT=1, TMA=1)),
             ("prefill", dict(BLOCK_M=32, BLOCK_N=32, FLAT=0, PERSISTENT=0, TMA=1))]
    for sched, cfg in geoms:
        y = gemm(x, w, schedule=sched, config=cfg, contract=V2)
        assert y.dtype == torch.bfloat16
        assert_bitwise_equal(y, ref, f"v2 bf16 K={K} N={N} {sched} {cfg}")


def test_v2_backward_forms_equal_reference():
    """dx = dy @ w and dw = dy.T @ x (transposed views, as the autograd calls them) follow v2 with
    their own reduction length: K = N = 1088 for dx, K = M = 1088 tokens for dw."""
    M, K, N = 1088, 40, 1088
    x, w, dy = _rand(M, K, seed=5), _rand(N, K, seed=6), _rand(M, N, seed=7)
    dx = gemm(dy[:9], w.t(), out_dtype=torch.float32, contract=V2)
    assert_bitwise_equal(dx, reference_v2(dy[:9], w.t(), torch.float32), "v2 dx")
    dw = gemm(dy.t()[:24], x.t(), out_dtype=torch.float32, contract=V2)
    assert_bitwise_equal(dw, reference_v2(dy.t()[:24], x.t(), torch.float32), "v2 dw")


@pytest.mark.parametrize("K,N", [(128, 96), (768, 96), (1000, 40)], ids=["split1", "split3", "split4_ragged"])
def test_v1_equals_segmented_reference(K, N):
    """The segmented reference models the interpreter: v1 (its own split, equal segments) matches
    it too, so a v2 mismatch is v2's segmentation, not the reference."""
    s = contract.split_k(K, N)
    x, w = _rand(9, K, seed=8), _rand(N, K, seed=9)
    ref = reference_segmented(x, w, s, -(-K // 64) // s, torch.float32)
    for sched in ("decode", "prefill"):
        assert_bitwise_equal(gemm(x, w, out_dtype=torch.float32, schedule=sched), ref, f"v1 K={K} {sched}")


@pytest.mark.parametrize("K,N", [(1024, 70), (2112, 33)], ids=["v1split4-v2seg1", "v1split3x11-v2seg3x16"])
def test_contract_id_selects_the_arithmetic(K, N):
    """Where v1 and v2 cut K differently, the fp32 bytes differ (the ID really selects another
    arithmetic); an explicit v1 equals the default call byte for byte."""
    v1_seg = contract.segments(K, N, V1)
    v2_seg = contract.segments(K, N, V2)
    assert v1_seg != v2_seg, (v1_seg, v2_seg)
    x, w = _rand(16, K, seed=10), _rand(N, K, seed=11)
    for sched in ("decode", "prefill"):
        d = gemm(x, w, out_dtype=torch.float32, schedule=sched)
        a = gemm(x, w, out_dtype=torch.float32, schedule=sched, contract=V1)
        b = gemm(x, w, out_dtype=torch.float32, schedule=sched, contract=V2)
        assert_bitwise_equal(a, d, f"explicit v1 vs default, {sched}")
        assert not torch.equal(a.view(torch.int32), b.view(torch.int32)), (
            f"v1 {v1_seg} and v2 {v2_seg} gave equal fp32 bytes at K={K} N={N} ({sched})")


def test_v2_split_is_a_function_of_k_only():
    assert [contract.segment_rule(k) for k in (1, 64, 1024, 1025, 1088, 2112, 4096, 12288)] == [1, 1, 1, 2, 2, 3, 4, 12]
    dev = torch.device(DEV)
    for K in (1024, 1088, 4096, 12288):
        splits = {launch.plan(m, K, n, dev, contract=V2)["split_k"] for m in (1, 17, 64, 65, 4096)
                  for n in (1, 63, 1536, 4096, 37984)}
        assert splits == {contract.segment_rule(K)}, (K, splits)
        p = launch.plan(1, K, 4096, dev, contract=V2)
        assert p["seg_chunks"] == contract.SEG_CHUNKS and p["contract"] == V2
        assert p["seg_steps"] * p["BLOCK_K"] == contract.SEG_CHUNKS * 64


def test_v2_plan_reuses_tiles_but_never_the_tables_split(monkeypatch, tmp_path):
    """The sm_90 table restates v1's split (4096x6144: 1); a v2 plan keeps the table's tiles and
    takes the split from the v2 rule (4), also when the entry's split_k is removed."""
    dev = torch.device(DEV)
    K, N = QWEN3_8B_GEMMS["qkv"]
    assert gemm_schedule.load_table()["shapes"][f"{K}x{N}"]["split_k"] == contract.split_rule(K, N) == 1
    for m in (1, 32, 64, 2048):
        p1 = launch.plan(m, K, N, dev)
        p2 = launch.plan(m, K, N, dev, contract=V2)
        assert (p1["split_k"], p2["split_k"]) == (1, 4)
        for key in gemm_schedule.SCHEDULE_KEYS[p1["schedule"]]:
            if key != "BLOCK_K":  # the interpreter forces 64 (launch._plan); tiles otherwise shared
                assert p1.get(key) == p2.get(key), (m, key)
    table = json.loads(open(gemm_schedule.table_path()).read())
    table["shapes"][f"{K}x{N}"].pop("split_k")
    path = tmp_path / "nosplit.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(gemm_schedule.TABLE_ENV, str(path))
    assert launch.plan(1, K, N, dev, contract=V2)["split_k"] == 4


def test_registry_lists_both_contracts():
    from rlk.gate import l0_checks

    c1, c2 = contracts.get(V1), contracts.get(V2)
    assert c1 is contract.CONTRACT and c2 is contract.CONTRACT_V2
    assert c1.bit_hash() != c2.bit_hash()
    # Same dtypes, rounding and MMA; different segmentation (the only intended difference).
    differ = {k for k in set(c1.bit_fields) | set(c2.bit_fields) if c1.bit_fields.get(k) != c2.bit_fields.get(k)}
    assert differ == {"reduction_order", "split_k", "seg_chunks", "backward"}, differ
    lock = json.loads(l0_checks.lock_path().read_text())
    assert lock[V1] == c1.bit_hash() and lock[V2] == c2.bit_hash()
    assert contracts.STRICT_CONTRACTS["gemm"] == V1  # v2 is opt-in: nothing runs it by default


@pytest.mark.parametrize("call", [
    lambda: gemm(_rand(2, 64), _rand(4, 64), contract="gemm.bf16.v3"),
    lambda: gemm(_rand(0, 64), _rand(4, 64), contract="gemm.v2"),
    lambda: launch.plan(2, 64, 4, torch.device(DEV), contract="attn.v2"),
    lambda: launch.warm_up(_rand(4, 64), 8, contract=""),
    lambda: contract.split_k(64, 4, "gemm.bf16.V2"),
    lambda: contract.contract("gemm.bf16"),
], ids=["gemm", "gemm-empty", "plan", "warm_up", "split_k", "record"])
def test_bad_contract_id_raises(call):
    with pytest.raises(UnsupportedConfigError, match=r"unknown contract .* \(known: gemm.bf16.v1, gemm.bf16.v2\)"):
        call()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qkv", "down"])  # v2: 4 and 12 segments (v1: 1)
def test_gpu_v2_rows_invariant_qwen3(name):
    K, N = QWEN3_8B_GEMMS[name]
    x, w = _rand(264, K, seed=1), _rand(N, K, seed=2)
    full = gemm(x[:256], w, out_dtype=torch.float32, schedule="prefill", contract=V2)
    for m in (1, 7, 33, 64, 129, 256):
        for sched in ("decode", "prefill"):
            y = gemm(x[:m], w, out_dtype=torch.float32, schedule=sched, contract=V2)
            assert_bitwise_equal(y, full[:m], f"{name} v2 M={m} {sched}")
        assert_bitwise_equal(gemm(x[:m], w, contract=V2), full[:m].to(torch.bfloat16), f"{name} v2 auto M={m}")
