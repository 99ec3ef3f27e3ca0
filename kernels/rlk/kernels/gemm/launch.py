"""Host side of contract ``gemm.bf16.v1``: checks, configuration lookup, grids, launches."""

from __future__ import annotations

import torch

from rlk.errors import UnsupportedConfigError
import triton.language as tl

from rlk.kernels.common import dot_dtype_for, interpret_flag, launch_options
from rlk.kernels.gemm import config as cfgmod
from rlk.kernels.gemm import kernel

_SCHEDULE_KEYS = {
    "decode": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"),
    "prefill": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"),
}


def _check(x: torch.Tensor, w: torch.Tensor, out_dtype) -> None:
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor):
            raise UnsupportedConfigError(f"gemm: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.bfloat16:
            raise UnsupportedConfigError(f"gemm.bf16.v1: {name} dtype {t.dtype} not supported (bf16 only)")
        if t.dim() != 2:
            raise UnsupportedConfigError(f"gemm: {name} must be 2-D, got shape {tuple(t.shape)}")
    if x.device != w.device:
        raise UnsupportedConfigError(f"gemm: x on {x.device} but w on {w.device}")
    if x.shape[1] != w.shape[1]:
        raise UnsupportedConfigError(f"gemm: x {tuple(x.shape)} and w {tuple(w.shape)} disagree on K "
                                     "(expected x [M, K], w [N, K])")
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise UnsupportedConfigError(f"gemm: out_dtype {out_dtype} not supported (bf16 or fp32)")
    if x.device.type == "cpu":
        if not interpret_flag():
            raise UnsupportedConfigError("gemm: CPU tensors need the Triton interpreter (TRITON_INTERPRET=1)")
    elif x.device.type != "cuda":
        raise UnsupportedConfigError(f"gemm: device {x.device} not supported")


def _dot_dtype(device: torch.device):
    """bf16 on GPU. Under the interpreter fp64 rather than common's fp32: numpy's fp32 matmul
    sums a chunk in a block-shape-dependent order, which would break row invariance on CPU only."""
    d = dot_dtype_for(device)
    return tl.float64 if d == tl.float32 else d


def plan(M: int, K: int, N: int, device: torch.device, schedule: str | None = None,
         config: dict | None = None) -> dict:
    """The launch plan: split count (contract), schedule and its parameters (free)."""
    arch = cfgmod.arch_of(device)
    if schedule is None:
        # Bytes do not depend on the schedule (tested), so choosing it from M is allowed.
        schedule = "decode" if M <= cfgmod.decode_max_m(arch) else "prefill"
    cfg = cfgmod.schedule_config(K, N, schedule, arch)
    n_chunks = cfgmod.cdiv(K, cfgmod.CHUNK_K)
    split = cfgmod.split_k(K, N)
    seg_chunks = n_chunks // split
    if config:
        unknown = set(config) - set(_SCHEDULE_KEYS[schedule])
        if unknown:
            raise UnsupportedConfigError(f"gemm: {sorted(unknown)} are not schedule fields of {schedule!r}")
        cfg.update(config)
        if (seg_chunks * cfgmod.CHUNK_K) % cfg["BLOCK_K"]:
            raise UnsupportedConfigError(f"gemm: BLOCK_K={cfg['BLOCK_K']} does not divide the segment "
                                         f"({seg_chunks} chunks of 64)")
    if cfg["BLOCK_K"] % cfgmod.CHUNK_K:
        raise UnsupportedConfigError(f"gemm: BLOCK_K={cfg['BLOCK_K']} is not a multiple of 64")
    if (seg_chunks * cfgmod.CHUNK_K) % cfg["BLOCK_K"] or device.type == "cpu":
        # A function of (K, N) only. Under the interpreter one dot is one exact fp64 chunk sum, so
        # a 128-wide dot would model another arithmetic than the GPU's chained 64-chunks.
        cfg["BLOCK_K"] = cfgmod.CHUNK_K
    return {"arch": arch, "schedule": schedule, "split_k": split, "seg_chunks": seg_chunks, **cfg}


def gemm(x: torch.Tensor, w: torch.Tensor, *, out_dtype: torch.dtype = torch.bfloat16,
         schedule: str | None = None, config: dict | None = None, _handles: list | None = None) -> torch.Tensor:
    """``y = x @ w.T`` under contract ``gemm.bf16.v1``.

    Args:
      x: ``[M, K]`` bf16, any strides (CUDA, or CPU under the Triton interpreter).
      w: ``[N, K]`` bf16 (the nn.Linear layout), any strides; pass ``w.t()`` for ``x @ w``.
      out_dtype: bf16 (one RNE rounding at the store) or fp32 (no rounding; e.g. for dw).
      schedule: ``"decode"`` or ``"prefill"`` to force one (tests, sweeps); None picks by M.
      config: overrides of the schedule's free launch fields (tests, sweeps).

    Returns:
      ``y [M, N]`` contiguous, ``out_dtype``.

    Determinism: contract gemm.bf16.v1: row i of y is byte-identical for any M, row position,
    padding rows, schedule and run (the split count depends on K and N only); no atomics.
    """
    _check(x, w, out_dtype)
    M, K = x.shape
    N = w.shape[0]
    if M == 0 or N == 0:
        return torch.empty((M, N), dtype=out_dtype, device=x.device)
    if K == 0:  # the fold of no segment: total = 0.0
        return torch.zeros((M, N), dtype=out_dtype, device=x.device)
    p = plan(M, K, N, x.device, schedule, config)
    y = torch.empty((M, N), dtype=out_dtype, device=x.device)
    flags = dict(DOT_DTYPE=_dot_dtype(x.device), OUT_FP32=out_dtype == torch.float32,
                 INTERPRET=interpret_flag())
    opts = launch_options()
    cdiv = cfgmod.cdiv
    S, SEG = p["split_k"], p["seg_chunks"]
    handles = []
    with torch.cuda.device(x.device) if x.device.type == "cuda" else _nullctx():
        if p["schedule"] == "decode":
            bm, bn = p["BLOCK_M"], p["BLOCK_N"]
            if cdiv(M, bm) > 65535:
                raise UnsupportedConfigError(f"gemm: decode schedule cannot cover M={M} with BLOCK_M={bm}")
            out = y if S == 1 else torch.empty((S, M, N), dtype=torch.float32, device=x.device)
            if S * M * N >= 2**31:
                raise UnsupportedConfigError(f"gemm: decode workspace {S}x{M}x{N} too large; use prefill")
            grid = (cdiv(N, bn), S, cdiv(M, bm))
            handles.append(kernel.gemm_segment_kernel[grid](
                out, x, w, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                y.stride(0), y.stride(1), M * N,
                SPLIT_K=S, SEG_CHUNKS=SEG, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=p["BLOCK_K"],
                num_warps=p["num_warps"], num_stages=p["num_stages"], **flags, **opts))
            if S > 1:
                f = cfgmod.fold_config(p["arch"])
                fgrid = (cdiv(N, f["BLOCK_N"]), cdiv(M, f["BLOCK_M"]))
                handles.append(kernel.gemm_fold_kernel[fgrid](
                    y, out, M, N, y.stride(0), y.stride(1), M * N,
                    SPLIT_K=S, BLOCK_M=f["BLOCK_M"], BLOCK_N=f["BLOCK_N"], OUT_FP32=flags["OUT_FP32"],
                    INTERPRET=flags["INTERPRET"], num_warps=f["num_warps"], **opts))
        else:
            bm, bn = p["BLOCK_M"], p["BLOCK_N"]
            grid = (cdiv(M, bm) * cdiv(N, bn),)
            handles.append(kernel.gemm_tiled_kernel[grid](
                y, x, w, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                y.stride(0), y.stride(1),
                SPLIT_K=S, SEG_CHUNKS=SEG, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=p["BLOCK_K"],
                GROUP_M=p["GROUP_M"], num_warps=p["num_warps"], num_stages=p["num_stages"],
                **flags, **opts))
    if _handles is not None:
        _handles.extend(handles)
    return y


class _nullctx:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False
