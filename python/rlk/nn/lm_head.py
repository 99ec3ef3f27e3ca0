"""Thin nn.Module over ``rlk.kernels.linear_logp.autograd`` (contract ``logp.v2``)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from rlk.kernels.linear_logp.autograd import LogpOutput, linear_logp


class LMHeadLogp(nn.Module):
    """LM head that returns selected-token log-probs instead of logits.

    weight: [V_local, H] bf16, this rank's rows (global columns [vocab_start, vocab_start +
    V_local)); vocab_real: real (unpadded) vocabulary size.

    Determinism: logp.v2 (see ``rlk.kernels.linear_logp.autograd.linear_logp``).
    """

    def __init__(self, hidden_size: int, vocab_local: int, vocab_start: int = 0,
                 vocab_real: Optional[int] = None, device=None, dtype=torch.bfloat16,
                 segmentation: Optional[tuple[int, int]] = None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty((vocab_local, hidden_size), device=device, dtype=dtype))
        self.vocab_start = int(vocab_start)
        self.vocab_real = int(vocab_local + vocab_start if vocab_real is None else vocab_real)
        self.segmentation = segmentation

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                return_entropy: bool = False, return_logits: bool = False) -> LogpOutput:
        """hidden [T, H] bf16, targets [T] int64 -> LogpOutput (see ``linear_logp``)."""
        return linear_logp(hidden, self.weight, targets, self.vocab_start, self.vocab_real, temperature,
                           return_entropy, return_logits, segmentation=self.segmentation)

    def extra_repr(self) -> str:
        v, h = self.weight.shape
        return f"hidden={h}, vocab_local={v}, vocab_start={self.vocab_start}, vocab_real={self.vocab_real}"
