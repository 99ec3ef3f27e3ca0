"""The wheel and sdist hold the library only: setup.py's build_py leaves out every test and tool
module (pyproject.toml's ``[tool.rlk] leaf_patterns``) except ``__main__.py``."""

import importlib.util
import os

import pytest
from setuptools import Distribution

# The checkout (the realpath of this file leaves Bazel's runfiles tree).
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


@pytest.fixture(scope="module")
def setup_py():
    spec = importlib.util.spec_from_file_location("rlk_setup", os.path.join(ROOT, "setup.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # not __main__: defines the helpers, runs no setup()
    return mod


def _command(cls, pkgs, dirs):
    dist = Distribution({"packages": pkgs, "package_dir": dirs, "cmdclass": {"build_py": cls},
                         "script_name": "setup.py"})
    cmd = dist.get_command_obj("build_py")
    cmd.ensure_finalized()
    return cmd


def _modules(setup_py, pkgs, dirs, cwd):
    """(package, module, file) of every module build_py puts in the wheel, as setup.py builds."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return _command(setup_py.BuildPyLibraryOnly, pkgs, dirs).find_all_modules()
    finally:
        os.chdir(old)


def test_patterns_are_the_layer_checks(setup_py):
    import check_build

    assert setup_py.leaf_patterns(ROOT) == check_build.LEAF_PATTERNS
    assert "__main__.py" in check_build.LEAF_PATTERNS and setup_py.WHEEL_KEEPS == ("__main__.py",)


def test_the_wheel_holds_no_test_or_tool_module(setup_py):
    pkgs, dirs = setup_py._packages(ROOT)
    mods = _modules(setup_py, pkgs, dirs, ROOT)
    names = {f"{p}.{m}" for p, m, _ in mods}
    patterns = setup_py.leaf_patterns(ROOT)
    leaked = sorted(f for _, _, f in mods if setup_py.is_tool_or_test(f, patterns))
    assert leaked == []
    assert "rlk.contracts" in names and "rlk.kernels.gemm.launch" in names
    assert not any(m.endswith(("_test", "_bench", "_probe", "_scenarios")) for m in names)


def test_a_tool_module_is_dropped_and_a_library_module_kept(setup_py, tmp_path):
    pkg = tmp_path / "src" / "rlk" / "demo"
    pkg.mkdir(parents=True)
    for f in ("__init__.py", "__main__.py", "lib.py", "thing_bench.py", "thing_probe.py", "thing_test.py",
              "conftest.py", "thing_scenarios.py", "bench.py"):
        (pkg / f).write_text("")
    mods = _modules(setup_py, ["rlk.demo"], {"rlk.demo": "src/rlk/demo"}, tmp_path)
    assert sorted(m for _, m, _ in mods) == ["__init__", "__main__", "bench", "lib"]
    # The plain build_py would ship them: the filter is what drops them.
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        from setuptools.command.build_py import build_py

        plain = _command(build_py, ["rlk.demo"], {"rlk.demo": "src/rlk/demo"})
        assert "thing_bench" in {m for _, m, _ in plain.find_all_modules()}
    finally:
        os.chdir(old)


def test_built_wheel_lists_no_test_or_tool_file(setup_py, tmp_path):
    """pip builds the wheel from a copy of the source roots (the checkout stays untouched)."""
    import fnmatch
    import shutil
    import subprocess
    import sys
    import zipfile

    src = tmp_path / "src"
    src.mkdir()
    for f in ("setup.py", "pyproject.toml"):
        shutil.copy(os.path.join(ROOT, f), src / f)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "*.safetensors")
    for r in setup_py.ROOTS:
        shutil.copytree(os.path.join(ROOT, r), src / r, ignore=skip)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    (whl,) = (tmp_path / "dist").glob("rlk-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    patterns = setup_py.leaf_patterns(ROOT)
    assert [n for n in names if setup_py.is_tool_or_test(n, patterns)] == []
    assert "rlk/contracts.py" in names and "rlk/kernels/gemm/launch.py" in names
    assert "rlk/replay/__main__.py" in names  # a package's command line stays
    assert not any(fnmatch.fnmatch(os.path.basename(n), "*_test.py") for n in names)
