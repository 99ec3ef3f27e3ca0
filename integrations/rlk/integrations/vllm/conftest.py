"""vLLM adapter tests: run with the separate venv (``bash ci/setup_vllm.sh``):

    .venv-vllm/bin/python -m pytest integrations/rlk/integrations/vllm -q

The engine processes must see the CPU settings and the counters directory before vLLM starts,
so they are set here, at collection, before any test module imports vLLM. Where vLLM is
missing the engine tests skip with a reason, except in CI (``CI`` set), where they fail.
"""

import os
import tempfile

import pytest

_WORK = tempfile.mkdtemp(prefix="rlk-vllm-test-")


def _vllm_missing() -> str | None:
    try:
        import vllm  # noqa: F401
    except Exception as e:  # ImportError or a broken install
        return f"{type(e).__name__}: {e}"
    return None


@pytest.fixture(scope="session")
def vllm_workdir():
    """Session work dir; engine env applied once (the engine's processes inherit it)."""
    missing = _vllm_missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"vLLM is not importable in CI ({missing}); run `bash ci/setup_vllm.sh` and use "
                        ".venv-vllm/bin/python", pytrace=False)
        pytest.skip(f"vLLM not installed ({missing}): not run, not verified; bash ci/setup_vllm.sh")
    from rlk import determinism
    from rlk.integrations.vllm import cpu_probe

    determinism.export(cpu_probe.engine_env(os.path.join(_WORK, "counters")))
    return _WORK


@pytest.fixture(scope="session")
def engine(vllm_workdir):
    """One engine start for the whole session (~40 s plus the interpreter's steps), serving the
    trained ``tiny-hd64`` checkpoint (``write_tiny_model``'s default)."""
    from rlk.integrations.vllm import cpu_probe

    model_dir = cpu_probe.write_tiny_model(os.path.join(vllm_workdir, "model"))
    llm = cpu_probe.make_llm(model_dir)
    yield llm, vllm_workdir
    del llm
