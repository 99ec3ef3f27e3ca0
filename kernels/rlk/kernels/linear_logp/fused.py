"""Fused LM head + selected-token logp + per-token loss gradient of ``logp.v2``: 3 GEMM-equivalents.

The unfused actor path costs 4: the forward (statistics, no logits stored), then
:func:`~rlk.kernels.linear_logp.launch.linear_logp_bwd` recomputes every logits tile to form G.
When the loss is known at forward time (L = sum_t l_t(logp_t)), :func:`linear_logp_fused_loss`
walks the tokens in row chunks and, per chunk, runs the forward with its fp32 logits kept, asks
the caller for dlogp, forms G from the kept logits (``grad_from_logits_kernel``: elementwise,
bwd_grad's formula through the same ``_grad_store``), then the two backward GEMMs. Same bytes as
``linear_logp_fwd`` + ``linear_logp_bwd`` fed the same dlogp:

* logp, lse: the forward kernels, rows independent of T (contract property) and of return_logits;
* G: equal wherever the stored logit equals bwd_grad's recomputed one (same K chain; the forward
  and bwd_grad tiles differ on sm_90, 128x256 vs 128x128: shown on the GPU by
  ``fused_test::test_gpu_fused_equals_unfused``, not by the interpreter);
* d_hidden rows: G_chunk @ weight, K = vocab columns ascending in one fp32 chain (the unfused
  path walks the same chain across vocab chunks), one RNE rounding at the store;
* d_weight: G_chunk^T @ hidden_chunk accumulated in fp32 across row chunks (ACC_IN), K = tokens
  ascending; chunks start at multiples of the GEMM's BLOCK_K, so the chain is the unfused one
  pass over all T; one RNE rounding at the end.

:func:`scale_by_` applies the backward's grad_out to those gradients in place, reading it on the
device (``scale_kernel``; no host read).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from rlk.errors import UnsupportedConfigError
from rlk.kernels.common import arch_of, cdiv, interpret_flag, launch_options
from rlk.kernels.linear_logp import contract, schedule
from rlk.kernels.linear_logp import kernel as K
from rlk.kernels.launcher import launch
from rlk.kernels.linear_logp.launch import (GradGemms, _check_device, _inv_temp, _vec, check_inputs,
                                            check_main_grad, linear_logp_fwd)

CONTRACT_ID = contract.CONTRACT_ID
_BYTES_PER_ELEMENT = 4 + 2  # fp32 logits + bf16 G per (row, column) of a chunk


def row_unit(tab: dict) -> int:
    """Row chunks are multiples of this: the d_weight GEMM's BLOCK_K (needed for its K chain to
    equal one pass over all tokens) and the forward / G / d_hidden row tiles (no partial tiles)."""
    return math.lcm(tab["gemm"]["BLOCK_K"], tab["gemm"]["BLOCK_M"], tab["fwd"]["BLOCK_T"],
                    tab["bwd_grad"]["BLOCK_T"])


def rows_per_chunk_for(T: int, V_local: int, tab: dict) -> int:
    """Rows per chunk: ``fused.ROWS_BUDGET_MB`` of fp32 logits + bf16 G buffers allows at most
    budget / (6 * V_local) rows (at least one unit); the T rows are then cut into that many
    chunks of equal size (rounded up to the unit, the last one shorter), which keeps the
    d_hidden GEMM's waves even. A schedule choice: chunk boundaries at multiples of BLOCK_K never
    change a byte (fused_test)."""
    unit = row_unit(tab)
    budget = float(tab.get("fused", {}).get("ROWS_BUDGET_MB", 4096)) * 2**20
    cap = max(unit, int(budget // (_BYTES_PER_ELEMENT * max(V_local, 1))) // unit * unit)
    per_chunk = -(-T // -(-T // cap))  # ceil(T / number of chunks) <= cap
    return -(-per_chunk // unit) * unit


def linear_logp_fused_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                           dlogp_fn: Callable[[torch.Tensor, int, int], torch.Tensor],
                           vocab_start: int = 0, vocab_real: Optional[int] = None, temperature: float = 1.0,
                           rows_per_chunk: Optional[int] = None, *, segmentation=None,
                           return_entropy: bool = False, need_d_hidden: bool = True,
                           need_d_weight: bool = True, main_grad: Optional[torch.Tensor] = None):
    """Forward and gradients of L = sum_t l_t(logp_t) in one pass (3 GEMM-equivalents).

    Args:
      hidden: [T, H] bf16. weight: [V_local, H] bf16 holding the whole vocabulary (single shard:
        vocab_start must be 0 and V_local >= vocab_real). targets: [T] int64 in [0, vocab_real).
      dlogp_fn: ``dlogp_fn(logp_chunk [Tc] fp32, lo, hi) -> dlogp_chunk [Tc] fp32``, dL/dlogp of
        rows [lo, hi); called once per row chunk, in ascending order, before that chunk's
        gradients are formed. Row t's value must depend on row t only.
      temperature: > 0 (logits x = (h @ w.T) * fp32(1/temperature), as the forward).
      rows_per_chunk: rows per chunk (a multiple of :func:`row_unit`'s BLOCK_K; default from
        ``fused.ROWS_BUDGET_MB``: :func:`rows_per_chunk_for`). Tests use it to force chunks.
      segmentation: the forward's (ALIGN, SEG_V), as ``linear_logp``.
      need_d_hidden / need_d_weight: skip a GEMM whose result is not wanted (None returned).
      main_grad: optional fp32 [V_local, H], contiguous (megatron's gradient-accumulation fusion:
        the weight's ``main_grad``). d_weight is then accumulated into it and not returned: the
        fp32 chain that otherwise lives in the d_weight accumulator starts from main_grad's
        values (ACC_IN on the first chunk too) and is never rounded. With main_grad all zeros it
        ends with the fp32 bytes whose bf16 rounding is the d_weight returned without it; a
        second call continues each element's chain over its own tokens (call order = order).

    Returns: (logp [T] fp32, lse [T] fp32, d_hidden [T, H] bf16 | None, d_weight [V_local, H]
    bf16 | None; None too with main_grad). Peak extra memory: the chunk's fp32 logits and bf16 G
    (6 * rows * V_local bytes) and, with more than one chunk and no main_grad, an fp32
    [V_local, H] d_weight accumulator (main_grad is that accumulator when given).

    Not supported (UnsupportedConfigError): vocabulary-parallel shards (they need every rank's
    statistics before any G: keep ``segment_stats`` / ``merge_segment_stats`` +
    ``linear_logp_bwd``), entropy (use the unfused path), dlse.

    Determinism: logp.v2. logp/lse equal ``linear_logp_fwd``'s; d_hidden/d_weight equal
    ``linear_logp_bwd``'s fed the same dlogp (bitwise on the interpreter; on GPU by
    fused_test's GPU cases); d_hidden rows independent of T; bitwise run to run.
    """
    vocab_real = int(weight.shape[0] + vocab_start if vocab_real is None else vocab_real)
    align, seg_v = contract.DEFAULT_SEGMENTATION if segmentation is None else tuple(segmentation)
    if return_entropy:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: the fused logp + loss path has no entropy; use "
                                     "linear_logp (unfused) for entropy terms")
    check_inputs(hidden, weight, targets, int(vocab_start), vocab_real, align, seg_v)
    V_local = weight.shape[0]
    if int(vocab_start) != 0 or V_local < vocab_real:
        raise UnsupportedConfigError(
            f"{CONTRACT_ID}: the fused logp + loss path is single-shard (vocab_start=0, V_local >= "
            f"vocab_real; got vocab_start={vocab_start}, V_local={V_local}, vocab_real={vocab_real}); "
            "vocabulary-parallel callers use segment_stats / merge_segment_stats + linear_logp_bwd")
    if not callable(dlogp_fn):
        raise UnsupportedConfigError(f"{CONTRACT_ID}: dlogp_fn must be callable: "
                                     "(logp_chunk, lo, hi) -> dlogp_chunk")
    inv_t = _inv_temp(temperature)
    hidden, weight, targets = hidden.contiguous(), weight.contiguous(), targets.contiguous()
    T, H = hidden.shape
    dev = hidden.device
    tab = schedule.table(arch_of(dev))
    unit = row_unit(tab)
    if rows_per_chunk is None:
        rows = rows_per_chunk_for(T, V_local, tab)
    else:
        rows = int(rows_per_chunk)
        if rows <= 0 or rows % tab["gemm"]["BLOCK_K"]:
            raise UnsupportedConfigError(f"{CONTRACT_ID}: rows_per_chunk={rows_per_chunk} must be a positive "
                                         f"multiple of the d_weight GEMM's BLOCK_K={tab['gemm']['BLOCK_K']} "
                                         "(else its token chain differs from the unfused one)")
    rows = min(rows, -(-T // unit) * unit)
    n_chunks = -(-T // rows)

    logp = torch.empty((T,), dtype=torch.float32, device=dev)
    lse = torch.empty_like(logp)
    acc_in = main_grad is not None and need_d_weight
    if acc_in:
        check_main_grad(main_grad, weight)
    dh = torch.empty_like(hidden) if need_d_hidden else None
    dw = torch.empty_like(weight) if need_d_weight and not acc_in else None
    # d_weight: one fp32 chain over all tokens; with several chunks it lives in an fp32 buffer
    # between them and is rounded once at the end. With main_grad that buffer is main_grad,
    # whose contents start the chain, and nothing is rounded.
    dw_acc = (main_grad if acc_in else
              torch.empty((V_local, H), dtype=torch.float32, device=dev) if need_d_weight and n_chunks > 1 else dw)
    need_grads = need_d_hidden or need_d_weight
    g = (torch.empty((rows, -(-V_local // 8) * 8), dtype=torch.bfloat16, device=dev)  # 16-byte rows (TMA)
         if need_grads else None)
    gemms = GradGemms(hidden, weight, tab)
    gc = schedule.grad_from_logits_fields(tab)
    cd = cdiv
    # Reduction order (d_weight): row chunks ascending, the fp32 chain continuing across them.
    for c, lo in enumerate(range(0, T, rows)):
        hi = min(lo + rows, T)
        n = hi - lo
        h_c, t_c = hidden[lo:hi], targets[lo:hi]
        lp, ls, _, x = linear_logp_fwd(h_c, weight, t_c, 0, vocab_real, temperature, False, need_grads,
                                       (align, seg_v), validate_targets=False)
        logp[lo:hi] = lp
        lse[lo:hi] = ls
        dl = _vec("dlogp_fn(...) result", dlogp_fn(lp, lo, hi), n, dev)
        if not need_grads:
            continue
        gv = g[:n, :V_local]
        launch(K.grad_from_logits_kernel, (cd(n, gc["BLOCK_T"]), cd(V_local, gc["BLOCK_V"])),
            gv, x, t_c, ls, dl, n, V_local, 0, vocab_real, x.stride(0), g.stride(0), inv_t,
            BLOCK_T=gc["BLOCK_T"], BLOCK_V=gc["BLOCK_V"], INTERPRET=interpret_flag(),
            num_warps=gc["num_warps"], num_stages=gc["num_stages"], **launch_options())
        del x
        if need_d_hidden:
            gemms.d_hidden(gv, weight, dh[lo:hi], ACC_IN=False, OUT_BF16=True)
        if need_d_weight:
            gemms.d_weight(gv, h_c, dw_acc, ACC_IN=c > 0 or acc_in, OUT_BF16=n_chunks == 1 and not acc_in)
    if need_d_weight and n_chunks > 1 and not acc_in:
        dw.copy_(dw_acc)  # one RNE rounding (torch's fp32 -> bf16 cast, as linear_logp_bwd's d_hidden)
    return logp, lse, dh, dw


def scale_by_(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x *= scale in place, with ``scale`` a one-element float tensor read on the device; returns x.

    The backward of :func:`rlk.kernels.linear_logp.autograd.linear_logp_loss` uses it to apply
    grad_out to the gradients formed in the forward without a host read of grad_out (which would
    block the host until the whole forward has run), so it also runs under CUDA-graph capture. One launch of
    ``scale_kernel`` over x's elements (flat grid): when scale == 1.0 (the usual
    ``loss.backward()``) every program returns after reading it and x keeps its bytes; otherwise
    each element becomes fp32(x) * fp32(scale) rounded once to x's dtype (RNE), the bytes of
    ``(x.float() * scale.float()).to(x.dtype)`` (a NaN stays NaN; its payload bits may differ).

    x: contiguous bf16 or fp32 tensor that nothing else reads (it is overwritten). scale: a 0-dim
    (or one-element) tensor of any float dtype on x's device; it is converted with
    ``reshape(1).float()`` (a device op, no host read; a bf16 or fp64 scale rounds as
    ``scale.float()`` does).

    Determinism: elementwise, one fp32 multiply and at most one rounding per element; the block
    and grid never change a byte; bitwise run to run.
    """
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.bfloat16, torch.float32):
        raise UnsupportedConfigError(f"{CONTRACT_ID}: scale_by_ needs a bf16 or fp32 tensor, got "
                                     f"{getattr(x, 'dtype', type(x).__name__)}")
    if not x.is_contiguous():
        raise UnsupportedConfigError(f"{CONTRACT_ID}: scale_by_ scales a contiguous buffer in place (flat "
                                     f"grid); got shape {tuple(x.shape)} with strides {x.stride()}")
    if not isinstance(scale, torch.Tensor) or not scale.is_floating_point() or scale.numel() != 1:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: scale_by_ needs a one-element float tensor as scale, got "
                                     f"{getattr(scale, 'dtype', type(scale).__name__)} of shape "
                                     f"{tuple(getattr(scale, 'shape', ()))}")
    if scale.device != x.device:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: scale on {scale.device}, tensor on {x.device}")
    _check_device(x)
    n = x.numel()
    if n == 0:
        return x
    s = scale.reshape(1).float()
    sc = schedule.scale_fields(arch_of(x.device))
    launch(K.scale_kernel, (cdiv(n, sc["BLOCK"] * sc["ITERS"]),),
        x, s, n, BLOCK=sc["BLOCK"], ITERS=sc["ITERS"], OUT_BF16=x.dtype == torch.bfloat16,
        INTERPRET=interpret_flag(), num_warps=sc["num_warps"], num_stages=sc["num_stages"], **launch_options())
    return x
