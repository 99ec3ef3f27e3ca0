"""Contracts and config tables of the strict row ops; registers every rowops kernel.

Config tables (``configs/<arch>.json``) are keyed by non-batch dims only (hidden size / head
dim); nothing here ever looks at the number of rows. A hidden size missing from the table gets
:func:`norm_rule` (a pure function of the hidden size, the same rule that wrote the table).
"""

from __future__ import annotations

import functools
import json
import os

from rlk import contracts
from rlk.determinism import FP_FUSION
from rlk.errors import UnsupportedConfigError
from rlk.kernels import registry
from rlk.kernels.common import TableOverrides, next_pow2
from rlk.kernels.rowops import kernel as K

_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
ARCH_FILES = {"sm_90": "sm90.json", "gfx942": "gfx942.json", "cpu-interpreter": "sm90.json"}
MAX_HIDDEN = 16384  # largest normalized row (BLOCK_H 16384 fp32 in registers)


def norm_rule(hidden: int) -> dict:
    """The pinned RMSNorm schedule of a hidden size (function of ``hidden`` only)."""
    bh = next_pow2(hidden)
    br = max(1, min(16, 2048 // bh))
    nw = min(16, max(4, bh * br // 512))
    bwd_rows = 32 if hidden >= 1024 else (1024 if hidden >= 128 else 4 * br)
    return {"BLOCK_H": bh, "BLOCK_ROWS": br, "num_warps": nw, "BWD_TILES": max(1, bwd_rows // br)}


@functools.lru_cache(maxsize=None)
def table(arch: str = "sm_90") -> dict:
    try:
        name = ARCH_FILES[arch]
    except KeyError:
        raise UnsupportedConfigError(f"rowops: no config table for arch {arch!r} (have {sorted(ARCH_FILES)})")
    with open(os.path.join(_DIR, name)) as f:
        return json.load(f)


# Table overrides for sweeps only (``with override("embedding", TILE_ELEMS=8192):``).
_OVERRIDES = TableOverrides()
override = _OVERRIDES.use


def entry(arch: str, kind: str) -> dict:
    """``table(arch)[kind]`` with any active :func:`override` applied (a copy when overridden)."""
    return _OVERRIDES.apply(kind, table(arch)[kind]) if _OVERRIDES.active else table(arch)[kind]


def norm_config(hidden: int, arch: str = "sm_90") -> dict:
    if not 1 <= hidden <= MAX_HIDDEN:
        raise UnsupportedConfigError(f"rms_norm: hidden size {hidden} outside [1, {MAX_HIDDEN}]")
    return dict(table(arch)["norm"].get(str(hidden)) or norm_rule(hidden))


_COMMON = {
    "fp_fusion": FP_FUSION,
    "interpreter": "fp32 arithmetic; bf16 rounding via round_bf16 (RNE on integer bits)",
}

RMSNORM = contracts.register(contracts.Contract(
    id="rmsnorm.v1",
    summary="RMSNorm / fused residual-add RMSNorm / QK-norm, HF-Qwen3 rounding order",
    bit_fields={
        **_COMMON,
        "dtypes": {"x": ["bf16", "fp32"], "weight": ["bf16", "fp32"], "out": "x dtype", "math": "fp32"},
        "accumulation": "fp32",
        "formula": "rstd = div_rn(1, sqrt_rn(div_rn(sum(x*x), H) + eps)); "
                   "y = round(w * round(x * rstd))",
        "rounding": ["new_residual = round(x + r) (fused form)", "n = round(x * rstd)",
                     "y = round(w * n)"],
        "rounding_mode": "RNE to the activation dtype (no rounding for fp32)",
        "residual": "the norm reads the rounded new_residual: fused == add then norm, bitwise",
        "reduction_order": "per row: tl.sum over BLOCK_H = next_pow2(H) lanes of a "
                           "[BLOCK_ROWS, BLOCK_H] fp32 tile, masked lanes +0.0, tree = Triton 3.6 "
                           "lowering for the pinned (BLOCK_ROWS, BLOCK_H, num_warps) of norm_config(H)",
        "norm_configs": "configs/sm90.json 'norm' (keyed by H only), else norm_rule(H)",
        # The tables decide the trees: their contents are part of the contract's identity.
        "norm_table_sm90": table("sm_90")["norm"],
        "fold_sm90": table("sm_90")["fold"],
        "rsqrt": "div_rn(1, sqrt_rn(.)) (correctly rounded; no approximate rsqrt)",
        "backward": "dx = round((g - xhat * div_rn(sum(g*xhat), H)) * rstd), g = dy*w, xhat = x*rstd; "
                    "fused: round(round(dx) + d_new_residual); dw: program p takes rows "
                    "[p*R, (p+1)*R), R = BLOCK_ROWS*BWD_TILES, slot row%BLOCK_ROWS ascending, tl.sum "
                    "over slots -> fp32 partial[p]; fold: slot j takes partials j, j+FOLD_ROWS, ... "
                    "ascending, tl.sum over FOLD_ROWS slots, one rounding; no atomics",
    },
    targets=("sm_90", "cpu-interpreter"),
    # rowops.qk_norm_rope: the QK-norm of this contract followed by rope.v1 in one pass (the
    # norm's tile, tree and roundings unchanged); inference only.
    kernels=("rowops.rmsnorm_fwd", "rowops.rmsnorm_bwd", "rowops.fold_partials", "rowops.qk_norm_rope"),
))

ROPE = contracts.register(contracts.Contract(
    id="rope.v1",
    summary="rotate-half RoPE with an fp64-host cos/sin table, fp32 apply, one rounding",
    bit_fields={
        **_COMMON,
        "dtypes": {"x": ["bf16", "fp32"], "table": "fp32", "positions": "int64", "math": "fp32"},
        "accumulation": "none (elementwise)",
        "table": "on CPU in fp64: inv_freq = 1 / theta ** (arange(0, D, 2) / D); "
                 "angle = arange(max_pos) * inv_freq (outer product, fp64); cos/sin in fp64; "
                 "one RNE cast to fp32 -> [max_pos, D/2]",
        "formula": "o1 = x1*c - x2*s; o2 = x2*c + x1*s (x1 = x[..., :D/2], x2 = x[..., D/2:])",
        "rounding": ["one RNE rounding of o1, o2 to the activation dtype"],
        "reduction_order": "none",
        "backward": "inverse rotation: same kernel with s -> -s",
        "bad_position": "host raises; in-kernel (when the host may not sync) the row is NaN",
    },
    schedule_fields={"BLOCK_ROWS": "TILE_ELEMS // next_pow2(D/2) (token, head) rows", "num_warps": [4]},
    bit_neutral_evidence={"BLOCK_ROWS": "elementwise, no reduction (rowops_invariance_test, interpreter)",
                          "num_warps": "elementwise, no reduction"},
    targets=("sm_90", "gfx942", "cpu-interpreter"),
    kernels=("rowops.rope",),
))

SWIGLU = contracts.register(contracts.Contract(
    id="swiglu.v1",
    summary="silu(gate) * up in fp32, one rounding",
    bit_fields={
        **_COMMON,
        "dtypes": {"gate_up": ["bf16", "fp32"], "out": "gate_up dtype", "math": "fp32"},
        "accumulation": "none (elementwise)",
        "formula": "y = div_rn(g, 1 + exp(-g)) * u, g = gate_up[:, :F], u = gate_up[:, F:]",
        "exp": "tl.exp (vendor lowering; sm_90: ex2.approx of x*log2(e))",
        "rounding": ["one RNE rounding of y"],
        "reduction_order": "none",
        "backward": "s = div_rn(1, 1 + exp(-g)); dg = round(dy*u*(s*(1 + g*(1 - s)))); "
                    "du = round(dy * div_rn(g, 1 + exp(-g)))",
    },
    schedule_fields={"BLOCK": [1024], "num_warps": [4]},
    bit_neutral_evidence={"BLOCK": "elementwise over T*F, no reduction", "num_warps": "elementwise"},
    targets=("sm_90", "cpu-interpreter"),
    kernels=("rowops.swiglu_fwd", "rowops.swiglu_bwd"),
))

EMBEDDING = contracts.register(contracts.Contract(
    id="embedding.v1",
    summary="exact row gather; deterministic sorted-segment weight gradient",
    bit_fields={
        **_COMMON,
        "dtypes": {"ids": "int64 (int32 accepted)", "weight": ["bf16", "fp32", "fp16"]},
        "accumulation": "fp32 (backward)",
        "rounding": ["forward: none (exact copy)", "backward: one RNE rounding of each dW row"],
        "reduction_order": "dW[v] = sum over tokens with id v in ascending token index "
                           "(stable sort), fp32, one program per present id; no atomics",
        "bad_id": "host raises; in-kernel (when the host may not sync) the row is NaN",
    },
    schedule_fields={"BLOCK_H": "min(1024, next_pow2(H))", "BLOCK_T": "TILE_ELEMS // BLOCK_H",
                     "num_warps": [4],
                     "forward_route": ["torch.index_select (ids known in range: host check or the caller's "
                                       "host_validated())", "embedding_fwd_kernel (otherwise)"]},
    bit_neutral_evidence={"BLOCK_H": "copy / per-column sums", "BLOCK_T": "copy",
                          "num_warps": "no cross-lane reduction",
                          "forward_route": "both routes copy every non-NaN element's bytes (a NaN may change "
                                           "payload through the kernel's fp32 pass); rowops_test compares "
                                           "them bitwise (interpreter; GPU case test_gpu_embedding_routes_"
                                           "and_graph_capture)"},
    targets=("sm_90", "gfx942", "cpu-interpreter"),
    kernels=("rowops.embedding_fwd", "rowops.embedding_bwd"),
))

CONTRACTS = (RMSNORM, ROPE, SWIGLU, EMBEDDING)


def _flags(**kw):
    return {"OUT_BF16": True, "INTERPRET": False, **kw}


def _register_kernels() -> None:
    t = table("sm_90")
    norm_cfgs = tuple(
        _flags(H=int(h), BLOCK_H=c["BLOCK_H"], BLOCK_ROWS=c["BLOCK_ROWS"], HAS_RESIDUAL=res,
               num_warps=c["num_warps"], num_stages=1)
        for h, c in t["norm"].items() for res in (False, True))
    bwd_cfgs = tuple(
        _flags(H=int(h), BLOCK_H=c["BLOCK_H"], BLOCK_ROWS=c["BLOCK_ROWS"], BWD_TILES=c["BWD_TILES"],
               HAS_DRES=dres, num_warps=c["num_warps"], num_stages=1)
        for h, c in t["norm"].items() for dres in (False, True))
    fold = t["fold"]
    entries = [
        ("rowops.rmsnorm_fwd", "rmsnorm.v1", K.rmsnorm_fwd_kernel,
         {"y_ptr": "*bf16", "res_out_ptr": "*bf16", "x_ptr": "*bf16", "r_ptr": "*bf16", "w_ptr": "*bf16",
          "n_rows": "i64", "NH": "i32", "stride_xt": "i64", "stride_xh": "i64", "stride_rt": "i64",
          "H_F": "fp32", "eps": "fp32"}, norm_cfgs),
        ("rowops.rmsnorm_bwd", "rmsnorm.v1", K.rmsnorm_bwd_kernel,
         {"dx_ptr": "*bf16", "dwp_ptr": "*fp32", "dy_ptr": "*bf16", "x_ptr": "*bf16", "w_ptr": "*bf16",
          "dres_ptr": "*bf16", "n_rows": "i64", "NH": "i32", "stride_xt": "i64", "stride_xh": "i64",
          "H_F": "fp32", "eps": "fp32"}, bwd_cfgs),
        ("rowops.fold_partials", "rmsnorm.v1", K.fold_partials_kernel,
         {"out_ptr": "*bf16", "p_ptr": "*fp32", "n_parts": "i32"},
         tuple(_flags(H=int(h), BLOCK_F=min(fold["BLOCK_F"], c["BLOCK_H"]), FOLD_ROWS=fold["FOLD_ROWS"],
                      num_warps=fold["num_warps"], num_stages=1) for h, c in t["norm"].items())),
        ("rowops.rope", "rope.v1", K.rope_kernel,
         {"out_ptr": "*bf16", "x_ptr": "*bf16", "pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
          "n_rows": "i64", "NH": "i32", "stride_xt": "i64", "stride_xh": "i64", "max_pos": "i64"},
         tuple(_flags(HALF=64, BLOCK_HALF=64, BLOCK_ROWS=t["rope"]["TILE_ELEMS"] // 64, BACKWARD=b,
                      num_warps=t["rope"]["num_warps"], num_stages=1) for b in (False, True))),
        ("rowops.qk_norm_rope", "rmsnorm.v1", K.qk_norm_rope_kernel,
         {"q_ptr": "*bf16", "k_ptr": "*bf16", "x_ptr": "*bf16", "wq_ptr": "*bf16", "wk_ptr": "*bf16",
          "pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "n_rows": "i64", "NQ": "i32",
          "NH": "i32", "stride_xt": "i64", "stride_xh": "i64", "H_F": "fp32", "eps": "fp32", "max_pos": "i64"},
         tuple(_flags(H=int(h), HALF=int(h) // 2, BLOCK_H=c["BLOCK_H"], BLOCK_ROWS=c["BLOCK_ROWS"],
                      num_warps=c["num_warps"], num_stages=1) for h, c in t["norm"].items() if int(h) in (64, 128))),
        ("rowops.swiglu_fwd", "swiglu.v1", K.swiglu_fwd_kernel,
         {"y_ptr": "*bf16", "gu_ptr": "*bf16", "n_elem": "i64", "F": "i64", "stride_gt": "i64"},
         (_flags(BLOCK=t["swiglu"]["BLOCK"], num_warps=t["swiglu"]["num_warps"], num_stages=1),)),
        ("rowops.swiglu_bwd", "swiglu.v1", K.swiglu_bwd_kernel,
         {"dgu_ptr": "*bf16", "dy_ptr": "*bf16", "gu_ptr": "*bf16", "n_elem": "i64", "F": "i64",
          "stride_gt": "i64"},
         (_flags(BLOCK=t["swiglu"]["BLOCK"], num_warps=t["swiglu"]["num_warps"], num_stages=1),)),
        ("rowops.embedding_fwd", "embedding.v1", K.embedding_fwd_kernel,
         {"y_ptr": "*bf16", "ids_ptr": "*i64", "w_ptr": "*bf16", "T": "i64", "V": "i64", "H": "i32",
          "stride_wv": "i64"},
         ({"BLOCK_T": 4, "BLOCK_H": 1024, "num_warps": 4, "num_stages": 1},)),
        ("rowops.embedding_bwd", "embedding.v1", K.embedding_bwd_kernel,
         {"dw_ptr": "*bf16", "dy_ptr": "*bf16", "order_ptr": "*i64", "uniq_ptr": "*i64",
          "start_ptr": "*i64", "count_ptr": "*i64", "H": "i32"},
         (_flags(BLOCK_H=1024, num_warps=4, num_stages=1),)),
    ]
    for name, cid, fn, sig, cfgs in entries:
        sig = dict(sig)
        for c in cfgs:
            sig.update({k: "constexpr" for k in c if k not in ("num_warps", "num_stages")})
        registry.register_kernel(registry.KernelEntry(
            name=name, contract_id=cid, fn=fn, signature=sig, configs=cfgs, expects_mma=False))


_register_kernels()
