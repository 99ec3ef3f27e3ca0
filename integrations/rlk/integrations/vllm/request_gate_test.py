"""The request gate on vLLM's admission check (``SamplingParams.verify``): it rejects what the
strict engine cannot serve, only for engines serving rlk's architecture, and installs once."""

from types import SimpleNamespace

import pytest


@pytest.fixture
def gate(monkeypatch):
    from vllm import SamplingParams

    from rlk.integrations.vllm import request_gate

    calls = []
    # vLLM's own checks replaced by a recorder: the wrapper must still call them first.
    monkeypatch.setattr(SamplingParams, "verify", lambda self, model_config, *a, **k: calls.append(model_config))
    from rlk.integrations.vllm.plugin import ARCH

    assert not request_gate.installed()
    request_gate.install(ARCH)
    return SamplingParams, calls


def test_rejects_an_uncovered_request_for_the_strict_architecture_only(gate):
    from rlk.integrations.vllm.plugin import ARCH

    SamplingParams, calls = gate
    rlk_cfg, other_cfg = SimpleNamespace(architectures=[ARCH]), SimpleNamespace(architectures=["Qwen3ForCausalLM"])
    bad = SamplingParams(top_p=0.5, logprobs=0, max_tokens=1)
    with pytest.raises(ValueError, match="rlk strict vLLM: request rejected: top_p=0.5"):
        bad.verify(rlk_cfg, None, None, None)
    bad.verify(other_cfg, None, None, None)  # a stock engine's requests are not rlk's business
    SamplingParams(logprobs=0, max_tokens=1).verify(rlk_cfg, None, None, None)
    assert calls == [rlk_cfg, other_cfg, rlk_cfg]  # vLLM's own checks ran every time


def test_install_is_idempotent(gate):
    from rlk.integrations.vllm import request_gate

    SamplingParams, _ = gate
    wrapped = SamplingParams.verify
    request_gate.install("AnyOtherArch")
    assert SamplingParams.verify is wrapped and request_gate.installed()


def test_strict_engine_kwargs_carry_no_logits_processor():
    """A custom logits processor makes vLLM 0.26 fall back from Model Runner V2 to V1."""
    from rlk.integrations.vllm.plugin import strict_engine_kwargs

    kw = strict_engine_kwargs(model="m")
    assert not kw.get("logits_processors")
