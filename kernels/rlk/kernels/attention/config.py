"""Contract ``attn.v2`` (and its small-segment test variant), kernel registry entries, and the
fixed per-architecture schedule tables (``configs/<arch>.json``; never keyed by batch or length).
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
from rlk.kernels.attention import kernel, kernel_bwd

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


# Schedule used under the CPU interpreter: large blocks, few loop steps.
_CPU = {
    "prefill": {"BLOCK_M": 64, "GP": 1},
    "paged_decode": {"BLOCK_M": 16},
    "paged_chunk": {"BLOCK_M": 64},
    "merge": {},
    "write_kv": {},
    "bwd_delta": {"BLOCK_M": 64},
    "bwd_dkdv": {"BLOCK_M": 64, "BLOCK_N": 64},
    "bwd_fold": {"BLOCK_T": 64},
    "bwd_dq": {"BLOCK_M": 64, "BLOCK_N": 64},
}


@functools.lru_cache(maxsize=None)
def _table(arch: str) -> dict:
    path = os.path.join(os.path.dirname(__file__), "configs", f"{arch}.json")
    if not os.path.exists(path):
        raise UnsupportedConfigError(f"attention: no schedule table for {arch} ({path})")
    with open(path) as f:
        return json.load(f)


def arch_of(device) -> str:
    if interpret_flag() or device.type == "cpu":
        return "cpu-interpreter"
    if torch.version.hip:
        return "gfx942"
    major, minor = device_capability(device)
    if (major, minor) != (9, 0):
        raise UnsupportedConfigError(f"attention: no table for sm_{major}{minor} (have sm_90)")
    return "sm_90"


# Schedule overrides for sweeps only (``with override("prefill", BLOCK_M=64):``).
_OVERRIDES = TableOverrides()
override = _OVERRIDES.use


def overrides_active() -> bool:
    """Whether a schedule override is in force (launch plans are then not used)."""
    return bool(_OVERRIDES.active)


def schedule(kind: str, device) -> dict:
    """Fixed launch parameters of one kernel kind on ``device`` (never batch-keyed). The table's
    own entry (read it, never change it: every launch of ``kind`` shares it), or a copy with the
    active :func:`override` applied (copying it for every launch cost host time for nothing)."""
    arch = arch_of(device)
    out = _CPU[kind] if arch == "cpu-interpreter" else _gpu_table(arch)[kind]
    return _OVERRIDES.apply(kind, out) if _OVERRIDES.active else out


def _gpu_table(arch: str) -> dict:
    return _table("sm90" if arch == "sm_90" else "gfx942")


def one_wave_schedule(kind: str, device):
    """The table's ``<kind>_one_wave`` entry (for launches whose whole grid fits in one wave of
    programs, one per SM), or None: no such entry (the CPU table, gfx942), or a sweep overriding
    ``kind`` (it times ``kind``'s own entry). Every field of it is bit-neutral, like ``kind``'s."""
    arch = arch_of(device)
    if arch == "cpu-interpreter" or kind in _OVERRIDES.active:
        return None
    out = _gpu_table(arch).get(kind + "_one_wave")
    if out is None:
        return None
    return _OVERRIDES.apply(kind + "_one_wave", out) if _OVERRIDES.active else out


_SMS: dict[int, int] = {}


def sm_count(device) -> int:
    """Streaming multiprocessors (compute units) of a GPU, memoized by device index."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


def _sig(names, types):
    return dict(zip(names, types))


def _arg_type(name: str) -> str:
    if name in ("qk_scale", "scale"):
        return "fp32"
    if not name.endswith("_ptr"):
        return "i32"
    if name.startswith(("lse", "ws_", "delta")):
        return "*fp32"
    if name.startswith(("cu_", "kv_len", "bt_")):
        return "*i32"
    if name.startswith("slot"):
        return "*i64"
    return "*bf16"


def _register() -> None:
    gpu = _table("sm90")
    fwd_consts = dict(G=4, GP=1, HEAD_DIM=128, KV_CHUNK=KV_CHUNK, SEG=512, PAGE=16, PAGED=0,
                      SPLIT=0, DOT_DTYPE="bf16", INTERPRET=False)
    fwd_cfgs = (
        {**fwd_consts, **gpu["prefill"]},
        *([{**fwd_consts, **gpu["prefill_one_wave"]}] if "prefill_one_wave" in gpu else []),
        {**fwd_consts, "GP": 4, "PAGED": 1, "SPLIT": 1, **gpu["paged_decode"]},
        {**fwd_consts, "GP": 4, "PAGED": 1, **gpu["paged_chunk"]},
    )
    entries = [
        ("attention.fwd", kernel.attn_fwd_kernel, fwd_cfgs, True),
        ("attention.merge", kernel.attn_merge_kernel,
         ({"G": 4, "BLOCK_G": 4, "HEAD_DIM": 128, "SEG": 512, "INTERPRET": False, **gpu["merge"]},), False),
        ("attention.write_kv", kernel.write_kv_kernel,
         ({"HK": 8, "BLOCK_H": 8, "HEAD_DIM": 128, "PAGE": 16, **gpu["write_kv"]},), False),
        ("attention.bwd_delta", kernel_bwd.bwd_delta_kernel,
         ({"HEAD_DIM": 128, **gpu["bwd_delta"]},), False),
        ("attention.bwd_dkdv", kernel_bwd.bwd_dkdv_kernel,
         ({"G": 4, "HEAD_DIM": 128, "DOT_DTYPE": "bf16", "INTERPRET": False, **gpu["bwd_dkdv"]},), True),
        ("attention.bwd_fold", kernel_bwd.bwd_fold_kernel,
         ({"G": 4, "HEAD_DIM": 128, "INTERPRET": False, **gpu["bwd_fold"]},), False),
        ("attention.bwd_dq", kernel_bwd.bwd_dq_kernel,
         ({"G": 4, "HEAD_DIM": 128, "DOT_DTYPE": "bf16", "INTERPRET": False, **gpu["bwd_dq"]},), True),
    ]
    for name, fn, cfgs, mma in entries:
        argnames = list(getattr(fn, "arg_names", []))
        consts = set(cfgs[0])
        sig = {a: "constexpr" if a in consts else _arg_type(a) for a in argnames}
        registry.register_kernel(registry.KernelEntry(
            name=name, contract_id="attn.v2", fn=fn, signature=sig, configs=tuple(cfgs), expects_mma=mma))


_register()
