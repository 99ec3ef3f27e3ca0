"""The tuner's selection logic (CPU): bucket runs, merging, candidate regimes, table validity."""

from __future__ import annotations

import json
import time

import pytest

from rlk.errors import UnsupportedConfigError
from rlk.kernels.gemm import contract, gemm_compile, gemm_tune, schedule


def test_choose_run_keeps_config_within_tie_and_jumps_when_needed():
    m_list = (1, 2, 4, 8)
    per_m = {1: {"a": 1.00, "b": 1.01}, 2: {"a": 1.015, "b": 1.00}, 4: {"a": 1.10, "b": 1.00, "c": 1.005},
             8: {"a": 1.0, "b": "error: smem", "c": 1.01}}
    run = gemm_tune.choose_run(per_m, m_list)
    # "b" is near-best for M = 1, 2, 4 (the longest reach) although "a" is fastest at M = 1; at
    # M = 8 "b" failed: of the near-best "a" and "c" (same reach) the faster one.
    assert [k for _, k in run[:3]] == ["b", "b", "b"]
    assert run[3][1] == "a"
    # No tie allowance: the fastest at every M.
    assert [k for _, k in gemm_tune.choose_run(per_m, m_list, tie=1.0)] == ["a", "b", "b", "a"]


def test_choose_run_skips_m_without_any_valid_config():
    run = gemm_tune.choose_run({1: {"a": "rejected: 3 bf16 elements differ"}, 2: {"a": 1.0}}, (1, 2))
    assert run == [(1, None), (2, "a")]


def test_to_buckets_merges_runs_and_ends_open():
    by_key = {"d": ("decode", {"BLOCK_M": 16}), "p": ("prefill", {"BLOCK_M": 64})}
    run = [(1, "d"), (8, "d"), (16, None), (32, "p"), (64, "p")]
    assert gemm_tune.to_buckets(run, by_key) == [[8, "decode", {"BLOCK_M": 16}], [None, "prefill", {"BLOCK_M": 64}]]
    tail = [None, "prefill", None]
    assert gemm_tune.to_buckets(run, by_key, open_tail=tail)[-2:] == [[64, "prefill", {"BLOCK_M": 64}], tail]


def test_candidates_by_regime():
    small, mid, large = gemm_tune.candidates(8), gemm_tune.candidates(128), gemm_tune.candidates(4096)
    assert {c["BLOCK_M"] for s, c in small if s == "decode"} == {16, 64}
    # Row tiles of 16 (and 32 from M = 17) for the TMA kernel at decode sizes, never past M = 32.
    assert {c["BLOCK_M"] for s, c in small if s == "prefill"} == {16, 64}
    assert {c["BLOCK_M"] for s, c in gemm_tune.candidates(24) if s == "prefill"} == {32, 64}
    assert all(c["BLOCK_M"] >= 64 for s, c in mid + gemm_tune.candidates(48))
    assert {s for s, _ in mid} == {"decode", "prefill"}
    assert all(s == "prefill" for s, _ in large) and len(large) < len(mid)
    # 128-row decode tiles and column ranges at 64 < M <= 256 only.
    mid_dec = [c for s, c in mid if s == "decode"]
    assert {c["BLOCK_M"] for c in mid_dec} == {64, 128}
    for ranges in (False, True):  # 128-row tiles of BLOCK_N and 128-row column ranges
        assert any(c["BLOCK_M"] == 128 and bool(c.get("N_PROGS")) == ranges for c in mid_dec)
    for m in (64, 384):
        assert not any(s == "decode" and c["BLOCK_M"] == 128 for s, c in gemm_tune.candidates(m))
    # Column sub-tiles (NSUB 3) at 64 < M <= 1024 only.
    assert {c.get("NSUB", 1) for s, c in mid} == {1, 3}
    for m in (64, 2048):
        assert all(c.get("NSUB", 1) == 1 for s, c in gemm_tune.candidates(m))
    for sched, cfg in gemm_tune.ALL_CANDIDATES:
        assert set(cfg) <= set(schedule.SCHEDULE_KEYS[sched])
        assert cfg["BLOCK_K"] % contract.CHUNK_K == 0


def _write(tmp_path, monkeypatch, table):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(schedule.TABLE_ENV, str(path))
    from rlk.kernels.gemm import launch

    launch.clear_plan_cache()
    return path


def test_default_rule_applies_to_untuned_shapes_only(tmp_path, monkeypatch):
    import torch

    from rlk.kernels.gemm import launch

    table = json.loads(open(schedule.table_path()).read())
    table["default_buckets"] = [[8, "decode", {"BLOCK_M": 64, "BLOCK_N": 16}],
                                [None, "prefill", {"BLOCK_M": 64, "BLOCK_N": 64, "PERSISTENT": 1}]]
    _write(tmp_path, monkeypatch, table)
    dev = torch.device("cpu")
    p = launch.plan(3, 640, 96, dev)  # no entry: the rule
    assert (p["schedule"], p["BLOCK_M"], p["BLOCK_N"]) == ("decode", 64, 16)
    p = launch.plan(9, 640, 96, dev)
    assert (p["schedule"], p["BLOCK_M"], p["BLOCK_N"], p["PERSISTENT"]) == ("prefill", 64, 64, 1)
    assert launch.plan(3, 4096, 6144, dev)["schedule"] == table["shapes"]["4096x6144"]["buckets"][0][1]
    launch.clear_plan_cache()


@pytest.mark.parametrize("bks,match", [
    ([[8, "decode", {"SPLIT_K": 2}], [None, "prefill", None]], "non-schedule fields"),
    ([[8, "decode", None], [4, "prefill", None], [None, "prefill", None]], "ascend"),
    ([[None, "decode", None], [8, "prefill", None]], "open bucket"),
    ([[8, "decode", None]], "must end with an open"),
    ([[8, "decode", "x"], [None, "prefill", None]], "fields must be"),
])
def test_bad_buckets_are_refused(tmp_path, monkeypatch, bks, match):
    table = json.loads(open(schedule.table_path()).read())
    table["default_buckets"] = bks
    path = _write(tmp_path, monkeypatch, table)
    with pytest.raises(UnsupportedConfigError, match=match):
        schedule.load_table()
    schedule._load_table_file.cache_clear()
    # The same list as a shape entry's buckets is refused the same way.
    table.pop("default_buckets")
    table["shapes"]["4096x6144"]["buckets"] = bks
    path.write_text(json.dumps(table))
    with pytest.raises(UnsupportedConfigError, match=match):
        schedule._load_table_file(str(path))
    schedule._load_table_file.cache_clear()


def _tiny_tuner(monkeypatch):
    """The tuner shrunk to interpreter-sized shapes, three M and two candidates."""
    monkeypatch.setattr(gemm_tune, "QWEN3_8B_GEMMS", {"a": (128, 96), "b": (256, 40)})
    monkeypatch.setattr(gemm_tune, "QWEN3_OTHER_GEMMS", {"t1_x": (192, 48), "h1_x": (128, 72)})
    monkeypatch.setattr(gemm_tune, "QWEN3_RULE_TUNE_SIZES", ("t1",))
    monkeypatch.setattr(gemm_tune, "QWEN3_RULE_HOLDOUT_SIZES", ("h1",))
    monkeypatch.setattr(gemm_tune, "M_LIST", (1, 3, 8))
    monkeypatch.setattr(gemm_tune, "RULE_MAX_M", 3)
    cands = [("decode", {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}),
             ("prefill", {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4,
                          "num_stages": 2, "FLAT": 1, "PERSISTENT": 1, "TMA": 1})]
    monkeypatch.setattr(gemm_tune, "candidates", lambda m: cands)
    monkeypatch.setattr(gemm_tune, "ALL_CANDIDATES", cands)
    monkeypatch.setattr(gemm_tune, "REF", {**gemm_tune.REF, "BLOCK_M": 16, "BLOCK_N": 16})


def test_tuner_rejects_a_candidate_with_other_bytes(tmp_path, monkeypatch):
    """A schedule whose output differs by one ulp in one element is rejected, never chosen, and
    the run exits non-zero."""
    import torch

    from rlk.kernels.gemm import launch

    _tiny_tuner(monkeypatch)
    real = launch.gemm

    def broken(x, w, **kw):
        y = real(x, w, **kw)
        if kw.get("schedule") == "decode":
            y.view(torch.int16)[0, 0] += 1
        return y

    monkeypatch.setattr(launch, "gemm", broken)
    out = tmp_path / "tuned.json"
    assert gemm_tune.main(["--out", str(out), "--workers", "1", "--no-rule"]) == 1
    doc = json.loads(out.read_text())
    assert doc["tuning"]["byte_comparisons"]["rejected"] > 0
    for entry in doc["shapes"].values():
        assert all(b[1] == "prefill" for b in entry["buckets"])


def _fake_compile(job):
    """A compile job for test_parallel_compile_pins_a_dying_process_on_its_job: "die" ends its
    process as a compiler abort would, "bad" raises."""
    import os

    if job == "die":
        os._exit(7)
    if job == "exit0":
        os._exit(0)
    if job == "hang":  # a kernel launch that never returns (long enough for the limit to end it)
        import time

        time.sleep(60)
    return "ValueError: bad config" if job == "bad" else None


def test_parallel_compile_pins_a_dying_process_on_its_job():
    """A process that dies while compiling (an LLVM abort, not an exception) is reported on the
    job it had started, and the jobs after it in its share are still compiled by a new process."""
    jobs = ["ok", "die", "ok", "bad", "ok", "ok", "ok", "exit0", "ok"]
    out = gemm_compile._compile_parallel(jobs, 2, compile_one=_fake_compile)
    assert out == {0: None, 1: "the compiling process died (exit code 7)", 2: None,
                   3: "ValueError: bad config", 4: None, 5: None, 6: None,
                   7: "the compiling process died (exit code 0)", 8: None}


def test_parallel_compile_kills_a_job_that_hangs():
    """A job still running after the time limit (a compile or first launch that hangs) has its
    process killed and is reported; the rest of that process's share is compiled by a new one."""
    t0 = time.monotonic()
    out = gemm_compile._compile_parallel(["ok", "hang", "ok", "bad"], 1, compile_one=_fake_compile, job_timeout_s=3)
    assert out == {0: None, 1: "did not finish in 3 s (compile or first launch hung): its process was killed",
                   2: None, 3: "ValueError: bad config"}
    assert time.monotonic() - t0 < 50


def test_precompile_compiles_n_progs_decode_once_per_n(monkeypatch):
    """A kernel's code follows (K, split, fields), and for N_PROGS decode also N (its tile width
    and column range): those are compiled per N, the others once for every N."""
    seen = []
    monkeypatch.setattr(gemm_compile, "_compile_one", lambda job: seen.append(job[:2]) or None)
    plain = ("decode", {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2})
    ranges = ("decode", {"BLOCK_M": 16, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "N_PROGS": 3})
    gemm_tune.precompile([(128, n, *c) for n in (40, 96) for c in (plain, ranges)], workers=1)
    assert sorted(seen) == [(128, 40), (128, 40), (128, 96)]


def test_merge_buckets_keeps_the_table_when_nothing_was_tuned():
    base = [[8, "decode", None], [None, "prefill", None]]
    assert gemm_tune.merge_buckets([], base, 64) == base


def test_tuner_never_launches_a_candidate_that_did_not_compile(tmp_path, monkeypatch):
    """A candidate whose compile failed in the workers is recorded as such and never launched in
    the tuner's own process (a compiler abort there would end the run): here the decode one."""
    from rlk.kernels.gemm import launch

    _tiny_tuner(monkeypatch)
    real_compile, real_gemm = gemm_compile._compile_one, launch.gemm
    monkeypatch.setattr(gemm_compile, "_compile_one",
                        lambda job: "RuntimeError: PassManager::run failed" if job[2] == "decode" else real_compile(job))
    launched = []

    def spy(x, w, **kw):
        launched.append(kw.get("schedule"))
        return real_gemm(x, w, **kw)

    monkeypatch.setattr(launch, "gemm", spy)
    out = tmp_path / "tuned.json"
    assert gemm_tune.main(["--out", str(out), "--workers", "1", "--no-rule"]) == 0
    doc = json.loads(out.read_text())
    assert "decode" not in launched and "prefill" in launched
    assert len(doc["tuning"]["compile"]["errors"]) == 2  # one per shape (K differs)
    for s in doc["tuning"]["shapes"].values():
        for per in s["cands_us"].values():
            dec = [v for k, v in per.items() if k.startswith("decode")]
            assert dec == ["error: did not compile (tuning.compile.errors)"]
    for entry in doc["shapes"].values():
        assert all(b[1] == "prefill" for b in entry["buckets"])


def test_tuner_end_to_end_smoke(tmp_path, monkeypatch):
    """The whole tuner (compile, per-shape buckets, default rule, holdout) on interpreter-sized
    shapes: it writes a table that schedule.py accepts and whose plans every M can launch."""
    import torch

    from rlk.kernels.gemm import gemm, launch

    _tiny_tuner(monkeypatch)

    out = tmp_path / "tuned.json"
    assert gemm_tune.main(["--out", str(out), "--workers", "1"]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["shapes"]) == {"128x96", "256x40"}
    assert doc["tuning"]["byte_comparisons"]["compared"] > 0 and doc["tuning"]["byte_comparisons"]["rejected"] == 0
    assert doc["default_buckets"][-1] == [None, "prefill", None]
    assert [r["shape"] for r in doc["tuning"]["rule"]["holdout_ratio_vs_cublas"]] == ["h1_x"]
    monkeypatch.setenv(schedule.TABLE_ENV, str(out))
    launch.clear_plan_cache()
    g = torch.Generator().manual_seed(0)
    for K, N in ((128, 96), (192, 48)):
        w = torch.randn(N, K, generator=g).to(torch.bfloat16)
        x = torch.randn(9, K, generator=g).to(torch.bfloat16)
        ref = gemm(x, w, out_dtype=torch.float32, schedule="prefill", config={"BLOCK_M": 16, "BLOCK_N": 16})
        for m in (1, 3, 9):
            assert torch.equal(gemm(x[:m], w, out_dtype=torch.float32), ref[:m])
    launch.clear_plan_cache()


def test_ring_size_covers_the_l2_and_refuses_nonsense():
    MiB = 1 << 20
    assert gemm_tune.ring_size(32 * MiB, 50 * MiB) == 7  # 4 x 50 MiB over 32 MiB copies
    assert gemm_tune.ring_size(400 * MiB, 50 * MiB) == 2  # never fewer than two
    assert gemm_tune.ring_size(10, 0) == 2  # the CPU: no L2 reported
    for n in (1, 7, 33, 1000):
        c = gemm_tune.ring_size(n * MiB, 50 * MiB)
        assert c * n >= gemm_tune.COLD_FACTOR * 50 and c >= 2
    for args in ((0, 1), (1, -1), (1, 1, 0)):
        with pytest.raises(ValueError):
            gemm_tune.ring_size(*args)


def test_weight_ring_rotates_over_equal_copies():
    import torch

    w = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    ring = gemm_tune.WeightRing(w, 3)
    got = [ring.next() for _ in range(7)]
    ptrs = [t.data_ptr() for t in got]
    assert len(set(ptrs[:3])) == 3 and ptrs[3:6] == ptrs[:3] and ptrs[6] == ptrs[0]
    assert all(torch.equal(t, w) for t in got) and got[0] is w
    assert ring.nbytes == 3 * w.numel() * 2
    with pytest.raises(ValueError):
        gemm_tune.WeightRing(w, 0)


@pytest.mark.parametrize("weights", ["warm", "cold"])
def test_cold_tuning_reads_a_new_weight_copy_in_every_timed_call(tmp_path, monkeypatch, weights):
    """With --weights cold the candidates and cuBLAS are timed on the ring's copies (several weight
    tensors per shape); warm timing uses the one weight. Byte checks are unaffected."""
    import torch

    from rlk.kernels.gemm import launch

    _tiny_tuner(monkeypatch)
    seen = {"gemm": set(), "cublas": set()}
    real_gemm, real_mm = launch.gemm, torch.matmul

    def gemm(x, w, **kw):
        seen["gemm"].add(w.data_ptr())
        return real_gemm(x, w, **kw)

    def matmul(a, b):
        seen["cublas"].add(b.data_ptr())
        return real_mm(a, b)

    monkeypatch.setattr(launch, "gemm", gemm)
    monkeypatch.setattr(gemm_tune.torch, "matmul", matmul)
    # An "L2" as large as shape a's weight: a ring of 4 copies (more than the 2 tensors the compile
    # job and the byte check use, so a ring left unused cannot pass).
    monkeypatch.setattr(gemm_tune, "l2_bytes", lambda: 96 * 128 * 2)
    out = tmp_path / "tuned.json"
    assert gemm_tune.main(["--out", str(out), "--workers", "1", "--no-rule", "--shapes", "a",
                           "--weights", weights]) == 0
    doc = json.loads(out.read_text())
    assert doc["tuning"]["weights"] == weights and weights in doc["status"]
    assert doc["tuning"]["byte_comparisons"]["rejected"] == 0
    if weights == "cold":
        copies = doc["tuning"]["ring_copies"]["a"]
        assert copies == 4 and doc["tuning"]["l2_bytes"] == 96 * 128 * 2
        # On the CPU each M's cuBLAS time is one call: three M, three different copies.
        assert len(seen["cublas"]) == 3
        # Six timed candidate calls go round the whole ring (+ the compile job's zero weight).
        assert len(seen["gemm"]) >= copies
    else:
        assert doc["tuning"]["ring_copies"] == {}
        assert len(seen["cublas"]) == 1


def test_v2_tuning_runs_every_candidate_under_v2_and_cannot_be_installed(tmp_path, monkeypatch):
    """--contract gemm.bf16.v2: candidates (the wide split tiles included), reference and byte
    checks all run under v2, the entry restates v2's split (2 segments at K = 1088, where v1 has
    one), and --install refuses the output."""
    from rlk.kernels.gemm import launch

    _tiny_tuner(monkeypatch)
    monkeypatch.setattr(gemm_tune, "QWEN3_8B_GEMMS", {"a": (1088, 40)})
    assert contract.split_k(1088, 40, contract.CONTRACT_ID_V2) == 2 != contract.split_k(1088, 40)
    seen = []
    real = launch.gemm

    def gemm(x, w, **kw):
        seen.append((kw.get("contract"), (kw.get("config") or {}).get("BLOCK_N")))
        return real(x, w, **kw)

    monkeypatch.setattr(launch, "gemm", gemm)
    out = tmp_path / "tuned_v2.json"
    assert gemm_tune.main(["--out", str(out), "--workers", "1", "--contract", "gemm.bf16.v2", "--max-m", "3"]) == 0
    doc = json.loads(out.read_text())
    assert doc["tuning"]["contract"] == contract.CONTRACT_ID_V2 and doc["tuning"]["m_list"] == [1, 3]
    assert doc["shapes"]["1088x40"]["split_k"] == 2
    assert {c for c, _ in seen} == {contract.CONTRACT_ID_V2}
    assert {bn for _, bn in seen} >= {t[0] for t in gemm_tune.SPLIT_DECODE_TILES}
    assert "rule" not in doc["tuning"] and doc["tuning"]["byte_comparisons"]["rejected"] == 0
    with pytest.raises(SystemExit, match="tuned for gemm.bf16.v2"):
        gemm_tune.install(str(out), str(tmp_path / "t.json"), str(tmp_path / "r.json"))
    assert not (tmp_path / "t.json").exists()


def test_max_m_below_every_m_is_refused(tmp_path, capsys, monkeypatch):
    _tiny_tuner(monkeypatch)
    assert gemm_tune.main(["--out", str(tmp_path / "x.json"), "--max-m", "0"]) == 2
    assert "no M of" in capsys.readouterr().err


def test_tables_and_tuner_candidates_stay_within_the_contract_schedule_fields():
    """Every free-field value a checked-in table or a tuner candidate uses is one the contract
    lists as allowed (with its evidence): a table cannot launch what the contract never vouched for."""
    allowed = {k: set(v) for k, v in contract.CONTRACT.schedule_fields.items() if isinstance(v, (list, tuple))}
    used = []
    for arch in ("sm_90", "gfx942"):
        t = json.loads(open(schedule.table_path(arch)).read())
        used += [(f"{arch} default {k}", c) for k, c in t["default"].items()]
        used += [(f"{arch} default_buckets", b[2]) for b in t.get("default_buckets", []) if b[2]]
        for shape, e in t["shapes"].items():
            used += [(f"{arch} {shape} {k}", e[k]) for k in contract.SCHEDULES if k in e]
            used += [(f"{arch} {shape} bucket {b[0]}", b[2]) for b in e.get("buckets", []) if b[2]]
    cands = gemm_tune.ALL_CANDIDATES + [c for m in gemm_tune.M_LIST for c in gemm_tune.split_candidates(m)]
    used += [(f"tuner {gemm_tune._key(c)}", c[1]) for c in cands]
    bad = [f"{where}: {k}={v}" for where, cfg in used for k, v in cfg.items() if k in allowed and v not in allowed[k]]
    assert not bad, bad[:10]


def test_a_partial_tune_is_merged_into_the_table_below_its_largest_m(tmp_path, monkeypatch):
    """--install of a --max-m / --shapes run: the tuned shapes take its buckets up to its largest
    M (its open bucket closed there) and keep the table's above; other shapes and the default rule
    stay; the table names both records and still loads. A whole run replaces the table."""
    monkeypatch.setattr(gemm_tune, "M_LIST", (1, 3, 8, 64))
    monkeypatch.setattr(gemm_tune, "QWEN3_8B_GEMMS", {"a": (128, 96), "b": (256, 40)})
    dec = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}
    pre = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
    base = json.loads(open(schedule.table_path()).read())
    base["shapes"] = {
        "128x96": {"split_k": contract.split_rule(128, 96),
                   "buckets": [[2, "decode", dec], [8, "decode", {**dec, "BLOCK_M": 64}], [None, "prefill", pre]]},
        "256x40": {"split_k": contract.split_rule(256, 40), "buckets": [[None, "prefill", pre]]}}
    base["tuning_record"] = "old.json"
    table = tmp_path / "sm90.json"
    table.write_text(json.dumps(base))
    new_dec = {**dec, "BLOCK_K": 128, "num_stages": 4}
    tuned = {"status": "tuned", "shapes": {"128x96": {"split_k": contract.split_rule(128, 96),
                                                      "buckets": [[1, "decode", new_dec], [None, "decode", dec]]}},
             "tuning": {"contract": contract.CONTRACT_ID, "m_list": [1, 3]}}
    tuned_path = tmp_path / "tuned.json"
    tuned_path.write_text(json.dumps(tuned))
    gemm_tune.install(str(tuned_path), str(table), str(tmp_path / "new.json"))
    got = json.loads(table.read_text())
    assert got["shapes"]["128x96"]["buckets"] == [[1, "decode", new_dec], [3, "decode", dec],
                                                  [8, "decode", {**dec, "BLOCK_M": 64}], [None, "prefill", pre]]
    assert got["shapes"]["256x40"] == base["shapes"]["256x40"]
    assert got["default_buckets"] == base["default_buckets"]
    assert got["tuning_record"] == "new.json" and got["tuning_base"]["record"] == "old.json"
    assert (tmp_path / "new.json").read_bytes() == tuned_path.read_bytes()
    schedule._load_table_file(str(table))  # validates the merged buckets
    # Every shape but no default rule (a --max-m run): still merged.
    tuned["shapes"]["256x40"] = {"split_k": contract.split_rule(256, 40), "buckets": [[None, "decode", dec]]}
    tuned_path.write_text(json.dumps(tuned))
    gemm_tune.install(str(tuned_path), str(table), str(tmp_path / "newer.json"))
    got = json.loads(table.read_text())
    assert got["shapes"]["256x40"]["buckets"] == [[3, "decode", dec], [None, "prefill", pre]]
    assert got["tuning_base"]["record"] == "new.json" and got["tuning_base"]["base"]["record"] == "old.json"
    # A run over every M whose budget skipped a shape: merged (the skipped shape kept).
    before = got["shapes"]["256x40"]
    skipped = {**tuned, "shapes": {"128x96": tuned["shapes"]["128x96"]},
               "tuning": {**tuned["tuning"], "m_list": [1, 3, 8, 64], "rule": {}}}
    tuned_path.write_text(json.dumps(skipped))
    with pytest.raises(SystemExit, match="keeps buckets measured in old.json"):
        gemm_tune.install(str(tuned_path), str(table), str(tmp_path / "old.json"))
    gemm_tune.install(str(tuned_path), str(table), str(tmp_path / "newest.json"))
    got = json.loads(table.read_text())
    assert got["shapes"]["256x40"] == before and "tuning_base" in got
    # A whole run (every shape and the rule, which only a run over every M fits) replaces the table.
    tuned["tuning"].update(m_list=[1, 3, 8, 64], rule={})
    tuned_path.write_text(json.dumps(tuned))
    gemm_tune.install(str(tuned_path), str(table), str(tmp_path / "new.json"))
    got = json.loads(table.read_text())
    assert got["shapes"]["128x96"]["buckets"] == tuned["shapes"]["128x96"]["buckets"]
    assert "tuning_base" not in got


def test_tuner_skips_column_ranges_wider_than_any_listed_tile(tmp_path, monkeypatch):
    """An N_PROGS candidate whose column ranges at some N would need a tile wider than the
    contract lists is neither compiled nor timed at that N (it is at an N where it fits), and the
    default rule, which serves every N, never takes an N_PROGS candidate."""
    from rlk.kernels.gemm import launch

    _tiny_tuner(monkeypatch)
    ranges = ("decode", {"BLOCK_M": 16, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "N_PROGS": 1})
    cands = [*gemm_tune.candidates(1), ranges]
    monkeypatch.setattr(gemm_tune, "candidates", lambda m: cands)
    monkeypatch.setattr(gemm_tune, "ALL_CANDIDATES", cands)
    # One program over N: N=40 fits a 64-wide tile, N=96 would need 128.
    monkeypatch.setattr(launch, "WIDEST_TILE", 64)
    compiled = []
    real_compile = gemm_compile._compile_one
    monkeypatch.setattr(gemm_compile, "_compile_one", lambda job: compiled.append(job[:4]) or real_compile(job))
    out = tmp_path / "tuned.json"
    assert gemm_tune.main(["--out", str(out), "--workers", "1"]) == 0
    doc = json.loads(out.read_text())
    key = gemm_tune._key(ranges)
    per_shape = {s: {k for per in v["cands_us"].values() for k in per} for s, v in doc["tuning"]["shapes"].items()}
    assert key in per_shape["b"] and key not in per_shape["a"]
    assert not [j for j in compiled if j[1] == 96 and j[3].get("N_PROGS")]
    assert all(not (b[2] or {}).get("N_PROGS") for b in doc["default_buckets"])


@pytest.mark.parametrize("N,n_progs,fits", [(37984, 132, False), (37984, 149, True), (24576, 132, True),
                                             (4096, 1, False), (256, 1, True)])
def test_plan_refuses_column_ranges_wider_than_the_widest_tile(N, n_progs, fits):
    """N_PROGS decode puts cdiv(N, N_PROGS) columns (rounded up to 8) in one power-of-two tile: a
    tile wider than the contract's widest (256; measured nowhere) is refused with the smallest
    program count that fits; range_fits (the tuner's filter) agrees with the plan."""
    import torch

    from rlk.errors import UnsupportedConfigError
    from rlk.kernels.gemm import launch

    assert launch.range_fits(N, "decode", {"N_PROGS": n_progs}) is fits
    if fits:
        p = launch.plan(16, 256, N, torch.device("cpu"), "decode", {"N_PROGS": n_progs})
        assert p["BLOCK_N"] <= 256 and p["COLS"] <= p["BLOCK_N"]
    else:
        with pytest.raises(UnsupportedConfigError, match=f"use N_PROGS >= {-(-N // 256)} or 0"):
            launch.plan(16, 256, N, torch.device("cpu"), "decode", {"N_PROGS": n_progs})


def test_default_rule_never_takes_column_ranges(tmp_path, monkeypatch):
    """An N_PROGS candidate that fits every tuned shape is timed there, but the default rule,
    which serves shapes nobody tuned (where the ranges may outgrow the widest tile), never lists it."""
    _tiny_tuner(monkeypatch)
    ranges = ("decode", {"BLOCK_M": 16, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "N_PROGS": 1})
    cands = [*gemm_tune.candidates(1), ranges]
    monkeypatch.setattr(gemm_tune, "candidates", lambda m: cands)
    monkeypatch.setattr(gemm_tune, "ALL_CANDIDATES", cands)
    out = tmp_path / "tuned.json"
    assert gemm_tune.main(["--out", str(out), "--workers", "1"]) == 0
    doc = json.loads(out.read_text())
    key = gemm_tune._key(ranges)
    assert all(key in {k for per in v["cands_us"].values() for k in per} for v in doc["tuning"]["shapes"].values())
    listed = {k for ks in doc["tuning"]["rule"]["candidates"].values() for k in ks}
    assert listed and key not in listed, listed
