"""Strict mode: one entry point that validates a run's configuration when its plan is built.

    from rlk.strict import StrictConfig, strict_mode

    with strict_mode(StrictConfig(dtype="bfloat16", head_dim=128, page_size=16, tp=4)) as plan:
        ...  # plan.contracts maps op -> contract ID; kernels run under those contracts

Everything outside the registered contracts raises when the plan is built (typed errors from
``rlk.errors``); nothing falls back to a native kernel. A stale weight generation or a
provenance mismatch raises ``ProvenanceError``; an exactness check that fails raises
``ExactnessError`` after writing a diagnostic JSON to ``plan.diag_dir``. With strict mode off,
native execution is unchanged: this module changes no global state except the current plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
from typing import Any, Callable, Mapping

from rlk import contracts, determinism
from rlk.errors import ContractMismatchError, ExactnessError, ProvenanceError, UnsupportedConfigError

# The contract each op uses in this release. A run may name others only if they are registered.
DEFAULT_CONTRACTS = {
    "gemm": "gemm.bf16.v1",
    "rmsnorm": "rmsnorm.v1",
    "rope": "rope.v1",
    "swiglu": "swiglu.v1",
    "embedding": "embedding.v1",
    "attention": "attn.v2",
    "logp": "logp.v2",
    "all_reduce": "ar.v1",
    "reduce_scatter": "rs.v1",
    "all_gather": "ag.v1",
}

SUPPORTED_DTYPES = ("bfloat16",)

# Per-op validators: fn(config, contract) -> None, raising UnsupportedConfigError. Op modules
# may register more precise ones; these read the common contract fields when present.
_VALIDATORS: dict[str, Callable[["StrictConfig", contracts.Contract], None]] = {}


def register_validator(op: str, fn: Callable[["StrictConfig", contracts.Contract], None]) -> None:
    _VALIDATORS[op] = fn


def _field(contract: contracts.Contract, *names: str):
    for source in (contract.bit_fields, contract.schedule_fields):
        for n in names:
            if n in source:
                return source[n]
    return None


def _validate_attention(cfg: "StrictConfig", c: contracts.Contract) -> None:
    if cfg.head_dim is not None:
        allowed = _field(c, "head_dims", "head_dim")
        if allowed is not None and cfg.head_dim not in tuple(allowed if isinstance(allowed, tuple) else (allowed,)):
            raise UnsupportedConfigError(f"head_dim {cfg.head_dim} not covered by {c.id} (allowed {list(allowed)})")
    if cfg.page_size is not None:
        allowed = _field(c, "page_sizes", "page_size")
        if allowed is not None and cfg.page_size not in tuple(allowed if isinstance(allowed, tuple) else (allowed,)):
            raise UnsupportedConfigError(f"page_size {cfg.page_size} not covered by {c.id} (allowed {list(allowed)})")


register_validator("attention", _validate_attention)


@dataclasses.dataclass(frozen=True)
class StrictConfig:
    """What a run asks for. ``contracts`` overrides entries of ``DEFAULT_CONTRACTS``."""

    dtype: str = "bfloat16"
    head_dim: int | None = None
    page_size: int | None = None
    tp: int = 1
    cp: int = 1
    ops: tuple[str, ...] = tuple(DEFAULT_CONTRACTS)
    contracts: Mapping[str, str] = dataclasses.field(default_factory=dict)
    graph_buckets: tuple[int, ...] = ()
    diag_dir: str | None = None


@dataclasses.dataclass
class ExecutionPlan:
    """A validated plan: the contract ID per op, the weight generation, where diagnostics go."""

    config: StrictConfig
    contracts: dict[str, str]
    weight_generation: int = 0
    diag_dir: str = "rlk_diagnostics"

    def contract(self, op: str) -> contracts.Contract:
        if op not in self.contracts:
            raise UnsupportedConfigError(f"op {op!r} is not part of this strict plan")
        return contracts.get(self.contracts[op])

    def bump_weight_generation(self) -> int:
        """Called when weights are updated; plans keyed by the old generation become stale."""
        self.weight_generation += 1
        return self.weight_generation

    def check_generation(self, generation: int) -> None:
        if generation != self.weight_generation:
            raise ProvenanceError(
                f"stale weight generation {generation} (plan is at {self.weight_generation}); rebuild"
            )

    def check_peer(self, peer_contracts: Mapping[str, str], peer_name: str = "peer") -> None:
        """The other engine (or rank) must use the same contract for every shared op."""
        shared = {op: self.contracts[op] for op in self.contracts if op in peer_contracts}
        contracts.require_same(shared, {op: peer_contracts[op] for op in shared}, ("this", peer_name))

    def verify_equal(self, actual, expected, what: str) -> None:
        """Bitwise check; on failure writes a diagnostic JSON and raises ExactnessError."""
        from rlk.testing import assert_bitwise_equal

        try:
            assert_bitwise_equal(actual, expected, what)
        except ExactnessError as e:
            path = self.write_diagnostic(what, {"error": str(e)})
            raise ExactnessError(f"{e} (diagnostic: {path})") from None

    def write_diagnostic(self, what: str, payload: Mapping[str, Any]) -> str:
        os.makedirs(self.diag_dir, exist_ok=True)
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in what)[:80]
        path = os.path.join(self.diag_dir, f"{safe}.json")
        body = {"what": what, "contracts": self.contracts, "weight_generation": self.weight_generation}
        body.update(payload)
        with open(path, "w") as f:
            json.dump(body, f, indent=2, default=str)
        return path


def build_plan(config: StrictConfig, load: bool = True) -> ExecutionPlan:
    """Validates ``config`` against the registered contracts; raises, never degrades."""
    if load:
        contracts.load_all()
    if config.dtype not in SUPPORTED_DTYPES:
        raise UnsupportedConfigError(f"dtype {config.dtype!r} not supported in strict mode ({SUPPORTED_DTYPES})")
    for name, v in (("tp", config.tp), ("cp", config.cp)):
        if not isinstance(v, int) or v < 1:
            raise UnsupportedConfigError(f"{name} must be a positive int, got {v!r}")
    unknown_ops = [op for op in config.contracts if op not in DEFAULT_CONTRACTS]
    if unknown_ops:
        raise UnsupportedConfigError(f"unknown ops in contracts override: {unknown_ops}")
    chosen = {}
    for op in config.ops:
        if op not in DEFAULT_CONTRACTS:
            raise UnsupportedConfigError(f"unknown op {op!r}")
        cid = config.contracts.get(op, DEFAULT_CONTRACTS[op])
        c = contracts.get(cid)  # ContractMismatchError for unknown IDs
        expected_family = DEFAULT_CONTRACTS[op].split(".", 1)[0]
        if c.op != expected_family:
            raise ContractMismatchError(f"contract {cid} is a {c.op!r} contract, not one for op {op!r}")
        v = _VALIDATORS.get(op)
        if v is not None:
            v(config, c)
        chosen[op] = cid
    env_problems = determinism.validate()
    if env_problems:
        raise UnsupportedConfigError("environment contradicts strict mode: " + "; ".join(env_problems))
    return ExecutionPlan(config=config, contracts=chosen, diag_dir=config.diag_dir or "rlk_diagnostics")


_LOCAL = threading.local()


def current_plan() -> ExecutionPlan | None:
    """The plan of the innermost active ``strict_mode``, or None when strict mode is off."""
    stack = getattr(_LOCAL, "stack", [])
    return stack[-1] if stack else None


@contextlib.contextmanager
def strict_mode(config: StrictConfig | None = None, load: bool = True):
    """Builds and activates an :class:`ExecutionPlan` for the enclosed code."""
    plan = build_plan(config or StrictConfig(), load=load)
    stack = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    stack.append(plan)
    try:
        yield plan
    finally:
        stack.pop()
