"""When a public rlk op may call its launcher directly instead of going through ``torch.library``.

The custom ops (``rlk::*``) exist for autograd and for tracing (``torch.compile``, fake tensors).
On the H200 their Python dispatch costs about 40-70 us per call on top of the launcher
(``rlk.bench.overhead_bench``), which dominates small decode-sized launches. When no autograd graph is
being built and nothing is tracing, the public functions call the same launcher the custom op's
body calls, with the same arguments: the bytes are identical by construction (one code path).
"""

from __future__ import annotations

import torch

_PLAIN = (torch.Tensor, torch.nn.Parameter)


try:  # imported once: an import statement per call costs host time on every op
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
except ImportError:  # pragma: no cover - older torch: stay on the custom-op path
    _get_current_dispatch_mode_stack = None


def _dispatch_mode_active() -> bool:
    """A TorchDispatchMode (fake tensors, rlk's megatron audit, tracing) sees every aten op; the
    custom op keeps the kernel one opaque ``rlk::`` op for it."""
    if _get_current_dispatch_mode_stack is None:  # pragma: no cover
        return True
    return bool(_get_current_dispatch_mode_stack())


def direct(*tensors) -> bool:
    """True when the launcher may be called directly: plain tensors (no fake/functional
    subclasses), not compiling, no dispatch mode active, and no autograd needed for any of them."""
    if torch.compiler.is_compiling() or _dispatch_mode_active():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if type(t) not in _PLAIN or (grad and t.requires_grad):
            return False
    return True
