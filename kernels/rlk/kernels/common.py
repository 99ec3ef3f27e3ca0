"""Helpers shared by every strict kernel and launcher.

Triton's CPU interpreter computes bf16 arithmetic wrongly (STACK.md): a bf16 ``tl.dot``
multiplies raw bit patterns, bf16 adds/compares are wrong, and fp32->bf16 casts truncate. bf16
loads, stores and ``.to(tl.float32)`` are exact for normal values; bf16 *subnormals* convert
wrongly in both directions (a 1e-39 load reads as ~4.4e-39; seen by fused_test's scale test), so
subnormal bf16 behaviour is checked on the GPU only. Every strict kernel therefore:
  * upcasts to fp32 right after loading;
  * feeds ``tl.dot`` operands in ``DOT_DTYPE`` (a launcher constexpr: bf16 on GPU, fp32 under
    the interpreter; a bf16 x bf16 product is exact in fp32, so the products agree);
  * rounds fp32 -> bf16 through :func:`round_bf16`, which is RNE on both.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading

import torch
import triton
import triton.language as tl

from rlk.determinism import FP_FUSION, interpreter_active
from rlk.errors import UnsupportedConfigError


def dot_dtype_for(device: torch.device):
    """The ``tl.dot`` operand dtype for bf16 inputs on ``device`` (a launcher constexpr)."""
    return tl.float32 if interpret_flag() or device.type == "cpu" else tl.bfloat16


def launch_options() -> dict:
    """Options every strict launch passes explicitly (never toolchain defaults)."""
    # The interpreter does not accept compiler options; fusion is moot there (numpy arithmetic).
    return {} if interpret_flag() else {"enable_fp_fusion": FP_FUSION}


_INTERPRET: list[bool] = []


def interpret_flag() -> bool:
    """Whether the kernels run under Triton's interpreter: ``TRITON_INTERPRET`` read once, at the
    first launch, and kept (every launch asks several times; an environment read costs ~1.5 us of
    host time). Triton fixes the same choice when each kernel's ``@triton.jit`` runs, at import,
    and rlk.determinism requires the variable to be set before any kernel module is imported."""
    if not _INTERPRET:
        _INTERPRET.append(interpreter_active())
    return _INTERPRET[0]


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for the host side of launches (grids, tile counts), a >= 0, b > 0.
    ``triton.cdiv`` is a Triton constexpr function: ~4 us per host call, this ~0.15."""
    return (a + b - 1) // b


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1; 1 for n <= 1), for launch constexprs on the host
    side. ``triton.next_power_of_2`` is a Triton constexpr function: microseconds per host call."""
    return 1 << max(0, (int(n) - 1).bit_length())


@triton.jit
def round_bf16(x, INTERPRET: tl.constexpr):
    """fp32 -> bf16 with round-to-nearest-even on GPU and under the interpreter.

    On GPU ``x.to(tl.bfloat16)`` is RNE. Under the interpreter the cast truncates, so the RNE
    step is done on the integer bits first (NaN kept NaN; the cast of the rounded value is exact).
    """
    if INTERPRET:
        bits = x.to(tl.uint32, bitcast=True)
        lsb = (bits >> 16) & 1
        rounded = (bits + 0x7FFF + lsb) & 0xFFFF0000
        is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
        bits = tl.where(is_nan, bits | 0x00400000, rounded)
        return bits.to(tl.float32, bitcast=True).to(tl.bfloat16)
    else:
        return x.to(tl.bfloat16)


def check_tensor(name: str, t: torch.Tensor, *, dtype=None, dim=None, device=None, contiguous_last=True):
    """Raises ``UnsupportedConfigError`` with a clear message before any launch.

    On every launch's host path (several calls per launch): each property is read once."""
    if not isinstance(t, torch.Tensor):
        raise UnsupportedConfigError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, (tuple, list)) else (dtype,)
        if t.dtype not in allowed:
            raise UnsupportedConfigError(f"{name}: dtype {t.dtype} not supported (allowed: {list(allowed)})")
    nd = t.dim()
    if dim is not None and nd != dim:
        raise UnsupportedConfigError(f"{name}: expected {dim} dims, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise UnsupportedConfigError(f"{name}: on {t.device}, expected {device}")
    if contiguous_last and nd > 0 and t.stride(-1) != 1 and t.numel() > 0:
        raise UnsupportedConfigError(f"{name}: last dimension must be contiguous (stride {t.stride()})")


# The row ops' value-check mode (rlk.kernels.rowops.launch explains the three). Kept here, not
# in the row ops, so that provenance can read it without importing them.
VALUE_CHECK_MODES = ("device", "host", "off")
# torch's CUDA builds keep CUDA_KERNEL_ASSERT; ROCm builds compile it out unless built otherwise.
DEVICE_ASSERTS = getattr(torch.version, "hip", None) is None


def mode_from(value) -> str:
    """The value-check mode named by ``value``: a mode name, True ("device") or False ("off")."""
    if value is True:
        return "device"
    if value is False:
        return "off"
    if value in VALUE_CHECK_MODES:
        return value
    raise UnsupportedConfigError(f"value checks: {value!r} is not one of {VALUE_CHECK_MODES} (or True / False)")


_VALUE_CHECKS = [mode_from(os.environ.get("RLK_VALUE_CHECKS", "device"))]


def set_value_checks(mode) -> str:
    """``"device"`` (or True), ``"host"`` or ``"off"`` (or False); returns the previous mode."""
    prev, _VALUE_CHECKS[0] = _VALUE_CHECKS[0], mode_from(mode)
    return prev


def value_checks() -> str:
    """The mode set (RLK_VALUE_CHECKS / set_value_checks)."""
    return _VALUE_CHECKS[0]


def effective_value_checks() -> str:
    """The mode GPU tensors get outside capture: "device" is "host" where kernel asserts are
    compiled out (ROCm builds)."""
    return "host" if _VALUE_CHECKS[0] == "device" and not DEVICE_ASSERTS else _VALUE_CHECKS[0]


# Value checks (token ids, positions, block ids, lengths within range). The attention / KV-cache
# launchers read device memory back for them (one host synchronization each) while
# device_value_checks_enabled(); the row ops have their own modes (rowops.launch: "device"
# asserts, "host" read-backs, "off"). host_validated() turns all of them off. Shape, dtype and
# device checks never sync and always run.
_CHECKS = threading.local()


def device_value_checks_enabled() -> bool:
    """False inside :func:`host_validated` (and while a CUDA graph is being captured)."""
    if not getattr(_CHECKS, "on", True):
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def host_validated_active() -> bool:
    """True inside :func:`host_validated` (the caller vouches for every id, position and length)."""
    return not getattr(_CHECKS, "on", True)


@contextlib.contextmanager
def host_validated():
    """Skip the launchers' value checks (host read-backs and device asserts) for the enclosed launches.

    Only for callers that built or validated every id, position, slot and length on the host
    (the replay harness, engine adapters): then the checks would only add one host sync per
    launch. Arithmetic is unchanged; out-of-range values would give NaN rows, wrong gathers or (the
    embedding forward's ``torch.index_select``) a device-side assert, so the caller owns that
    validation. Nests; restores the previous state on exit.
    """
    prev = getattr(_CHECKS, "on", True)
    _CHECKS.on = False
    try:
        yield
    finally:
        _CHECKS.on = prev


class TableOverrides:
    """Temporary per-kind overrides of a launch table, for variant sweeps and tests only::

        OVERRIDES = TableOverrides()
        with OVERRIDES.use("prefill", BLOCK_M=64): ...
        entry = OVERRIDES.apply("prefill", table_entry)  # a copy with the active overrides

    Nests; restores the previous state on exit. Never used by production launches' callers.
    """

    def __init__(self):
        self.active: dict = {}

    @contextlib.contextmanager
    def use(self, kind: str, **values):
        old = self.active.get(kind)
        self.active[kind] = {**(old or {}), **values}
        try:
            yield
        finally:
            if old is None:
                self.active.pop(kind, None)
            else:
                self.active[kind] = old

    def apply(self, kind: str, entry: dict) -> dict:
        return {**entry, **self.active.get(kind, {})}


_CAPABILITY: dict[int, tuple[int, int]] = {}
_SMS: dict[int, int] = {}


def device_capability(device: torch.device) -> tuple[int, int]:
    """``torch.cuda.get_device_capability`` memoized per device index (it costs microseconds of
    host time per call, and every launcher asks for its table on every call)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    cap = _CAPABILITY.get(idx)
    if cap is None:
        cap = _CAPABILITY[idx] = tuple(torch.cuda.get_device_capability(idx))
    return cap


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors (compute units) of a GPU, memoized per device index: the one SM
    count every launcher sizes one-wave and persistent grids by (a property read per launch costs
    host time). Never part of a contract: no reduction is split by it."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    n = _SMS.get(idx)
    if n is None:
        n = _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n


# --- architectures and schedule tables ----------------------------------------------------------
# Every op picks its tables the same way. arch_of names the table architecture of a device; a CPU
# tensor, or any tensor while TRITON_INTERPRET=1, runs under Triton's interpreter as arch
# ``cpu-interpreter``. Which table that arch reads is the op's CPU-table choice, stated in its
# schedule: gemm and rowops read their sm_90 table (the same code paths and reduction trees),
# attention and linear_logp keep interpreter-sized tables of their own (linear_logp's block sizes
# are bit fields of logp.v2, so its CPU table is part of the contract).
CPU_ARCH = "cpu-interpreter"
TABLE_FILES = {"sm_90": "sm90.json", "gfx942": "gfx942.json"}
_KERNELS_DIR = os.path.dirname(os.path.abspath(__file__))


def arch_of(device: torch.device) -> str:
    """``cpu-interpreter`` (CPU, or the interpreter), ``gfx942`` (ROCm) or ``sm_90``; any other
    device raises: no table and no invariance evidence exist for it."""
    if device.type == "cpu" or interpret_flag():
        return CPU_ARCH
    if device.type != "cuda":
        raise UnsupportedConfigError(f"rlk kernels: device type {device.type!r} not supported")
    if getattr(torch.version, "hip", None):
        return "gfx942"
    major, minor = device_capability(device)
    if (major, minor) != (9, 0):
        raise UnsupportedConfigError(f"rlk kernels: sm_{major}{minor} has no schedule table (sm_90 measured; "
                                     "add a table and invariance evidence first)")
    return "sm_90"


def table_path(op: str, arch: str) -> str:
    """The checked-in table of ``op`` for a GPU ``arch``: ``kernels/rlk/kernels/<op>/configs/``."""
    if arch not in TABLE_FILES:
        raise UnsupportedConfigError(f"{op}: no config table for arch {arch!r} (have {sorted(TABLE_FILES)})")
    return os.path.join(_KERNELS_DIR, op, "configs", TABLE_FILES[arch])


@functools.lru_cache(maxsize=None)
def load_table(op: str, arch: str) -> dict:
    """``op``'s table for ``arch``, read once per process and shared: callers read it, never
    change it (overrides copy)."""
    with open(table_path(op, arch)) as f:
        return json.load(f)

