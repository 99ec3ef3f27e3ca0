"""Bitwise assertions. Exactness in rlk means equal raw bytes, not ``allclose``."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from rlk.errors import ExactnessError

_INT_VIEW = {
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    iv = _INT_VIEW.get(t.dtype)
    return t.view(iv) if iv is not None else t


def _hex(t: torch.Tensor, idx) -> str:
    v = t[idx]
    iv = _INT_VIEW.get(t.dtype)
    if iv is None:
        return repr(v.item())
    nbits = torch.finfo(t.dtype).bits
    raw = int(_bits(t)[idx].item()) & ((1 << nbits) - 1)
    return f"{v.item()!r} (0x{raw:0{nbits // 4}x})"


def first_difference(a: torch.Tensor, b: torch.Tensor):
    """Index (tuple) of the first element whose bytes differ, or None."""
    diff = _bits(a) != _bits(b)
    if not bool(diff.any()):
        return None
    flat = int(torch.nonzero(diff.reshape(-1))[0].item())
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor, msg: str = "") -> None:
    """Raises ``ExactnessError`` unless the tensors have equal dtype, shape and raw bytes.

    The message names the first differing index, both values in hex, and how many differ.
    NaNs with equal bit patterns compare equal (bytes, not values).
    """
    prefix = f"{msg}: " if msg else ""
    if actual.dtype != expected.dtype:
        raise ExactnessError(f"{prefix}dtype {actual.dtype} != {expected.dtype}")
    if tuple(actual.shape) != tuple(expected.shape):
        raise ExactnessError(f"{prefix}shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    a, e = actual.detach().cpu(), expected.detach().cpu()
    idx = first_difference(a, e)
    if idx is None:
        return
    n = int((_bits(a) != _bits(e)).sum().item())
    raise ExactnessError(
        f"{prefix}{n} of {a.numel()} elements differ; first at {idx}: "
        f"actual {_hex(a, idx)} vs expected {_hex(e, idx)}"
    )


def assert_batch_invariant(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    sizes: Sequence[int],
    msg: str = "",
) -> None:
    """``fn(x[:k])`` must equal ``fn(x)[:k]`` bitwise for every ``k`` in ``sizes`` (row dim 0)."""
    full = fn(x)
    for k in sizes:
        part = fn(x[:k].contiguous())
        assert_bitwise_equal(part, full[:k], f"{msg} rows[:{k}] of {x.shape[0]}")
