"""Fault injection on gloo: a missing rank, a wrong contract ID, a stale generation, a
different call. Every case must raise a typed error naming the rank within a bounded time."""

from rlk.collectives.harness import run_world

SC = "rlk.collectives.scenarios:"


def _results(rs):
    for r in rs:
        assert r["ok"], f"rank {r['rank']}: {r.get('error_type')}: {r.get('error')}\n{r.get('traceback', r.get('log', ''))}"
    return [r["result"] for r in rs]


def test_missing_rank_times_out_naming_it():
    res = _results(run_world(SC + "missing_rank", 2, {"sleep_s": 5.0, "diag_timeout_s": 2.0}, pg_timeout_s=2.0))
    assert res[1] == {"skipped": True}
    assert res[0]["raised"] == "RankTimeoutError", res[0]
    assert "rank(s) [1] did not arrive" in res[0]["message"], res[0]["message"]
    assert res[0]["after_s"] < 6.0, res[0]  # 2 s transport timeout + 2 s diagnosis (+ slack)


def test_contract_mismatch_names_rank():
    res = _results(run_world(SC + "contract_mismatch", 2))
    assert all(r["raised"] == "ContractMismatchError" for r in res), res
    assert "rank(s) [1]" in res[0]["message"] and "rank(s) [0]" in res[1]["message"]


def test_stale_generation_names_rank():
    res = _results(run_world(SC + "stale_generation", 2))
    assert all(r["raised"] == "StaleGenerationError" for r in res), res
    assert "rank 1 at 2" in res[0]["message"] and "rank 0 at 1" in res[0]["message"], res[0]["message"]


def test_different_calls_are_named():
    res = _results(run_world(SC + "op_mismatch", 2))
    assert all(r["raised"] == "CollectiveError" for r in res), res
    assert "rank 1: all_reduce(16 x bfloat16" in res[0]["message"]
