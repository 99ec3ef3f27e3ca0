"""Bitwise invariance of contract gemm.bf16.v1: row i of y = x @ w.T has the same bytes whatever
M, the row's position, padding rows, the schedule (decode split-K + ordered fold vs prefill
tiles with in-register fold), the launch geometry and the run.

Under the CPU interpreter this shows the tiling/split/fold logic is batch invariant (the dot is
numpy's fp32 matmul, so it says nothing about the GPU's bf16 MMA). fp32 outputs are compared too:
they expose accumulation-order differences that a bf16 rounding would hide. The ``gpu`` tests
repeat this on the H200 at the Qwen3-8B shapes, plus CUDA graph replay vs eager.
"""

from __future__ import annotations

import json

import pytest
import torch

from rlk.errors import UnsupportedConfigError
from rlk.kernels.common import arch_of
from rlk.kernels.gemm import contract, gemm
from rlk.kernels.gemm import schedule as gemm_schedule
from rlk.testing import assert_bitwise_equal
from rlk.testing.shapes import GPU_ROWS, QWEN3_8B_GEMMS

DEV = "cuda" if torch.cuda.is_available() else "cpu"
CPU_M = (1, 2, 7, 16, 17, 33)
# (K, N, split): splits 1, 2, 3, 4; K=1000 ends in a zero-padded chunk.
CPU_KN = [(128, 96), (192, 257), (512, 63), (768, 96), (1000, 40)]


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16).to(DEV)


@pytest.mark.parametrize("K,N,out_dtype", [(k, n, torch.float32) for k, n in CPU_KN] + [(512, 63, torch.bfloat16)],
                         ids=[f"K{k}-N{n}-fp32" for k, n in CPU_KN] + ["K512-N63-bf16"])
def test_rows_invariant_across_m_and_schedules(K, N, out_dtype):
    x, w = _rand(max(CPU_M), K, seed=K), _rand(N, K, seed=N)
    full = gemm(x, w, out_dtype=out_dtype, schedule="prefill")
    for m in CPU_M:
        for schedule in ("decode", "prefill"):
            y = gemm(x[:m], w, out_dtype=out_dtype, schedule=schedule)
            assert_bitwise_equal(y, full[:m], f"K={K} N={N} split={contract.split_k(K, N)} M={m} {schedule}")


def test_rows_invariant_across_launch_geometry():
    K, N = 768, 96  # split 3
    x, w = _rand(33, K, seed=1), _rand(N, K, seed=2)
    ref = gemm(x, w, out_dtype=torch.float32, schedule="prefill")
    # BLOCK_K is not varied here: the interpreter forces 64 (see launch.plan); the GPU sweep covers it.
    geoms = [("decode", dict(BLOCK_M=16, BLOCK_N=32, num_warps=8)),
             ("decode", dict(BLOCK_M=64, BLOCK_N=16, num_stages=2)),
             ("prefill", dict(BLOCK_M=16, BLOCK_N=128, GROUP_M=1)),
             ("prefill", dict(BLOCK_M=64, BLOCK_N=32, GROUP_M=2))]
    for schedule, cfg in geoms:
        y = gemm(x, w, out_dtype=torch.float32, schedule=schedule, config=cfg)
        assert_bitwise_equal(y, ref, f"{schedule} {cfg}")


def test_row_position_permutation_and_padding():
    K, N = 512, 63
    x, w = _rand(17, K, seed=3), _rand(N, K, seed=4)
    ref = gemm(x, w, out_dtype=torch.float32)
    perm = torch.randperm(17, generator=torch.Generator().manual_seed(0)).to(DEV)
    assert_bitwise_equal(gemm(x[perm], w, out_dtype=torch.float32), ref[perm], "permuted rows")
    pad = torch.cat([_rand(5, K, seed=5) * 1e4, x, torch.zeros(6, K, dtype=x.dtype, device=DEV)])
    assert_bitwise_equal(gemm(pad, w, out_dtype=torch.float32)[5:22], ref, "padded rows")
    for i in (0, 8, 16):  # one row at a time, at any position
        assert_bitwise_equal(gemm(x[i:i + 1], w, out_dtype=torch.float32), ref[i:i + 1], f"row {i} alone")


def test_run_to_run():
    x, w = _rand(7, 1000, seed=6), _rand(40, 1000, seed=7)
    for schedule in ("decode", "prefill"):
        a = gemm(x, w, schedule=schedule, out_dtype=torch.float32)
        b = gemm(x, w, schedule=schedule, out_dtype=torch.float32)
        assert_bitwise_equal(a, b, f"run to run, {schedule}")


def test_plan_memo_equals_fresh_plan_and_follows_the_table_file(monkeypatch, tmp_path):
    """plan() is memoized: the cached plan equals a fresh computation, callers get a copy, and a
    different table file ($RLK_GEMM_TABLE) is part of the key."""
    from rlk.kernels.gemm import launch

    dev = torch.device(DEV)
    for args in ((8, 4096, 6144), (1700, 4096, 6144), (6144, 1700, 4096)):
        p = launch.plan(*args, dev)
        fresh = launch._plan(*args, arch_of(dev), None, dev.type == "cpu")
        assert p == fresh
        p["BLOCK_N"] = -1  # a caller's change never reaches the cache
        assert launch.plan(*args, dev)["BLOCK_N"] == fresh["BLOCK_N"]
    table = json.loads(open(gemm_schedule.table_path("sm_90")).read())
    table["default"]["prefill"]["BLOCK_N"] = 64
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    assert launch.plan(1700, 4096, 999, dev, schedule="prefill")["BLOCK_N"] != 64  # memoized first
    monkeypatch.setenv(gemm_schedule.TABLE_ENV, str(path))
    assert launch.plan(1700, 4096, 999, dev, schedule="prefill")["BLOCK_N"] == 64


def test_split_count_changes_bits(monkeypatch, request):
    """Negative control: the invariance checks can fail. Another split count (a contract change)
    gives other fp32 bytes, even under the interpreter."""
    K, N = 1024, 70
    x, w = _rand(16, K, seed=8), _rand(N, K, seed=9)
    ref = gemm(x, w, out_dtype=torch.float32, schedule="prefill")
    assert contract.split_k(K, N) == 4
    from rlk.kernels.gemm import launch

    monkeypatch.setattr(contract, "split_k", lambda k, n: 1)
    launch.clear_plan_cache()  # plans are memoized; the patched rule must be seen (and undone)
    request.addfinalizer(launch.clear_plan_cache)
    other = gemm(x, w, out_dtype=torch.float32, schedule="prefill")
    assert not torch.equal(other.view(torch.int32), ref.view(torch.int32)), (
        "split 1 and split 4 gave equal fp32 bytes: the invariance tests could not detect a fold change")


@pytest.mark.parametrize("K,N", [(512, 63), (768, 96), (128, 96)], ids=["split2", "split3", "split1"])
def test_prefill_variants_identical(K, N):
    """FLAT (one K loop, fold at segment ends), PERSISTENT (3 programs walk the tiles; 2: the walk
    as one flattened pipeline on the GPU, the same walk here) and TMA (tensor descriptors; x, w
    contiguous with 16-byte rows) and NSUB (tiles of 2 or 3 column sub-tiles, the last tile past N)
    give the reference bytes; an unknown PERSISTENT or NSUB, and NSUB without FLAT, are refused."""
    x, w = _rand(40, K, seed=11), _rand(N, K, seed=12)
    ref = gemm(x, w, out_dtype=torch.float32, schedule="prefill",
               config=dict(BLOCK_M=32, BLOCK_N=32, FLAT=0, PERSISTENT=0, TMA=0))
    with pytest.raises(UnsupportedConfigError, match="PERSISTENT=3"):
        gemm(x, w, schedule="prefill", config=dict(PERSISTENT=3))
    with pytest.raises(UnsupportedConfigError, match="NSUB=4"):
        gemm(x, w, schedule="prefill", config=dict(NSUB=4))
    with pytest.raises(UnsupportedConfigError, match="NSUB=3 needs FLAT=1"):
        gemm(x, w, schedule="prefill", config=dict(NSUB=3, FLAT=0))
    cfgs = [dict(BLOCK_N=64, FLAT=flat, PERSISTENT=pers, TMA=tma)
            for flat, pers, tma in ((1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1), (1, 2, 1))]
    cfgs += [dict(BLOCK_N=16, FLAT=1, PERSISTENT=pers, TMA=tma, NSUB=nsub)
             for nsub, pers, tma in ((3, 0, 0), (3, 0, 1), (3, 1, 1), (2, 0, 1))]
    for cfg in cfgs:
        cfg.update(BLOCK_M=16, GROUP_M=2)
        for m in (1, 17, 40):
            y = gemm(x[:m], w, out_dtype=torch.float32, schedule="prefill", config=cfg)
            assert_bitwise_equal(y, ref[:m], f"K={K} N={N} M={m} {cfg}")


@pytest.mark.parametrize("K,N", [(512, 97), (768, 200), (128, 41)], ids=["split2", "split3", "split1"])
def test_decode_column_ranges_identical(K, N):
    """N_PROGS cuts N into column ranges that are not tiles (a multiple of 8 wide, the last one
    shorter, each in a wider power-of-two tile): the bytes equal the tiled prefill reference at
    M = 1, 17, 40, split or not; a column left out or summed by the wrong program would differ."""
    from rlk.kernels.gemm import launch

    x, w = _rand(40, K, seed=31), _rand(N, K, seed=32)
    ref = gemm(x, w, out_dtype=torch.float32, schedule="prefill",
               config=dict(BLOCK_M=32, BLOCK_N=32, FLAT=0, PERSISTENT=0, TMA=0))
    for n_progs in (1, 3, 5, 13):
        p = launch.plan(40, K, N, torch.device("cpu"), "decode", dict(N_PROGS=n_progs))
        ranges = -(-N // p["COLS"])
        assert p["COLS"] % 8 == 0 and p["COLS"] <= p["BLOCK_N"] and ranges <= n_progs, p
        for m in (1, 17, 40):
            y = gemm(x[:m], w, out_dtype=torch.float32, schedule="decode", config=dict(BLOCK_M=64, N_PROGS=n_progs))
            assert_bitwise_equal(y, ref[:m], f"K={K} N={N} M={m} N_PROGS={n_progs} COLS={p['COLS']}")


@pytest.mark.parametrize("K,N", [(520, 97), (128, 64)], ids=["split2_ragged", "split1"])
def test_tma_transposed_operands_identical(K, N):
    """Operands that are transposes of row-major tensors (the backward's ``dy @ w`` and
    ``dy.T @ x``) go through descriptors of the row-major tensor and a register transpose: the
    bytes equal the pointer path's and the contiguous copies' (ragged M, N, K edges included),
    column sub-tiles (NSUB) too."""
    from rlk.kernels.gemm import launch

    x = _rand(K, 40, seed=15).t()  # [40, K], the transpose of a row-major [K, 40]
    w = _rand(K, 104, seed=16)[:, :N].t()  # [N, K]: 208-byte rows of the row-major parent
    assert launch.tma_layout(x) == "t" and launch.tma_layout(w) == "t"
    assert launch.tma_layout(_rand(K, 63).t()) is None  # 126-byte rows: pointer loads
    ref = gemm(x.contiguous(), w.contiguous(), out_dtype=torch.float32, schedule="prefill",
               config=dict(BLOCK_M=32, BLOCK_N=32, FLAT=0, PERSISTENT=0, TMA=0))
    for flat, pers, nsub in ((0, 0, 1), (1, 1, 1), (1, 0, 3), (1, 1, 2)):  # NSUB: column sub-tiles
        for tma in (0, 1):
            cfg = dict(BLOCK_M=16, BLOCK_N=32 if nsub == 1 else 16, GROUP_M=2, FLAT=flat, PERSISTENT=pers, TMA=tma,
                       NSUB=nsub)
            for m in (1, 17, 40):
                assert_bitwise_equal(gemm(x[:m], w, out_dtype=torch.float32, schedule="prefill", config=cfg),
                                     ref[:m], f"x.T w.T K={K} M={m} {cfg}")
                assert_bitwise_equal(gemm(x[:m].contiguous(), w, out_dtype=torch.float32, schedule="prefill",
                                          config=cfg), ref[:m], f"x w.T K={K} M={m} {cfg}")


def test_tma_falls_back_on_unaligned_strides():
    from rlk.kernels.gemm import launch

    x = _rand(5, 100, seed=13)  # 200-byte rows: not 16-byte aligned
    w = _rand(24, 100, seed=14)
    assert not launch.tma_ok(x) and launch.tma_ok(_rand(5, 64))
    assert not launch.tma_ok(_rand(64, 5).t())
    ref = gemm(x, w, out_dtype=torch.float32, schedule="prefill", config=dict(TMA=0))
    assert_bitwise_equal(gemm(x, w, out_dtype=torch.float32, schedule="prefill", config=dict(TMA=1)), ref, "fallback")


def test_decode_block_m_covers_m_and_buckets(monkeypatch, tmp_path):
    """Decode picks one m-tile for M <= 64 (weights streamed once); table M buckets select the
    schedule and BLOCK_M here (any free field in general), and the bytes do not change with them."""
    from rlk.kernels.gemm import launch

    dev = torch.device(DEV)
    K, N = 512, 63
    x, w = _rand(70, K, seed=15), _rand(N, K, seed=16)
    ref = gemm(x, w, out_dtype=torch.float32)
    table = json.loads(open(gemm_schedule.table_path()).read())
    # Without buckets or a default rule: decode up to decode_max_m, BLOCK_M covering M.
    table.pop("default_buckets", None)
    table["shapes"]["4096x6144"].pop("buckets", None)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(table))
    monkeypatch.setenv(gemm_schedule.TABLE_ENV, str(bare))
    for m, bm in ((1, 16), (16, 16), (17, 32), (33, 64), (64, 64)):
        p = launch.plan(m, 4096, 6144, dev)
        assert p["schedule"] == "decode" and p["BLOCK_M"] == bm, (m, p)
    table["shapes"][f"{K}x{N}"] = {"split_k": contract.split_rule(K, N), "prefill": {"BLOCK_N": 32},
                                   "buckets": [[2, "decode", None], [20, "prefill", 16], [40, "decode", 64],
                                               [None, "prefill", 64]]}
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(gemm_schedule.TABLE_ENV, str(path))
    for m, sched, bm in ((2, "decode", 16), (3, "prefill", 16), (33, "decode", 64), (70, "prefill", 64)):
        p = launch.plan(m, K, N, dev)
        assert (p["schedule"], p["BLOCK_M"]) == (sched, bm), (m, p)
        assert_bitwise_equal(gemm(x[:m], w, out_dtype=torch.float32), ref[:m], f"bucket M={m}")


def test_table_cannot_change_split(monkeypatch, tmp_path):
    table = json.loads(open(gemm_schedule.table_path()).read())
    table["shapes"]["4096x6144"]["split_k"] = 4
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(gemm_schedule.TABLE_ENV, str(path))
    with pytest.raises(UnsupportedConfigError, match="split_k=4 differs from the contract rule"):
        gemm_schedule.load_table()
    assert contract.split_k(4096, 6144) == 1


def test_split_rule_fills_programs_with_narrow_tiles():
    # S=1 wherever ceil(N/16) >= 132; S=2 for TP4 qkv (N=1536: 96 tiles of 16).
    assert contract.split_rule(4096, 4096) == 1 and contract.split_rule(12288, 4096) == 1
    assert contract.split_rule(1024, 4096) == 1 and contract.split_rule(4096, 37984) == 1
    assert contract.split_rule(4096, 1536) == 2 and contract.split_rule(4096, 1024) == 4


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(QWEN3_8B_GEMMS))
def test_gpu_rows_invariant_qwen3(name):
    """Every M in GPU_ROWS (1..8192), both schedules where M <= 256, rows at an offset."""
    K, N = QWEN3_8B_GEMMS[name]
    top = max(GPU_ROWS)
    x, w = _rand(top + 8, K, seed=1), _rand(N, K, seed=2)
    full = gemm(x[:top], w)  # the prefill schedule
    for m in GPU_ROWS:
        y = gemm(x[:m], w)
        assert_bitwise_equal(y, full[:m], f"{name} M={m} auto")
        if m <= 256:
            other = "prefill" if m <= gemm_schedule.decode_max_m() else "decode"
            assert_bitwise_equal(gemm(x[:m], w, schedule=other), full[:m], f"{name} M={m} {other}")
    shifted = gemm(x[8:8 + 33], w)
    assert_bitwise_equal(shifted[:25], full[8:33], f"{name} rows at offset 8")
    if name not in ("qkv", "down", "tp4_lm_head"):  # split 4, 6, 1: enough fp32 coverage, fewer compiles
        return
    fp32_full = gemm(x[:256], w, out_dtype=torch.float32, schedule="prefill")
    for m in (1, 33, 64):
        assert_bitwise_equal(gemm(x[:m], w, out_dtype=torch.float32, schedule="decode"), fp32_full[:m],
                             f"{name} fp32 M={m} decode vs prefill")


@pytest.mark.gpu
def test_gpu_cuda_graph_matches_eager():
    K, N = QWEN3_8B_GEMMS["qkv"]
    w = _rand(N, K, seed=3)
    for m in (1, 8, 64, 256):
        x = _rand(m, K, seed=m)
        eager = gemm(x, w)
        static_x = x.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            gemm(static_x, w)  # warm-up: compile outside the capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = gemm(static_x, w)
        for _ in range(2):
            g.replay()
            torch.cuda.synchronize()
            assert_bitwise_equal(out, eager, f"graph replay M={m}")
        static_x.copy_(_rand(m, K, seed=m + 1))
        g.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(out, gemm(static_x, w), f"graph replay new input M={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qkv", "tp4_qkv"])  # split 1 and 2; one compile per candidate each
def test_gpu_tuner_candidates_identical(name):
    """Every candidate the tuner may pick (FLAT / PERSISTENT / TMA prefill variants, decode BLOCK_N /
    BLOCK_K / stages) gives the reference config's fp32 bytes (the accumulation itself) at Qwen3-8B shapes."""
    import multiprocessing

    from rlk.kernels.gemm import gemm_tune

    K, N = QWEN3_8B_GEMMS[name]
    # The candidates' fp32-output kernels compiled in parallel first (Triton's disk cache): one
    # process would spend most of the test compiling. Those that do not compile are listed in
    # full and never launched here (a compiler abort would end pytest); the others are all checked.
    _, errors, failed = gemm_tune.precompile([(K, N, s, c) for s, c in gemm_tune.ALL_CANDIDATES],
                                             max(1, min(14, multiprocessing.cpu_count() - 2)), out_fp32=True)
    for e in errors:
        print(f"compile error: {e}")
    x, w = _rand(2048, K, seed=21), _rand(N, K, seed=22)
    checked = 0
    for dt in (torch.float32,):
        ref = gemm(x, w, out_dtype=dt, schedule="prefill", config=gemm_tune.REF)
        for sched, cfg in gemm_tune.ALL_CANDIDATES:
            if (K, N, gemm_tune._key((sched, cfg))) in failed:
                continue
            for m in ((1, 300, 2048) if sched == "prefill" else (1, 63, 129)):
                y = gemm(x[:m], w, out_dtype=dt, schedule=sched, config=cfg)
                assert_bitwise_equal(y, ref[:m], f"{name} {dt} {sched} {cfg} M={m}")
            checked += 1
    print(f"{name}: {checked} candidates byte-identical to the reference, {len(errors)} did not compile")
    assert not errors, errors


# Triton plans of x @ w.T for (K, N) = (128, 40) under _WARM_TABLE: decode BLOCK_M 16 (M 1-16),
# 32 (M 17-20), the 64 bucket (21-40), prefill (41-).
_WARM_KN = (128, 40)
_WARM_BUCKETS = [[20, "decode", None], [40, "decode", {"BLOCK_M": 64}], [None, "prefill", {"BLOCK_M": 16}]]


def _table_with(tmp_path, K, N, buckets) -> str:
    """A copy of the sm_90 table whose (K, N) entry has ``buckets``; returns its path."""
    table = json.loads(open(gemm_schedule.table_path()).read())
    table["shapes"][f"{K}x{N}"] = {"split_k": contract.split_rule(K, N), "buckets": buckets}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    return str(path)


def test_warm_up_launches_each_plan_once(monkeypatch, tmp_path):
    """warm_up runs one launch per distinct plan of M in 1..max_m (decode BLOCK_M steps included),
    at the smallest M of each, and refuses a bad max_m."""
    from rlk import determinism
    from rlk.kernels.gemm import launch

    K, N = _WARM_KN
    w = _rand(N, K, seed=3)
    calls = []
    real = launch.gemm
    monkeypatch.setattr(launch, "gemm", lambda x, w, **kw: calls.append(x.shape[0]) or real(x, w, **kw))
    with determinism.scoped({gemm_schedule.TABLE_ENV: _table_with(tmp_path, K, N, _WARM_BUCKETS)}):
        assert launch.warm_up(w, 100) == [1, 17, 21, 41] == calls
        calls.clear()
        assert launch.warm_up(w, 18) == [1, 17] == calls  # buckets past max_m are not compiled
        with pytest.raises(UnsupportedConfigError, match="max_m"):
            launch.warm_up(w, 0)


def test_warm_up_calls_every_picked_sm90_configuration_before_any_capture(monkeypatch, tmp_path):
    """On sm_90 the engines' warm-up also launches each CUTLASS configuration the route can pick
    (its first, eager call sets the shared-memory limit a captured launch relies on)."""
    from rlk import determinism
    from rlk.kernels.gemm import launch, sm90

    K, N = _WARM_KN
    sm_buckets = [[64, None], [128, "pp64x96"], [None, "co128x256"]]
    monkeypatch.setattr(launch, "arch_of", lambda device: "sm_90")
    monkeypatch.setattr(sm90, "buckets", lambda K, N: sm_buckets)
    monkeypatch.setattr(sm90, "route", lambda x, w, M, K, N, split: sm90.pick(M, K, N))
    monkeypatch.setattr(sm90, "pick", lambda M, K, N: next(n for m, n in sm_buckets if m is None or M <= m))
    w = _rand(N, K, seed=3)
    calls = []
    monkeypatch.setattr(launch, "gemm", lambda x, w, **kw: calls.append(x.shape[0]))
    launch.clear_plan_cache()
    with determinism.scoped({gemm_schedule.TABLE_ENV: _table_with(tmp_path, K, N, _WARM_BUCKETS)}):
        # Triton plans start at 1, 17, 21, 41; the route's configurations at 65 and 129.
        assert launch.warm_up(w, 200) == [1, 17, 21, 41, 65, 129] == calls
        calls.clear()
        assert launch.warm_up(w, 100) == [1, 17, 21, 41, 65] == calls
    launch.clear_plan_cache()
