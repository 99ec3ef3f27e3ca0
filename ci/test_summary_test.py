"""Tests of ci/test_summary.py: counts from a synthetic build-event file and JUnit XMLs."""

import json
import os

import test_summary

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="a" name="t1"/><testcase classname="a" name="t2"/>
<testcase classname="a" name="t3"><failure message="boom"/></testcase>
<testcase classname="a" name="t4"><skipped message="no gpu"/></testcase>
<testcase classname="a" name="t5"><error message="setup"/></testcase>
</testsuite></testsuites>"""


def _result(label, status, xml=None, attempt=1):
    outs = [{"name": "test.log", "uri": "file:///nonexistent/test.log"}]
    if xml:
        outs.append({"name": "test.xml", "uri": "file://" + xml})
    return {"id": {"testResult": {"label": label, "run": 1, "shard": 1, "attempt": attempt}},
            "testResult": {"status": status, "testActionOutput": outs}}


def _bep(tmp_path, events):
    p = tmp_path / "bep.json"
    p.write_text("\n".join(json.dumps(e) for e in events) + "\n")
    return str(p)


def test_counts_cases_from_junit(tmp_path, capsys):
    xml = tmp_path / "a.xml"
    xml.write_text(XML)
    bep = _bep(tmp_path, [_result("//a:t", "FAILED", str(xml)),
                          {"id": {"testSummary": {"label": "//a:t"}}, "testSummary": {"overallStatus": "FAILED"}}])
    total = test_summary.summarize(bep)
    assert (total.passed, total.failed, total.skipped) == (2, 2, 1)
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "2 passed, 2 failed, 1 skipped"
    assert "FAILED target: //a:t" in out


def test_target_without_xml_counts_once(tmp_path):
    bep = _bep(tmp_path, [_result("//a:ok", "PASSED"), _result("//a:bad", "TIMEOUT")])
    total = test_summary.summarize(bep, out=open(os.devnull, "w"))
    assert (total.passed, total.failed) == (1, 1)


def test_failed_target_with_clean_xml_adds_failure(tmp_path):
    xml = tmp_path / "ok.xml"
    xml.write_text('<testsuites><testsuite><testcase name="x"/></testsuite></testsuites>')
    bep = _bep(tmp_path, [_result("//a:crash", "FAILED", str(xml))])
    total = test_summary.summarize(bep, out=open(os.devnull, "w"))
    assert (total.passed, total.failed) == (1, 1)


def test_last_attempt_wins(tmp_path):
    bep = _bep(tmp_path, [_result("//a:t", "FAILED", attempt=1), _result("//a:t", "PASSED", attempt=2)])
    total = test_summary.summarize(bep, out=open(os.devnull, "w"))
    assert (total.passed, total.failed) == (1, 0)


def test_summary_only_target_counts_by_status(tmp_path):
    bep = _bep(tmp_path, [{"id": {"testSummary": {"label": "//a:nb"}}, "testSummary": {"overallStatus": "FAILED_TO_BUILD"}}])
    total = test_summary.summarize(bep, out=open(os.devnull, "w"))
    assert (total.passed, total.failed) == (0, 1)


def test_main_exit_code(tmp_path, capsys):
    bep = _bep(tmp_path, [_result("//a:ok", "PASSED")])
    assert test_summary.main([bep]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 passed, 0 failed"
    assert test_summary.main([str(tmp_path / "missing.json")]) == 1


def test_deselected_cases_and_targets_that_ran_no_case_are_shown(tmp_path, capsys):
    import pytest_runner

    a, b = tmp_path / "a.xml", tmp_path / "b.xml"
    a.write_text(XML)
    b.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest">'
                 '<testcase classname="g" name="t"><skipped message="gpu"/></testcase></testsuite></testsuites>')
    assert pytest_runner.record_deselected(str(a), 3) and pytest_runner.record_deselected(str(b), 4)
    assert not pytest_runner.record_deselected(str(tmp_path / "missing.xml"), 1)
    bep = _bep(tmp_path, [_result("//a:t", "PASSED", str(a)), _result("//b:gpu_only", "PASSED", str(b))])
    total = test_summary.summarize(bep)
    assert total.deselected == 7 and total.skipped == 2
    out = capsys.readouterr().out.splitlines()
    assert "ran no case: //b:gpu_only" in out and "ran no case: //a:t" not in out
    assert "2 test targets, 0 failing, 1 that ran no case" in out
    assert "7 cases deselected (marked for another variant, e.g. GPU): not run here" in out
    assert out[-1].startswith("2 passed, 2 failed")
