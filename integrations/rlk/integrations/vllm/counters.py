"""Run-time evidence that rlk's kernels (and not vLLM's stock ones) ran in every worker.

vLLM only logs a plugin that fails to load, so strict mode cannot trust that its model class
was used: each worker process counts the rlk ops its model called and any call of the stock
attention implementation, and writes the counts to ``$RLK_VLLM_COUNTERS_DIR/counters-<pid>.json``
after every forward (tiny file; the directory is the caller's). :func:`check` turns a set of
such files into a verdict and fails closed.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import time

from rlk.errors import ExactnessError

ENV_DIR = "RLK_VLLM_COUNTERS_DIR"

# rlk op methods (rlk.models.qwen3.routes.StrictOps) whose calls prove the strict path ran.
REQUIRED = ("linear", "attn_paged", "write_kv", "logits_logp")
STOCK = "stock_attention"


class Counters:
    """Per-process counts, flushed to a JSON file when ``RLK_VLLM_COUNTERS_DIR`` is set."""

    def __init__(self, meta: dict | None = None):
        self.counts: collections.Counter = collections.Counter()
        self.meta = dict(meta or {})
        self._flushes = 0
        self._last_flush = 0.0

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def snapshot(self) -> dict:
        return {"pid": os.getpid(), "counts": dict(self.counts), **self.meta}

    def flush_throttled(self, every_s: float = 1.0, first: int = 3) -> str | None:
        """:meth:`flush` for the first ``first`` calls, then at most once per ``every_s`` seconds
        (a forward runs every few milliseconds; the file only has to show which ops ran)."""
        now = time.monotonic()
        if self._flushes < first or now - self._last_flush >= every_s:
            return self.flush()
        return None

    def flush(self) -> str | None:
        d = os.environ.get(ENV_DIR)
        if not d:
            return None
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"counters-{os.getpid()}.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.snapshot(), f, sort_keys=True)
        os.replace(tmp, path)
        self._flushes += 1
        self._last_flush = time.monotonic()
        return path


class CountingOps:
    """Wraps a route's op set (``StrictOps``); counts each call after the op returned."""

    def __init__(self, ops, counters: Counters):
        self._ops, self._counters = ops, counters

    def __getattr__(self, name):
        attr = getattr(self._ops, name)
        if not callable(attr):
            return attr
        counters = self._counters

        def wrapped(*a, **k):
            out = attr(*a, **k)
            counters.add(name)
            return out

        return wrapped


def read(directory: str) -> list[dict]:
    out = []
    for p in sorted(glob.glob(os.path.join(directory, "counters-*.json"))):
        with open(p) as f:
            out.append(json.load(f))
    return out


def check(records: list[dict], min_workers: int = 1) -> dict:
    """Raises ``ExactnessError`` unless every worker ran rlk's ops and none ran stock attention.

    Returns a summary ``{"workers", "counts" (summed), "strict_backend_ran": True}``.
    """
    if len(records) < min_workers:
        raise ExactnessError(f"rlk vLLM: {len(records)} worker counter files, expected >= {min_workers} "
                             "(plugin not loaded in the worker, or RLK_VLLM_COUNTERS_DIR not passed)")
    total: collections.Counter = collections.Counter()
    contracts = {}
    for r in records:
        c = r.get("counts", {})
        if c.get(STOCK, 0):
            raise ExactnessError(f"rlk vLLM: stock attention ran {c[STOCK]} times in worker pid {r.get('pid')}")
        missing = [k for k in REQUIRED if not c.get(k, 0)]
        if missing:
            raise ExactnessError(f"rlk vLLM: worker pid {r.get('pid')} never ran rlk ops {missing} (counts {c})")
        total.update(c)
        contracts.update(r.get("contracts", {}))
    return {"workers": len(records), "counts": dict(total), "contracts": contracts, "strict_backend_ran": True}
