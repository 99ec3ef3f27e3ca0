"""Host side of the strict row ops: input checks, config lookup, grid, launch.

Every function raises :class:`rlk.errors.UnsupportedConfigError` before launching on bad input.
Tile sizes come from ``config.norm_config(H)`` / the table, never from the number of rows.
Contracts: ``rmsnorm.v1``, ``rope.v1``, ``swiglu.v1``, ``embedding.v1`` (see ``contract.py``).
"""

from __future__ import annotations

import math

import torch

from rlk.errors import UnsupportedConfigError
from rlk.kernels import common
from rlk.kernels.common import arch_of, cdiv, check_tensor, interpret_flag, launch_options, next_pow2
from rlk.kernels.launcher import launch
from rlk.kernels.rowops import schedule
from rlk.kernels.rowops import kernel as K

ACT_DTYPES = (torch.bfloat16, torch.float32)


_TABLE_BY_INDEX: dict[int, dict] = {}


def _table_of(t: torch.Tensor) -> dict:
    """``schedule.table(arch_of(t.device))`` memoized by device index (``t.device`` builds a Python
    object and arch_of asks for the capability: ~1 us of host time per launch saved)."""
    tab = _TABLE_BY_INDEX.get(t.get_device())
    if tab is None:
        tab = _TABLE_BY_INDEX[t.get_device()] = schedule.table(arch_of(t.device))
    return tab


# Value checks: token ids and positions within their table. Three modes (RLK_VALUE_CHECKS sets
# the first; set_value_checks changes it):
#   "device" (default): on a GPU nothing is read back; an out-of-range value fails the stream with
#       a device-side assert (the call returns at once, the error surfaces at a later CUDA call and
#       the CUDA context is lost), as torch's native embedding does: the kernel of one
#       torch.index_select asserts each index in bounds (the embedding's own copy; for RoPE, one
#       gather from an n-byte scratch row at the positions). It compares the index as a 32-bit
#       value when the tensors allow 32-bit indexing, so an int64 value at or beyond 2**32 in
#       magnitude can alias a valid one: the embedding then copies that row (torch's F.embedding
#       has the same gap; int32 ids or "host" mode close it); RoPE's kernel still writes a NaN
#       row (it compares in int64). Also inside CUDA-graph capture (the assert is captured).
#       Only where torch's kernel asserts are compiled in: CUDA builds. ROCm builds leave them
#       out by default, so there "device" is "host" (and, during capture, "off").
#   "host": (min, max) are read back and UnsupportedConfigError names the bad values: one host
#       synchronization per call on a GPU (while a graph is captured the device check runs
#       instead). For debugging a device-side assert: RLK_VALUE_CHECKS=host.
#   "off": no test; the kernels write NaN rows for out-of-range ids / positions (visible, never a
#       silent fix) and the embedding takes its Triton kernel.
# On the CPU "device" and "host" are the same host check (reading a CPU tensor costs no sync).
# The embedding backward synchronizes anyway (unique_consecutive's output size), so it always
# checks the sorted ids on the host, in every mode. Inside common.host_validated() no value check
# runs: the caller vouches for every value.
# The mode itself lives in rlk.kernels.common (provenance reads it without importing the row ops).
set_value_checks, value_checks, effective_value_checks = (
    common.set_value_checks, common.value_checks, common.effective_value_checks)


def _check_mode(t) -> str:
    """How the values of ``t`` are checked by this call: "host" (read back), "device" (asserted
    on the device) or "off" (not checked: the kernels' NaN rows)."""
    mode = common.value_checks()
    if mode == "off" or common.host_validated_active():
        return "off"
    if not t.is_cuda:
        return "host"
    if torch.cuda.is_current_stream_capturing():
        return "device" if common.DEVICE_ASSERTS else "off"
    return "device" if mode == "device" and common.DEVICE_ASSERTS else "host"


def _span(t: torch.Tensor) -> tuple[int, int]:
    """(min, max) of an integer tensor with one kernel and one device read."""
    lo, hi = torch.aminmax(t)
    return tuple(int(v) for v in torch.stack((lo, hi)).tolist())


def _assert_in_range_on_device(t: torch.Tensor, n: int) -> None:
    """Fail the stream (device-side assert) if a value of ``t`` lies outside [0, n); reads nothing
    back. One launch: ``torch.index_select`` from an n-byte scratch row at ``t`` (its kernel
    asserts each index, as a 32-bit value when 32-bit indexing applies: see the comment above; the
    bytes are never looked at; on the CPU it raises IndexError)."""
    torch.index_select(torch.empty(n, dtype=torch.uint8, device=t.device), 0, t)


def _check_same_device(**tensors) -> None:
    devs = {n: t.device for n, t in tensors.items() if t is not None}
    if len(set(devs.values())) > 1:
        raise UnsupportedConfigError(f"rowops: tensors on different devices: {devs}")


def _check_eps(eps) -> float:
    if not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise UnsupportedConfigError(f"rms_norm: eps must be a finite float >= 0, got {eps!r}")
    return float(eps)


def _rows_view(x: torch.Tensor, name: str):
    """(n_rows, NH, H, stride_t, stride_h) of a [T, H] or [T, nh, D] tensor, last dim contiguous."""
    check_tensor(name, x, dtype=ACT_DTYPES)
    if x.dim() == 2:
        return x.shape[0], 1, x.shape[1], x.stride(0), 0
    if x.dim() == 3:
        return x.shape[0] * x.shape[1], x.shape[1], x.shape[2], x.stride(0), x.stride(1)
    raise UnsupportedConfigError(f"{name}: expected [T, H] or [T, nh, D], got shape {tuple(x.shape)}")


def _check_weight(weight: torch.Tensor, H: int, x: torch.Tensor) -> None:
    check_tensor("weight", weight, dtype=ACT_DTYPES, dim=1)
    if weight.shape[0] != H:
        raise UnsupportedConfigError(f"weight: {weight.shape[0]} elements, the rows have {H}")
    _check_same_device(x=x, weight=weight)


def _norm_fwd(x, weight, eps, residual=None):
    n_rows, nh, H, s_t, s_h = _rows_view(x, "x")
    _check_weight(weight, H, x)
    eps = _check_eps(eps)
    cfg = schedule.norm_config(H, arch_of(x.device))
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out, r, s_r = y, x, 0
    if residual is not None:
        check_tensor("residual", residual, dtype=ACT_DTYPES, dim=2)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise UnsupportedConfigError(
                f"residual: {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}")
        _check_same_device(x=x, residual=residual)
        res_out, r, s_r = torch.empty_like(y), residual, residual.stride(0)
    if n_rows == 0:
        return y, res_out
    grid = (cdiv(n_rows, cfg["BLOCK_ROWS"]),)
    launch(K.rmsnorm_fwd_kernel, grid,
        y, res_out, x, r, weight, n_rows, nh, s_t, s_h, s_r, float(H), eps,
        H=H, BLOCK_H=cfg["BLOCK_H"], BLOCK_ROWS=cfg["BLOCK_ROWS"], HAS_RESIDUAL=residual is not None,
        OUT_BF16=x.dtype == torch.bfloat16, INTERPRET=interpret_flag(),
        num_warps=cfg["num_warps"], **launch_options())
    return y, res_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of rows. x [T, H] bf16/fp32, weight [H] -> [T, H] (x dtype). Contract rmsnorm.v1."""
    if x.dim() != 2:
        raise UnsupportedConfigError(f"rms_norm: x must be [T, H], got {tuple(x.shape)}")
    return _norm_fwd(x, weight, eps)[0]


def add_rms_norm(x, residual, weight, eps):
    """(normed, new_residual), new_residual = round(x + residual); normed = rms_norm(new_residual)."""
    if x.dim() != 2:
        raise UnsupportedConfigError(f"add_rms_norm: x must be [T, H], got {tuple(x.shape)}")
    return _norm_fwd(x, weight, eps, residual=residual)


def qk_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of x [T, nh, D] (strided token/head dims allowed) -> contiguous."""
    if x.dim() != 3:
        raise UnsupportedConfigError(f"qk_norm: x must be [T, nh, D], got {tuple(x.shape)}")
    return _norm_fwd(x, weight, eps)[0]


def rms_norm_backward(dy, x, weight, eps, d_residual=None):
    """(dx, dw) of ``rms_norm``/``qk_norm`` (x: the normalized input, i.e. the new residual of
    the fused form). With ``d_residual`` (grad of the fused residual output) it is added to dx
    after dx's own rounding. dw has weight's dtype; fixed-order reduction, no atomics."""
    n_rows, nh, H, s_t, s_h = _rows_view(x, "x")
    _check_weight(weight, H, x)
    eps = _check_eps(eps)
    if tuple(dy.shape) != tuple(x.shape) or dy.dtype != x.dtype:
        raise UnsupportedConfigError(f"dy: {tuple(dy.shape)} {dy.dtype} must match x {tuple(x.shape)} {x.dtype}")
    dy = dy.contiguous()
    if d_residual is not None:
        if tuple(d_residual.shape) != tuple(x.shape) or d_residual.dtype != x.dtype:
            raise UnsupportedConfigError("d_residual must match x in shape and dtype")
        d_residual = d_residual.contiguous()
    arch = arch_of(x.device)
    cfg = schedule.norm_config(H, arch)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows_per_prog = cfg["BLOCK_ROWS"] * cfg["BWD_TILES"]
    n_parts = max(1, cdiv(n_rows, rows_per_prog))
    parts = torch.zeros((n_parts, H), dtype=torch.float32, device=x.device)
    bf16 = x.dtype == torch.bfloat16
    if n_rows > 0:
        launch(K.rmsnorm_bwd_kernel, (n_parts,),
            dx, parts, dy, x, weight, d_residual if d_residual is not None else dy,
            n_rows, nh, s_t, s_h, float(H), eps,
            H=H, BLOCK_H=cfg["BLOCK_H"], BLOCK_ROWS=cfg["BLOCK_ROWS"], BWD_TILES=cfg["BWD_TILES"],
            HAS_DRES=d_residual is not None, OUT_BF16=bf16, INTERPRET=interpret_flag(),
            num_warps=cfg["num_warps"], **launch_options())
    dw = fold_partials(parts, weight.dtype, arch)
    return dx, dw


def fold_partials(parts: torch.Tensor, dtype: torch.dtype, arch: str) -> torch.Tensor:
    """sum(parts [n, H] fp32, dim 0) in the fixed order of ``fold_partials_kernel``."""
    n, H = parts.shape
    fold = schedule.table(arch)["fold"]
    block_f = min(fold["BLOCK_F"], next_pow2(H))
    out = torch.empty((H,), dtype=dtype, device=parts.device)
    launch(K.fold_partials_kernel, (cdiv(H, block_f),),
        out, parts, n, H=H, BLOCK_F=block_f, FOLD_ROWS=fold["FOLD_ROWS"],
        OUT_BF16=dtype == torch.bfloat16, INTERPRET=interpret_flag(),
        num_warps=fold["num_warps"], **launch_options())
    return out


# -------------------------------------------------------------------------------------- RoPE
_ROPE_CACHE: dict = {}


def rope_table(max_positions: int, head_dim: int, theta: float, device=None):
    """(cos, sin), each [max_positions, head_dim // 2] fp32, by the fixed recipe of rope.v1:
    computed on the CPU in fp64 (inv_freq = 1 / theta ** (arange(0, D, 2) / D); angle =
    position * inv_freq; cos, sin), then one RNE cast to fp32, then copied to ``device``."""
    if not (isinstance(max_positions, int) and max_positions > 0):
        raise UnsupportedConfigError(f"rope_table: max_positions must be a positive int, got {max_positions!r}")
    if not (isinstance(head_dim, int) and head_dim > 0 and head_dim % 2 == 0):
        raise UnsupportedConfigError(f"rope_table: head_dim must be a positive even int, got {head_dim!r}")
    if not (isinstance(theta, (int, float)) and math.isfinite(theta) and theta > 0):
        raise UnsupportedConfigError(f"rope_table: theta must be a positive finite number, got {theta!r}")
    key = (max_positions, head_dim, float(theta))
    if key not in _ROPE_CACHE:
        inv_freq = 1.0 / (float(theta) ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        angle = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        _ROPE_CACHE[key] = (angle.cos().to(torch.float32), angle.sin().to(torch.float32))
    cos, sin = _ROPE_CACHE[key]
    dev = torch.device(device) if device is not None else torch.device("cpu")
    return cos.to(dev, copy=True), sin.to(dev, copy=True)


def _rope_inputs(what, x, positions, cos, sin):
    """Checks shared by the RoPE launchers (x [T, nh, D], positions [T], cos/sin [max_pos, D/2]
    fp32 contiguous, positions in the table by the value-check mode). Returns (positions
    contiguous, max_pos)."""
    check_tensor("x", x, dtype=ACT_DTYPES, dim=3)
    check_tensor("positions", positions, dtype=(torch.int64, torch.int32), dim=1)
    check_tensor("cos", cos, dtype=torch.float32, dim=2)
    check_tensor("sin", sin, dtype=torch.float32, dim=2)
    T, nh, D = x.shape
    if D % 2:
        raise UnsupportedConfigError(f"{what}: head_dim {D} must be even")
    if positions.shape[0] != T:
        raise UnsupportedConfigError(f"positions: {positions.shape[0]} entries for {T} tokens")
    if cos.shape != sin.shape or cos.shape[1] != D // 2 or not cos.is_contiguous() or not sin.is_contiguous():
        raise UnsupportedConfigError(
            f"cos/sin: contiguous [max_pos, {D // 2}] expected, got {tuple(cos.shape)}, {tuple(sin.shape)}")
    _check_same_device(x=x, positions=positions, cos=cos, sin=sin)
    max_pos = cos.shape[0]
    positions = positions.contiguous()
    mode = _check_mode(positions) if T else "off"
    if mode == "host":
        lo, hi = _span(positions)
        if lo < 0 or hi >= max_pos:
            raise UnsupportedConfigError(f"{what}: positions span [{lo}, {hi}], table holds [0, {max_pos})")
    elif mode == "device":
        _assert_in_range_on_device(positions, max_pos)
    return positions, max_pos


def apply_rope(x, positions, cos, sin, backward: bool = False):
    """Rotate-half RoPE. x [T, nh, D] (strided T/nh allowed), positions [T] int64, cos/sin
    [max_pos, D/2] fp32 -> contiguous [T, nh, D]. ``backward`` applies the inverse rotation."""
    positions, max_pos = _rope_inputs("apply_rope", x, positions, cos, sin)
    T, nh, D = x.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if T == 0 or nh == 0:
        return out
    cfg = _table_of(x)["rope"]
    bhalf = next_pow2(D // 2)
    br = max(1, cfg["TILE_ELEMS"] // bhalf)
    n_rows = T * nh
    launch(K.rope_kernel, (cdiv(n_rows, br),),
        out, x, positions, cos, sin, n_rows, nh, x.stride(0), x.stride(1), max_pos,
        HALF=D // 2, BLOCK_HALF=bhalf, BLOCK_ROWS=br, BACKWARD=bool(backward),
        OUT_BF16=x.dtype == torch.bfloat16, INTERPRET=interpret_flag(),
        num_warps=cfg["num_warps"], **launch_options())
    return out


def qk_norm_rope(x, q_weight, k_weight, eps, n_q_heads, positions, cos, sin):
    """QK-norm then RoPE of the q and k heads of a fused QKV output, one launch, no autograd.

    Args: x [T, Hq + Hk, D] (strided token/head dims allowed: the ``[:, :q_size + kv_size]``
      columns of a fused QKV output viewed as heads); q_weight, k_weight [D]; eps; n_q_heads =
      Hq; positions [T] int64/int32; cos/sin [max_pos, D/2] fp32 (``rope_table``).
    Returns: (q [T, Hq, D], k [T, Hk, D]), contiguous.
    Determinism: byte-identical to ``apply_rope(qk_norm(x[:, :Hq], q_weight), ...)`` and the same
    for k (contracts ``rmsnorm.v1`` then ``rope.v1``; same tile, reduction and roundings).
    """
    positions, max_pos = _rope_inputs("qk_norm_rope", x, positions, cos, sin)
    T, nh, D = x.shape
    nq = int(n_q_heads)
    if not 0 < nq < nh:
        raise UnsupportedConfigError(f"qk_norm_rope: n_q_heads {nq} must lie in (0, {nh}) (x holds q and k heads)")
    if x.stride(2) != 1:
        raise UnsupportedConfigError("qk_norm_rope: x's last dim must be contiguous")
    _check_weight(q_weight, D, x)
    _check_weight(k_weight, D, x)
    eps = _check_eps(eps)
    q = torch.empty((T, nq, D), dtype=x.dtype, device=x.device)
    k = torch.empty((T, nh - nq, D), dtype=x.dtype, device=x.device)
    n_rows = T * nh
    if n_rows == 0:
        return q, k
    cfg = schedule.qk_norm_rope_config(D, arch_of(x.device))  # the norm's per-row reduction tree
    launch(K.qk_norm_rope_kernel, (cdiv(n_rows, cfg["BLOCK_ROWS"]),),
        q, k, x, q_weight, k_weight, positions, cos, sin, n_rows, nq, nh, x.stride(0), x.stride(1),
        float(D), eps, max_pos,
        H=D, HALF=D // 2, BLOCK_H=cfg["BLOCK_H"], BLOCK_ROWS=cfg["BLOCK_ROWS"],
        OUT_BF16=x.dtype == torch.bfloat16, INTERPRET=interpret_flag(),
        num_warps=cfg["num_warps"], **launch_options())
    return q, k


# ------------------------------------------------------------------------------------ SwiGLU
def _swiglu_checks(gate_up):
    check_tensor("gate_up", gate_up, dtype=ACT_DTYPES, dim=2)
    if gate_up.shape[1] % 2:
        raise UnsupportedConfigError(f"swiglu: gate_up last dim {gate_up.shape[1]} must be even ([gate | up])")
    return gate_up.shape[0], gate_up.shape[1] // 2


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up. gate_up [T, 2F] (gate = [:, :F]) -> [T, F]. Contract swiglu.v1."""
    T, F = _swiglu_checks(gate_up)
    y = gate_up.new_empty((T, F))
    if T and F:
        cfg = _table_of(gate_up)["swiglu"]
        launch(K.swiglu_fwd_kernel, (cdiv(T * F, cfg["BLOCK"]),),
            y, gate_up, T * F, F, gate_up.stride(0), BLOCK=cfg["BLOCK"],
            OUT_BF16=gate_up.dtype == torch.bfloat16, INTERPRET=interpret_flag(),
            num_warps=cfg["num_warps"], **launch_options())
    return y


def swiglu_backward(dy: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """d(gate_up) [T, 2F] of ``swiglu`` given dy [T, F]."""
    T, F = _swiglu_checks(gate_up)
    if tuple(dy.shape) != (T, F) or dy.dtype != gate_up.dtype:
        raise UnsupportedConfigError(f"dy: {tuple(dy.shape)} {dy.dtype}, expected ({T}, {F}) {gate_up.dtype}")
    dy = dy.contiguous()
    dgu = gate_up.new_empty((T, 2 * F))
    if T and F:
        cfg = _table_of(gate_up)["swiglu"]
        launch(K.swiglu_bwd_kernel, (cdiv(T * F, cfg["BLOCK"]),),
            dgu, dy, gate_up, T * F, F, gate_up.stride(0), BLOCK=cfg["BLOCK"],
            OUT_BF16=gate_up.dtype == torch.bfloat16, INTERPRET=interpret_flag(),
            num_warps=cfg["num_warps"], **launch_options())
    return dgu


# --------------------------------------------------------------------------------- Embedding
_EMB_DTYPES = (torch.bfloat16, torch.float32, torch.float16)
_ID_DTYPES = (torch.int64, torch.int32)


def _ids_checks(ids, V, copy_asserts):
    """(contiguous ids, in_range): ``in_range`` is True when no out-of-range id can pass silently:
    read back here ("host" mode: one device read on a GPU), vouched for by ``host_validated()``, or
    guarded on the device ("device" mode): by ``torch.index_select``'s own bounds assert when the
    caller copies with it (``copy_asserts``), else by :func:`_assert_in_range_on_device`. False
    when unchecked (the kernel writes NaN rows for bad ids)."""
    check_tensor("ids", ids, dtype=_ID_DTYPES, dim=1)
    ids = ids.contiguous()
    if ids.numel() == 0:
        return ids, True
    mode = _check_mode(ids)
    if mode == "host":
        _raise_if_ids_outside("embedding", ids, V, *_span(ids))
    elif mode == "device" and not copy_asserts:
        _assert_in_range_on_device(ids, V)
    return ids, mode != "off" or common.host_validated_active()


def _raise_if_ids_outside(what, ids, V, lo, hi) -> None:
    """UnsupportedConfigError naming up to four ids outside [0, V), given their span [lo, hi]."""
    if lo < 0 or hi >= V:
        bad = ids[(ids < 0) | (ids >= V)][:4].tolist()
        raise UnsupportedConfigError(f"{what}: ids out of range [0, {V}): e.g. {bad} (span [{lo}, {hi}])")


def _device_copy_route(ids) -> bool:
    """Whether value checks are "device" on a GPU with kernel asserts (index_select then asserts
    bad ids itself). A function so that CPU tests can drive the short route."""
    return common.value_checks() == "device" and common.DEVICE_ASSERTS and ids.is_cuda


def _copy_route_short(ids, weight) -> bool:
    """Whether :func:`embedding` may go straight to index_select: the caller vouches
    (``host_validated()``) or "device" checks on a GPU (index_select asserts bad ids itself), and
    the inputs are what the full checks accept (rowops_test checks it rejects what they reject).
    The device's arch was accepted by an earlier call's full checks (``_embedding_copy``)."""
    if not (isinstance(weight, torch.Tensor) and isinstance(ids, torch.Tensor)):
        return False
    if not (common.host_validated_active() or _device_copy_route(ids)):
        return False
    return (weight.dtype in _EMB_DTYPES and ids.dtype in _ID_DTYPES and weight.dim() == 2 and ids.dim() == 1
            and weight.stride()[1] == 1 and ids.stride()[0] == 1 and ids.is_cuda == weight.is_cuda
            and ids.get_device() == weight.get_device() and weight.get_device() in _TABLE_BY_INDEX)


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """weight[ids]: ids [T] int64 (int32 accepted), weight [V, H] -> [T, H] (exact copy).
    Contract embedding.v1.

    Two routes. When no out-of-range id can pass silently (value checks "device" on a GPU: the
    copy's own bounds assert; "host": read back here; or the caller is inside ``host_validated()``)
    the copy is ``torch.index_select``: ATen's launch costs a fraction of a Triton launch's host
    time, which is all an eager embedding costs (docs/results/h200_2026-12-01_session5/README.md).
    With value checks "off" it is :func:`embedding_kernel`, which writes a NaN row for an
    out-of-range id. Both copy every non-NaN element's bytes; a NaN element may leave the kernel
    with another NaN payload (it passes through fp32). A bad id on the copy route fails as
    index_select does: a device-side assert on GPU, an IndexError on CPU (only inside
    ``host_validated()`` there: otherwise the host check raises first).
    """
    if _copy_route_short(ids, weight):
        return torch.index_select(weight, 0, ids)
    ids, V, H, in_range = _embedding_checks(ids, weight, copy_asserts=True)
    if in_range:
        return _embedding_copy(ids, weight)
    return _embedding_launch(ids, weight, V, H)


def _embedding_copy(ids, weight):
    _table_of(weight)  # an unsupported device raises on this route too (and is memoized)
    return torch.index_select(weight, 0, ids)


def embedding_kernel(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """:func:`embedding` through ``embedding_fwd_kernel`` whatever the ids' status (same checks;
    a NaN row per out-of-range id when value checks are off). For benchmarks and tests of the
    kernel route; callers use :func:`embedding`."""
    ids, V, H, _ = _embedding_checks(ids, weight, copy_asserts=False)
    return _embedding_launch(ids, weight, V, H)


def _embedding_checks(ids, weight, copy_asserts):
    check_tensor("weight", weight, dtype=_EMB_DTYPES, dim=2)
    _check_same_device(ids=ids, weight=weight)
    V, H = weight.shape
    ids, in_range = _ids_checks(ids, V, copy_asserts)
    return ids, V, H, in_range


def _embedding_launch(ids, weight, V, H):
    y = torch.empty((ids.shape[0], H), dtype=weight.dtype, device=weight.device)
    if ids.shape[0] and H:
        cfg = schedule.entry(arch_of(weight.device), "embedding")
        bh = min(cfg["BLOCK_H"], next_pow2(H))
        bt = max(1, cfg["TILE_ELEMS"] // bh)
        T = ids.shape[0]
        launch(K.embedding_fwd_kernel, (cdiv(T, bt), cdiv(H, bh)),
            y, ids, weight, T, V, H, weight.stride(0), BLOCK_T=bt, BLOCK_H=bh,
            num_warps=cfg["num_warps"], **launch_options())
    return y


def embedding_backward(dy: torch.Tensor, ids: torch.Tensor, num_embeddings: int) -> torch.Tensor:
    """dW [V, H] (dy's dtype): per id, the sum of its tokens' dy rows in ascending token order.

    Synchronizes with the device (``unique_consecutive``'s output size), so its range check always
    reads the smallest and largest sorted id back (UnsupportedConfigError before the launch),
    whatever the value-check mode; inside ``host_validated()`` it is skipped (the kernel writes
    row ``id`` of dW unchecked)."""
    check_tensor("dy", dy, dtype=(torch.bfloat16, torch.float32, torch.float16), dim=2)
    check_tensor("ids", ids, dtype=_ID_DTYPES, dim=1)
    _check_same_device(ids=ids, dy=dy)
    ids = ids.contiguous()
    if dy.shape[0] != ids.shape[0]:
        raise UnsupportedConfigError(f"dy: {dy.shape[0]} rows for {ids.shape[0]} ids")
    dy = dy.contiguous()
    H = dy.shape[1]
    V = int(num_embeddings)
    dw = torch.zeros((V, H), dtype=dy.dtype, device=dy.device)
    if ids.numel() == 0 or H == 0:
        return dw
    sorted_ids, order = torch.sort(ids.to(torch.int64), stable=True)
    uniq, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    if not common.host_validated_active():
        _raise_if_ids_outside("embedding backward", uniq, V, *uniq[[0, -1]].tolist())
    starts = torch.cumsum(counts, 0) - counts
    bh = min(_table_of(dy)["embedding"]["BLOCK_H"], next_pow2(H))
    launch(K.embedding_bwd_kernel, (uniq.shape[0], cdiv(H, bh)),
        dw, dy, order, uniq, starts, counts, H, BLOCK_H=bh,
        OUT_BF16=dy.dtype == torch.bfloat16, INTERPRET=interpret_flag(), num_warps=4, **launch_options())
    return dw
