"""``StrictGroup``: a process group plus the checks that make a fixed-order collective fail closed.

* **Contract handshake.** Before the first reduction on a device (and whenever :meth:`verify`
  is called) every rank sends a fixed-size int64 header: a magic word, a 128-bit hash of its
  collective contract IDs (``ar``/``rs``/``ag`` IDs and their bit hashes), its generation counter
  and world size. A different hash on any rank raises ``ContractMismatchError`` naming the rank.
  No pickling: headers are plain integer tensors (``all_gather_object`` is never used).
* **Generation counter.** Every exchange increments the group's counter. With per-call checks
  (default for CPU tensors; ``check_every_call=True`` forces it on GPUs, at the cost of one
  device-to-host read per call) the header rides in front of the payload bytes of every call,
  so a stale generation, a different op, size or dtype on some rank is named at once.
* **Bounded waits.** The transport waits at most the process group's timeout (set it with
  ``init_process_group(timeout=...)`` / ``new_group(timeout=...)``). When it fails, each live
  rank posts an arrival marker for the failed generation in the group's store and waits
  ``diag_timeout_s`` for the others; ranks whose markers never come are named in a
  :class:`RankTimeoutError`. Nothing retries and nothing falls back to a native reduction.
"""

from __future__ import annotations

import hashlib
import time
from typing import Mapping

import torch
import torch.distributed as dist

from rlk.errors import ContractMismatchError, RlkError

MAGIC = 0x524C4B434F4C4C31  # "RLKCOLL1"
HEADER_WORDS = 8
HEADER_BYTES = HEADER_WORDS * 8

OP_CODES = {"handshake": 0, "all_reduce": 1, "reduce_scatter": 2, "all_gather": 3}
_OP_NAMES = {v: k for k, v in OP_CODES.items()}
DTYPE_CODES = {
    torch.float32: 1, torch.bfloat16: 2, torch.float16: 3, torch.float64: 4,
    torch.int64: 5, torch.int32: 6, torch.int16: 7, torch.int8: 8, torch.uint8: 9, torch.bool: 10,
}
_DTYPE_NAMES = {v: str(k).replace("torch.", "") for k, v in DTYPE_CODES.items()}


class CollectiveError(RlkError):
    """Ranks disagree about a collective call (op, size, dtype), or the transport failed."""


class StaleGenerationError(CollectiveError):
    """A rank is at another generation of the group (it skipped or repeated a collective)."""


class RankTimeoutError(CollectiveError, TimeoutError):
    """One or more ranks did not arrive at a collective within the group's timeout."""


def _all_gather_single(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    # torch 2.13 renames all_gather_into_tensor to all_gather_single; 2.11 has only the former.
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


def contract_hash(contract_ids: Mapping[str, str]) -> tuple[int, int]:
    """128 bits of sha256 over the sorted ``op -> contract id`` map and each ID's bit hash."""
    from rlk import contracts as _c

    parts = []
    for op in sorted(contract_ids):
        cid = contract_ids[op]
        try:
            bh = _c.get(cid).bit_hash()
        except ContractMismatchError:
            bh = "unregistered"
        parts.append(f"{op}={cid}:{bh}")
    d = hashlib.sha256(";".join(parts).encode()).digest()
    return (int.from_bytes(d[:8], "little", signed=True), int.from_bytes(d[8:16], "little", signed=True))


def _default_store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - diagnostics only; reported as "no store" below
        return None


_INSTANCES = [0]


class StrictGroup:
    """Wraps a ``torch.distributed`` process group for the fixed-order collectives.

    Args:
      group: a ProcessGroup, or None for the default (WORLD) group.
      check_every_call: send and check the header with every call. Default: True for CPU
        tensors, False for GPU tensors (GPU calls are checked at the handshake and at
        :meth:`verify`, so that they stay asynchronous and graph-capturable).
      diag_timeout_s: how long a failed call waits for the other ranks' arrival markers.
      contract_ids: ``op -> contract id`` this rank claims (default: the registered v1 IDs).
      store: the store used for failure diagnostics (default: the default group's store).

    Every rank must create its StrictGroups in the same order and call collectives on them
    in the same order (as with any process group).
    """

    def __init__(self, group=None, *, check_every_call: bool | None = None, diag_timeout_s: float = 5.0,
                 contract_ids: Mapping[str, str] | None = None, store=None):
        if not dist.is_available() or not dist.is_initialized():
            raise CollectiveError("torch.distributed is not initialized (call init_process_group first)")
        from rlk.collectives.contracts import COLLECTIVE_CONTRACT_IDS

        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.check_every_call = check_every_call
        self.diag_timeout_s = float(diag_timeout_s)
        self.contract_ids = dict(contract_ids or COLLECTIVE_CONTRACT_IDS)
        self._hash = contract_hash(self.contract_ids)
        self._store = store if store is not None else _default_store()
        self.generation = 0
        self._verified: set[str] = set()
        _INSTANCES[0] += 1
        self.uid = f"g{_INSTANCES[0]}w{self.world_size}"

    # -- headers ---------------------------------------------------------------------------
    def _header(self, gen: int, op: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(
            [MAGIC, self._hash[0], self._hash[1], gen, OP_CODES[op], numel,
             DTYPE_CODES.get(dtype, 0), self.world_size],
            dtype=torch.int64,
        )

    def _check_headers(self, headers: torch.Tensor, mine: torch.Tensor) -> None:
        """``headers [N, HEADER_WORDS]`` int64 in rank order (CPU). Raises naming ranks."""
        h = headers.tolist()
        me = mine.tolist()
        bad_magic = [r for r in range(self.world_size) if h[r][0] != MAGIC]
        if bad_magic:
            raise CollectiveError(f"rank(s) {bad_magic} sent no rlk collective header (a native or "
                                  f"foreign collective on the same group?); this rank: {self.rank}")
        bad = [r for r in range(self.world_size) if h[r][1:3] != me[1:3]]
        if bad:
            raise ContractMismatchError(
                f"collective contract IDs differ: rank(s) {bad} hash "
                f"{[hex(h[r][1] & (2**64 - 1)) for r in bad]} vs this rank {self.rank} "
                f"{hex(me[1] & (2**64 - 1))} ({self.contract_ids})")
        bad = [r for r in range(self.world_size) if h[r][3] != me[3]]
        if bad:
            raise StaleGenerationError(
                "generation mismatch: " + ", ".join(f"rank {r} at {h[r][3]}" for r in range(self.world_size))
                + f" (this rank {self.rank} at {me[3]}); a rank skipped or repeated a collective")
        bad = [r for r in range(self.world_size) if h[r][4:8] != me[4:8]]
        if bad:
            def desc(w):
                return f"{_OP_NAMES.get(w[4], w[4])}({w[5]} x {_DTYPE_NAMES.get(w[6], w[6])}, world {w[7]})"
            raise CollectiveError("ranks called different collectives: " + ", ".join(
                f"rank {r}: {desc(h[r])}" for r in range(self.world_size)))

    def _checks(self, device: torch.device) -> bool:
        if self.check_every_call is not None:
            return self.check_every_call
        return device.type == "cpu"

    # -- failure diagnosis -----------------------------------------------------------------
    def _diagnose(self, gen: int, op: str, exc: BaseException) -> RankTimeoutError:
        base = f"{op} at generation {gen} failed on rank {self.rank}: {type(exc).__name__}: {str(exc)[:300]}"
        if self._store is None:
            return RankTimeoutError(base + " (no store for diagnostics: missing rank unknown)")
        prefix = f"rlk_coll/{self.uid}/arrive/{gen}/"
        try:
            self._store.set(prefix + str(self.rank), "1")
            deadline = time.monotonic() + self.diag_timeout_s
            missing = list(range(self.world_size))
            while missing and time.monotonic() < deadline:
                missing = [r for r in missing if not self._store.check([prefix + str(r)])]
                if missing:
                    time.sleep(0.05)
        except Exception as e:  # noqa: BLE001
            return RankTimeoutError(base + f"; store unreachable ({type(e).__name__}: {e}); the rank hosting "
                                    "the store (usually global rank 0) may be the missing one")
        if missing:
            return RankTimeoutError(base + f"; rank(s) {missing} did not arrive at this collective "
                                    f"(no marker within {self.diag_timeout_s:.1f} s)")
        return RankTimeoutError(base + "; every rank arrived: the transport itself failed")

    # -- transports (bytes only) -----------------------------------------------------------
    def _run(self, op: str, fn):
        gen = self.generation
        self.generation += 1
        try:
            return fn(gen)
        except RlkError:
            raise
        except RuntimeError as e:  # gloo/NCCL timeouts, closed connections (DistBackendError too)
            raise self._diagnose(gen, op, e) from e

    def verify(self, device: torch.device | str = "cpu") -> None:
        """Handshake: contract IDs, generation and world size equal on every rank (else raise)."""
        device = torch.device(device)

        def go(gen):
            mine = self._header(gen, "handshake", 0, torch.uint8)
            out = torch.empty(self.world_size * HEADER_WORDS, dtype=torch.int64, device=device)
            _all_gather_single(out, mine.to(device), self.group)
            self._check_headers(out.view(self.world_size, HEADER_WORDS).cpu(), mine)

        self._run("handshake", go)
        self._verified.add(device.type)

    def _ensure_verified(self, device: torch.device) -> None:
        if device.type not in self._verified and not self._checks(device):
            self.verify(device)

    def gather_bytes(self, payload: torch.Tensor, op: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """All-gather of ``payload`` (1-D uint8, same length on every rank) -> ``[N, len]`` uint8."""
        self._ensure_verified(payload.device)
        check = self._checks(payload.device)

        def go(gen):
            n = self.world_size
            if check:
                mine = self._header(gen, op, numel, dtype)
                buf = torch.cat([mine.view(torch.uint8).to(payload.device), payload])
            else:
                buf = payload
            out = torch.empty(n * buf.numel(), dtype=torch.uint8, device=payload.device)
            _all_gather_single(out, buf, self.group)
            out = out.view(n, buf.numel())
            if check:
                self._check_headers(out[:, :HEADER_BYTES].contiguous().view(torch.int64).cpu(), mine)
                out = out[:, HEADER_BYTES:]
            return out

        return self._run(op, go)

    def all_to_all_bytes(self, chunks: torch.Tensor, op: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """``chunks [N, len]`` uint8 (row j goes to rank j) -> ``[N, len]`` (row j came from rank j)."""
        self._ensure_verified(chunks.device)
        check = self._checks(chunks.device)

        def go(gen):
            n = self.world_size
            if check:
                mine = self._header(gen, op, numel, dtype)
                hdr = mine.view(torch.uint8).to(chunks.device).expand(n, HEADER_BYTES)
                send = torch.cat([hdr, chunks], dim=1).contiguous()
            else:
                send = chunks.contiguous()
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv.view(-1), send.view(-1), group=self.group)
            if check:
                self._check_headers(recv[:, :HEADER_BYTES].contiguous().view(torch.int64).cpu(), mine)
                recv = recv[:, HEADER_BYTES:]
            return recv

        return self._run(op, go)


_WRAPPERS: dict[int, StrictGroup] = {}


def as_strict_group(group=None) -> StrictGroup:
    """``group`` if it is a StrictGroup; else a cached StrictGroup around the ProcessGroup."""
    if isinstance(group, StrictGroup):
        return group
    key = id(group) if group is not None else 0
    sg = _WRAPPERS.get(key)
    if sg is None or sg.group is not group:
        sg = StrictGroup(group)
        _WRAPPERS[key] = sg
    return sg
