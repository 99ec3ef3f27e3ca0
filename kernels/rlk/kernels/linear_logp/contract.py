"""Contract ``logp.v2`` (fused LM head + selected-token log-prob) and the tables it covers.

Every block size of a launch table is a bit field (it fixes tl.max/tl.sum trees and MMA shapes)
except the schedule fields (``SCHEDULE_FIELDS``); none is ever chosen from the number of tokens
T. So the contract reads its tables: ``configs/sm90.json`` (GPU) and ``CPU_TABLE`` (Triton
interpreter, tests only) are embedded in the record, and its bit hash covers them. The
bit-neutral choices made on top of them (overrides, decode tiles, merge unroll, grad_out scaling
tiles) are in ``schedule.py``.
"""

from __future__ import annotations

import functools

from rlk import contracts
from rlk.determinism import FP_FUSION
from rlk.errors import UnsupportedConfigError
from rlk.kernels import common
from rlk.kernels.common import CPU_ARCH

CONTRACT_ID = "logp.v2"
BLOCK_K = 64  # the gemm.bf16.v1 K chunk

# Vocabulary segmentation (bit fields). Columns are cut into "alignment blocks" of ALIGN global
# columns; each block into segments of SEG_V columns (the last one shorter when SEG_V does not
# divide ALIGN). A tensor-parallel shard must start on a block boundary and hold whole blocks
# (only the shard holding the last real column may end inside a block); then the segments of
# ranks 0..N-1 in order are exactly the segments of the unsharded vocabulary, and logp/lse are
# byte-identical for every such shard count.
# Production: Qwen3's padded vocabulary 151936 = 8 x 18992, so TP 1, 2, 4, 8 all align.
# SEG_V 256 = one BLOCK_V tile per segment on sm_90. Against SEG_V 512 (two tiles folded by the
# online rule, logp.v1's segmentation) it is faster at every T on the H200
# (docs/results/linear_logp_variants_h200.json) and it doubles the programs at decode sizes.
DEFAULT_SEGMENTATION = (18992, 256)
# (ALIGN, SEG_V) pairs the contract defines. Small ones exist so that interpreter tests can run
# several blocks, segments and shards; (128, 48) has a short last segment per block.
ALLOWED_SEGMENTATIONS = ((18992, 256), (64, 32), (128, 48), (128, 128))

CPU_TABLE = {
    "arch": "cpu-interpreter",
    "fwd": {"BLOCK_T": 16, "BLOCK_V": 32, "BLOCK_K": 64, "GROUP_T": 2, "TMA": 1, "num_warps": 4,
            "num_stages": 1},
    "merge": {"BLOCK": 64, "num_warps": 4, "num_stages": 1},
    "bwd_grad": {"BLOCK_T": 16, "BLOCK_V": 32, "BLOCK_K": 64, "TMA": 1, "num_warps": 4, "num_stages": 1},
    "gemm": {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 2, "TMA": 1, "num_warps": 4,
             "num_stages": 1},
    "G_BUDGET_MB": 256, "V_CHUNK_MAX": 64,
    # 0.25 MB: about 170 rows at V 257, so the interpreter tests run several row chunks by default.
    "fused": {"ROWS_BUDGET_MB": 0.25},
}


# Schedule fields: they choose the load path (TMA descriptors or masked pointers), the program
# order or the pipeline depth, never a sum. Everything else in a table is a bit field.
SCHEDULE_FIELDS = ("GROUP_T", "GROUP_M", "TMA", "num_stages", "G_BUDGET_MB", "V_CHUNK_MAX", "ROWS_BUDGET_MB",
                   "DECODE_T_MAX", "DECODE_STAGES")


SCHEDULE_EVIDENCE = ("linear_logp_variants@sm_90, docs/results/linear_logp_variants_*h200.json: "
                     "logp/lse byte-identical with TMA on/off, GROUP 1/8/32, num_stages 2/3/4 (T 8..8192, "
                     "v1 and v2 tables), d_hidden/d_weight byte-identical with TMA on/off and 128 MB vocab "
                     "chunks vs 4096-column chunks; linear_logp_invariance_test (interpreter: TMA on/off, "
                     "vocab chunk sizes; the d_hidden chain continues across chunks through an exact fp32 "
                     "store/load)")


DECODE_EVIDENCE = ("linear_logp_variants --graph@sm_90 (docs/results/"
                   "linear_logp_variants_decode_graph_h200.json): the forward with one-warpgroup tiles "
                   "(BLOCK_T 64, 4 warps, stages 2/3/4) gives logp/lse byte-identical to the table's "
                   "two-warpgroup tiles (BLOCK_T 128, 8 warps) at T 8, 64 and 256 (BLOCK_T 64 with 8 warps "
                   "does not: its warpgroups split the columns); GPU test "
                   "linear_logp_invariance_test::test_gpu_rows_logits_run_to_run compares rows of T <= 64 "
                   "(decode tiles) with the same rows of T = 1000")


FUSED_EVIDENCE = ("fused_test (interpreter): fused d_hidden/d_weight byte-identical to linear_logp_bwd for 1, "
                  "2 and 3 row chunks (the d_weight fp32 chain continues across chunks cut at multiples of "
                  "BLOCK_K); GPU: fused_test::test_gpu_fused_equals_unfused (H200)")


def bit_table(t: dict) -> dict:
    """A launch table without its schedule fields (what the contract's bit hash covers); an entry
    holding only schedule fields (``fused``) has no bits and is left out."""
    out = {}
    for k, e in t.items():
        if k == "status":
            continue
        if isinstance(e, dict):
            bits = {f: v for f, v in e.items() if f not in SCHEDULE_FIELDS}
            if e and not bits:
                continue  # schedule fields only (``fused``)
            e = bits
        out[k] = e
    return out


@functools.lru_cache(maxsize=None)
def load_table(arch: str) -> dict:
    """The launch table of ``arch`` (``rlk.kernels.common.arch_of``): ``CPU_TABLE`` under the
    interpreter (its block sizes are bit fields too, so the CPU keeps its own), else the
    checked-in file, checked against the rules above."""
    if arch == CPU_ARCH:
        return CPU_TABLE
    t = common.load_table("linear_logp", arch)
    name = common.TABLE_FILES[arch]
    for kind in ("fwd", "bwd_grad", "gemm"):
        if t[kind]["BLOCK_K"] % BLOCK_K:
            raise UnsupportedConfigError(f"{name}: {kind}.BLOCK_K must be a multiple of {BLOCK_K}")
    f = t["fwd"]
    if f.get("DECODE_T_MAX") and (f["BLOCK_T"], f["num_warps"]) != (128, 8):
        raise UnsupportedConfigError(f"{name}: DECODE_T_MAX needs fwd tiles of two 64-row "
                                     f"warpgroups (BLOCK_T 128, 8 warps), not {f['BLOCK_T']} / {f['num_warps']}")
    if t.get("V_CHUNK_MAX") is not None and t["V_CHUNK_MAX"] % BLOCK_K:
        raise UnsupportedConfigError(f"{name}: V_CHUNK_MAX must be a multiple of {BLOCK_K}")
    return t


def check_segmentation(align: int, seg_v: int) -> None:
    if (align, seg_v) not in ALLOWED_SEGMENTATIONS:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: segmentation (align={align}, seg_v={seg_v}) is not "
                                     f"defined by the contract (allowed: {list(ALLOWED_SEGMENTATIONS)})")


CONTRACT = contracts.register(contracts.Contract(
    id=CONTRACT_ID,
    summary="fused LM head + selected-token log-prob: no full logits, fixed segment merge, "
            "vocab-parallel by concatenating segment stats in rank order",
    bit_fields={
        "fp_fusion": FP_FUSION,
        "dtypes": {"hidden": "bf16", "weight": "bf16", "targets": "int64", "accumulator": "fp32",
                   "logits": "fp32 (never rounded to bf16)", "stats/logp/lse/entropy": "fp32",
                   "grad_logits": "bf16", "grad_hidden": "bf16", "grad_weight": "bf16"},
        "accumulation": "acc = tl.dot(h, w^T, acc), fp32, K (hidden) in chunks of 64 ascending, no "
                        "split (equals gemm.bf16.v1 wherever its split_k(K, N) == 1, e.g. 4096x37984)",
        "temperature": "x = acc * inv_t, inv_t = fp32(1 / float64(temperature)) computed on the host",
        "masking": "columns >= vocab_real (global) or >= V_local give x = -inf, exactly 0 in every sum",
        "segmentation": {"default": list(DEFAULT_SEGMENTATION),
                         "allowed": [list(p) for p in ALLOWED_SEGMENTATIONS],
                         "rule": "alignment blocks of ALIGN global columns, segments of SEG_V within "
                                 "a block; shards start at a multiple of ALIGN and hold whole blocks "
                                 "(the last real shard may end inside one)"},
        "rounding": ["logits fp32 (returned as computed)",
                     "lse = M + log(S); logp = x_target - lse; entropy = lse - div_rn(E, S)",
                     "backward: dL/dacc rounded once to bf16 (RNE); dH, dW fp32 chains rounded once"],
        "reduction_order": {
            "tile": "per token, the segment's BLOCK_V tiles ascending, online rule m' = max(m, "
                    "max x); s' = s*exp(m-m') + sum exp(x-m'); e' = e*exp(m-m') + sum exp(x-m')*x "
                    "(factor 1 exactly when m' == m)",
            "merge": "M = max over segments; S = sum_k s_k*exp(m_k - M) over global segments "
                     "0..S-1 ascending (terms with m_k = -inf are 0); same for E",
            "ranks": "segment stats of ranks 0..N-1 concatenated in rank order, then the merge",
            "grad_hidden": "vocab columns ascending in one chain (chunks of 64), fp32, one rounding",
            "grad_weight": "tokens ascending in one chain (chunks of 64), fp32, one rounding",
        },
        "mma_form": {"sm_90": "wgmma.f32.bf16.bf16", "gfx942": "v_mfma_f32_32x32x8_bf16"},
        "exp_log": "Triton 3.6 tl.exp / tl.log lowering (toolchain pinned in provenance)",
        "backward_formula": "dL/dx = dlogp*(onehot - p) + dlse*p - dent*p*((x - lse) + entropy), "
                            "p = exp(x - lse); dL/dacc = dL/dx * inv_t",
        "tables": {"sm_90": bit_table(load_table("sm_90")), "cpu-interpreter": bit_table(CPU_TABLE)},
    },
    schedule_fields={"GROUP_T": [1, 2, 8, 32], "GROUP_M": [1, 2, 8], "TMA": [0, 1], "num_stages": [1, 2, 3, 4],
                     "G_BUDGET_MB": "bytes of the backward's G buffer; sets the vocab chunk (multiple of 64)",
                     "V_CHUNK_MAX": "cap of the vocab chunk (None: V_local)",
                     "DECODE_T_MAX": "T at or below which the forward runs one-warpgroup tiles (64 rows, 4 "
                                     "warps; see fwd_entry); 0 / absent: never",
                     "DECODE_STAGES": "num_stages of those tiles",
                     "ROWS_BUDGET_MB": "fused logp + loss path (fused.py): bytes of its per-row-chunk "
                                       "buffers (fp32 logits + bf16 G, 6 bytes per (row, column)); sets "
                                       "the row chunk (a multiple of the gemm BLOCK_K)"},
    bit_neutral_evidence={k: {"ROWS_BUDGET_MB": FUSED_EVIDENCE, "DECODE_T_MAX": DECODE_EVIDENCE,
                              "DECODE_STAGES": DECODE_EVIDENCE}.get(k, SCHEDULE_EVIDENCE)
                          for k in SCHEDULE_FIELDS},
    targets=("sm_90", "cpu-interpreter"),
    kernels=("linear_logp.fwd_stats", "linear_logp.merge", "linear_logp.bwd_grad", "linear_logp.gemm",
             "linear_logp.grad_from_logits", "linear_logp.scale"),
))
