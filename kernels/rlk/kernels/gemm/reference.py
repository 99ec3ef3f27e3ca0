"""Reference (the spec) of contract ``gemm.bf16.v1``. Kernels never import this module.

Casting contract: x [M, K] and w [N, K] are bf16; every product is exact in fp32/fp64; the kernel
sums in fp32 (K in chunks of 64 ascending, split-K segments folded in ascending order) and rounds
once to bf16 (round-to-nearest-even). This reference sums in fp64 (``reference_fp64``) for
accuracy tests, and ``reference_order`` mimics the contract's order with fp32 torch sums on CPU
for orientation only (torch's own dot order inside a chunk differs from the MMA's).
"""

from __future__ import annotations

import torch


def reference_fp64(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` in fp64 on CPU (no rounding): [M, K] x [N, K] -> [M, N] fp64."""
    return x.detach().double().cpu() @ w.detach().double().cpu().T


def reference(x: torch.Tensor, w: torch.Tensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """fp64 product rounded once to ``out_dtype`` (torch's fp64->bf16 cast is RNE)."""
    return reference_fp64(x, w).to(out_dtype)


def tolerance(K: int, out_dtype=torch.bfloat16) -> tuple[float, float]:
    """(atol, rtol) of the kernel vs :func:`reference_fp64`, scaled by sum |x||w| per element.

    Error budget: one bf16 rounding (2**-8 relative) plus fp32 accumulation over K terms
    (K * 2**-24 of sum |x_k w_k|).
    """
    rtol = 2.0 ** -8 if out_dtype == torch.bfloat16 else 0.0
    return K * 2.0 ** -24, rtol
