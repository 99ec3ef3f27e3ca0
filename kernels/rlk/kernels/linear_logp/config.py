"""Contract ``logp.v2`` (fused LM head + selected-token log-prob) and its config tables.

Every block size below is a bit field (it fixes tl.max/tl.sum trees and MMA shapes); none is
ever chosen from the number of tokens T. Tables: ``configs/sm90.json`` (GPU, embedded in the
contract so its hash covers them) and ``CPU_TABLE`` (Triton interpreter, tests only).
"""

from __future__ import annotations

import functools
import json
import os

import torch

from rlk import contracts
from rlk.determinism import FP_FUSION
from rlk.errors import UnsupportedConfigError
from rlk.kernels import registry
from rlk.kernels.common import TableOverrides, device_capability, interpret_flag
from rlk.kernels.linear_logp import kernel as K

CONTRACT_ID = "logp.v2"
BLOCK_K = 64  # the gemm.bf16.v1 K chunk
_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
TABLE_FILES = {"sm_90": "sm90.json", "gfx942": "gfx942.json"}

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
    return MERGE_UNROLL_CPU if arch == "cpu-interpreter" else MERGE_UNROLL


def scale_fields(arch: str) -> dict:
    return SCALE_FIELDS_CPU if arch == "cpu-interpreter" else SCALE_FIELDS


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


@functools.lru_cache(maxsize=None)
def load_table(arch: str) -> dict:
    if arch == "cpu-interpreter":
        return CPU_TABLE
    if arch not in TABLE_FILES:
        raise UnsupportedConfigError(f"{CONTRACT_ID}: no config table for arch {arch!r} "
                                     f"(have {sorted(TABLE_FILES)} and 'cpu-interpreter')")
    with open(os.path.join(_DIR, TABLE_FILES[arch])) as f:
        t = json.load(f)
    for name in ("fwd", "bwd_grad", "gemm"):
        if t[name]["BLOCK_K"] % BLOCK_K:
            raise UnsupportedConfigError(f"{TABLE_FILES[arch]}: {name}.BLOCK_K must be a multiple of {BLOCK_K}")
    f = t["fwd"]
    if f.get("DECODE_T_MAX") and (f["BLOCK_T"], f["num_warps"]) != (128, 8):
        raise UnsupportedConfigError(f"{TABLE_FILES[arch]}: DECODE_T_MAX needs fwd tiles of two 64-row "
                                     f"warpgroups (BLOCK_T 128, 8 warps), not {f['BLOCK_T']} / {f['num_warps']}")
    if t.get("V_CHUNK_MAX") is not None and t["V_CHUNK_MAX"] % BLOCK_K:
        raise UnsupportedConfigError(f"{TABLE_FILES[arch]}: V_CHUNK_MAX must be a multiple of {BLOCK_K}")
    return t


# Table overrides for sweeps and tests only (``with override("fwd", BLOCK_V=256):``).
_OVERRIDES = TableOverrides()
override = _OVERRIDES.use


def table(arch: str) -> dict:
    """The launch table of ``arch`` with any active :func:`override` applied (a copy)."""
    t = load_table(arch)
    if not _OVERRIDES.active:
        return t
    return {k: _OVERRIDES.apply(k, e) if isinstance(e, dict) else e for k, e in t.items()}


def arch_of(device: torch.device) -> str:
    if device.type == "cpu" or interpret_flag():
        return "cpu-interpreter"
    if torch.version.hip:
        return "gfx942"
    major, minor = device_capability(device)
    if (major, minor) != (9, 0):
        raise UnsupportedConfigError(f"{CONTRACT_ID}: sm_{major}{minor} has no config table (sm_90 only)")
    return "sm_90"


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
