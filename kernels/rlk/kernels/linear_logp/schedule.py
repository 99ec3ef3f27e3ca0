"""Bit-neutral launch choices of ``logp.v2`` over its tables, and the kernel registry entries.

The tables themselves are contract bits (``contract.py``); here: sweep/test overrides of them,
the arch a device runs, the forward's decode tiles, the merge unroll and the grad_out scaling
tiles (none of them changes a byte).
"""

from __future__ import annotations

from rlk.kernels import registry
from rlk.kernels.common import CPU_ARCH, TableOverrides
from rlk.kernels.linear_logp import kernel as K
from rlk.kernels.linear_logp.contract import CONTRACT_ID, DEFAULT_SEGMENTATION, load_table

# grad_out scaling of the fused loss's gradients (``kernel.scale_kernel``, ``fused.scale_by_``):
# elementwise, one fp32 multiply and one RNE rounding per element, so its tile is no bit field and
# it is not in the tables (whose bit hash would change with it). BLOCK * ITERS elements per program;
# when grad_out == 1 each program only reads the scalar, so few large programs keep that launch short.
SCALE_FIELDS = {"BLOCK": 4096, "ITERS": 8, "num_warps": 8, "num_stages": 1}
SCALE_FIELDS_CPU = {"BLOCK": 512, "ITERS": 2, "num_warps": 4, "num_stages": 1}  # several programs in tests


# Segments per trip of merge_kernel's loops (loads issued together; the per-row order and
# operations are unchanged and the padding segments of the last trip are exact no-ops, so it is
# no bit field: merge_kernel's docstring). 3 under the interpreter: tests cover a partial trip.
# 16 rather than 8: CUDA-graph device time of the merge alone on the H200, unroll 8 -> 16, bytes equal
# at every point (docs/results/linear_logp_variants_merge_unroll_h200.json): V=151936 (600
# segments) T=8 76 -> 60 us, T=1024 103 -> 95, T=8192 112 -> 105; V=37984 (150) T=8 20.7 -> 17.8,
# T=1024 27.4 -> 26.0, T=8192 28.6 -> 27.1. 32 and 64 were slower at decode sizes. gfx942 uses
# the same constant (bit-neutral by construction; its speed there is unmeasured).
MERGE_UNROLL = 16
MERGE_UNROLL_CPU = 3


def merge_unroll(arch: str) -> int:
    return MERGE_UNROLL_CPU if arch == CPU_ARCH else MERGE_UNROLL


def scale_fields(arch: str) -> dict:
    return SCALE_FIELDS_CPU if arch == CPU_ARCH else SCALE_FIELDS


def fwd_entry(tab: dict, T: int) -> dict:
    """The forward's launch entry for ``T`` rows (a schedule choice, never a byte).

    With ``DECODE_T_MAX`` set, ``T <= DECODE_T_MAX`` runs one-warpgroup tiles: 64 rows and 4
    warps instead of the table's 128 rows and 8 warps. On sm_90 a 128-row tile is two
    warpgroups of 64 rows each doing exactly what the 64-row tile does (wgmma m64 per warpgroup,
    row reductions inside a warpgroup), so every row's bytes are the same (``DECODE_EVIDENCE``);
    at decode sizes it halves the padded MMA work and lets two programs share an SM.
    """
    f = tab["fwd"]
    if T > (f.get("DECODE_T_MAX") or 0):
        return f
    return {**f, "BLOCK_T": 64, "num_warps": 4, "num_stages": f.get("DECODE_STAGES", f["num_stages"])}


# Table overrides for sweeps and tests only (``with override("fwd", BLOCK_V=256):``).
_OVERRIDES = TableOverrides()
override = _OVERRIDES.use


def table(arch: str) -> dict:
    """The launch table of ``arch`` with any active :func:`override` applied (a copy)."""
    t = load_table(arch)
    if not _OVERRIDES.active:
        return t
    return {k: _OVERRIDES.apply(k, e) if isinstance(e, dict) else e for k, e in t.items()}


def _launch_fields(entry: dict) -> dict:
    """A table entry as kernel constexprs: ``TMA`` -> ``USE_TMA=False`` (the registry's compile
    check uses pointer loads; TMA needs descriptors made from real tensors)."""
    out = {k: v for k, v in entry.items() if k not in ("TMA", "DECODE_T_MAX", "DECODE_STAGES")}
    if "TMA" in entry:
        out["USE_TMA"] = False
    return out


def grad_from_logits_fields(t: dict) -> dict:
    """Launch fields of grad_from_logits: bwd_grad's tile and warps (elementwise, so any tile
    gives the same bytes; no bit field of its own)."""
    return {k: t["bwd_grad"][k] for k in ("BLOCK_T", "BLOCK_V", "num_warps", "num_stages")}


def _register_kernels() -> None:
    t = load_table("sm_90")
    ptr = "*fp32"
    regs = [
        ("fwd_stats", K.fwd_stats_kernel,
         {"m_ptr": ptr, "s_ptr": ptr, "e_ptr": ptr, "tg_ptr": ptr, "logits_ptr": ptr,
          "h_ptr": "*bf16", "w_ptr": "*bf16", "tgt_ptr": "*i64", "h_desc": "constexpr",
          "w_desc": "constexpr", "T": "i32", "V_local": "i32",
          "H": "i32", "vocab_start": "i32", "vocab_real": "i32", "n_seg": "i32", "stride_ht": "i32",
          "stride_wv": "i32", "stride_lt": "i32", "inv_temp": "fp32"},
         {"ALIGN": DEFAULT_SEGMENTATION[0], "SEG_V": DEFAULT_SEGMENTATION[1], "WITH_ENTROPY": True,
          "WITH_LOGITS": True, "h_desc": None, "w_desc": None, **_launch_fields(t["fwd"])}),
        ("merge", K.merge_kernel,
         {"logp_ptr": ptr, "lse_ptr": ptr, "ent_ptr": ptr, "m_ptr": ptr, "s_ptr": ptr, "e_ptr": ptr,
          "tg_ptr": ptr, "S": "i32", "R": "i32", "T": "i32"},
         {"WITH_ENTROPY": True, "UNROLL": MERGE_UNROLL, **t["merge"]}),
        ("bwd_grad", K.bwd_grad_kernel,
         {"g_ptr": "*bf16", "h_ptr": "*bf16", "w_ptr": "*bf16", "tgt_ptr": "*i64",
          "lse_ptr": ptr, "ent_ptr": ptr, "dlogp_ptr": ptr, "dlse_ptr": ptr, "dent_ptr": ptr,
          "h_desc": "constexpr", "w_desc": "constexpr", "T": "i32",
          "V_local": "i32", "H": "i32", "col0": "i32", "col_end": "i32", "vocab_start": "i32",
          "vocab_real": "i32", "stride_ht": "i32", "stride_wv": "i32", "stride_gt": "i32", "inv_temp": "fp32"},
         {"HAS_DLSE": True, "HAS_DENT": True, "INTERPRET": False,
          "h_desc": None, "w_desc": None, **_launch_fields(t["bwd_grad"])}),
        ("gemm", K.gemm_kernel,
         {"c_ptr": ptr, "a_ptr": "*bf16", "b_ptr": "*bf16", "a_desc": "constexpr", "b_desc": "constexpr",
          "M": "i32", "N": "i32", "K": "i32",
          "stride_am": "i32", "stride_ak": "i32", "stride_bk": "i32", "stride_bn": "i32",
          "stride_cm": "i32", "stride_cn": "i32"},
         {"ACC_IN": True, "OUT_BF16": False, "INTERPRET": False, "a_desc": None, "b_desc": None,
          "A_KM": False, "B_KN": False, **_launch_fields(t["gemm"])}),
        ("grad_from_logits", K.grad_from_logits_kernel,
         {"g_ptr": "*bf16", "x_ptr": ptr, "tgt_ptr": "*i64", "lse_ptr": ptr, "dlogp_ptr": ptr, "T": "i32",
          "V_local": "i32", "vocab_start": "i32", "vocab_real": "i32", "stride_xt": "i32", "stride_gt": "i32",
          "inv_temp": "fp32"},
         {"INTERPRET": False, **grad_from_logits_fields(t)}),
        ("scale", K.scale_kernel, {"x_ptr": "*bf16", "s_ptr": ptr, "n": "i32"},
         {"OUT_BF16": True, "INTERPRET": False, **SCALE_FIELDS}),
    ]
    # The forward's one-warpgroup decode tile (fwd_entry) is compiled and fingerprinted too.
    decode = [_launch_fields(fwd_entry(t, 1))] if t["fwd"].get("DECODE_T_MAX") else []
    for name, fn, sig, cfg in regs:
        extra = [{**cfg, **d} for d in decode] if name == "fwd_stats" else []
        if name == "merge":
            # Triton specializes an int argument equal to 1 as a constexpr: a one-row merge (a
            # rollout step of one sampling row) compiles that variant, so L0 compiles it too.
            extra = [{**cfg, "T": 1}]
        _register(name, fn, sig, [cfg, *extra])


def _register(name, fn, sig0, cfgs) -> None:
    """The entry's signature is the first config's; a later config's extra constexprs (e.g. the
    one-row merge's T=1) become constexpr for that config only (the compile harness marks every
    constexpr of a config as such)."""
    configs, entry_sig = [], None
    for cfg in cfgs:
        sig, cfg = dict(sig0), dict(cfg)
        # GPU values of the interpreter-only constexprs (kernel.py: loop bounds).
        for k in ("INTERPRET", "H_I", "S_I", "R_I", "K_I"):
            if k in fn.arg_names:
                cfg[k] = False if k == "INTERPRET" else 0
        if "DOT_DTYPE" in fn.arg_names:
            cfg["DOT_DTYPE"] = "bf16"
        for k in cfg:
            if k not in ("num_warps", "num_stages"):
                sig[k] = "constexpr"
        missing = [a for a in fn.arg_names if a not in sig]
        if missing:
            raise RuntimeError(f"linear_logp.{name}: signature lacks {missing}")
        configs.append(cfg)
        entry_sig = entry_sig or sig
    registry.register_kernel(registry.KernelEntry(
        name=f"linear_logp.{name}", contract_id=CONTRACT_ID, fn=fn, signature=entry_sig,
        configs=tuple(configs), expects_mma=name not in ("merge", "grad_from_logits", "scale")))


_register_kernels()
