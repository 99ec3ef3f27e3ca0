"""Environment policy of strict mode, in one place.

Nothing else in rlk writes ``os.environ``. ``TRITON_INTERPRET`` must be set before any
``@triton.jit`` decorator runs, so CPU test entry points call :func:`configure_cpu_interpreter`
first (conftest, Bazel test env, the release gate's ``cpu`` profile).
"""

from __future__ import annotations

import contextlib
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


def configure_cpu_interpreter_without_gpu() -> bool:
    """Turns the CPU interpreter on when no CUDA device is present; returns whether it did.
    Must run before any kernel module is imported (CLIs call it first)."""
    import torch

    if torch.cuda.is_available():
        return False
    configure_cpu_interpreter()
    return True


def single_process_rendezvous_defaults() -> dict[str, str]:
    """env:// rendezvous defaults for a process that starts torch.distributed alone (loopback,
    a free port, rank 0 of 1). Variables already set (a launcher's) are kept; returns what it set."""
    import socket

    wanted = {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1"}
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            wanted["MASTER_PORT"] = str(s.getsockname()[1])
    return export({k: v for k, v in wanted.items() if k not in os.environ})


def export(variables: dict[str, str]) -> dict[str, str]:
    """Sets variables another component needs in this process (engine settings, rendezvous).
    Refuses a value that contradicts ``STRICT_ENV`` or the pinned fp fusion."""
    for k, v in variables.items():
        if k in STRICT_ENV and v != STRICT_ENV[k]:
            raise ValueError(f"{k}={v!r} contradicts strict mode ({STRICT_ENV[k]!r})")
        if k == "TRITON_DEFAULT_FP_FUSION" and v != ("1" if FP_FUSION else "0"):
            raise ValueError(f"{k}={v!r} contradicts the pinned fp_fusion={FP_FUSION}")
    os.environ.update(variables)
    return dict(variables)


def unset(names) -> dict[str, str]:
    """Removes ``names`` from this process's environment (e.g. a baseline engine that must start
    without strict mode's variables); returns the values it removed."""
    return {k: os.environ.pop(k) for k in list(names) if k in os.environ}


@contextlib.contextmanager
def scoped(put: dict[str, str], drop=()):
    """Inside the block ``put`` is exported (:func:`export`'s checks) and ``drop`` unset, for
    processes started there to inherit (a baseline engine's); the previous values come back after."""
    saved = {k: os.environ.get(k) for k in [*put, *drop]}
    try:
        unset(drop)
        export(put)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
