"""Fixed per-architecture schedule tables of strict attention (``configs/<arch>.json``; never
keyed by batch or length), the CPU-interpreter schedule, and the kernel registry entries.
"""

from __future__ import annotations

from rlk.kernels import registry
from rlk.kernels.attention import kernel, kernel_bwd
from rlk.kernels.attention.contract import KV_CHUNK
from rlk.kernels.common import CPU_ARCH, TableOverrides, arch_of, load_table

# Schedule of the interpreter (arch cpu-interpreter): large blocks, few loop steps. Every field is
# bit-neutral (the contract's schedule fields), so the CPU may keep a table of its own.
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
    out = _CPU[kind] if arch == CPU_ARCH else load_table("attention", arch)[kind]
    return _OVERRIDES.apply(kind, out) if _OVERRIDES.active else out


def one_wave_schedule(kind: str, device):
    """The table's ``<kind>_one_wave`` entry (for launches whose whole grid fits in one wave of
    programs, one per SM), or None: no such entry (the CPU table, gfx942), or a sweep overriding
    ``kind`` (it times ``kind``'s own entry). Every field of it is bit-neutral, like ``kind``'s."""
    arch = arch_of(device)
    if arch == CPU_ARCH or kind in _OVERRIDES.active:
        return None
    out = load_table("attention", arch).get(kind + "_one_wave")
    if out is None:
        return None
    return _OVERRIDES.apply(kind + "_one_wave", out) if _OVERRIDES.active else out


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
    gpu = load_table("attention", "sm_90")
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
