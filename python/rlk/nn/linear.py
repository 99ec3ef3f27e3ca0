"""``StrictLinear``: an nn.Linear (no bias) computed under contract ``gemm.bf16.v1``."""

from __future__ import annotations

import math

import torch
from torch import nn

from rlk.errors import UnsupportedConfigError
from rlk.kernels.gemm.autograd import linear


class StrictLinear(nn.Module):
    """``y [..., out_features] = x [..., in_features] @ weight.T``; weight ``[out, in]`` bf16.

    Bias is not part of the contract (Qwen3 projections have none): ``bias=True`` raises.

    Determinism: contract gemm.bf16.v1 (rows batch invariant; backward bitwise run to run).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 device=None, dtype=torch.bfloat16):
        super().__init__()
        if bias:
            raise UnsupportedConfigError("StrictLinear: bias is not in contract gemm.bf16.v1")
        if dtype != torch.bfloat16:
            raise UnsupportedConfigError(f"StrictLinear: dtype {dtype} not supported (bf16 only)")
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias=False, contract=gemm.bf16.v1"
