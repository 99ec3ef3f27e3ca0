"""Counts pytest tests behind a `bazel test` run and prints `N passed, N failed`.

    python3 ci/test_summary.py BEP_JSON

BEP_JSON is Bazel's build-event file (`--build_event_json_file`) of that one invocation, so
only the test targets of that run count (stale logs under .bazel/testlogs do not). For each
target's last attempt, the JUnit XML that ci/pytest_runner.py had pytest write is read:
every test case counts as passed, failed (failure or error) or skipped. A target that failed
without a usable XML (crash, timeout, failed build) counts as one failure; one that failed
although its XML shows no failing case (a crash after the last test) adds one failure too.
A target that passed without XML (not a pytest target) counts as one pass.

Output: one line per failing target and per target that ran no case (all its cases skipped or
deselected: it passed without testing anything here), the number of cases the variant's marker
deselected (ci/pytest_runner.py records it in the XML), then the closing line
`N passed, N failed, N skipped` (`N targets` details before it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import urllib.parse
import xml.etree.ElementTree as ET

PASSED_STATUSES = {"PASSED", "FLAKY"}


@dataclasses.dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    deselected: int = 0  # cases the variant's marker deselected (GPU cases on a CPU run): not run

    def add(self, other: "Counts") -> None:
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped
        self.deselected += other.deselected

    @property
    def ran(self) -> int:
        return self.passed + self.failed


def _uri_path(uri: str) -> str | None:
    if not uri.startswith("file://"):
        return None
    return urllib.parse.unquote(urllib.parse.urlparse(uri).path)


def count_junit(path: str) -> Counts | None:
    """Test-case counts of one JUnit XML file (None when missing or unreadable)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    c = Counts()
    for prop in root.iter("property"):
        if prop.get("name") == "rlk_deselected":
            c.deselected += int(prop.get("value") or 0)
    for case in root.iter("testcase"):
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            c.failed += 1
        elif "skipped" in tags:
            c.skipped += 1
        else:
            c.passed += 1
    return c


def read_bep(path: str) -> dict[str, dict]:
    """label -> {"status", "xml", "log"} of each test target's last attempt (summed shards)."""
    results: dict[tuple[str, int, int], dict] = {}
    summaries: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            ev = json.loads(line)
            eid = ev.get("id", {})
            if "testResult" in eid and "testResult" in ev:
                tid = eid["testResult"]
                key = (tid["label"], tid.get("run", 1), tid.get("shard", 1))
                attempt = tid.get("attempt", 1)
                prev = results.get(key)
                if prev is not None and prev["attempt"] > attempt:
                    continue
                outs = {o.get("name"): _uri_path(o.get("uri", "")) for o in ev["testResult"].get("testActionOutput", [])}
                results[key] = {"attempt": attempt, "status": ev["testResult"].get("status", "NO_STATUS"),
                                "xml": outs.get("test.xml"), "log": outs.get("test.log")}
            elif "testSummary" in eid and "testSummary" in ev:
                summaries[eid["testSummary"]["label"]] = ev["testSummary"].get("overallStatus", "NO_STATUS")
    targets: dict[str, dict] = {}
    for (label, _run, _shard), r in sorted(results.items()):
        targets.setdefault(label, {"parts": []})["parts"].append(r)
    for label, status in summaries.items():
        targets.setdefault(label, {"parts": []})["summary"] = status
    return targets


def count_target(info: dict) -> tuple[Counts, bool]:
    """(counts, target_failed) for one test target."""
    total = Counts()
    failed_target = False
    parts = info.get("parts", [])
    if not parts:
        status = info.get("summary", "NO_STATUS")
        ok = status in PASSED_STATUSES
        return Counts(passed=int(ok), failed=int(not ok)), not ok
    for r in parts:
        ok = r["status"] in PASSED_STATUSES
        c = count_junit(r["xml"]) if r.get("xml") and os.path.exists(r["xml"]) else None
        if c is None:
            c = Counts(passed=int(ok), failed=int(not ok))
        elif not ok and c.failed == 0:
            c.failed += 1  # crashed or timed out after (or before) the cases it reported
        if not ok:
            failed_target = True
        total.add(c)
    return total, failed_target


def summarize(bep_path: str, out=None) -> Counts:
    out = sys.stdout if out is None else out
    targets = read_bep(bep_path)
    total = Counts()
    bad, empty = [], []
    for label, info in sorted(targets.items()):
        c, failed = count_target(info)
        total.add(c)
        if failed:
            bad.append(label)
        elif c.ran == 0:
            empty.append(label)
    for label in bad:
        print(f"FAILED target: {label}", file=out)
    for label in empty:
        print(f"ran no case: {label}", file=out)
    print(f"{len(targets)} test targets, {len(bad)} failing, {len(empty)} that ran no case", file=out)
    if total.deselected:
        print(f"{total.deselected} cases deselected (marked for another variant, e.g. GPU): not run here", file=out)
    line = f"{total.passed} passed, {total.failed} failed"
    if total.skipped:
        line += f", {total.skipped} skipped"
    print(line, file=out)
    return total


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    if not os.path.exists(argv[0]):
        print(f"test_summary: no build-event file {argv[0]}", file=sys.stderr)
        print("0 passed, 0 failed")
        return 1
    total = summarize(argv[0])
    return 1 if total.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
