"""``merge_reports``: one report of arms run in separate processes; refused when they are not the
same experiment (another setting, model, device or toolchain, or a route twice)."""

import json
import os

import pytest

from rlk.errors import UnsupportedConfigError
from rlk.rl import loop, report
from rlk.rl.merge import merge_reports

PROV = {"device": {"name": "NVIDIA H200"}, "toolchain": {"torch": "2.11.0", "vllm": "0.26.0"}, "fingerprint": "f"}


def _step(i: int, route: str, not_one: int) -> dict:
    digest = f"{i:064x}"
    return {"step": i, "route": route, "tokens": 8, "ratio_not_one": not_one, "logp_mismatch": not_one,
            "reward_mean": 0.5, "reward_min": 0.4, "reward_max": 0.6, "entropy_mean": 1.0, "loss": 0.0,
            "abs_dev": {"max": 0.1 * bool(not_one), "p99": 0.0, "p50": 0.0},
            "sync": {"match": True, "sha256_trainer": digest, "sha256_rollout": digest},
            "seconds": {"step": 1.0}}


def _report(tmp_path, route: str, not_one: int = 0, steps: int = 2, prov=None, **cfg) -> str:
    lc = loop.LoopConfig(route=route, steps=steps, **cfg)
    arm = {"route": route, "config": lc.to_dict(), "model": {"layers": 2, "setup_seconds": 3.0 if route == "strict" else 4.0},
           "engine": {"name": "vLLM + rlk" if route == "strict" else "stock vLLM"},
           "steps": [_step(i + 1, route, not_one) for i in range(steps)]}
    path = tmp_path / f"{route}_{not_one}_{steps}.json"
    path.write_text(json.dumps({"arms": {route: arm}, "routes": [route], "provenance": prov or PROV}))
    return str(path)


def test_merge_keeps_both_arms_and_each_source_provenance(tmp_path):
    a = _report(tmp_path, "strict")
    b = _report(tmp_path, "native", not_one=5)
    rep = merge_reports([b, a], str(tmp_path / "out"), tag="merged")
    assert rep["routes"] == ["strict", "native"] and rep["passed"] and rep["failures"] == []
    assert [s["routes"] for s in rep["provenance"]["merged_from"]] == [["native"], ["strict"]]
    on_disk = json.load(open(rep["files"]["json"]))
    assert on_disk["arms"]["native"]["steps"][0]["ratio_not_one"] == 5
    assert rep["files"]["json"].endswith("rl_loop_merged.json")
    assert report.arm_names(rep["arms"], "engine") == "strict: vLLM + rlk; native: stock vLLM"
    del rep["arms"]["strict"]["engine"]  # a record written before arms named their engine
    assert report.arm_names(rep["arms"], "engine") == "strict: engine not recorded; native: stock vLLM"


def test_merge_recomputes_the_strict_verdict(tmp_path):
    rep = merge_reports([_report(tmp_path, "strict", not_one=1), _report(tmp_path, "native")],
                             str(tmp_path / "out"))
    assert not rep["passed"] and any("ratio_not_one 1" in f for f in rep["failures"])


def _odd(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


CASES = {
    "same_route": (lambda t: _report(t, "strict", steps=2, not_one=1), "more than one report"),
    "other_lr": (lambda t: _report(t, "native", lr=1e-3), "differ in config"),
    "other_steps": (lambda t: _report(t, "native", steps=3), "differ in config"),
    "other_device": (lambda t: _report(t, "native", prov=dict(PROV, device={"name": "NVIDIA H100"})),
                     "another device .*name differ"),
    "other_driver": (lambda t: _report(t, "native", prov=dict(PROV, toolchain={"torch": "2.11.0", "vllm": "0.27.0"})),
                     "another toolchain .*vllm differ"),
    "no_provenance": (lambda t: _report(t, "native", prov={"error": "no record"}), "no device or toolchain"),
    "unknown_route": (lambda t: _odd(t, "odd.json", {"arms": {"greedy": {"config": {}, "steps": []}},
                                                      "provenance": PROV}), "unknown route 'greedy'"),
    "not_a_report": (lambda t: _odd(t, "list.json", [1, 2]), "holds no arms"),
    "one_report": (lambda t: None, "at least two"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_merge_refuses_what_is_not_one_experiment(tmp_path, case):
    a = _report(tmp_path, "strict")
    make, message = CASES[case]
    b = make(tmp_path)
    with pytest.raises(UnsupportedConfigError, match=f"merge: .*{message}"):
        merge_reports([p for p in (a, b) if p], str(tmp_path / "out"))


def test_merge_refuses_to_overwrite_a_source(tmp_path):
    a = _report(tmp_path, "strict")
    b = _report(tmp_path, "native")
    os.rename(b, tmp_path / "rl_loop_x.json")
    with pytest.raises(UnsupportedConfigError, match="would overwrite its source"):
        merge_reports([a, str(tmp_path / "rl_loop_x.json")], str(tmp_path), tag="x")
    assert json.loads((tmp_path / "rl_loop_x.json").read_text())["routes"] == ["native"]  # untouched
