"""Main of every `rlk_py_test` (rlk.bzl): runs pytest on the test's files, prints its summary.

    pytest_runner.py --rlk-variant=cpu|gpu FILE... [PYTEST_ARGS...]

cpu: `-m "not gpu"` under Triton's CPU interpreter (TRITON_INTERPRET=1, set here as well as in
the Bazel test env, before pytest imports conftest.py or any kernel module). gpu: `-m gpu`, no
interpreter. HOME and TRITON_CACHE_DIR default to the test's private $TEST_TMPDIR. pytest runs
with the workspace's pyproject.toml, rootdir = the runfiles workspace (so the root conftest.py
applies), `--import-mode=importlib` with namespace packages considered, so that a test module
under kernels/rlk/kernels/<op>/ is imported as `rlk.kernels.<op>.<mod>` (pytest's default
`prepend` mode would import it a second time as `kernels.<op>.<mod>`). JUnit XML goes to
$XML_OUTPUT_FILE, where Bazel (and ci/bazel's pass/fail count) reads it. Under Bazel the
editable install of rlk (`pip install -e .` in the same venv) is switched off, so that every
rlk module comes from the runfiles through declared deps.

Exit status is pytest's, except 5 (no test selected, e.g. a file whose tests are all GPU tests
in the cpu variant), which becomes 0 with a line saying so.
"""

from __future__ import annotations

import os
import sys

VARIANTS = {"cpu": "not gpu", "gpu": "gpu"}


def _workspace_dir() -> str:
    srcdir, ws = os.environ.get("TEST_SRCDIR"), os.environ.get("TEST_WORKSPACE")
    if srcdir and ws and os.path.isdir(os.path.join(srcdir, ws)):
        return os.path.join(srcdir, ws)
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _prepare_env(variant: str) -> None:
    tmp = os.environ.get("TEST_TMPDIR")
    if tmp:
        os.environ.setdefault("HOME", tmp)
        os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(tmp, "triton-cache"))
        os.environ.setdefault("MPLCONFIGDIR", os.path.join(tmp, "mpl"))
    if variant == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def drop_editable_install() -> int:
    """Removes setuptools' editable-install finder of rlk (from `pip install -e .`).

    Under Bazel every rlk module must come from the test's runfiles, through its declared deps;
    the editable finder would quietly serve a missing dep from the source tree. Returns how
    many hooks it removed.
    """
    def editable(obj) -> bool:
        return str(getattr(obj, "__module__", "")).startswith("__editable__")

    n = len(sys.meta_path) + len(sys.path_hooks) + len(sys.path)
    sys.meta_path[:] = [f for f in sys.meta_path if not editable(f)]
    sys.path_hooks[:] = [h for h in sys.path_hooks if not editable(h) and "__editable__" not in repr(h)]
    sys.path[:] = [p for p in sys.path if "__editable__" not in p]
    sys.path_importer_cache.clear()
    return n - len(sys.meta_path) - len(sys.path_hooks) - len(sys.path)


def build_args(argv: list[str], workspace: str) -> tuple[str, list[str]]:
    variant, rest = "cpu", []
    for a in argv:
        if a.startswith("--rlk-variant="):
            variant = a.split("=", 1)[1]
        else:
            rest.append(a)
    if variant not in VARIANTS:
        raise SystemExit(f"pytest_runner: unknown --rlk-variant={variant!r} (cpu or gpu)")
    args = rest + ["-m", VARIANTS[variant], "-p", "no:cacheprovider", "--rootdir", workspace,
                   "--import-mode=importlib", "-o", "consider_namespace_packages=true"]
    cfg = os.path.join(workspace, "pyproject.toml")
    if os.path.exists(cfg):
        args += ["-c", cfg]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args += ["--junitxml", xml]
    return variant, args


class _Deselected:
    """pytest plugin: counts the cases the variant's marker expression deselected."""

    def __init__(self):
        self.n = 0

    def pytest_deselected(self, items):
        self.n += len(items)


DESELECTED = "rlk_deselected"  # JUnit testsuite property read by ci/test_summary.py


def record_deselected(xml_path: str, n: int) -> bool:
    """Adds ``<property name="rlk_deselected" value="n"/>`` to the first testsuite of a JUnit file
    (pytest's XML has no record of deselected cases). False when the file is missing or unreadable."""
    import xml.etree.ElementTree as ET

    try:
        tree = ET.parse(xml_path)
    except (OSError, ET.ParseError):
        return False
    root = tree.getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return False
    props = suite.find("properties")
    if props is None:
        props = ET.Element("properties")
        suite.insert(0, props)
    ET.SubElement(props, "property", name=DESELECTED, value=str(int(n)))
    tree.write(xml_path, encoding="utf-8", xml_declaration=True)
    return True


STACK = ("torch", "triton", "pytest")


def missing_stack() -> str | None:
    """A message naming the fix when the interpreter Bazel picked lacks rlk's stack, else None.

    Bazel 4 runs tests with the first ``python3`` on PATH: after ``bash ci/bootstrap.sh`` that is
    the project's ``.venv`` only when ``ci/bazel`` (or an activated venv) put it first.
    """
    import importlib.util

    miss = [m for m in STACK if importlib.util.find_spec(m) is None]
    if not miss:
        return None
    return (f"pytest_runner: {sys.executable} has no {', '.join(miss)}: rlk's tests run in the project's .venv. "
            "Use ./ci/bazel test ... (it bootstraps and puts .venv/bin first on PATH), or run "
            "`bash ci/bootstrap.sh && . .venv/bin/activate` before plain `bazel-4 test ...`.")


def main(argv: list[str]) -> int:
    msg = missing_stack()
    if msg:
        print(msg, file=sys.stderr, flush=True)
        return 2
    workspace = _workspace_dir()
    variant, args = build_args(argv, workspace)
    _prepare_env(variant)
    if os.environ.get("TEST_SRCDIR"):
        drop_editable_install()
    os.chdir(workspace)
    sys.dont_write_bytecode = True  # runfiles are not ours to litter
    import pytest

    print(f"pytest_runner: variant={variant} workspace={workspace}", flush=True)
    counter = _Deselected()
    rc = int(pytest.main(args, plugins=[counter]))
    if counter.n:
        print(f"pytest_runner: {counter.n} cases deselected by -m {VARIANTS[variant]!r} (not run here)")
        xml = os.environ.get("XML_OUTPUT_FILE")
        if xml:
            record_deselected(xml, counter.n)
    if rc == int(pytest.ExitCode.NO_TESTS_COLLECTED):
        print(f"pytest_runner: no test selected by -m {VARIANTS[variant]!r} in {variant} variant: 0 run")
        return 0
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
