"""The release gate: runs the ladder levels registered by the code, for one profile.

    ./ci/bazel run //ci:release_gate                       # cpu profile (the main job)
    python -m rlk.gate.release_gate --profile h200 --out out/gate_h200
    python -m rlk.gate.release_gate --profile h200 --merge out/g1,out/g2 --out out/gate_h200

``--merge`` joins partial runs (``--levels``) made on the same stack, e.g. when the levels of one
profile do not fit one 10-minute device call together: their provenance records must agree (all
but time stamps), no check may appear twice, and the joined rows must cover every required level.

Every level the profile requires must have at least one registered check that ran and passed;
a required level with no check is reported MISSING and fails the gate. The gate never reports
success for a level that did not run. Reports: ``<out>/release_gate.md`` and
``<out>/release_gate.json`` (with the provenance record).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_enum("profile", "cpu", ["cpu", "h200", "mi300x-8"], "Hardware profile to qualify.")
flags.DEFINE_string("out", None, "Report folder (default: <workspace>/out/release_gate_<profile>).")
flags.DEFINE_list("levels", None, "Run only these levels (a partial run never passes the gate).")
flags.DEFINE_list("merge", None, "Join the reports of these partial runs (folders) instead of running checks.")


def _default_out(profile: str) -> str:
    base = os.environ.get("BUILD_WORKSPACE_DIRECTORY") or os.getcwd()
    return os.path.join(base, "out", f"release_gate_{profile}")


def _prepare_env(profile: str) -> None:
    from rlk import determinism

    determinism.apply_strict_env()
    if profile == "cpu":
        import torch

        if not torch.cuda.is_available():
            determinism.configure_cpu_interpreter()


def run_gate(profile: str, out_dir: str, levels=None, progress=print) -> dict:
    """Runs the gate and writes the reports; returns the JSON report (``passed`` inside)."""
    _prepare_env(profile)
    from rlk import provenance
    from rlk.gate import registry

    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for mod in registry.CHECK_MODULES:
        try:
            importlib.import_module(mod)
        except Exception as e:
            rows.append({"level": "L0", "check": f"import {mod}", "result": "FAIL", "seconds": 0.0,
                         "detail": f"{type(e).__name__}: {e}", "metrics": {}})
    checks = registry.checks_for(profile)
    if levels:
        checks = [c for c in checks if c.level in levels]
    ctx = registry.GateContext(profile=profile, out_dir=out_dir, progress=progress)
    for i, c in enumerate(checks, 1):
        progress(f"[{i}/{len(checks)}] {c.level} {c.name} ...")
        t0 = time.perf_counter()
        try:
            res = c.fn(ctx)
            result = "PASS" if res.passed else "FAIL"
            detail, metrics = res.detail, res.metrics
        except Exception as e:
            result, detail, metrics = "FAIL", f"{type(e).__name__}: {e}", {"traceback": traceback.format_exc()[-2000:]}
        dt = time.perf_counter() - t0
        progress(f"[{i}/{len(checks)}] {c.level} {c.name}: {result} ({dt:.1f} s) {detail[:160]}")
        rows.append({"level": c.level, "check": c.name, "result": result, "seconds": round(dt, 2),
                     "detail": detail, "metrics": metrics})
    required = registry.REQUIRED_LEVELS[profile]
    if levels:
        required = tuple(l for l in required if l in levels)
    for lvl in required:
        if not any(r["level"] == lvl and r["result"] in ("PASS", "FAIL") and not r["check"].startswith("import ")
                   for r in rows):
            rows.append({"level": lvl, "check": "(no check registered)", "result": "MISSING", "seconds": 0.0,
                         "detail": f"level {lvl} is required by profile {profile} but nothing implements it",
                         "metrics": {}})
    rows.sort(key=lambda r: (r["level"], r["check"]))
    passed = bool(rows) and all(r["result"] == "PASS" for r in rows) and not levels
    report = {
        "profile": profile,
        "passed": passed,
        "partial": bool(levels),
        "levels_run": sorted(levels) if levels else None,
        "counts": {k: sum(r["result"] == k for r in rows) for k in ("PASS", "FAIL", "MISSING")},
        "rows": rows,
        "levels_not_run": dict(registry.NOT_RUN.get(profile, {})),
        "provenance": provenance.capability_record(route="strict", extra={"gate_profile": profile}),
    }
    with open(os.path.join(out_dir, "release_gate.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    with open(os.path.join(out_dir, "release_gate.md"), "w") as f:
        f.write(render_markdown(report))
    return report


def merge_reports(dirs: list[str], out_dir: str) -> dict:
    """One report from partial runs of the same profile on the same stack (module docstring).

    Raises ``UnsupportedConfigError`` when the runs' profiles or provenance records differ or a
    check ran in two of them. The joined report passes only when every required level has a
    check and every row passed; its provenance is the first run's, ``merged_from`` names the runs.
    """
    from rlk import provenance
    from rlk.errors import UnsupportedConfigError
    from rlk.gate import registry

    if len(dirs) < 2:
        raise UnsupportedConfigError(f"--merge needs two or more report folders, got {dirs}")
    reps = []
    for d in dirs:
        with open(os.path.join(d, "release_gate.json")) as f:
            reps.append(json.load(f))
    profiles = sorted({r["profile"] for r in reps})
    if len(profiles) != 1:
        raise UnsupportedConfigError(f"--merge: the runs qualify different profiles {profiles}")
    profile = profiles[0]
    for d, r in zip(dirs[1:], reps[1:]):
        diff = provenance.differences(reps[0]["provenance"], r["provenance"])
        if diff:
            raise UnsupportedConfigError(f"--merge: {d} ran on another stack than {dirs[0]}: {diff}")
    rows, seen = [], {}
    for d, r in zip(dirs, reps):
        for row in r["rows"]:
            if row["result"] == "MISSING":
                continue  # a partial run's missing levels are judged again below, over all runs
            key = (row["level"], row["check"])
            if key in seen:
                raise UnsupportedConfigError(f"--merge: {key[0]} {key[1]} ran in both {seen[key]} and {d}")
            seen[key] = d
            rows.append(dict(row, run=d))
    for lvl in registry.REQUIRED_LEVELS[profile]:
        if not any(r["level"] == lvl and not r["check"].startswith("import ") for r in rows):
            rows.append({"level": lvl, "check": "(no check ran)", "result": "MISSING", "seconds": 0.0,
                         "detail": f"level {lvl} is required by profile {profile}; none of the joined runs ran it",
                         "metrics": {}})
    rows.sort(key=lambda r: (r["level"], r["check"]))
    report = {
        "profile": profile,
        "passed": all(r["result"] == "PASS" for r in rows),
        "partial": False,
        "merged_from": list(dirs),
        "counts": {k: sum(r["result"] == k for r in rows) for k in ("PASS", "FAIL", "MISSING")},
        "rows": rows,
        "levels_not_run": dict(registry.NOT_RUN.get(profile, {})),
        "provenance": reps[0]["provenance"],
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "release_gate.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    with open(os.path.join(out_dir, "release_gate.md"), "w") as f:
        f.write(render_markdown(report))
    return report


def render_markdown(report: dict) -> str:
    prov = report["provenance"]
    lines = [
        f"# rlk release gate — profile `{report['profile']}`: {'PASSED' if report['passed'] else 'FAILED'}",
        "",
        f"Device: {prov['device'].get('name')} ({prov['device'].get('kind')}); torch {prov['toolchain']['torch']}, "
        f"triton {prov['toolchain']['triton']}; image {prov['image'].get('tag') or '(none)'}; "
        f"fingerprint `{prov['fingerprint'][:16]}`.",
        "",
    ]
    if report.get("partial"):
        lines += [f"Partial run (levels {', '.join(report.get('levels_run') or ['?'])} only): a partial run never "
                  "passes the gate, whatever its rows say. Join the partial runs of one stack with "
                  "`python -m rlk.gate.release_gate --profile P --merge DIR1,DIR2 --out DIR`.", ""]
    if report.get("merged_from"):
        lines += [f"Joined from the partial runs {', '.join(report['merged_from'])} (same provenance).", ""]
    lines += [
        "| level | check | result | time (s) | detail |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in report["rows"]:
        detail = r["detail"].replace("|", "\\|").replace("\n", " ")  # whole: a report never cuts a detail
        lines.append(f"| {r['level']} | {r['check']} | {r['result']} | {r['seconds']:.1f} | {detail} |")
    c = report["counts"]
    lines += ["", f"{c['PASS']} passed, {c['FAIL']} failed, {c['MISSING']} missing.", ""]
    not_run = report.get("levels_not_run") or {}
    if not_run:
        lines += [f"Levels this profile does not run ({', '.join(sorted(not_run))}):", ""]
        lines += [f"- {lvl}: {why}" for lvl, why in sorted(not_run.items())] + [""]
    return "\n".join(lines)


def _print_table(report: dict) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"rlk release gate ({report['profile']})")
        for col in ("level", "check", "result", "time (s)", "detail"):
            t.add_column(col, overflow="fold")
        for r in report["rows"]:
            t.add_row(r["level"], r["check"], r["result"], f"{r['seconds']:.1f}", r["detail"])  # folded, not cut
        Console(width=160).print(t)
    except ImportError:  # rich is pinned; plain text if it is absent anyway
        for r in report["rows"]:
            print(f"{r['level']:3} {r['check']:40} {r['result']:8} {r['seconds']:7.1f}  {r['detail']}")
    for lvl, why in sorted((report.get("levels_not_run") or {}).items()):
        print(f"not run by profile {report['profile']}: {lvl}: {why}")


def main(argv) -> int:
    del argv
    out = FLAGS.out or _default_out(FLAGS.profile)
    if FLAGS.merge:
        if FLAGS.levels:
            raise app.UsageError("--merge joins finished runs: do not combine it with --levels")
        report = merge_reports(FLAGS.merge, out)
    else:
        report = run_gate(FLAGS.profile, out, levels=FLAGS.levels)
    _print_table(report)
    c = report["counts"]
    not_run = ", ".join(sorted(report.get("levels_not_run") or {}))
    print(f"gate {'PASSED' if report['passed'] else 'FAILED'}: {c['PASS']} passed, {c['FAIL']} failed, "
          f"{c['MISSING']} missing{f'; levels not run by this profile: {not_run}' if not_run else ''}"
          f"{'; a partial run (--levels) never passes' if report.get('partial') else ''}; "
          f"reports in {out}")
    return 0 if report["passed"] else 1


def run() -> None:
    app.run(main)


if __name__ == "__main__":
    run()
