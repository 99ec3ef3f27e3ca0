"""The request gate as a vLLM v1 logits processor.

vLLM runs ``validate_params`` of every configured logits processor when a request is admitted
(``vllm.v1.engine.input_processor``), in the process that receives the request, and turns the
raised error into a rejection (HTTP 400 online). ``apply`` returns the logits untouched
(the same tensor), so installing the gate cannot change any value.
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor

from rlk.integrations.vllm.admission import check_sampling_params


class RlkRequestGate(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params):
        # UnsupportedConfigError is a ValueError: vLLM reports it as a validation error.
        check_sampling_params(sampling_params)

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update) -> None:
        return None
