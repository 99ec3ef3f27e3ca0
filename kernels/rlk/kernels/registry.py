"""Registry of strict Triton kernels, for cross-target static checks (ladder L0) and provenance.

Each op's ``schedule.py`` calls :func:`register_kernel` for every ``@triton.jit`` function it
launches, with the signature and every constexpr configuration of its checked-in tables. The L0
cross-target check compiles each entry for ``sm_90`` and ``gfx942`` without a GPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from typing import Any, Callable, Mapping


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    """One strict kernel.

    name: unique, ``<op>.<kernel>`` (``gemm.matmul``).
    contract_id: the contract it implements.
    fn: the ``@triton.jit`` function.
    signature: Triton signature of the non-constexpr args (``{"x_ptr": "*bf16", "M": "i32"}``);
      constexpr args are listed as ``"constexpr"``.
    configs: each a mapping of constexpr values plus ``num_warps``/``num_stages`` as launched
      on GPU (the ``DOT_DTYPE``-style constexprs take their GPU value).
    expects_mma: whether the compiled code must contain the contract's MMA form.
    """

    name: str
    contract_id: str
    fn: Any
    signature: Mapping[str, str]
    configs: tuple[Mapping[str, Any], ...]
    expects_mma: bool = False

    def source_sha256(self) -> str:
        fn = getattr(self.fn, "fn", self.fn)
        return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()


_KERNELS: dict[str, KernelEntry] = {}


def register_kernel(entry: KernelEntry) -> KernelEntry:
    old = _KERNELS.get(entry.name)
    if old is not None and old.fn is not entry.fn:
        raise ValueError(f"kernel {entry.name!r} registered twice")
    _KERNELS[entry.name] = entry
    return entry


def all_kernels() -> list[KernelEntry]:
    return [_KERNELS[k] for k in sorted(_KERNELS)]


def get_kernel(name: str) -> KernelEntry:
    return _KERNELS[name]
