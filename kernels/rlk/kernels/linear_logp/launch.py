"""Host side of contract ``logp.v2``: input checks, config lookup, grids and launches.

Forward: :func:`segment_stats` (per-(segment, token) statistics of one vocabulary shard, and the
logits if asked) then :func:`merge_segment_stats` (ranks' statistics in rank order -> logp, lse,
entropy). :func:`linear_logp_fwd` does both for a single shard. Backward: :func:`linear_logp_bwd`.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional, Sequence

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from rlk.errors import UnsupportedConfigError
from rlk.kernels.common import (arch_of, cdiv, check_tensor, device_value_checks_enabled, dot_dtype_for,
                                interpret_flag, launch_options)
from rlk.kernels.linear_logp import contract, schedule
from rlk.kernels.linear_logp import kernel as K
from rlk.kernels.launcher import launch

CONTRACT_ID = contract.CONTRACT_ID


class SegmentStats(NamedTuple):
    """Statistics of one shard, segments in ascending global order (all fp32, contiguous).

    m, s: [S_local, T] running max and sum of exp(x - m); e: [S_local, T] sum of exp(x - m) * x
    or None; tg: [T] target logit where this shard owns the target, else -inf.
    """

    m: torch.Tensor
    s: torch.Tensor
    e: Optional[torch.Tensor]
    tg: torch.Tensor


def _inv_temp(temperature) -> float:
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        raise UnsupportedConfigError(f"{CONTRACT_ID}: temperature must be a number, got {temperature!r}")
    if not (math.isfinite(t) and t > 0.0):
        raise UnsupportedConfigError(f"{CONTRACT_ID}: temperature must be finite and > 0, got {t}")
    return _fp32_inverse(t)


@functools.lru_cache(maxsize=64)
def _fp32_inverse(t: float) -> float:
    """fp32(1 / float64(t)): the contract's single host-side rounding (memoized: a tensor round
    trip per launch costs tens of microseconds of host time)."""
    return float(torch.tensor(1.0 / t, dtype=torch.float32).item())


def _dot(device) -> object:
    """``tl.dot`` operand dtype: bf16 on GPU, fp64 under the interpreter (exact 64-chunk sums)."""
    d = dot_dtype_for(device)
    return tl.float64 if d == tl.float32 else d


def _bound(n: int) -> int:
    """A runtime loop bound as a constexpr under the interpreter only (see kernel.py); 0 on GPU
    so that one compiled kernel serves every size."""
    return int(n) if interpret_flag() else 0


def _check_device(t: torch.Tensor) -> None:
    if t.device.type == "cpu":
        if not interpret_flag():
            raise UnsupportedConfigError(f"{CONTRACT_ID}: CPU tensors need the Triton interpreter "
                                         "(TRITON_INTERPRET=1)")
    elif t.device.type != "cuda":
        raise UnsupportedConfigError(f"{CONTRACT_ID}: device {t.device} not supported")


def check_inputs(hidden, weight, targets, vocab_start: int, vocab_real: int,
                 align: int, seg_v: int, validate_targets: bool = True) -> None:
    """Raises ``UnsupportedConfigError`` for anything outside the contract (before any launch)."""
    check_tensor("hidden", hidden, dtype=torch.bfloat16, dim=2)
    check_tensor("weight", weight, dtype=torch.bfloat16, dim=2, device=hidden.device)
    check_tensor("targets", targets, dtype=torch.int64, dim=1, device=hidden.device)
    _check_device(hidden)
    T, H = hidden.shape
    V_local = weight.shape[0]
    if T == 0:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: empty hidden (T == 0)")
    if V_local == 0:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: empty weight shard (V_local == 0)")
    if weight.shape[1] != H:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: hidden {tuple(hidden.shape)} and weight "
                                     f"{tuple(weight.shape)} disagree on H (expected weight [V_local, H])")
    if H % contract.BLOCK_K:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: H={H} is not a multiple of {contract.BLOCK_K}")
    if targets.shape[0] != T:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: targets has {targets.shape[0]} entries, hidden has T={T}")
    if targets.stride(0) != 1:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: targets must be contiguous")
    if vocab_start < 0 or vocab_real < 1:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: need vocab_start >= 0 and vocab_real >= 1 "
                                     f"(got {vocab_start}, {vocab_real})")
    if align is None:  # backward: no segmentation involved
        pass
    elif contract.check_segmentation(align, seg_v) or vocab_start % align:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: vocab_start={vocab_start} is not a multiple of the "
                                     f"alignment block {align}: shard boundaries must fall on blocks")
    elif V_local % align and vocab_start + V_local < vocab_real:
        raise UnsupportedConfigError(
            f"{CONTRACT_ID}: shard [{vocab_start}, {vocab_start + V_local}) ends inside alignment block "
            f"of {align} columns but is not the last shard (vocab_real={vocab_real}); only the shard "
            "holding the last real column may hold a partial block")
    if max(T, V_local, H) >= 2**31 or T * max(H, V_local) >= 2**62:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: sizes too large")
    if validate_targets and targets.numel() and device_value_checks_enabled():
        # One device sync; engines that capture graphs validate their token ids upstream.
        bad = (targets < 0) | (targets >= vocab_real)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0].item())
            raise UnsupportedConfigError(f"{CONTRACT_ID}: targets[{i}] = {int(targets[i])} outside "
                                         f"[0, vocab_real={vocab_real})")


def _tma_ok(t: torch.Tensor) -> bool:
    """Whether ``t`` [rows, K] can be read through a tensor descriptor: unit inner stride, 16-byte
    aligned base and row stride (on GPU the TMA unit; the interpreter emulates descriptors)."""
    return (t.device.type in ("cuda", "cpu") and t.dim() == 2 and t.stride(1) == 1
            and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0 and t.shape[0] > 0)


def _desc(t: torch.Tensor, block):
    return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], list(block))


def num_segments(V_local: int, align: int, seg_v: int) -> int:
    return cdiv(V_local, align) * cdiv(align, seg_v)


def segment_stats(hidden, weight, targets, vocab_start: int = 0, vocab_real: Optional[int] = None,
                  temperature: float = 1.0, return_entropy: bool = False, return_logits: bool = False,
                  segmentation=None, validate_targets: bool = True):
    """Per-segment statistics of one vocabulary shard.

    hidden [T, H] bf16, weight [V_local, H] bf16 (global columns [vocab_start, vocab_start +
    V_local)), targets [T] int64 (global ids). Returns (SegmentStats, logits [T, V_local] fp32 or
    None). Logits are the temperature-scaled fp32 values the statistics use; padded columns
    (>= vocab_real) hold -inf.

    Determinism: logp.v2; rows independent of T; bitwise run to run.
    """
    vocab_real = int(weight.shape[0] + vocab_start if vocab_real is None else vocab_real)
    align, seg_v = contract.DEFAULT_SEGMENTATION if segmentation is None else tuple(segmentation)
    check_inputs(hidden, weight, targets, int(vocab_start), vocab_real, align, seg_v, validate_targets)
    inv_t = _inv_temp(temperature)
    hidden, weight, targets = hidden.contiguous(), weight.contiguous(), targets.contiguous()
    T, H = hidden.shape
    V_local = weight.shape[0]
    cfg = schedule.fwd_entry(schedule.table(arch_of(hidden.device)), hidden.shape[0])
    S = num_segments(V_local, align, seg_v)
    dev = hidden.device
    m = torch.empty((S, T), dtype=torch.float32, device=dev)
    s = torch.empty((S, T), dtype=torch.float32, device=dev)
    e = torch.empty((S, T), dtype=torch.float32, device=dev) if return_entropy else None
    tg = torch.full((T,), float("-inf"), dtype=torch.float32, device=dev)
    logits = torch.empty((T, V_local), dtype=torch.float32, device=dev) if return_logits else None
    bt, bv = cfg["BLOCK_T"], cfg["BLOCK_V"]
    if H % cfg["BLOCK_K"]:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: H={H} is not a multiple of the k-step {cfg['BLOCK_K']}")
    use_tma = bool(cfg.get("TMA", 0)) and _tma_ok(hidden) and _tma_ok(weight)
    hd, wd = (_desc(hidden, (bt, cfg["BLOCK_K"])), _desc(weight, (bv, cfg["BLOCK_K"]))) if use_tma else (None, None)
    grid = (cdiv(T, bt) * S,)
    launch(K.fwd_stats_kernel, grid,
        m, s, e if e is not None else m, tg, logits if logits is not None else m,
        hidden, weight, targets, hd, wd, T, V_local, H, int(vocab_start), vocab_real, S,
        hidden.stride(0), weight.stride(0), logits.stride(0) if logits is not None else 0, inv_t,
        ALIGN=align, SEG_V=seg_v, BLOCK_T=bt, BLOCK_V=bv, BLOCK_K=cfg["BLOCK_K"],
        GROUP_T=cfg.get("GROUP_T", 1), USE_TMA=use_tma,
        DOT_DTYPE=_dot(dev), WITH_ENTROPY=return_entropy, WITH_LOGITS=return_logits,
        INTERPRET=interpret_flag(), H_I=_bound(H),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **launch_options())
    return SegmentStats(m, s, e, tg), logits


def merge_segment_stats(stats: Sequence[SegmentStats]):
    """Merges shard statistics given in rank order 0..N-1 -> (logp [T], lse [T], entropy [T] | None).

    Call it after an all_gather of every rank's :class:`SegmentStats` (exact copies). The result
    is byte-identical to the unsharded computation when the shards follow the contract's
    segmentation rule (checked by :func:`check_inputs` on each rank).

    Determinism: logp.v2 (max over segments, then sums over global segments ascending).
    """
    if isinstance(stats, SegmentStats) or not len(stats):
        raise UnsupportedConfigError(f"{CONTRACT_ID}: merge_segment_stats takes a non-empty list of "
                                     "SegmentStats in rank order")
    T = stats[0].tg.shape[0]
    with_e = stats[0].e is not None
    for i, st in enumerate(stats):
        if st.tg.shape != (T,) or st.m.shape[1:] != (T,) or st.m.shape != st.s.shape:
            raise UnsupportedConfigError(f"{CONTRACT_ID}: rank {i} stats shapes disagree (T={T})")
        if (st.e is not None) != with_e:
            raise UnsupportedConfigError(f"{CONTRACT_ID}: rank {i} entropy statistics present/absent "
                                         "unlike rank 0")
    cat = (lambda xs: xs[0].contiguous()) if len(stats) == 1 else (lambda xs: torch.cat(xs, 0))
    m = cat([st.m for st in stats])
    s = cat([st.s for st in stats])
    e = cat([st.e for st in stats]) if with_e else None
    # One shard (the single-GPU forward): a [1, T] view of its target logits, not a stacked copy
    # (torch.stack is a copy kernel: a launch and host time for the same bytes).
    tg = stats[0].tg.contiguous()[None] if len(stats) == 1 else torch.stack([st.tg for st in stats], 0).contiguous()
    dev = m.device
    cfg = schedule.table(arch_of(dev))["merge"]
    logp = torch.empty((T,), dtype=torch.float32, device=dev)
    lse = torch.empty_like(logp)
    ent = torch.empty_like(logp) if with_e else None
    launch(K.merge_kernel, (cdiv(T, cfg["BLOCK"]),),
        logp, lse, ent if with_e else logp, m, s, e if with_e else m, tg, m.shape[0], tg.shape[0], T,
        WITH_ENTROPY=with_e, BLOCK=cfg["BLOCK"], INTERPRET=interpret_flag(), S_I=_bound(m.shape[0]),
        R_I=_bound(tg.shape[0]), UNROLL=schedule.merge_unroll(arch_of(dev)), num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **launch_options())
    return logp, lse, ent


def linear_logp_fwd(hidden, weight, targets, vocab_start: int = 0, vocab_real: Optional[int] = None,
                    temperature: float = 1.0, return_entropy: bool = False, return_logits: bool = False,
                    segmentation=None, validate_targets: bool = True):
    """Single-shard forward: (logp [T], lse [T], entropy [T] | None, logits [T, V_local] | None).

    hidden [T, H] bf16, weight [V_local, H] bf16, targets [T] int64. No autograd, no saved
    tensors (the reference-scoring path). With return_logits the statistics arithmetic is
    unchanged: logp/lse bytes do not depend on it.

    Determinism: logp.v2; rows independent of T; bitwise run to run.
    """
    st, logits = segment_stats(hidden, weight, targets, vocab_start, vocab_real, temperature,
                               return_entropy, return_logits, segmentation, validate_targets)
    logp, lse, ent = merge_segment_stats([st])
    return logp, lse, ent, logits


def vocab_chunk(T: int, V_local: int, tab: dict) -> int:
    """Columns per backward chunk: as many as the G buffer budget [T, chunk] bf16 allows, a
    multiple of 64, at most V_CHUNK_MAX. A schedule choice: every G element and d_weight row is
    computed within one chunk, and the d_hidden fp32 chain continues across chunks (exact fp32
    store/load), so the chunk size never changes a byte (linear_logp_invariance_test)."""
    budget = int(tab.get("G_BUDGET_MB", 128)) * 2**20
    vc = max(64, (budget // (2 * max(T, 1))) // 64 * 64)
    cap = tab.get("V_CHUNK_MAX")
    if cap:
        vc = min(vc, int(cap))
    return min(vc, -(-V_local // 64) * 64)


def _vec(name, t, T, dev):
    if t is None:
        return None
    check_tensor(name, t, dtype=torch.float32, dim=1, device=dev)
    if t.shape[0] != T:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: {name} has {t.shape[0]} entries, expected T={T}")
    return t.contiguous()


def check_main_grad(main_grad, weight) -> None:
    """Raises ``UnsupportedConfigError`` unless ``main_grad`` can take d_weight accumulation:
    fp32, the weight's shape and device, contiguous (the GEMM stores rows of unit stride)."""
    if not isinstance(main_grad, torch.Tensor):
        raise UnsupportedConfigError(f"{CONTRACT_ID}: main_grad must be a torch.Tensor, got "
                                     f"{type(main_grad).__name__}")
    if main_grad.dtype != torch.float32:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: main_grad must be fp32 (d_weight accumulates in the "
                                     f"GEMM's fp32 chain), got {main_grad.dtype}")
    if tuple(main_grad.shape) != tuple(weight.shape):
        raise UnsupportedConfigError(f"{CONTRACT_ID}: main_grad has shape {tuple(main_grad.shape)}, the weight "
                                     f"{tuple(weight.shape)}")
    if main_grad.device != weight.device:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: main_grad on {main_grad.device}, weight on {weight.device}")
    if not main_grad.is_contiguous():
        raise UnsupportedConfigError(f"{CONTRACT_ID}: main_grad must be contiguous (strides {main_grad.stride()})")


def linear_logp_bwd(hidden, weight, targets, lse, dlogp, vocab_start: int = 0,
                    vocab_real: Optional[int] = None, temperature: float = 1.0, dlse=None,
                    entropy=None, dentropy=None, main_grad=None):
    """Gradients (d_hidden [T, H] bf16, d_weight [V_local, H] bf16) from the saved lse [T] fp32.

    dlogp [T] fp32 (zeros if None), dlse / dentropy [T] fp32 optional (dentropy needs entropy).
    Logits are recomputed in vocab chunks (:func:`vocab_chunk` columns); per chunk the bf16 gradient of the
    pre-temperature logits G [T, chunk] is written, then d_weight[chunk] = G^T @ hidden (tokens
    ascending, one chain) and d_hidden += G @ weight[chunk] (vocab ascending, one fp32 chain that
    continues across chunks), rounded once at the end. No atomics.

    main_grad: optional fp32 [V_local, H] (megatron's gradient-accumulation fusion): d_weight is
    not rounded or returned (None) but accumulated into it: each element's fp32 chain starts from
    main_grad's value and continues over the tokens ascending (a zero main_grad ends with the
    unrounded bytes whose bf16 rounding is the d_weight returned without it).

    Determinism: logp.v2; bitwise run to run; d_hidden rows independent of T.
    """
    vocab_real = int(weight.shape[0] + vocab_start if vocab_real is None else vocab_real)
    check_inputs(hidden, weight, targets, int(vocab_start), vocab_real, None, None, False)
    inv_t = _inv_temp(temperature)
    T, H = hidden.shape
    V_local = weight.shape[0]
    dev = hidden.device
    lse = _vec("lse", lse, T, dev)
    dlogp = _vec("dlogp", dlogp, T, dev)
    dlse = _vec("dlse", dlse, T, dev)
    dentropy = _vec("dentropy", dentropy, T, dev)
    entropy = _vec("entropy", entropy, T, dev)
    if lse is None:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: backward needs the saved lse")
    if dentropy is not None and entropy is None:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: entropy gradient needs the forward entropy")
    if dlogp is None:
        dlogp = torch.zeros((T,), dtype=torch.float32, device=dev)
    hidden, weight, targets = hidden.contiguous(), weight.contiguous(), targets.contiguous()
    tab = schedule.table(arch_of(dev))
    gc = tab["bwd_grad"]
    VC = vocab_chunk(T, V_local, tab)
    dot = _dot(dev)
    interp = interpret_flag()
    opts = launch_options()
    VCc = min(VC, V_local)
    g = torch.empty((T, -(-VCc // 8) * 8), dtype=torch.bfloat16, device=dev)
    gtm = bool(gc.get("TMA", 0)) and _tma_ok(hidden) and _tma_ok(weight)
    ghd, gwd = ((_desc(hidden, (gc["BLOCK_T"], gc["BLOCK_K"])), _desc(weight, (gc["BLOCK_V"], gc["BLOCK_K"])))
                if gtm else (None, None))
    gemms = GradGemms(hidden, weight, tab)
    if main_grad is not None:
        check_main_grad(main_grad, weight)
    dw = torch.empty_like(weight) if main_grad is None else main_grad
    dh_acc = torch.empty((T, H), dtype=torch.float32, device=dev)
    cd = cdiv
    # Reduction order (d_hidden): vocab chunks ascending; the fp32 chain continues across chunks.
    for c, col0 in enumerate(range(0, V_local, VC)):
        nc = min(VC, V_local - col0)
        launch(K.bwd_grad_kernel, (cd(T, gc["BLOCK_T"]), cd(nc, gc["BLOCK_V"])),
            g, hidden, weight, targets, lse, entropy if entropy is not None else lse, dlogp,
            dlse if dlse is not None else lse, dentropy if dentropy is not None else lse, ghd, gwd,
            T, V_local, H, col0, col0 + nc, int(vocab_start), vocab_real,
            hidden.stride(0), weight.stride(0), g.stride(0), inv_t,
            BLOCK_T=gc["BLOCK_T"], BLOCK_V=gc["BLOCK_V"], BLOCK_K=gc["BLOCK_K"],
            USE_TMA=gtm, DOT_DTYPE=dot, HAS_DLSE=dlse is not None,
            HAS_DENT=dentropy is not None, INTERPRET=interp, H_I=_bound(H),
            num_warps=gc["num_warps"], num_stages=gc["num_stages"], **opts)
        # d_weight[chunk] = G^T @ hidden (tokens ascending); d_hidden (+)= G @ weight[chunk].
        # With main_grad the chain starts from its fp32 contents (ACC_IN) and stays unrounded.
        gemms.d_weight(g[:, :nc], hidden, dw[col0:col0 + nc], ACC_IN=main_grad is not None,
                       OUT_BF16=main_grad is None)
        gemms.d_hidden(g[:, :nc], weight[col0:col0 + nc], dh_acc, ACC_IN=c > 0, OUT_BF16=False)
    # One RNE rounding (torch's fp32 -> bf16 cast is round-to-nearest-even on CPU and GPU).
    return dh_acc.to(hidden.dtype), (dw if main_grad is None else None)


class GradGemms:
    """The backward's two GEMMs over a bf16 gradient block G [n, nc] (a unit-inner-stride view of
    a buffer whose row stride is a multiple of 8), launched with the table's ``gemm`` entry.

    Reduction order: K in chunks of BLOCK_K ascending, one fp32 chain per output element; with
    ACC_IN the chain continues from the fp32 partial sums already in ``out`` (exact fp32
    store/load), so K cut at multiples of BLOCK_K gives the bytes of one uncut walk. OUT_BF16:
    one RNE rounding at the store. TMA path (when the table asks and hidden and weight allow it):
    G, hidden and weight are read in place through descriptors (G^T and weight rows as [K, M] /
    [K, N] tiles, transposed in registers), with the pointer path's tiles and K chains, so the
    same bytes (checked by linear_logp_variants on GPU and by the interpreter tests).
    """

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, tab: dict):
        mc = self.mc = tab["gemm"]
        self.use_tma = bool(mc.get("TMA", 0)) and _tma_ok(hidden) and _tma_ok(weight)
        self.kw = dict(BLOCK_M=mc["BLOCK_M"], BLOCK_N=mc["BLOCK_N"], BLOCK_K=mc["BLOCK_K"],
                       GROUP_M=mc.get("GROUP_M", 1), USE_TMA=self.use_tma, DOT_DTYPE=_dot(hidden.device),
                       INTERPRET=interpret_flag(), num_warps=mc["num_warps"], num_stages=mc["num_stages"])

    def d_weight(self, g, hidden_rows, out, *, ACC_IN: bool, OUT_BF16: bool) -> None:
        """out [nc, H] (+)= G^T @ hidden_rows [n, H]: K = the n tokens ascending."""
        mc, bk = self.mc, self.mc["BLOCK_K"]
        descs = ((_desc(g, (bk, mc["BLOCK_M"])), _desc(hidden_rows, (bk, mc["BLOCK_N"])))
                 if self.use_tma else (None, None))
        self._launch(out, g, hidden_rows, descs, g.shape[1], g.shape[0],
                     (1, g.stride(0), hidden_rows.stride(0), 1), ACC_IN, OUT_BF16, A_KM=True)

    def d_hidden(self, g, weight_rows, out, *, ACC_IN: bool, OUT_BF16: bool) -> None:
        """out [n, H] (+)= G @ weight_rows [nc, H]: K = the nc columns ascending."""
        mc, bk = self.mc, self.mc["BLOCK_K"]
        descs = ((_desc(g, (mc["BLOCK_M"], bk)), _desc(weight_rows, (bk, mc["BLOCK_N"])))
                 if self.use_tma else (None, None))
        self._launch(out, g, weight_rows, descs, g.shape[0], g.shape[1],
                     (g.stride(0), 1, weight_rows.stride(0), 1), ACC_IN, OUT_BF16, A_KM=False)

    def _launch(self, out, a, b, descs, M, Kdim, strides, ACC_IN, OUT_BF16, A_KM) -> None:
        H = out.shape[1]
        grid = (cdiv(M, self.mc["BLOCK_M"]) * cdiv(H, self.mc["BLOCK_N"]),)
        launch(K.gemm_kernel, grid, out, a, b, *descs, M, H, Kdim, *strides, out.stride(0), 1,
                            ACC_IN=ACC_IN, OUT_BF16=OUT_BF16, A_KM=A_KM, B_KN=True, K_I=_bound(Kdim),
                            **self.kw, **launch_options())
