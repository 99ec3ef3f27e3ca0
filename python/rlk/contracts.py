"""Versioned arithmetic contracts.

A contract is a frozen record that names every bit-relevant choice of one operator (dtypes and
rounding points, K/KV chunk sizes, split counts, reduction tree, MMA form, exp/log form, masked
lane rule, rank order, floating-point fusion). Its ID (``gemm.bf16.v1``) is what both engines
record. Schedule fields (launch geometry along independent rows, warps, stages, ...) are kept
apart: they may change freely, but only with evidence that they are bit-neutral.

Contracts are defined next to their kernels (``rlk.kernels.<op>.contract``) and registered when
that module is imported; :func:`load_all` imports every module listed in
``CONTRACT_MODULES``. Changing a bit field without bumping the version is caught by the L0 check
against ``contracts.lock.json`` (see :func:`check_lock`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import re
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from rlk.errors import ContractMismatchError

ID_RE = re.compile(r"^(?P<op>[a-z][a-z0-9_]*)(\.[a-z0-9_]+)*\.v(?P<version>[0-9]+)$")

# Every contract must state these; op-specific fields come on top.
REQUIRED_BIT_FIELDS = (
    "dtypes",  # input/output/accumulator dtypes
    "accumulation",  # accumulator precision and form
    "rounding",  # where results are rounded, and how (RNE)
    "reduction_order",  # the fixed reduction tree / walk
    "fp_fusion",  # FMA contraction: pinned explicitly, never a toolchain default
)

# Launch knobs that are known to be bit-relevant somewhere. A contract may list one of them as a
# schedule field only with evidence (a test name and the hardware it was measured on) that it is
# bit-neutral for this kernel form.
KNOWN_BIT_RELEVANT_KNOBS = frozenset(
    {"num_warps", "BLOCK_K", "SPLIT_K", "KV_CHUNK", "BLOCK_D", "BLOCK_V", "enable_fp_fusion"}
)

# Modules that define and register contracts, and the modules that register the kernels
# implementing them (an op's ``schedule`` registers its kernels with the configs of its tables).
# Import failures are errors, not skips.
CONTRACT_MODULES = (
    "rlk.kernels.gemm.contract",
    "rlk.kernels.gemm.schedule",
    "rlk.kernels.rowops.contract",
    "rlk.kernels.rowops.schedule",
    "rlk.kernels.attention.contract",
    "rlk.kernels.attention.schedule",
    "rlk.kernels.linear_logp.contract",
    "rlk.kernels.linear_logp.schedule",
    "rlk.collectives.contracts",
    "rlk.collectives.ipc",  # registers the one-shot transport's fold kernel (ar.v1)
)


# The contract each op runs under in this release: the one map of op -> contract ID, keyed by
# the op names the engines use (the model's ops, then the collectives). The strict model route
# (``rlk.models.qwen3.routes.StrictOps.contracts``), the megatron spec (``spec.CONTRACTS``), the
# vLLM plugin's model (through the route) and the replay records all read their IDs from here.
STRICT_CONTRACTS: Mapping[str, str] = MappingProxyType({
    "gemm": "gemm.bf16.v1",
    "rmsnorm": "rmsnorm.v1",
    "rope": "rope.v1",
    "swiglu": "swiglu.v1",
    "embedding": "embedding.v1",
    "attention": "attn.v2",
    "linear_logp": "logp.v2",
    "all_reduce": "ar.v1",
    "reduce_scatter": "rs.v1",
    "all_gather": "ag.v1",
})

def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in sorted(value.items())})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class Contract:
    """One operator's arithmetic contract.

    Attributes:
      id: ``<op>[.<variant>...].v<N>``, for example ``gemm.bf16.v1``.
      summary: one line for reports.
      bit_fields: every bit-relevant choice (see ``REQUIRED_BIT_FIELDS``).
      schedule_fields: free launch choices, each mapped to the values allowed.
      bit_neutral_evidence: for each schedule field, where its bit-neutrality was shown
        (``"test_name@sm_90"``, ``"interpreter"``, ...). Required for every schedule field.
      targets: architectures the contract claims (``"sm_90"``, ``"gfx942"``, ``"cpu-interpreter"``).
      kernels: names of the kernels (in ``rlk.kernels.registry``) implementing it.
    """

    id: str
    summary: str
    bit_fields: Mapping[str, Any]
    schedule_fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    bit_neutral_evidence: Mapping[str, str] = dataclasses.field(default_factory=dict)
    targets: tuple[str, ...] = ("sm_90", "gfx942", "cpu-interpreter")
    kernels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("bit_fields", "schedule_fields", "bit_neutral_evidence"):
            object.__setattr__(self, name, _freeze(getattr(self, name)))
        object.__setattr__(self, "targets", tuple(self.targets))
        object.__setattr__(self, "kernels", tuple(self.kernels))
        problems = self.problems()
        if problems:
            raise ContractMismatchError(f"malformed contract {self.id!r}: " + "; ".join(problems))

    @property
    def op(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def version(self) -> int:
        m = ID_RE.match(self.id)
        return int(m.group("version")) if m else -1

    def problems(self) -> list[str]:
        """Reasons this record is not well formed (empty when it is)."""
        out = []
        if not ID_RE.match(self.id):
            out.append("id must look like '<op>[.<variant>].v<N>'")
        for f in REQUIRED_BIT_FIELDS:
            if f not in self.bit_fields:
                out.append(f"bit field {f!r} missing")
        if "fp_fusion" in self.bit_fields and self.bit_fields["fp_fusion"] not in (True, False):
            out.append("fp_fusion must be pinned to True or False")
        overlap = set(self.bit_fields) & set(self.schedule_fields)
        if overlap:
            out.append(f"fields both bit-relevant and free: {sorted(overlap)}")
        for f in self.schedule_fields:
            if not self.bit_neutral_evidence.get(f):
                out.append(f"schedule field {f!r} has no bit-neutrality evidence")
        return out

    def bit_hash(self) -> str:
        """sha256 of the canonical JSON of the ID and bit fields (the contract's identity)."""
        blob = json.dumps({"id": self.id, "bit_fields": _thaw(self.bit_fields)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "summary": self.summary,
            "bit_fields": _thaw(self.bit_fields),
            "schedule_fields": _thaw(self.schedule_fields),
            "bit_neutral_evidence": _thaw(self.bit_neutral_evidence),
            "targets": list(self.targets),
            "kernels": list(self.kernels),
            "bit_hash": self.bit_hash(),
        }


_REGISTRY: dict[str, Contract] = {}


def register(contract: Contract) -> Contract:
    """Adds ``contract``; re-registering the same ID with other content is an error."""
    old = _REGISTRY.get(contract.id)
    if old is not None and old != contract:
        raise ContractMismatchError(f"contract {contract.id!r} registered twice with different fields")
    _REGISTRY[contract.id] = contract
    return contract


def get(contract_id: str) -> Contract:
    try:
        return _REGISTRY[contract_id]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none loaded"
        raise ContractMismatchError(f"unknown contract {contract_id!r} (known: {known})") from None


def all_contracts() -> list[Contract]:
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def load_all(modules: Iterable[str] = CONTRACT_MODULES) -> list[Contract]:
    """Imports every contract-defining module (errors propagate) and returns the registry."""
    for name in modules:
        importlib.import_module(name)
    return all_contracts()


def require_same(side_a: Mapping[str, str], side_b: Mapping[str, str], what=("a", "b")) -> None:
    """Both sides must use the same contract ID for every operator (``op -> contract id``)."""
    diffs = []
    for op in sorted(set(side_a) | set(side_b)):
        ia, ib = side_a.get(op), side_b.get(op)
        if ia != ib:
            diffs.append(f"{op}: {what[0]}={ia} {what[1]}={ib}")
    if diffs:
        raise ContractMismatchError("contract IDs differ between sides: " + "; ".join(diffs))


def lock_json(contracts: Iterable[Contract] | None = None) -> dict:
    cs = all_contracts() if contracts is None else list(contracts)
    return {c.id: c.bit_hash() for c in cs}


def check_lock(lock: Mapping[str, str], contracts: Iterable[Contract] | None = None) -> list[str]:
    """Differences between the registry and a checked-in lock (``id -> bit hash``).

    A changed hash under an unchanged ID is an unversioned bit-relevant change; a registered ID
    missing from the lock (or the other way round) must be added/removed deliberately.
    """
    cur = lock_json(contracts)
    out = []
    for cid in sorted(set(cur) | set(lock)):
        if cid not in lock:
            out.append(f"{cid}: registered but not in the lock (add it)")
        elif cid not in cur:
            out.append(f"{cid}: in the lock but not registered")
        elif cur[cid] != lock[cid]:
            out.append(f"{cid}: bit fields changed without a new version")
    return out
