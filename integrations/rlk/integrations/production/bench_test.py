"""The production benchmark's command line without vLLM or a GPU: bad options are refused with
the option's name before any engine is imported; ``pairs`` runs both arms of each pair in its
recorded seeded order, skips complete pairs, stops on a failing arm and before a pair that would
pass ``--budget-s``; ``arm`` merges its two halves and passes a fail-closed exit status on (the
subprocesses are stubs here; train_test runs the real trainer)."""

import json
import os
import subprocess
import sys
import types

import pytest

from rlk.integrations.production import records
from rlk.integrations.production.bench import __main__ as B


@pytest.fixture()
def ckpt(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return str(d)


@pytest.mark.parametrize("argv, message", [
    (["pairs", "--results", "R", "--n", "0"], "--n must be >= 1"),
    (["pairs", "--results", "R", "--budget-s", "-1"], "--budget-s >= 0"),
    (["pairs", "--results", "R", "--profile-pairs", "1"], "--profile-pairs 1: needs --profile"),
    (["pairs", "--results", "R", "--profile", "--profile-pairs", "-1"], "--profile-pairs '-1': pair numbers"),
    (["pairs", "--results", "R", "--profile", "--profile-pairs", "a"], "--profile-pairs 'a': pair numbers"),
    (["arm", "--arm", "pp", "--out", "x.json", "--workload", "W9"], "--workload 'W9'"),
    (["arm", "--arm", "rr", "--out", "x.json", "--micro-tokens", "0"], "--micro-tokens must be >= 1"),
    (["arm", "--arm", "rr", "--out", "x.json", "--warmup", "-1"], "--warmup must be >= 0"),
    (["arm", "--arm", "rr", "--out", "x.json", "--order", "rr,rr"], "--order 'rr,rr'"),
    (["train", "--arm", "rr", "--rollout", "missing.json", "--out", "x.json"], "--rollout 'missing.json'"),
    (["rollout", "--arm", "pp", "--out", "x.json", "--workload", "W7"], "--workload 'W7'"),
])
def test_bad_options_are_refused_by_name(argv, message, ckpt):
    argv = argv[:1] + ["--dir", ckpt] + argv[1:]
    with pytest.raises(SystemExit, match=message.replace("(", r"\(")):
        B.main(argv)
    assert "vllm" not in sys.modules  # refused before any engine import


def test_missing_checkpoint_and_unknown_arm(tmp_path):
    with pytest.raises(SystemExit, match="holds no config.json"):
        B.main(["arm", "--arm", "pp", "--dir", str(tmp_path), "--out", "x.json"])
    with pytest.raises(SystemExit):  # argparse: invalid choice
        B.main(["arm", "--arm", "stock", "--dir", str(tmp_path), "--out", "x.json"])


def test_pair_order_is_seeded_and_not_constant():
    orders = [B.pair_order(0, i) for i in range(16)]
    assert orders == [B.pair_order(0, i) for i in range(16)]
    assert set(orders) == {("pp", "rr"), ("rr", "pp")} and all(sorted(o) == ["pp", "rr"] for o in orders)
    assert orders != [B.pair_order(1, i) for i in range(16)]


def _fake_arm_runner(calls, fail=None):
    """Stands in for ``bench arm`` subprocesses: records the call, writes the arm file."""
    def run(cmd, env=None):
        a = B.parser().parse_args(cmd[3:])
        calls.append((a.pair, a.arm, a.order, a.profile))
        if fail == (a.pair, a.arm):
            return types.SimpleNamespace(returncode=3)
        records.write_json(a.out, {"arm": a.arm, "pair": {"index": a.pair, "order": a.order.split(",")}})
        return types.SimpleNamespace(returncode=0)

    return run


def test_pairs_order_skip_and_stop(tmp_path, ckpt):
    R = str(tmp_path / "R")
    calls = []
    a = B.parser().parse_args(["pairs", "--dir", ckpt, "--results", R, "--n", "3", "--seed", "4"])
    assert B.run_pairs(a, run=_fake_arm_runner(calls)) == 0
    assert [c[0] for c in calls] == [0, 0, 1, 1, 2, 2]
    for i in range(3):
        order = B.pair_order(4, i)
        assert [c[1] for c in calls if c[0] == i] == list(order)
        assert all(c[2] == ",".join(order) for c in calls if c[0] == i)
    calls.clear()  # again, one more pair: the three complete pairs are skipped
    a = B.parser().parse_args(["pairs", "--dir", ckpt, "--results", R, "--n", "4", "--seed", "4"])
    assert B.run_pairs(a, run=_fake_arm_runner(calls)) == 0
    assert [c[0] for c in calls] == [3, 3]
    calls.clear()  # a failing arm stops the run with its exit status
    a = B.parser().parse_args(["pairs", "--dir", ckpt, "--results", R, "--start", "4", "--n", "2"])
    second = B.pair_order(0, 4)[1]
    assert B.run_pairs(a, run=_fake_arm_runner(calls, fail=(4, second))) == 3
    assert [c[0] for c in calls] == [4, 4]
    calls.clear()  # pair 4 has one arm file only: both of its arms run again
    assert B.run_pairs(a, run=_fake_arm_runner(calls)) == 0
    assert [c[0] for c in calls] == [4, 4, 5, 5]


def test_pairs_budget_stops_before_a_pair_that_would_not_fit(tmp_path, ckpt, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(B.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(B, "_T0", 0.0)
    calls = []
    inner = _fake_arm_runner(calls)

    def slow(cmd, env=None):
        clock[0] += 100.0  # each arm takes 100 s
        return inner(cmd, env)

    a = B.parser().parse_args(["pairs", "--dir", ckpt, "--results", str(tmp_path / "R"), "--n", "5",
                               "--budget-s", "450"])
    assert B.run_pairs(a, run=slow) == 0
    assert sorted({c[0] for c in calls}) == [0, 1]  # at 400 s a third 200 s pair would end at 600 > 450


def test_arm_merges_halves_and_passes_fail_closed_on(tmp_path, ckpt):
    out = str(tmp_path / "pair2_rr.json")
    roll = {"workload": "W1", "generate_s": 5.0, "engine_start_s": 70.0}
    train = {"phases": {"ref_logp": {"seconds": 2.0}, "actor_fwd_bwd": {"seconds": 6.5}}, "layers": 36,
             "sequences": 64, "response_tokens": 10, "packed_tokens": 30, "micro_batches": 1, "micro_tokens": 16384,
             "recompute": "full", "logp_mismatches": 0}
    cmds = []

    def run(cmd, env=None, rc_train=0):
        cmds.append(cmd[3])
        a = B.parser().parse_args(cmd[3:])
        records.write_json(a.out, roll if a.cmd == "rollout" else train)
        return types.SimpleNamespace(returncode=rc_train if a.cmd == "train" else 0)

    a = B.parser().parse_args(["arm", "--arm", "rr", "--dir", ckpt, "--out", out, "--pair", "2", "--order", "rr,pp"])
    assert B.run_arm(a, run=run) == 0 and cmds == ["rollout", "train"]
    rec = json.loads(open(out).read())
    assert rec["phases"] == {"rollout_generate": 5.0, "ref_logp": 2.0, "actor_fwd_bwd": 6.5}
    assert rec["total_s"] == 13.5 and rec["logp_mismatches"] == 0 and rec["pair"] == {"index": 2, "order": ["rr", "pp"]}
    out2 = str(tmp_path / "pair3_rr.json")
    a = B.parser().parse_args(["arm", "--arm", "rr", "--dir", ckpt, "--out", out2])
    assert B.run_arm(a, run=lambda c, env=None: run(c, env, rc_train=3)) == 3
    assert not (tmp_path / "pair3_rr.json").exists()  # no arm file: the pair is not counted


def test_module_runs_as_documented():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, "-m", "rlk.integrations.production.bench", "--help"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode == 0 and "pairs" in p.stdout and "report" in p.stdout


@pytest.mark.parametrize("extra, profiled", [([], []), (["--profile"], [0, 1, 2]),
                                             (["--profile", "--profile-pairs", "1"], [1]),
                                             (["--profile", "--profile-pairs", "0,2"], [0, 2]),
                                             (["--profile", "--profile-pairs", "7"], [])])
def test_profile_pairs_picks_the_profiled_pairs(tmp_path, ckpt, extra, profiled):
    calls = []
    a = B.parser().parse_args(["pairs", "--dir", ckpt, "--results", str(tmp_path / "R"), "--n", "3"] + extra)
    B.validate(a)
    assert B.run_pairs(a, run=_fake_arm_runner(calls)) == 0
    assert sorted({c[0] for c in calls if c[3]}) == profiled  # both arms of a profiled pair, no other
    assert all(c[3] == (c[0] in profiled) for c in calls)


def _with_provenance(R, pair, prov):
    """Pair ``pair``'s two arm files in R, each carrying a trainer provenance (a copy of ``prov``)."""
    for arm in records.ARMS:
        records.write_json(records.arm_path(R, pair, arm),
                           {"arm": arm, "pair": {"index": pair}, "train": {"provenance": json.loads(json.dumps(prov))}})


def test_pairs_refuse_a_new_pair_whose_tree_differs_from_the_earlier_pairs(tmp_path, ckpt, monkeypatch):
    """Before a new pair runs next to complete ones, this tree's capability records are compared
    with theirs (the report would refuse pairs of one arm with other fingerprints): a changed
    kernel source stops the run with status 4 and names the field; the same record lets it run."""
    R = str(tmp_path / "R")
    os.makedirs(R)
    prov = {"route": "strict", "device": {"name": "H200"}, "toolchain": {"driver": "580"},
            "kernel_sources": {"gemm/kernel.py": "aa"}, "tuning_tables": {}, "contracts": {},
            "compiled_kernels": {}, "environment": {}, "extra": {"layers": 36}, "created_at": "then"}
    _with_provenance(R, 0, prov)
    same = {arm: dict(prov, extra={"other": 1}, created_at="now") for arm in records.ARMS}
    changed = {arm: dict(prov, kernel_sources={"gemm/kernel.py": "bb"}) for arm in records.ARMS}
    calls = []
    a = B.parser().parse_args(["pairs", "--dir", ckpt, "--results", R, "--n", "2"])
    monkeypatch.setattr(B, "current_capability", lambda: changed)
    assert B.run_pairs(a, run=_fake_arm_runner(calls)) == B.PROVENANCE_RC
    assert calls == []
    assert records.provenance_conflicts(R, lambda: changed) == [
        "pp (pair0): kernel_sources.gemm/kernel.py", "rr (pair0): kernel_sources.gemm/kernel.py"]
    monkeypatch.setattr(B, "current_capability", lambda: same)  # run fields (extra, time) may differ
    assert B.run_pairs(a, run=_fake_arm_runner(calls)) == 0
    assert [c[0] for c in calls] == [1, 1]
    # Nothing left to run: no comparison is made (complete pairs are only skipped).
    monkeypatch.setattr(B, "current_capability", lambda: changed)
    assert B.run_pairs(a, run=_fake_arm_runner(calls)) == 0
