import json
import os

import pytest

from rlk.gate import registry, release_gate


@pytest.fixture
def fake_checks(monkeypatch):
    monkeypatch.setattr(registry, "_CHECKS", {})
    monkeypatch.setattr(registry, "CHECK_MODULES", [])
    monkeypatch.setattr(registry, "REQUIRED_LEVELS", {"cpu": ("L0", "L1"), "h200": ("L0",), "mi300x-8": ("L0",)})
    return registry


def _run(tmp_path, **kw):
    return release_gate.run_gate("cpu", str(tmp_path), progress=lambda s: None, **kw)


def test_all_required_levels_passing_passes(fake_checks, tmp_path):
    fake_checks.register_check("L0", "a")(lambda ctx: registry.CheckResult(True, "ok", {"n": 1}))
    fake_checks.register_check("L1", "b")(lambda ctx: registry.CheckResult(True, "ok"))
    rep = _run(tmp_path)
    assert rep["passed"] and rep["counts"] == {"PASS": 2, "FAIL": 0, "MISSING": 0}
    on_disk = json.load(open(os.path.join(tmp_path, "release_gate.json")))
    assert on_disk["passed"] and on_disk["provenance"]["fingerprint"]
    md = open(os.path.join(tmp_path, "release_gate.md")).read()
    assert "| L0 | a | PASS |" in md and "2 passed, 0 failed, 0 missing." in md


def test_missing_level_fails_the_gate(fake_checks, tmp_path):
    fake_checks.register_check("L0", "a")(lambda ctx: registry.CheckResult(True))
    rep = _run(tmp_path)
    assert not rep["passed"]
    assert [r["result"] for r in rep["rows"] if r["level"] == "L1"] == ["MISSING"]


def test_failing_and_raising_checks_fail(fake_checks, tmp_path):
    fake_checks.register_check("L0", "a")(lambda ctx: registry.CheckResult(False, "mismatch_count=3"))

    def boom(ctx):
        raise RuntimeError("kernel exploded")

    fake_checks.register_check("L1", "b")(boom)
    rep = _run(tmp_path)
    res = {r["check"]: r for r in rep["rows"]}
    assert res["a"]["result"] == "FAIL" and res["b"]["result"] == "FAIL"
    assert "kernel exploded" in res["b"]["detail"] and not rep["passed"]


def test_import_failure_of_a_check_module_fails(fake_checks, tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "CHECK_MODULES", ["rlk.no_such_module_for_test"])
    fake_checks.register_check("L0", "a")(lambda ctx: registry.CheckResult(True))
    fake_checks.register_check("L1", "b")(lambda ctx: registry.CheckResult(True))
    rep = _run(tmp_path)
    assert not rep["passed"]
    assert any(r["check"].startswith("import rlk.no_such") and r["result"] == "FAIL" for r in rep["rows"])


def test_partial_run_never_passes(fake_checks, tmp_path):
    fake_checks.register_check("L0", "a")(lambda ctx: registry.CheckResult(True))
    rep = _run(tmp_path, levels=["L0"])
    assert rep["partial"] and not rep["passed"] and rep["levels_run"] == ["L0"]
    md = release_gate.render_markdown(rep)
    assert "FAILED" in md and "Partial run (levels L0 only)" in md  # why a run of passing rows failed
    assert "Partial run" not in release_gate.render_markdown(dict(rep, partial=False))


def test_checks_are_filtered_by_profile(fake_checks):
    fake_checks.register_check("L0", "gpu-only", profiles=("h200",))(lambda ctx: registry.CheckResult(True))
    assert registry.checks_for("cpu") == []
    assert [c.name for c in registry.checks_for("h200")] == ["gpu-only"]
    with pytest.raises(ValueError):
        registry.register_check("L9", "x")


def test_report_keeps_whole_details_and_names_the_levels_not_run(fake_checks, tmp_path, capsys):
    long = "CUDA graphs not exercised (no GPU: padded decode buckets ran eagerly); " + "x" * 300 + " END"
    fake_checks.register_check("L0", "a")(lambda ctx: registry.CheckResult(True, long))
    fake_checks.register_check("L1", "b")(lambda ctx: registry.CheckResult(True, "ok"))
    rep = _run(tmp_path)
    assert rep["levels_not_run"] == registry.NOT_RUN["cpu"] and set(rep["levels_not_run"]) == {"L6"}
    md = open(os.path.join(tmp_path, "release_gate.md")).read()
    assert long in md
    assert "Levels this profile does not run (L6):" in md and registry.NOT_RUN["cpu"]["L6"] in md
    release_gate._print_table(rep)
    out = capsys.readouterr().out
    assert "END" in out and "not run by profile cpu: L6" in out


def test_every_level_is_required_or_named_as_not_run():
    for profile in registry.PROFILES:
        required, not_run = set(registry.REQUIRED_LEVELS[profile]), set(registry.NOT_RUN[profile])
        assert not required & not_run and required | not_run == set(registry.LEVELS), profile
        assert all(registry.NOT_RUN[profile].values())


def _partial(fake_checks, tmp_path, name, levels):
    out = tmp_path / name
    rep = release_gate.run_gate("cpu", str(out), progress=lambda s: None, levels=levels)
    assert rep["partial"] and not rep["passed"]
    return str(out)


def test_merged_partial_runs_pass_only_when_together_they_cover_every_level(fake_checks, tmp_path):
    fake_checks.register_check("L0", "a")(lambda ctx: registry.CheckResult(True, "ok"))
    fake_checks.register_check("L1", "b")(lambda ctx: registry.CheckResult(True, "ok"))
    d0, d1 = _partial(fake_checks, tmp_path, "r0", ["L0"]), _partial(fake_checks, tmp_path, "r1", ["L1"])
    rep = release_gate.merge_reports([d0, d1], str(tmp_path / "joined"))
    assert rep["passed"] and not rep["partial"] and rep["counts"] == {"PASS": 2, "FAIL": 0, "MISSING": 0}
    assert "Joined from the partial runs" in open(tmp_path / "joined" / "release_gate.md").read()
    # The same check in two runs is refused (which result would count?).
    d0b = _partial(fake_checks, tmp_path, "r0b", ["L0"])
    with pytest.raises(Exception, match="ran in both"):
        release_gate.merge_reports([d0, d0b], str(tmp_path / "twice"))
    fake_checks.register_check("L1", "c")(lambda ctx: registry.CheckResult(False, "mismatch"))
    d1f = _partial(fake_checks, tmp_path, "r1f", ["L1"])
    bad = release_gate.merge_reports([d0, d1f], str(tmp_path / "failing"))
    assert not bad["passed"] and bad["counts"]["FAIL"] == 1


def test_merge_refuses_runs_on_another_stack_and_reports_uncovered_levels(fake_checks, tmp_path, monkeypatch):
    fake_checks.register_check("L0", "a")(lambda ctx: registry.CheckResult(True, "ok"))
    fake_checks.register_check("L1", "b")(lambda ctx: registry.CheckResult(True, "ok"))
    d0, d1 = _partial(fake_checks, tmp_path, "r0", ["L0"]), _partial(fake_checks, tmp_path, "r1", ["L1"])
    p = os.path.join(d1, "release_gate.json")
    rep = json.load(open(p))
    rep["provenance"]["toolchain"]["triton"] = "9.9.9"
    json.dump(rep, open(p, "w"))
    with pytest.raises(Exception, match="another stack"):
        release_gate.merge_reports([d0, d1], str(tmp_path / "joined"))
    # Two runs of L0 (other checks) cover no L1: the joined report has L1 MISSING and fails.
    monkeypatch.setattr(registry, "_CHECKS", {})
    fake_checks.register_check("L0", "a2")(lambda ctx: registry.CheckResult(True, "ok"))
    d0b = _partial(fake_checks, tmp_path, "r0b", ["L0"])
    joined = release_gate.merge_reports([d0, d0b], str(tmp_path / "j2"))
    assert not joined["passed"] and [r["result"] for r in joined["rows"] if r["level"] == "L1"] == ["MISSING"]
