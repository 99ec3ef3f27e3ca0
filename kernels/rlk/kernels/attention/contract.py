"""Contract ``attn.v2`` and its small-segment test variant ``attn.seg128.v2``: the fixed KV walk,
online-softmax step, segment fold and rounding points every attention kernel follows.
"""

from __future__ import annotations

from rlk import contracts
from rlk.determinism import FP_FUSION
from rlk.errors import UnsupportedConfigError

KV_CHUNK = 64
HEAD_DIMS = (16, 32, 64, 128)  # 16/32 exist for tiny CPU models; Qwen3 uses 128 (64 for tests)
PAGE_SIZES = (16, 32, 64, 128, 256)

_PENDING = ("attention_invariance_sweep@sm_90 (configs/invariance_sm90.json: prefill BLOCK_M/num_warps/GP "
            "bit-neutral) and attention_variants@sm_90 (docs/results/attention_variants_h200.json, "
            "attention_variants_bwd_h200.json: prefill/decode warps/stages/BLOCK_M/GP and backward "
            "warps/stages byte-identical); interpreter: attention_invariance_test.py")


def _bit_fields(seg: int) -> dict:
    return {
        "dtypes": {"q_k_v": "bf16", "out": "bf16", "lse": "fp32", "accumulator": "fp32",
                   "dot_operands": "bf16 on GPU (q, k, v, p); under the CPU interpreter fp64 operands, each "
                                   "dot an exact fp64 sum rounded once to fp32 (GPU arithmetic as in v1)"},
        "accumulation": "fp32 MMA accumulators for q.k, p@v and the row sum p@ones[64,16]",
        "rounding": "one bf16 RNE rounding of out at the store; lse stays fp32; p is rounded to the "
                    "dot operand dtype before both p@v and p@ones (numerator and denominator agree)",
        "reduction_order": (
            f"per query row: KV positions walked in chunks of {KV_CHUNK} ascending; chunks grouped in "
            f"segments of {seg} positions (segment s = [s*{seg}, (s+1)*{seg})); each segment starts "
            "from m=-inf, l=0, acc=0 and runs the online step per chunk; segment states are left-folded "
            "in ascending order starting from the empty state; in-chunk sums are MMA (K=64)"),
        "fp_fusion": FP_FUSION,
        "kv_chunk": KV_CHUNK,
        "segment": seg,
        # MMA forms the compiled code may use (checked by rlk.gate.crosstarget). Prefill tiles use
        # wgmma, BLOCK_M=16 decode tiles mma.sync; their rows must agree (GPU invariance sweep).
        "mma_form": {
            "attention.fwd": {"sm_90": ["wgmma.f32.bf16.bf16", "mma.sync.m16n8k16.f32.bf16.bf16"],
                              "gfx942": ["v_mfma_f32_16x16x16_bf16", "v_mfma_f32_32x32x8_bf16"]},
            "attention.bwd_dq": {"sm_90": ["wgmma.f32.bf16.bf16", "mma.sync.m16n8k16.f32.bf16.bf16"],
                                 "gfx942": ["v_mfma_f32_16x16x16_bf16", "v_mfma_f32_32x32x8_bf16"]},
            "attention.bwd_dkdv": {"sm_90": ["wgmma.f32.bf16.bf16", "mma.sync.m16n8k16.f32.bf16.bf16"],
                                   "gfx942": ["v_mfma_f32_16x16x16_bf16", "v_mfma_f32_32x32x8_bf16"]},
        },
        "score": "s2 = fp32(q.k) * qk_scale, qk_scale = fp32(scale * log2(e)) computed on the host "
                 "(float64 product, one RNE rounding); all exponentials are exp2, logs log2",
        "online_step": "m' = max(m, rowmax(s2)); ms = (m' == -inf ? 0 : m'); alpha = (m' == m ? 1 : "
                       "exp2(m - ms)); p = exp2(s2 - ms); l = dot(p, ones, l*alpha); acc = dot(p, v, acc*alpha)",
        "segment_fold": "m = max(m1, m2); ms = (m == -inf ? 0 : m); a_i = (m_i == m ? 1 : exp2(m_i - ms)); "
                        "l = l1*a1 + l2*a2; acc = acc1*a1 + acc2*a2 (no FMA)",
        "finalize": "out = bf16_rne(l > 0 ? acc / l : 0) after +0.0 (canonical zero); "
                    "lse = l > 0 ? (m + log2(l)) * fp32(ln 2) : -inf (natural-log units, log2-domain m)",
        "masking": "key j visible to the query at position i iff 0 <= j <= i and j < kv_len; masked "
                   "lanes get s2 = -inf and K/V loaded as 0 (garbage in unused cache slots never "
                   "reaches a product); fully masked chunks and segments are bit no-ops",
        "gqa": "q head h reads kv head h // (Hq / Hk)",
        "positions": "paged: query i of a sequence sits at kv_len - q_len + i; prefill: at i",
        "empty": "q_len 0: no rows; a query with no visible key (kv_len 0 padding slot): out 0, lse -inf",
        "backward": "p recomputed as exp2(s2 - lse*log2(e)); delta = sum(dO*O) fp32; dK/dV: one "
                    "program per (KV block, q head): query blocks ascending into that head's fp32 "
                    "partial; the group's partials left-folded over q heads ascending from 0.0 "
                    "(fp32 adds), dK times scale, one bf16 rounding; dQ: KV blocks ascending; no "
                    "atomics; one bf16 rounding per gradient",
    }


_SCHEDULE = {
    "BLOCK_M": "prefill 128 / chunked 64 / decode 16 rows (GPU table); rows are independent",
    "num_warps": "per kernel in configs/<arch>.json",
    "num_stages": "per kernel in configs/<arch>.json",
    "GP": "q heads of a group packed as rows of one tile",
    "split": "decode: one program per segment + merge kernel, else in-register fold (same fold)",
    "page_size": list(PAGE_SIZES),
}


ATTN_V2 = contracts.register(contracts.Contract(
    id="attn.v2",
    summary="fixed-chunk (64) / fixed-segment (512) online-softmax attention; prefill, chunked "
            "prefill and paged decode give identical rows (forward GPU arithmetic as attn.v1; "
            "backward dK/dV as per-head partials folded over q heads ascending; the "
            "CPU-interpreter model sums each dot exactly in fp64)",
    bit_fields=_bit_fields(512),
    schedule_fields=_SCHEDULE,
    bit_neutral_evidence={k: _PENDING for k in _SCHEDULE},
    kernels=("attention.fwd", "attention.merge", "attention.write_kv", "attention.bwd_delta",
             "attention.bwd_dkdv", "attention.bwd_fold", "attention.bwd_dq"),
))


# Same kernels, segments of 128 positions: lets CPU tests exercise segment folds and split decode
# at interpreter-sized lengths. Never used by a model; recorded IDs differ from attn.v2.
ATTN_SEG128_V2 = contracts.register(contracts.Contract(
    id="attn.seg128.v2",
    summary="test variant of attn.v2 with 128-position segments",
    bit_fields=_bit_fields(128),
    schedule_fields=_SCHEDULE,
    bit_neutral_evidence={k: _PENDING for k in _SCHEDULE},
    targets=("cpu-interpreter", "sm_90"),
    kernels=ATTN_V2.kernels,
))


CONTRACTS = {c.id: c for c in (ATTN_V2, ATTN_SEG128_V2)}


def contract(contract_id: str) -> contracts.Contract:
    if contract_id not in CONTRACTS:
        raise UnsupportedConfigError(f"attention contract {contract_id!r} unknown (known: {sorted(CONTRACTS)})")
    return CONTRACTS[contract_id]
