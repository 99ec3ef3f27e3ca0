"""Autograd and ``torch.library`` registration of the strict GEMM (contract ``gemm.bf16.v1``).

Ops (namespace ``rlk``):
  * ``torch.ops.rlk.gemm(x [M, K], w [N, K], out_fp32=False) -> [M, N]``: ``x @ w.T``, any
    strides; differentiable (backward below).

Backward of ``y = x @ w.T`` with ``dy [M, N]``:
  * ``dx = dy @ w`` = ``gemm(dy, w.t())``: the same contract with (K, N) = (N, K); batch
    invariant like the forward (row i of dx depends on row i of dy only).
  * ``dw = dy.T @ x`` = ``gemm(dy.t(), x.t())``: the same contract with the tokens as the
    reduction dimension: tokens walked in chunks of 64 ascending, split into
    ``split_k(M, K)`` segments folded in ascending order. It depends on M by nature (M is what
    is summed); it is bitwise equal run to run, no atomics.
"""

from __future__ import annotations

import torch

from rlk.kernels.gemm import launch
from rlk.kernels.dispatch import direct

_OP = "rlk::gemm"


@torch.library.custom_op(_OP, mutates_args=())
def _gemm_op(x: torch.Tensor, w: torch.Tensor, out_fp32: bool = False) -> torch.Tensor:
    return launch.gemm(x, w, out_dtype=torch.float32 if out_fp32 else torch.bfloat16)


@_gemm_op.register_fake
def _(x, w, out_fp32=False):
    return x.new_empty((x.shape[0], w.shape[0]), dtype=torch.float32 if out_fp32 else torch.bfloat16)


def _setup_context(ctx, inputs, output):
    x, w, out_fp32 = inputs
    ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, w if ctx.needs_input_grad[0] else None)


def _backward(ctx, dy):
    x, w = ctx.saved_tensors
    dy = dy.to(torch.bfloat16)
    dx = dw = None
    if ctx.needs_input_grad[0]:
        # Reduction order: over N in chunks of 64 ascending, split_k(N, K) segments, ordered fold.
        dx = torch.ops.rlk.gemm(dy, w.t())
    if ctx.needs_input_grad[1]:
        # Reduction order: over tokens M in chunks of 64 ascending, split_k(M, K) segments folded
        # in ascending order (fixed by M and K only); no atomics.
        dw = torch.ops.rlk.gemm(dy.t(), x.t())
    return dx, dw, None


_gemm_op.register_autograd(_backward, setup_context=_setup_context)


def gemm(x: torch.Tensor, w: torch.Tensor, out_fp32: bool = False) -> torch.Tensor:
    """``x [M, K] @ w [N, K].T -> [M, N]`` (bf16, or fp32 when ``out_fp32``), differentiable.

    Determinism: contract gemm.bf16.v1 (batch-invariant rows; bitwise run to run).
    """
    if direct(x, w):
        return launch.gemm(x, w, out_dtype=torch.float32 if out_fp32 else torch.bfloat16)
    return torch.ops.rlk.gemm(x, w, out_fp32)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Strict ``nn.functional.linear`` without bias: ``x [..., K] @ w [N, K].T -> [..., N]``.

    x and w are bf16 (CUDA, or CPU under the Triton interpreter). Autograd: dx strict (batch
    invariant), dw with a fixed reduction order over tokens (bitwise run to run).

    Determinism: contract gemm.bf16.v1: each output row depends only on its input row, whatever
    the number of rows, their order or padding; no atomics.
    """
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    y = launch.gemm(x2, w) if direct(x2, w) else torch.ops.rlk.gemm(x2, w, False)
    return y.reshape(*lead, w.shape[0])
