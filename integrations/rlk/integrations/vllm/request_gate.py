"""The request gate at vLLM's admission seam: ``SamplingParams.verify``.

vLLM's input processor calls ``params.verify(model_config, ...)`` for every request it admits, in
the process that receives the request, and turns the raised ``ValueError`` into a rejection (an
exception from ``LLM.generate``, HTTP 400 online). :func:`install` wraps that method once per
process: after vLLM's own checks, a request to an engine serving rlk's strict architecture
(``model_config.architectures`` holds the architecture given to :func:`install`, the plugin's
``ARCH``) goes through
:func:`rlk.integrations.vllm.admission.check_sampling_params`; other engines are untouched.

Why not a logits processor (``validate_params``, the earlier seam): any custom logits processor
makes vLLM 0.26 fall back from Model Runner V2 to the V1 runner, whatever it does.
"""

from __future__ import annotations

import functools

_MARK = "_rlk_request_gate"


def _serves(model_config, arch: str) -> bool:
    try:
        archs = list(getattr(model_config, "architectures", None) or [])
    except Exception:  # a config without an architecture list serves no rlk model
        archs = []
    return arch in archs


def install(arch: str) -> None:
    """Wraps ``vllm.SamplingParams.verify`` for engines serving ``arch`` (idempotent)."""
    from vllm import SamplingParams

    from rlk.integrations.vllm.admission import check_sampling_params

    if installed():
        return
    orig = SamplingParams.verify

    @functools.wraps(orig)
    def verify(self, model_config, *args, **kwargs):
        out = orig(self, model_config, *args, **kwargs)
        if _serves(model_config, arch):
            check_sampling_params(self)
        return out

    setattr(verify, _MARK, True)
    SamplingParams.verify = verify


def installed() -> bool:
    from vllm import SamplingParams

    return bool(getattr(SamplingParams.verify, _MARK, False))
