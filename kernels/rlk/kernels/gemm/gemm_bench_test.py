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
