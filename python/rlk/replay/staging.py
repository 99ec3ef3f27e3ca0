"""Non-blocking host-to-device input copies for the rollout executor.

CUDA copies from pageable host memory synchronize: "for transfers from pageable host memory to
device memory, a stream sync is performed before the copy is initiated" (CUDA Runtime API,
*API synchronization behavior*). An executor that copies its per-step inputs from ordinary CPU
tensors therefore waits for the previous step's kernels before every step: host and device time
add up instead of overlapping. :class:`PinnedRing` stages each copy in page-locked memory and
issues it with ``non_blocking=True``; a slot of the ring is refilled only after the event
recorded behind its previous copy has completed, so the host runs at most ``slots - 1`` copies
ahead of the device and never overwrites bytes a queued copy still has to read.

The bytes copied are the bytes given: staging changes when a copy happens, never what it copies.
"""

from __future__ import annotations

import torch

_ALIGN = 16  # byte offset alignment of packed arrays (Triton specializes on 16-byte alignment)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class PinnedRing:
    """A ring of pinned host buffers for non-blocking copies to ``device`` (current stream)."""

    def __init__(self, device, slots: int = 3):
        if slots < 1:
            raise ValueError("PinnedRing needs at least one slot")
        self.device = torch.device(device)
        self._bufs: list[torch.Tensor | None] = [None] * slots
        self._events = [None] * slots
        self._next = 0
        self._views: dict = {}  # (slot, buffer address, layout) -> typed views into that slot's buffer
        self.waits = 0  # copies that had to wait for their slot (the host was slots-1 copies ahead)

    def _slot(self, nbytes: int) -> tuple[int, torch.Tensor]:
        """(index, pinned buffer of >= nbytes) of the next slot, once its previous copy is done."""
        i = self._next
        self._next = (i + 1) % len(self._bufs)
        ev = self._events[i]
        if ev is not None and not ev.query():
            self.waits += 1
            ev.synchronize()
        buf = self._bufs[i]
        if buf is None or buf.numel() < nbytes:
            buf = self._bufs[i] = torch.empty(max(nbytes, 4096), dtype=torch.uint8, pin_memory=True)
            # The slot's old buffer is gone: drop the views cached on it (they would keep it pinned).
            self._views = {k: v for k, v in self._views.items() if k[0] != i}
        return i, buf

    def _record(self, i: int) -> None:
        ev = self._events[i]
        if ev is None:
            ev = self._events[i] = torch.cuda.Event()
        ev.record()

    def copy_packed(self, dst: torch.Tensor, arrays: list[torch.Tensor], offsets: list[int],
                    reuse_views: bool = False) -> None:
        """One non-blocking copy of CPU ``arrays`` into the flat uint8 device buffer ``dst`` at
        byte ``offsets`` (see :func:`pack_layout`). ``reuse_views``: the layout recurs (a decode
        bucket's, a handful per rollout): keep the typed views of each slot instead of slicing
        them anew every step (host time only; the bytes copied are the same)."""
        i, buf = self._slot(dst.numel())
        views = None
        if reuse_views:
            key = (i, buf.data_ptr(), tuple(offsets), tuple((a.dtype, tuple(a.shape)) for a in arrays))
            views = self._views.get(key)
            if views is None:
                views = self._views[key] = unpack(buf, arrays, offsets)
        if views is None:
            views = unpack(buf, arrays, offsets)
        for v, a in zip(views, arrays):
            v.copy_(a)
        dst.copy_(buf[:dst.numel()], non_blocking=True)
        self._record(i)

    def to_device(self, *arrays: torch.Tensor) -> list[torch.Tensor]:
        """Fresh device tensors equal to the CPU ``arrays``, in one non-blocking copy."""
        offsets, total = pack_layout(arrays)
        flat = torch.empty(total, dtype=torch.uint8, device=self.device)
        self.copy_packed(flat, list(arrays), offsets)
        return unpack(flat, arrays, offsets)


def pack_layout(arrays) -> tuple[list[int], int]:
    """Byte offsets (16-byte aligned) of ``arrays`` packed back to back, and the total size."""
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += _aligned(a.numel() * a.element_size())
    return offsets, max(total, _ALIGN)


def unpack(flat: torch.Tensor, like, offsets) -> list[torch.Tensor]:
    """Views of the flat uint8 buffer ``flat`` with the dtypes and shapes of ``like``."""
    return [flat[off:off + a.numel() * a.element_size()].view(a.dtype).view(a.shape)
            for a, off in zip(like, offsets)]
