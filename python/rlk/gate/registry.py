"""Ladder checks registered by the code that implements them.

A module that implements a ladder level registers a check function::

    from rlk.gate.registry import CheckResult, register_check

    @register_check("L4", "replay.tiny", profiles=("cpu",))
    def replay_tiny(ctx) -> CheckResult:
        ...
        return CheckResult(passed=mismatches == 0, detail="mismatch_count=0 over 1234 elements",
                           metrics={"mismatch_count": 0})

``ctx`` is a :class:`GateContext` (profile name, output folder, a progress callback). A check
that raises fails with the exception text; a check never reports success for work it did not do.
Modules holding checks are listed in ``CHECK_MODULES`` and imported by the gate; an import error
there fails the gate.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

LEVELS = ("L0", "L1", "L2", "L3", "L4", "L5", "L6")
PROFILES = ("cpu", "h200", "mi300x-8")

# Which levels each profile must run. A required level with no registered check is reported
# MISSING and fails the gate.
REQUIRED_LEVELS = {
    "cpu": ("L0", "L1", "L2", "L3", "L4", "L5"),
    "h200": ("L0", "L1", "L2", "L4", "L5"),
    "mi300x-8": LEVELS,
}

# Why a profile does not run a level (every level a profile leaves out is listed, with its reason;
# reports print these so that "0 missing" is never read as "every level ran").
NOT_RUN = {
    "cpu": {"L6": "needs an 8-GPU node: the 200-step release run is profile mi300x-8's"},
    "h200": {"L3": "one GPU is lent: multi-rank collectives run on gloo in profile cpu (multi-GPU: mi300x-8)",
             "L6": "needs an 8-GPU node: the 200-step release run is profile mi300x-8's"},
    "mi300x-8": {},
}

# Modules that register checks; import failures fail the gate.
CHECK_MODULES = [
    "rlk.gate.l0_checks",
    "rlk.replay.checks",
    "rlk.collectives.checks",
    "rlk.integrations.production.checks",
    "rlk.rl.checks",
]


@dataclasses.dataclass
class CheckResult:
    passed: bool
    detail: str = ""
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class GateContext:
    profile: str
    out_dir: str
    progress: Callable[[str], None] = print


@dataclasses.dataclass(frozen=True)
class Check:
    level: str
    name: str
    fn: Callable[[GateContext], CheckResult]
    profiles: tuple[str, ...]


_CHECKS: dict[str, Check] = {}


def register_check(level: str, name: str, profiles=("cpu",)):
    if level not in LEVELS:
        raise ValueError(f"unknown ladder level {level!r}")
    for p in profiles:
        if p not in PROFILES:
            raise ValueError(f"unknown profile {p!r}")

    def deco(fn):
        key = f"{level}:{name}"
        if key in _CHECKS and _CHECKS[key].fn is not fn:
            raise ValueError(f"check {key} registered twice")
        _CHECKS[key] = Check(level, name, fn, tuple(profiles))
        return fn

    return deco


def checks_for(profile: str) -> list[Check]:
    return sorted((c for c in _CHECKS.values() if profile in c.profiles), key=lambda c: (c.level, c.name))
