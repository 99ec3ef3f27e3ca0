"""Contracts of the strict row ops: ``rmsnorm.v1``, ``rope.v1``, ``swiglu.v1``, ``embedding.v1``.

Each record names the bit-relevant choices of its op (dtypes, formula, rounding points, reduction
order). RMSNorm's reduction trees are fixed by the pinned ``norm`` and ``fold`` entries of the
sm_90 table (``schedule.py``), so the record embeds them: a table edit that changes a tree
changes the contract's bit hash.
"""

from __future__ import annotations

from rlk import contracts
from rlk.determinism import FP_FUSION
from rlk.kernels.rowops.schedule import table

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
    # The fused QK-norm + RoPE of the engine may run the norm with fewer rows per program (decode
    # has few rows); its table entry holds only tiles measured byte-identical to the norm tile.
    schedule_fields={"qk_norm_rope_tile": "configs/sm90.json 'qk_norm_rope' tiles: (BLOCK_ROWS, num_warps) "
                                          "per head size, BLOCK_H the norm's; else the norm tile"},
    bit_neutral_evidence={"qk_norm_rope_tile": (table("sm_90").get("qk_norm_rope") or {}).get(
        "evidence", "no entry: the norm tile itself")},
    targets=("sm_90", "cpu-interpreter"),
    # rowops.qk_norm_rope: the QK-norm of this contract followed by rope.v1 in one pass (the
    # norm's per-row reduction and roundings unchanged); inference only.
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
