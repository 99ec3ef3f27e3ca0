"""rlk.replay.staging: packed layout (CPU) and pinned ring copies against a busy GPU."""

import pytest
import torch

from rlk.replay.staging import PinnedRing, pack_layout, unpack


def _arrays():
    return [torch.arange(5, dtype=torch.int64), torch.arange(12, dtype=torch.int32).view(3, 4) - 7,
            torch.tensor([-1, 2, 3], dtype=torch.int64), torch.arange(3, dtype=torch.int32)]


def test_pack_layout_is_aligned_and_round_trips():
    arrays = _arrays()
    offsets, total = pack_layout(arrays)
    assert offsets[0] == 0 and all(o % 16 == 0 for o in offsets) and total % 16 == 0
    assert all(b >= a + x.numel() * x.element_size() for a, b, x in zip(offsets, offsets[1:], arrays))
    flat = torch.zeros(total, dtype=torch.uint8)
    views = unpack(flat, arrays, offsets)
    for v, a in zip(views, arrays):
        v.copy_(a)
    for v, a in zip(unpack(flat, arrays, offsets), arrays):  # views share the flat buffer
        assert v.dtype == a.dtype and v.shape == a.shape and torch.equal(v, a)


def test_ring_needs_a_slot():
    with pytest.raises(ValueError, match="at least one slot"):
        PinnedRing("cpu", slots=0)


@pytest.mark.gpu
@pytest.mark.parametrize("reuse_views", [False, True])
def test_gpu_ring_never_overwrites_a_queued_copy(reuse_views):
    """The GPU is held busy while the host issues more copies than the ring has slots; every
    destination must still receive its own source (a reused slot must wait for its copy), also
    when the slots' typed views are cached (copy_packed(reuse_views=True), the decode buckets' path)."""
    ring = PinnedRing("cuda", slots=2)
    srcs = [torch.full((1000,), i, dtype=torch.int64) for i in range(6)]
    torch.cuda._sleep(200_000_000)  # ~0.1 s of device time queued ahead of the copies
    if reuse_views:
        offsets, total = pack_layout(srcs[:1])
        outs = [torch.empty(total, dtype=torch.uint8, device="cuda") for _ in srcs]
        for o, s in zip(outs, srcs):
            ring.copy_packed(o, [s], offsets, reuse_views=True)
        outs = [unpack(o, srcs[:1], offsets)[0] for o in outs]
    else:
        outs = [ring.to_device(s)[0] for s in srcs]
    torch.cuda.synchronize()
    for i, (o, s) in enumerate(zip(outs, srcs)):
        assert torch.equal(o.cpu(), s), f"copy {i} corrupted"
    assert ring.waits >= 1  # the host had to wait for a slot: the reuse check was exercised


@pytest.mark.gpu
@pytest.mark.parametrize("reuse_views", [False, True])
def test_gpu_copy_packed_into_static_buffer(reuse_views):
    """Every step's bytes arrive, also when the ring keeps each slot's typed views (more steps
    than slots, so each slot's cached views are reused with new contents)."""
    ring = PinnedRing("cuda", slots=3)
    arrays = _arrays()
    offsets, total = pack_layout(arrays)
    flat = torch.empty(total, dtype=torch.uint8, device="cuda")
    views = unpack(flat, arrays, offsets)
    for step in range(7):
        shifted = [a + step for a in arrays]
        ring.copy_packed(flat, shifted, offsets, reuse_views=reuse_views)
        for v, a in zip(views, shifted):
            assert torch.equal(v.cpu(), a)
    assert len(ring._views) == (3 if reuse_views else 0)
