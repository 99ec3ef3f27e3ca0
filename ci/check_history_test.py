"""Tests of ci/check_history.py: each kind of history marker fails on a synthetic file, a clean
file passes, and the real tree passes (so the test suite enforces the rule)."""

import os
import textwrap

import pytest

import check_history

# Built from parts so that this file itself holds no marker.
DATE = "20" + "26-12-01"
# The checkout (under Bazel this file is a runfiles symlink into it; the runfiles hold only the
# declared deps).
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

CLEAN_PY = '''\
"""Fixed-order sum (contract ar.v1): rank order 0..N-1, fp32, one rounding.

Evidence: collectives_test.py::test_all_reduce_fixed_order and docs/results/gemm_h200.json.
"""

# 16 rather than 8: the merge is faster at every T (docs/results/e2e_h200_{date}_40d2b14.md).
X = 16  # ordered fold, #pragma-free
Y = "#{{i}}"
'''.format(date=DATE)


def _write(root, rel, text):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(textwrap.dedent(text))
    return p


def test_clean_file_passes(tmp_path):
    _write(str(tmp_path), "python/rlk/clean.py", CLEAN_PY)
    _write(str(tmp_path), "ci/clean.sh", "# bisects one test (docs/results/h200_run/README.md)\necho ok\n")
    assert check_history.check_tree(str(tmp_path)) == []


@pytest.mark.parametrize("text,kind", [
    (f"# On by default since {DATE}: measured on the H200.\nX = 1\n", "date"),
    (f'def f():\n    """Written {DATE}; not run yet."""\n', "date"),
    (f'EVIDENCE = ("sweep@sm_90 {DATE}: 96 configs identical")\n', "date"),
    ("# Fixes the empty grid (issue #13).\nX = 1\n", "issue number"),
    ('"""Megatron adapters and audits (issue 11)."""\n', "issue number"),
    ("X = 1  # see #42\n", "issue number"),
    ("# Measured in session 8 on the H200.\nX = 1\n", "session number"),
    ("# the default since the third session\nX = 1\n", "session number"),
    ("# run3 showed the fold is faster\nX = 1\n", "run number"),
    ('EVIDENCE = "fused_test on the H200 (run by the lead)"\n', "author"),
])
def test_each_marker_fails_in_python(tmp_path, text, kind):
    _write(str(tmp_path), "kernels/rlk/kernels/op/config.py", text)
    hits = check_history.check_tree(str(tmp_path))
    assert len(hits) == 1 and f": {kind} " in hits[0], hits
    assert hits[0].startswith("kernels/rlk/kernels/op/config.py:"), hits


def test_shell_and_starlark_lines_are_checked(tmp_path):
    _write(str(tmp_path), "ci/diag.sh", f"# bisects the {DATE} capture failure\necho\n")
    _write(str(tmp_path), "python/rlk/BUILD.bazel", "# session 9: added\n")
    hits = check_history.check_tree(str(tmp_path))
    assert [h.split(":")[0] for h in hits] == ["python/rlk/BUILD.bazel", "ci/diag.sh"], hits


def test_code_and_other_folders_are_not_checked(tmp_path):
    # Not a comment or string literal: an identifier; docs/results and files outside the source
    # roots and ci/ hold history by design.
    _write(str(tmp_path), "python/rlk/ok.py", "def session9():\n    return 1\n")
    _write(str(tmp_path), "docs/results/x/README.md", f"{DATE}: session 9\n")
    _write(str(tmp_path), "docs/results/x/probe.py", f"# {DATE}\n")
    _write(str(tmp_path), "notes.py", f"# {DATE}\n")
    assert check_history.check_tree(str(tmp_path)) == []


def test_cited_results_path_may_hold_a_date_but_the_text_may_not():
    assert check_history.hits_in_text(f"(docs/results/h200_{DATE}_session8/README.md)") == []
    assert check_history.hits_in_text(f"e2e_h200_{DATE}_40d2b14.json took 110 s") == []
    assert [k for k, _ in check_history.hits_in_text(f"{DATE}: docs/results/a.json")] == ["date"]


def test_main_exit_status(tmp_path, capsys):
    _write(str(tmp_path), "ci/a.py", f"# {DATE}\n")
    assert check_history.main(["--root", str(tmp_path)]) == 1
    assert "ci/a.py:1: date" in capsys.readouterr().out
    os.remove(os.path.join(str(tmp_path), "ci/a.py"))
    assert check_history.main(["--root", str(tmp_path)]) == 0


def test_real_tree_has_no_history_markers():
    """The checkout's own sources (the rule this file exists for)."""
    assert os.path.exists(os.path.join(ROOT, "MODULE.bazel")), f"{ROOT} is not the checkout"
    hits = check_history.check_tree(ROOT)
    assert hits == [], "history in code (say what is and why; history goes to git log):\n" + "\n".join(hits)
