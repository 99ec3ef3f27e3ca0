"""Host plans: a launcher's metadata-derived work, memoized by that metadata.

Between its entry and its launch, a strict launcher checks dtypes, ranks, devices, shapes and
strides, looks up its schedule, and derives the grid, the integer arguments (strides, counts) and
the constexprs. All of it depends only on the inputs' metadata (type, dtype, shape, strides,
device) and the launcher's Python scalars, and repeating it costs host time on every call
(paged decode 32 us, prefill 17 us on a CPU host, launch excluded: ``rlk.bench.overhead_bench``). Where
a launcher's calls repeat their metadata (a decode step, fixed-shape steps, a benchmark) a
:class:`PlanCache` keeps the result; a hit allocates the outputs and launches.

The rules a launcher follows (``rlk.kernels.attention.launch`` is the first user):

* the key (:func:`key`) holds every tensor the checks or the derivation read, by
  :func:`meta`, and every scalar argument with its type; state that changes a plan and is not in
  the key (schedule overrides of the sweeps) makes the launcher skip the cache;
* a plan is stored only by the full path, after its checks passed: a hit repeats a launch the full
  path made for the same metadata, with the new call's tensors;
* checks that read tensor *contents* (device value checks: lengths, block ids) never run from a
  plan, so launchers use plans only when those checks are off (``host_validated()``, CUDA-graph
  capture, ``validate=False``).

A tensor of another type than ``torch.Tensor`` / ``nn.Parameter`` (fake and functional tensors,
subclasses) or a scalar of an unlisted type gives no key: the full path runs.

``RLK_HOST_PLANS=0`` in the environment (or :func:`set_enabled`) turns plans off. Bytes never
depend on it: the same launch is made either way (``attention_test`` compares both).
"""

from __future__ import annotations

import os
from typing import Optional

import torch

_ENABLED = [os.environ.get("RLK_HOST_PLANS", "1") != "0"]
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_SCALAR_TYPES = (int, float, str, bool, type(None))


def set_enabled(enabled: bool) -> bool:
    """Turn plans on or off for this process; returns the previous setting (benchmarks, tests)."""
    prev = _ENABLED[0]
    _ENABLED[0] = bool(enabled)
    return prev


def enabled() -> bool:
    return _ENABLED[0]


def meta(t: torch.Tensor) -> tuple:
    """What the checks and the launch arguments read of a tensor (never its contents)."""
    return (t.dtype, t.shape, t.stride(), t.device)


def key(kind: str, tensors: tuple, scalars: tuple) -> Optional[tuple]:
    """The plan key of one call, or None (no plan) for an unlisted tensor or scalar type."""
    parts = [kind]
    for t in tensors:
        if type(t) not in _TENSOR_TYPES:
            return None
        parts.append(meta(t))
    for s in scalars:
        if type(s) not in _SCALAR_TYPES:
            return None
        parts.append((type(s), s))  # 1, 1.0 and True are equal keys otherwise
    return tuple(parts)


class PlanCache:
    """Plans of one module, bounded (emptied when ``max_entries`` is reached: varying shapes,
    such as packed training batches, make new keys every step)."""

    def __init__(self, name: str, max_entries: int = 512):
        self.name = name
        self.max_entries = max_entries
        self._plans: dict = {}
        self.stats = {"hits": 0, "misses": 0}

    def get(self, k):
        plan = self._plans.get(k)
        self.stats["hits" if plan is not None else "misses"] += 1
        return plan

    def put(self, k, plan) -> None:
        if len(self._plans) >= self.max_entries:
            self._plans.clear()
        self._plans[k] = plan

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)
