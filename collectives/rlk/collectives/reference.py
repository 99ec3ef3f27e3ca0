"""Single-process specification of ``ar.v1`` / ``rs.v1`` / ``ag.v1`` (tests and benchmarks only).

Written independently of the implementation (numpy float32 adds and an integer
round-to-nearest-even for bf16) so that a test comparing the two checks both the order and the
rounding. The implementation never imports this module.

Casting contract: every rank's input is widened to fp32 (exact for bf16/fp32); the sum is the
left-to-right chain over ranks 0..N-1 in fp32; the result is rounded once (RNE) to the output
dtype.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def _to_f32(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        bits = t.view(torch.int16).numpy().astype(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    if t.dtype == torch.float32:
        return t.numpy().copy()
    raise TypeError(f"reference: dtype {t.dtype} not in the contract")


def _f32_to_bf16_rne(a: np.ndarray) -> torch.Tensor:
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16) & 0xFFFF
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = np.where(is_nan, ((bits >> 16) | 0x0040) & 0xFFFF, rounded)
    return torch.from_numpy(rounded.astype(np.uint16).view(np.int16).copy()).view(torch.bfloat16)


def fixed_order_sum(inputs: Sequence[torch.Tensor], out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``inputs[r]`` is rank r's tensor (same shape); returns the ar.v1 result on CPU."""
    out_dtype = out_dtype or inputs[0].dtype
    # Reduction order: ranks 0..N-1 left to right, fp32, one rounding at the end.
    acc = _to_f32(inputs[0])
    for t in inputs[1:]:
        acc = np.add(acc, _to_f32(t), dtype=np.float32)
    shape = tuple(inputs[0].shape)
    if out_dtype == torch.float32:
        return torch.from_numpy(acc.reshape(shape).copy())
    if out_dtype == torch.bfloat16:
        return _f32_to_bf16_rne(acc).reshape(shape)
    raise TypeError(f"reference: out dtype {out_dtype} not in the contract")


def all_reduce(inputs: Sequence[torch.Tensor], out_dtype=None) -> list[torch.Tensor]:
    s = fixed_order_sum(inputs, out_dtype)
    return [s.clone() for _ in inputs]


def reduce_scatter(inputs: Sequence[torch.Tensor], out_dtype=None) -> list[torch.Tensor]:
    n = len(inputs)
    s = fixed_order_sum(inputs, out_dtype)
    return list(s.chunk(n, dim=0))


def all_gather(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().cpu() for t in inputs], dim=0)


def merge_max_sumexp(stats: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Test stand-in for ``rlk.kernels.linear_logp.launch.merge_segment_stats`` (labelled: not logp.v2).

    ``stats[r] = (max_r [T] fp32, sumexp_r [T] fp32)`` with ``sumexp_r = sum exp(x - max_r)``.
    Reduction order: ranks ascending; m = max over all; s = sum_r s_r * exp(m_r - m), chain
    left to right in fp32. Returns (m, s).
    """
    m = stats[0][0].float().clone()
    for mr, _ in stats[1:]:
        m = torch.maximum(m, mr.float())
    s = torch.zeros_like(m)
    for mr, sr in stats:
        scale = torch.where(torch.isneginf(mr), torch.zeros_like(m), torch.exp(mr.float() - m))
        s = s + sr.float() * scale
    return m, s
