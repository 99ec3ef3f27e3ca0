"""Tests of ci/pytest_runner.py's argument building (the runner itself runs every Bazel test)."""

import os
import sys

import pytest

import pytest_runner


def test_cpu_variant_selects_non_gpu_and_importlib(tmp_path, monkeypatch):
    monkeypatch.setenv("XML_OUTPUT_FILE", str(tmp_path / "t.xml"))
    (tmp_path / "pyproject.toml").write_text("")
    variant, args = pytest_runner.build_args(["--rlk-variant=cpu", "a/b_test.py"], str(tmp_path))
    assert variant == "cpu"
    assert args[0] == "a/b_test.py"
    assert args[args.index("-m") + 1] == "not gpu"
    assert "--import-mode=importlib" in args
    assert args[args.index("--junitxml") + 1] == str(tmp_path / "t.xml")
    assert args[args.index("-c") + 1] == os.path.join(str(tmp_path), "pyproject.toml")


def test_gpu_variant(tmp_path):
    variant, args = pytest_runner.build_args(["--rlk-variant=gpu", "x_test.py"], str(tmp_path))
    assert variant == "gpu" and args[args.index("-m") + 1] == "gpu"


def test_unknown_variant_fails(tmp_path):
    with pytest.raises(SystemExit):
        pytest_runner.build_args(["--rlk-variant=tpu"], str(tmp_path))


def test_cpu_env_turns_interpreter_on(monkeypatch, tmp_path):
    monkeypatch.setenv("TEST_TMPDIR", str(tmp_path))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    pytest_runner._prepare_env("cpu")
    assert os.environ["TRITON_INTERPRET"] == "1"
    assert os.environ["TRITON_CACHE_DIR"].startswith(str(tmp_path))


def test_interpreter_is_on_in_this_test():
    # Every rlk_py_test's CPU variant runs with TRITON_INTERPRET=1 (Bazel env + runner).
    if os.environ.get("TEST_SRCDIR"):
        assert os.environ.get("TRITON_INTERPRET") == "1"


def test_rlk_comes_from_runfiles_under_bazel():
    # Under Bazel the editable install is dropped: rlk must resolve inside the runfiles tree.
    srcdir = os.environ.get("TEST_SRCDIR")
    if not srcdir:
        pytest.skip("only meaningful under bazel test")
    import rlk

    assert all(os.path.abspath(p).startswith(os.path.abspath(srcdir)) for p in rlk.__path__), rlk.__path__
    assert not any("__editable__" in str(getattr(f, "__module__", "")) for f in sys.meta_path)


def test_a_python_without_the_stack_gets_a_clear_message(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    msg = pytest_runner.missing_stack()
    assert "no torch" in msg and "./ci/bazel test" in msg and ".venv/bin/activate" in msg
    assert pytest_runner.main(["--rlk-variant=cpu", "x_test.py"]) == 2
    assert "no torch" in capsys.readouterr().err
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert pytest_runner.missing_stack() is None


def test_deselected_cases_are_counted(tmp_path):
    f = tmp_path / "sample_test.py"
    f.write_text("import pytest\n\ndef test_a():\n    pass\n\n@pytest.mark.gpu\ndef test_b():\n    pass\n")
    counter = pytest_runner._Deselected()
    rc = pytest.main([str(f), "-q", "-m", "not gpu", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                      "-W", "ignore::pytest.PytestUnknownMarkWarning"], plugins=[counter])
    assert rc == 0 and counter.n == 1
