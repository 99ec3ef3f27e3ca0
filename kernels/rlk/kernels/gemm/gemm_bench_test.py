"""The benchmark's CPU paths: argument checks and ``--compare-contracts --dry-run`` (plans only)."""

from __future__ import annotations

import json

import pytest

from rlk.kernels.gemm import contract, gemm_bench


def test_compare_contracts_dry_run_writes_both_plans(tmp_path):
    out = tmp_path / "plans.json"
    assert gemm_bench.main(["--compare-contracts", "--dry-run", "--shapes", "down,tp4_qkv", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["contracts"]) == set(gemm_bench.CONTRACT_IDS) == {contract.CONTRACT_ID, contract.CONTRACT_ID_V2}
    assert [r["M"] for r in doc["rows"][:len(gemm_bench.COMPARE_M)]] == list(gemm_bench.COMPARE_M)
    for r in doc["rows"]:
        assert r["v1_plan"]["split_k"] == contract.split_rule(r["K"], r["N"])
        assert r["v2_plan"]["split_k"] == contract.segment_rule(r["K"])
    down = {r["v2_plan"]["split_k"] for r in doc["rows"] if r["shape"] == "down"}
    assert down == {12}


@pytest.mark.parametrize("argv,err", [
    (["--contract", "gemm.bf16.v3"], "unknown contract 'gemm.bf16.v3'"),
    (["--dry-run"], "go with --compare-contracts"),
    (["--compare-contracts", "--contract", "gemm.bf16.v2"], "no --backward or --contract"),
    (["--compare-contracts", "--dry-run", "--shapes", "nope"], "unknown shapes"),
    (["--timing", "cudagraph,hot"], "unknown timing 'cudagraph,hot'"),
    (["--timing", ""], "unknown timing ''"),
    (["--max-m", "0"], "--max-m (>= 1)"),
    (["--max-m", "512", "--backward"], "not with --backward"),
])
def test_bad_arguments_exit_2(argv, err, tmp_path, capsys):
    assert gemm_bench.main([*argv, "--out", str(tmp_path / "x.json")]) == 2
    assert err in capsys.readouterr().err


def test_eager_rows_alternate_the_arms_and_take_medians(monkeypatch):
    """Eager timing: EAGER_ROUNDS rounds, the arms in alternating order (a host slowdown hits both
    arms of a round, not one arm's whole measurement), each arm's median over its rounds;
    CUDA-graph timing: one measurement per arm, no rounds."""
    from rlk.kernels.gemm import gemm_bench

    calls = []
    slow = iter([False, False, True, True] + [False] * 20)  # the second round (both arms) under host jitter

    def fake_time(fn, eager, rep=100):
        calls.append((fn(), eager, rep))
        return (10.0 if calls[-1][0] == "s" else 8.0) * (3.0 if next(slow) else 1.0)

    monkeypatch.setattr(gemm_bench, "_time", fake_time)
    s, n, rounds = gemm_bench._time_pair(lambda: "s", lambda: "n", True, rep=100)
    assert [c[0] for c in calls] == ["s", "n", "n", "s", "s", "n", "n", "s", "s", "n"]
    assert all(c[1] is True and c[2] == 100 // gemm_bench.EAGER_ROUNDS for c in calls)
    assert rounds == {"strict_ms": [10.0, 30.0, 10.0, 10.0, 10.0], "native_ms": [8.0, 24.0, 8.0, 8.0, 8.0]}
    assert (s, n) == (10.0, 8.0)
    calls.clear()
    assert gemm_bench._time_pair(lambda: "s", lambda: "n", False, rep=50) == (10.0, 8.0, None)
    assert calls == [("s", False, 50), ("n", False, 50)]
