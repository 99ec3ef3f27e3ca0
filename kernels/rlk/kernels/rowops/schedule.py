"""Schedule tables of the strict row ops; registers every rowops kernel.

Config tables (``configs/<arch>.json``) are keyed by non-batch dims only (hidden size / head
dim); nothing here ever looks at the number of rows. A hidden size missing from the table gets
:func:`norm_rule` (a pure function of the hidden size, the same rule that wrote the table). The
``norm`` and ``fold`` entries fix RMSNorm's reduction trees; ``contract.py`` embeds them in
``rmsnorm.v1``.
"""

from __future__ import annotations

from rlk.errors import UnsupportedConfigError
from rlk.kernels import registry
from rlk.kernels.common import CPU_ARCH, TableOverrides, load_table, next_pow2
from rlk.kernels.rowops import kernel as K

MAX_HIDDEN = 16384  # largest normalized row (BLOCK_H 16384 fp32 in registers)


def norm_rule(hidden: int) -> dict:
    """The pinned RMSNorm schedule of a hidden size (function of ``hidden`` only)."""
    bh = next_pow2(hidden)
    br = max(1, min(16, 2048 // bh))
    nw = min(16, max(4, bh * br // 512))
    bwd_rows = 32 if hidden >= 1024 else (1024 if hidden >= 128 else 4 * br)
    return {"BLOCK_H": bh, "BLOCK_ROWS": br, "num_warps": nw, "BWD_TILES": max(1, bwd_rows // br)}


def table(arch: str = "sm_90") -> dict:
    """The table of ``arch`` (``rlk.kernels.common.arch_of``); the interpreter
    (``cpu-interpreter``) runs the sm_90 table, so CPU tests walk the GPU's reduction trees."""
    return load_table("rowops", "sm_90" if arch == CPU_ARCH else arch)


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


def qk_norm_rope_config(hidden: int, arch: str = "sm_90") -> dict:
    """The tile of ``qk_norm_rope`` at head size ``hidden``: :func:`norm_config`'s, with the
    table's ``qk_norm_rope`` entry (more programs for decode's few rows) where there is one. An
    entry only changes BLOCK_ROWS and num_warps, and only where the GPU measured its outputs
    byte-identical to the norm tile's (the entry's ``evidence``; ``rowops_variants.py``): the
    per-row reduction is the norm's."""
    cfg = norm_config(hidden, arch)
    tile = (table(arch).get("qk_norm_rope") or {}).get("tiles", {}).get(str(hidden))
    if tile:
        cfg.update(BLOCK_ROWS=int(tile["BLOCK_ROWS"]), num_warps=int(tile["num_warps"]))
    return cfg


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
                      num_warps=c["num_warps"], num_stages=1)
               for h, c in ((h, qk_norm_rope_config(int(h))) for h in t["norm"]) if int(h) in (64, 128))),
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
