"""Environment policy of strict mode, in one place.

Nothing else in rlk writes ``os.environ``. ``TRITON_INTERPRET`` must be set before any
``@triton.jit`` decorator runs, so CPU test entry points call :func:`configure_cpu_interpreter`
first (conftest, Bazel test env, the release gate's ``cpu`` profile).
"""

from __future__ import annotations

import os

# Variables strict mode needs, with the value it needs. Checked by validate().
STRICT_ENV = {
    # cuBLAS workspace config makes torch's own deterministic algorithms usable (native arm).
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    # NVLink multicast (NVLS) changes reduction grouping; rlk never uses it.
    "NCCL_NVLS_ENABLE": "0",
}

# Floating-point fusion (FMA contraction) changes rounding. Every strict launch passes it
# explicitly; this is the value every contract in this release pins.
FP_FUSION = False


def interpreter_active() -> bool:
    """True when Triton kernels run under the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def configure_cpu_interpreter() -> None:
    """Turns the Triton CPU interpreter on. Call before importing any kernel module."""
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def apply_strict_env() -> dict[str, str]:
    """Sets the variables of ``STRICT_ENV`` that are unset; returns what it set."""
    changed = {}
    for k, v in STRICT_ENV.items():
        if k not in os.environ:
            os.environ[k] = v
            changed[k] = v
    return changed


def validate() -> list[str]:
    """Variables that contradict strict mode (empty list when all is well)."""
    out = []
    for k, v in STRICT_ENV.items():
        cur = os.environ.get(k)
        if cur is not None and cur != v:
            out.append(f"{k}={cur!r} (strict mode needs {v!r})")
    if os.environ.get("TRITON_DEFAULT_FP_FUSION") not in (None, "", "0" if not FP_FUSION else "1"):
        out.append("TRITON_DEFAULT_FP_FUSION contradicts the pinned fp_fusion")
    return out


def snapshot() -> dict[str, str | None]:
    """The values of every variable that can change bits, for the provenance record."""
    names = sorted(set(STRICT_ENV) | {"TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION", "OMP_NUM_THREADS"})
    return {k: os.environ.get(k) for k in names}
