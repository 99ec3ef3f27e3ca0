"""Padded decode steps of the rollout executor, and their CUDA graphs (one per batch bucket).

A decode-only step of ``B`` requests (one query each) is padded to the smallest bucket
``P >= B``; the block-table width is fixed for the whole rollout (the most pages any request can
need). Every input shape of ``model.rollout_step`` then depends on ``P`` only, so one graph per
bucket serves every such step. Padding rows: token id 0, position 0, slot -1 (``write_kv`` skips
it), kv length 0 (``attn.v2`` gives out 0 / lse -inf), block-table row of zeros, one query each;
they trail the real rows and are dropped before sampling and logp. With ``targets`` (a replay
with forced tokens, ``RolloutConfig.step_logp``) the step also computes every row's logp of its
forced token (``model.logp``; every row of a decode step samples), inside the graph.

:class:`DecodeGraphs` follows the PyTorch CUDA-graphs recipe: static input buffers per bucket,
eager warm-up on a side stream, capture with ``torch.cuda.graph`` (one memory pool shared by
every bucket: graphs never run concurrently and each replay's output is consumed before the next
replay), then per step one non-blocking copy of the host-built inputs from pinned memory into the
static buffers (:mod:`rlk.replay.staging`: a pageable copy would make the host wait for the
previous step) and ``replay()``.
"""

from __future__ import annotations

import dataclasses

import torch

from rlk.models.qwen3.routes import PagedMeta
from rlk.replay.staging import PinnedRing, pack_layout, unpack

WARMUP_RUNS = 2  # eager runs on a side stream before each capture (Triton compiles, cuBLAS init)


@dataclasses.dataclass
class PaddedInputs:
    """Host (CPU) tensors of one padded decode step; rows ``0..real-1`` are the real requests."""

    ids: torch.Tensor  # [P] int64
    positions: torch.Tensor  # [P] int64
    block_tables: torch.Tensor  # [P, width] int32
    cu_seqlens_q: torch.Tensor  # [P+1] int32 (0, 1, ..., P)
    seq_lens_kv: torch.Tensor  # [P] int32
    slot_mapping: torch.Tensor  # [P] int64
    real: int
    targets: torch.Tensor | None = None  # [P] int64: forced tokens (0 on padding rows), or None

    @property
    def bucket(self) -> int:
        return self.ids.shape[0]

    def arrays(self) -> list[torch.Tensor]:
        """The input arrays in the order of the packed device buffer (:class:`_Bucket`): six, and
        ``targets`` seventh when present."""
        out = [self.ids, self.positions, self.block_tables, self.cu_seqlens_q, self.seq_lens_kv,
               self.slot_mapping]
        return out if self.targets is None else out + [self.targets]

    def meta(self, device, block_size: int) -> PagedMeta:
        """Device metadata for an eager padded step (no host copies: same code as the graph)."""
        return padded_meta(self.block_tables.to(device), self.cu_seqlens_q.to(device),
                           self.seq_lens_kv.to(device), self.slot_mapping.to(device), block_size)


def padded_meta(block_tables, cu_seqlens_q, seq_lens_kv, slot_mapping, block_size: int) -> PagedMeta:
    return PagedMeta(block_tables=block_tables, cu_seqlens_q=cu_seqlens_q, seq_lens_kv=seq_lens_kv,
                     slot_mapping=slot_mapping, block_size=block_size, max_seqlen_q=1, padded_decode=True)


def pad_decode_inputs(ids: list[int], positions: list[int], slots: list[int], lens: list[int],
                      pages: list[list[int]], bucket: int, width: int,
                      targets: list[int] | None = None) -> PaddedInputs:
    """The host tensors of a decode step of ``len(ids)`` requests padded to ``bucket`` rows.

    ``pages[b]``: request ``b``'s page ids (at most ``width``); ``lens[b]``: its kv length after
    this step; ``targets[b]``: the token whose logp row ``b`` gives (forced replays), or None.
    Determinism: exact host construction; real rows are unchanged by the padding.
    """
    B, P = len(ids), bucket
    if not 1 <= B <= P or len(positions) != B or len(slots) != B or len(lens) != B or len(pages) != B:
        raise ValueError(f"pad_decode_inputs: {B} rows for bucket {P} (one id, position, slot, length, page list each)")
    if targets is not None and len(targets) != B:
        raise ValueError(f"pad_decode_inputs: {len(targets)} targets for {B} rows")
    pad = P - B
    # One flat list, one tensor: a tensor per request's page row cost ~B small host ops per step.
    flat = [0] * (P * width)
    for b, pg in enumerate(pages):
        n = len(pg)
        if n > width:
            raise ValueError(f"pad_decode_inputs: request {b} has {n} pages > width {width}")
        flat[b * width: b * width + n] = pg
    return PaddedInputs(
        ids=torch.tensor(list(ids) + [0] * pad, dtype=torch.int64),
        positions=torch.tensor(list(positions) + [0] * pad, dtype=torch.int64),
        block_tables=torch.tensor(flat, dtype=torch.int32).view(P, width),
        cu_seqlens_q=torch.arange(P + 1, dtype=torch.int32),
        seq_lens_kv=torch.tensor(list(lens) + [0] * pad, dtype=torch.int32),
        slot_mapping=torch.tensor(list(slots) + [-1] * pad, dtype=torch.int64),
        real=B,
        targets=None if targets is None else torch.tensor(list(targets) + [0] * pad, dtype=torch.int64))


class _Bucket:
    """Static device inputs of one bucket (views of one flat buffer, filled by one non-blocking
    copy from pinned memory per step), its graph and the graph's output."""

    def __init__(self, host: PaddedInputs, device, block_size: int, ring: PinnedRing):
        arrays = host.arrays()
        self.offsets, total = pack_layout(arrays)
        self.flat = torch.empty(total, dtype=torch.uint8, device=device)
        ids, pos, bt, cu, lens, slots, *tg = unpack(self.flat, arrays, self.offsets)
        self.ids, self.positions = ids, pos
        self.targets = tg[0] if tg else None
        self.meta = padded_meta(bt, cu, lens, slots, block_size)
        self.ring = ring
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: tuple | None = None  # (hidden [P, H], logp [P] fp32 or None)
        self.load(host)

    def load(self, host: PaddedInputs):
        # cu_seqlens_q is the same for every step of a bucket; copied anyway (cheap, keeps it exact).
        self.ring.copy_packed(self.flat, host.arrays(), self.offsets, reuse_views=True)


class DecodeGraphs:
    """CUDA graphs of ``model.rollout_step`` for padded decode steps, captured lazily per bucket.

    Args:
      model: a :class:`rlk.models.qwen3.Qwen3` on a CUDA device.
      kv_cache: the rollout's KV cache (allocated once, before any capture; never reallocated:
        the graphs hold its addresses).
      block_size: page size.
    Call inside :func:`rlk.kernels.common.host_validated` (launchers must not read the device).

    Determinism: a replay runs the captured launches of the eager step on the same shapes, so its
    output bytes equal the eager padded step's; with the strict route those equal the unpadded
    eager step's rows (contracts ``attn.v2``, ``gemm.bf16.v1``, row ops: batch-invariant).
    """

    def __init__(self, model, kv_cache, block_size: int):
        if model.device.type != "cuda":
            raise ValueError("DecodeGraphs needs the model on a CUDA device")
        self.model, self.kv, self.block_size = model, kv_cache, block_size
        self._buckets: dict[int, _Bucket] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self.ring = PinnedRing(model.device)
        self.captures = 0
        self.replays = 0

    def _run(self, st: _Bucket):
        hidden = self.model.rollout_step(st.ids, st.positions, self.kv, st.meta)
        return hidden, (None if st.targets is None else self.model.logp(hidden, st.targets))

    def _capture(self, host: PaddedInputs) -> _Bucket:
        st = _Bucket(host, self.model.device, self.block_size, self.ring)
        # Warm-up on a side stream with this step's own inputs. Re-running a step is idempotent:
        # each layer rewrites the same K/V bytes into the same slots before reading the cache.
        side = torch.cuda.Stream(device=self.model.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self._run(st)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool):
            st.out = self._run(st)
        st.graph = g
        self.captures += 1
        return st

    def step(self, host: PaddedInputs) -> tuple:
        """``(hidden [P, H], logp [P] fp32 or None)`` of one padded decode step (rows ``>=
        host.real`` are padding; logp when ``host.targets`` is given: one graph per bucket and
        kind).

        The results are the graph's static outputs: valid until the next :meth:`step`; copy the
        rows needed (``index_select``, ``clone``) before then.
        """
        key = (host.bucket, host.targets is not None)
        st = self._buckets.get(key)
        if st is None:
            st = self._buckets[key] = self._capture(host)
        st.load(host)
        st.graph.replay()
        self.replays += 1
        return st.out
