"""sm90_step on the CPU: arms, the alternating timing loop, the bytes check and the summaries
(tiny shapes through the Triton interpreter; the table arms' route needs an sm_90 GPU)."""
import json
import os

import pytest
import torch

from rlk.kernels.gemm import sm90, sm90_step

DIMS = {"a": (64, 32), "b": (32, 48)}


def test_arms_are_cublas_triton_then_each_table(tmp_path):
    t1, t2 = tmp_path / "before.json", tmp_path / "now.json"
    t1.write_text("{}")
    t2.write_text("{}")
    arms = sm90_step.parse_arms(f"{t1},{t2}")
    assert [a for a, _ in arms] == ["cublas", "triton", "table:before", "table:now"]
    assert sm90_step.arm_env("table:now", str(t2)) == {sm90.MODE_ENV: "require", sm90.TABLE_ENV: str(t2)}
    assert sm90_step.arm_env("triton", None) == {sm90.MODE_ENV: "off"}
    with pytest.raises(SystemExit, match="two tables"):
        sm90_step.parse_arms(f"{t1},{t1}")
    with pytest.raises(SystemExit, match="no table"):
        sm90_step.parse_arms(str(tmp_path / "missing.json"))


def test_summaries_are_medians_and_ratios_of_them():
    s = sm90_step.summarize({"cublas": [2.0, 9.0, 2.2], "triton": [3.0, 3.0, 3.3], "table:x": [1.0, 2.1, 2.0]})
    assert s["cublas"]["ms"] == 2.2 and s["table:x"]["ms"] == 2.0
    assert s["table:x"]["vs_cublas"] == pytest.approx(2.0 / 2.2) and s["table:x"]["vs_triton"] == pytest.approx(2.0 / 3.0)
    rows = [{"arms": s}, {"arms": sm90_step.summarize({"cublas": [1.0], "triton": [1.0], "table:x": [2.0]})}]
    t = sm90_step.totals(rows, ["cublas", "table:x"])
    assert t["table:x"]["sum_ms"] == pytest.approx(4.0) and t["table:x"]["sum_vs_cublas"] == pytest.approx(4.0 / 3.2)
    assert t["table:x"]["geomean_vs_cublas"] == pytest.approx(((2.0 / 2.2) * 2.0) ** 0.5)
    assert t["cublas"]["geomean_vs_cublas"] == pytest.approx(1.0)


def test_step_times_every_arm_and_counts_bytes_that_differ_from_the_triton_kernels(monkeypatch):
    arms = [("cublas", None), ("triton", None), ("table:same", None), ("table:off_by_one", None)]
    env = {"table:same": {sm90.MODE_ENV: "off"}, "table:off_by_one": {"RLK_TEST_PERTURB": "1"}}
    monkeypatch.setattr(sm90_step, "arm_env", lambda arm, table: env.get(arm, {sm90.MODE_ENV: "off"}))
    real = sm90_step.gemm

    def gemm(x, w):  # an arm whose kernel is one bf16 ulp off at one element
        y = real(x, w)
        if os.environ.get("RLK_TEST_PERTURB"):
            y.view(torch.int16)[0, 0] += 1
        return y

    monkeypatch.setattr(sm90_step, "gemm", gemm)
    doc = sm90_step.step([1, 3], arms, layers=2, shapes=("a", "b"), rounds=2, dims=DIMS)
    assert [r["M"] for r in doc["rows"]] == [1, 3]
    for r in doc["rows"]:
        assert set(r["arms"]) == {a for a, _ in arms} and all(len(v["rounds_ms"]) == 2 for v in r["arms"].values())
        assert r["differing"] == {"triton": 0, "table:same": 0, "table:off_by_one": 2}  # one per shape
        assert r["routes"]["triton"] == {"a": None, "b": None}  # the route's picks are recorded per arm
        assert r["cublas_max_abs_diff"] < 0.1
    assert doc["differing_total"] == 4 and set(doc["totals"]) == {a for a, _ in arms}
    json.dumps(doc)


def test_the_command_refuses_unknown_shapes_and_empty_batches(tmp_path):
    with pytest.raises(SystemExit, match="unknown shapes"):
        sm90_step.main(["--out", str(tmp_path / "o.json"), "--shapes", "qkv,lm_head"])
    with pytest.raises(SystemExit, match="M, layers"):
        sm90_step.main(["--out", str(tmp_path / "o.json"), "--m", "0,8"])


@pytest.mark.gpu
@pytest.mark.skipif(not sm90.usable_here(), reason="needs an sm_90 GPU and the built library")
def test_the_checked_in_table_gives_the_triton_kernels_bytes_in_a_captured_step():
    arms = [("cublas", None), ("triton", None), ("table:checked_in", str(sm90.TABLE))]
    doc = sm90_step.step([1, 77, 200, 256], arms, layers=2, rounds=1)
    assert doc["differing_total"] == 0 and all("table:checked_in" in r["differing"] for r in doc["rows"])
    # the table arm did route to CUTLASS (qkv at M 77-256 has entries), the Triton arm never did
    assert any(r["routes"]["table:checked_in"]["qkv"] for r in doc["rows"])
    assert not any(v for r in doc["rows"] for v in r["routes"]["triton"].values())


def test_padded_arms_run_each_table_over_rows_padded_in_advance_and_compare_the_first_m(monkeypatch):
    """``pad_m``: each table arm again as ``+pad<n>``, its GEMMs over inputs of M rounded up to n rows
    (zeros past M), only the first M output rows compared with the Triton kernels'; an arm whose
    kept rows change with the padding counts as differing."""
    arms = [("cublas", None), ("triton", None), ("table:t", None)]
    monkeypatch.setattr(sm90_step, "arm_env", lambda arm, table: {sm90.MODE_ENV: "off"})
    real, rows_seen = sm90_step.gemm, []

    def gemm(x, w):
        rows_seen.append(x.shape[0])
        return real(x, w)

    monkeypatch.setattr(sm90_step, "gemm", gemm)
    monkeypatch.setattr(sm90, "route", lambda x, w, M, K, N, split: f"picked at M={M}")
    doc = sm90_step.step([3, 8], arms, layers=1, shapes=("a", "b"), rounds=1, dims=DIMS, pad_m=8)
    assert doc["pad_m"] == 8 and list(doc["arms"]) == ["cublas", "triton", "table:t", "table:t+pad8"]
    for r in doc["rows"]:
        assert r["differing"]["table:t+pad8"] == 0 and set(r["arms"]) == set(doc["arms"])
    at3 = doc["rows"][0]["routes"]  # the padded arm's route picks at the padded M
    assert at3["table:t"]["a"] == "picked at M=3" and at3["table:t+pad8"]["a"] == "picked at M=8"
    assert 8 in rows_seen and 3 in rows_seen  # M 3 ran unpadded and padded to 8

    def drifting(x, w):  # a kernel whose rows depend on how many rows it is given
        y = real(x, w)
        if x.shape[0] % 8 == 0:
            y.view(torch.int16)[0, 0] += 1
        return y

    monkeypatch.setattr(sm90_step, "gemm", drifting)
    doc = sm90_step.step([3], arms, layers=1, shapes=("a", "b"), rounds=1, dims=DIMS, pad_m=8)
    assert doc["rows"][0]["differing"] == {"triton": 0, "table:t": 0, "table:t+pad8": 2}
    assert sm90_step.padded_arms(arms, 0) == arms
    with pytest.raises(ValueError, match="pad_m"):
        sm90_step.step([3], arms, layers=1, shapes=("a", "b"), rounds=1, dims=DIMS, pad_m=-8)
    with pytest.raises(SystemExit, match="share a name"):  # a table whose stem looks like a padded arm
        sm90_step.step([3], arms + [("table:t+pad8", None)], layers=1, shapes=("a",), rounds=1, dims=DIMS, pad_m=8)
    monkeypatch.setattr(sm90_step, "step", lambda *a, **k: pytest.fail("stepped with a bad --pad-m"))
    with pytest.raises(SystemExit, match="--pad-m 12"):
        sm90_step.main(["--out", "/tmp/unused.json", "--pad-m", "12"])
