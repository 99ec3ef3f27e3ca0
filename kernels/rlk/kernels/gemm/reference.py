"""Reference (the spec) of contracts ``gemm.bf16.v1`` and ``gemm.bf16.v2``. Kernels never import
this module.

Casting contract: x [M, K] and w [N, K] are bf16; every product is exact in fp32/fp64; the kernel
sums in fp32 (K in chunks of 64 ascending, segments of consecutive chunks each summed from zero,
folded in ascending order) and rounds once to bf16 (round-to-nearest-even).

* :func:`reference_fp64` / :func:`reference`: the exact fp64 sum (accuracy tests, any target).
* :func:`reference_segmented`: the contracts' order on the CPU-interpreter target, bit for bit:
  each 64-chunk an exact fp64 sum rounded once to fp32 (what the interpreter's dot computes; the
  GPU's MMA chain inside a chunk is not modelled), ``acc += chunk`` in fp32 inside a segment,
  ``total += acc`` in fp32 across segments. :func:`reference_v2` feeds it v2's segments, derived
  here from the spec (not from ``contract.py``), so a wrong rule in the contract module shows.
"""

from __future__ import annotations

import torch

CHUNK_K = 64
V2_SEG_CHUNKS = 16  # gemm.bf16.v2: segments of 16 chunks (1024 K elements)


def reference_fp64(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` in fp64 on CPU (no rounding): [M, K] x [N, K] -> [M, N] fp64."""
    return x.detach().double().cpu() @ w.detach().double().cpu().T


def reference(x: torch.Tensor, w: torch.Tensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """fp64 product rounded once to ``out_dtype`` (torch's fp64->bf16 cast is RNE)."""
    return reference_fp64(x, w).to(out_dtype)


def reference_segmented(x: torch.Tensor, w: torch.Tensor, split: int, seg_chunks: int,
                        out_dtype=torch.bfloat16) -> torch.Tensor:
    """The interpreter target's bytes of ``x [M, K] @ w [N, K].T`` with ``split`` segments of
    ``seg_chunks`` chunks of 64 -> [M, N] ``out_dtype`` on CPU.

    Reduction order: chunk c = K elements [64c, 64c+64), zero past K (``split * seg_chunks`` may
    pass ceil(K/64): v2's padded chunks, summed like real ones); per chunk an exact fp64 sum
    rounded once to fp32; acc = 0.0, acc += chunk (fp32) per chunk of the segment ascending;
    total = 0.0, total += acc_s (fp32) for s ascending; one RNE rounding to ``out_dtype``.
    Exact for data whose 64 products per chunk span < 2**31 (as the interpreter's fp64 dot).
    """
    M, K = x.shape
    N = w.shape[0]
    if split * seg_chunks * CHUNK_K < K:
        raise ValueError(f"reference_segmented: {split} x {seg_chunks} chunks of 64 do not cover K={K}")
    kp = split * seg_chunks * CHUNK_K
    xp = torch.zeros(M, kp, dtype=torch.float64)
    wp = torch.zeros(N, kp, dtype=torch.float64)
    xp[:, :K] = x.detach().double().cpu()
    wp[:, :K] = w.detach().double().cpu()
    total = torch.zeros(M, N, dtype=torch.float32)
    for s in range(split):
        acc = torch.zeros(M, N, dtype=torch.float32)
        for c in range(s * seg_chunks, (s + 1) * seg_chunks):
            k = slice(c * CHUNK_K, (c + 1) * CHUNK_K)
            acc = acc + (xp[:, k] @ wp[:, k].T).to(torch.float32)
        total = total + acc
    return total.to(out_dtype)


def v2_segments(K: int) -> int:
    """gemm.bf16.v2's segment count, from the spec: ceil(ceil(K/64) / 16)."""
    n_chunks = -(-K // CHUNK_K)
    return -(-n_chunks // V2_SEG_CHUNKS)


def reference_v2(x: torch.Tensor, w: torch.Tensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """gemm.bf16.v2 on the interpreter target, bit for bit (:func:`reference_segmented`)."""
    return reference_segmented(x, w, v2_segments(x.shape[1]), V2_SEG_CHUNKS, out_dtype)


def tolerance(K: int, out_dtype=torch.bfloat16) -> tuple[float, float]:
    """(atol, rtol) of the kernel vs :func:`reference_fp64`, scaled by sum |x||w| per element.

    Error budget: one bf16 rounding (2**-8 relative) plus fp32 accumulation over K terms
    (K * 2**-24 of sum |x_k w_k|).
    """
    rtol = 2.0 ** -8 if out_dtype == torch.bfloat16 else 0.0
    return K * 2.0 ** -24, rtol
