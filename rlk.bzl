"""rlk's Bazel macros: the one place that wraps the Python rules.

    load("//:rlk.bzl", "rlk_py_library", "rlk_py_test")

    rlk_py_library(
        name = "gemm",
        srcs = glob(["*.py"], exclude = ["*_test.py", "*_bench.py"]),
        deps = ["//kernels/rlk/kernels:common"],
        data = glob(["configs/*.json"]),
    )

    rlk_py_test(
        name = "gemm_test",
        srcs = ["gemm_test.py", "gemm_invariance_test.py"],
        deps = [":gemm"],
        gpu = True,  # also makes gemm_test_gpu, tagged requires-gpu-nvidia
    )

One import root, `rlk`, is spread over four source roots (python/, kernels/, collectives/,
integrations/). Each macro puts the source root of its package on sys.path (`imports`), so an
import line is the same under Bazel and under `pip install -e .`.

Tests run pytest (ci/pytest_runner.py) on their `srcs`:
  * `<name>`: the CPU variant, `-m "not gpu"`, TRITON_INTERPRET=1 (Triton's CPU interpreter,
    set before any kernel module is imported), OMP_NUM_THREADS=1. `bazel test //...` runs it.
  * `<name>_gpu` (gpu = True): `-m gpu`, no interpreter, tagged `requires-gpu-nvidia`.
    .bazelrc filters that tag out of every `bazel test` unless `--config=gpu` is given.
The root conftest.py and pyproject.toml (pytest markers and options) are data of every test.

Works with Bazel 4.2.3 (WORKSPACE + third_party stand-ins, CI) and Bazel 7+/8 with bzlmod
(MODULE.bazel): under bzlmod, the packages of the hash-locked lock file come from pip.parse's
hub `@pypi`; under Bazel 4 from the `python3` first on PATH (the project's .venv).
"""

load("@rules_python//python:defs.bzl", "py_binary", "py_library", "py_test")

# Top-level folders that hold part of the `rlk` import root.
SOURCE_ROOTS = ["python", "kernels", "collectives", "integrations"]

# Bazel 7+ with bzlmod spells main-repository labels "@@//..."; Bazel 4 never does.
_BZLMOD = str(Label("//:rlk.bzl")).startswith("@@")

# Third-party packages rlk code imports (names of pip.parse's hub `@pypi`, bzlmod only).
DEFAULT_PIP_DEPS = [
    "absl_py",
    "numpy",
    "rich",
    "safetensors",
    "torch",
    "tqdm",
    "triton",
]

TEST_PIP_DEPS = [
    "hypothesis",
    "pytest",
]

_RUNNER = "//ci:pytest_runner.py"
_PYTEST_CONFIG = "//:pytest_config"

GPU_TAGS = ["requires-gpu-nvidia"]

def _pip(names):
    if not _BZLMOD:
        return []
    return ["@pypi//%s" % n for n in names]

def source_root_imports(package = None):
    """`imports` that put the package's source root on sys.path ([] outside the roots).

    Args:
      package: package path; default: the package being loaded.

    Returns:
      kernels/rlk/kernels/gemm -> ["../../.."]; python/rlk -> [".."]; ci -> [].
    """
    pkg = native.package_name() if package == None else package
    parts = pkg.split("/") if pkg else []
    if not parts or parts[0] not in SOURCE_ROOTS:
        return []
    depth = len(parts) - 1
    if depth == 0:
        return ["."]
    return ["/".join([".."] * depth)]

def _file_path(src):
    """Workspace-relative path of a source file given as `srcs` names it in this package."""
    pkg = native.package_name()
    if src.startswith("//"):
        p, _, f = src[2:].partition(":")
        return p + "/" + f if p else f
    if src.startswith(":"):
        src = src[1:]
    return pkg + "/" + src if pkg else src

def rlk_py_library(name, srcs, deps = [], data = [], pip_deps = None, **kwargs):
    """A py_library whose package's source root is on sys.path.

    Args:
      name: target name.
      srcs: .py files.
      deps: rlk targets.
      data: files read at run time (configs/*.json, contract locks).
      pip_deps: third-party packages (bzlmod hub names); default DEFAULT_PIP_DEPS.
      **kwargs: passed to py_library (visibility, tags, ...).
    """
    kwargs.setdefault("visibility", ["//visibility:public"])
    py_library(
        name = name,
        srcs = srcs,
        deps = deps + _pip(DEFAULT_PIP_DEPS if pip_deps == None else pip_deps),
        data = data,
        imports = source_root_imports(),
        **kwargs
    )

def rlk_py_binary(name, srcs, main = None, deps = [], data = [], pip_deps = None, **kwargs):
    """A py_binary whose package's source root is on sys.path."""
    py_binary(
        name = name,
        srcs = srcs,
        main = main,
        deps = deps + _pip(DEFAULT_PIP_DEPS if pip_deps == None else pip_deps),
        data = data,
        imports = source_root_imports(),
        **kwargs
    )

def rlk_py_test(
        name,
        srcs,
        deps = [],
        data = [],
        gpu = False,
        size = "medium",
        args = [],
        env = {},
        tags = [],
        pip_deps = None,
        **kwargs):
    """pytest over `srcs`: a CPU-interpreter test `<name>`, and `<name>_gpu` when gpu = True.

    Args:
      name: target name of the CPU variant.
      srcs: pytest files (`*_test.py`) of this package.
      deps: what they import (the package's library, //python/rlk:core, ...).
      data: files the tests read.
      gpu: also make `<name>_gpu`, which runs the `@pytest.mark.gpu` tests of `srcs` on an
        NVIDIA GPU; tagged requires-gpu-nvidia and left out of `bazel test //...` by .bazelrc.
      size: Bazel test size (timeout class) of both variants.
      args: extra pytest arguments.
      env: extra environment of both variants.
      tags: extra tags of both variants.
      pip_deps: third-party packages (bzlmod hub names); default DEFAULT_PIP_DEPS + pytest.
      **kwargs: passed to both py_test targets (shard_count, flaky is not allowed, ...).
    """
    if kwargs.get("flaky"):
        fail("rlk_py_test %s: flaky tests are not allowed (no reruns in strict CI)" % name)
    files = [_file_path(s) for s in srcs]
    common = dict(
        srcs = srcs + [_RUNNER],
        main = _RUNNER,
        deps = deps + _pip((DEFAULT_PIP_DEPS if pip_deps == None else pip_deps) + TEST_PIP_DEPS),
        data = data + [_PYTEST_CONFIG],
        imports = source_root_imports(),
        size = size,
    )
    common.update(kwargs)
    cpu_env = {"OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
    cpu_env.update(env)
    py_test(
        name = name,
        args = ["--rlk-variant=cpu"] + files + args,
        env = cpu_env,
        tags = tags + ["cpu-interpreter"],
        **common
    )
    if gpu:
        gpu_env = {"OMP_NUM_THREADS": "1"}
        gpu_env.update(env)
        py_test(
            name = name + "_gpu",
            args = ["--rlk-variant=gpu"] + files + args,
            env = gpu_env,
            tags = tags + GPU_TAGS + ["exclusive"],
            **common
        )
