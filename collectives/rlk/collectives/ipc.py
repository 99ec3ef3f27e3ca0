"""Single-node one-shot all-reduce over peer memory (contract ``ar.v1``, transport "ipc-oneshot").

Every rank copies its input into its own slot of a symmetric-memory buffer
(``torch.distributed._symmetric_memory``: the same allocation mapped into every rank's address
space), a device-side barrier makes all slots visible, and every rank sums the N slots itself
with :func:`fold_pointers`: one Triton program per block of elements loads rank 0's value, then
adds rank 1's, ..., rank N-1's in fp32 and rounds once. That is ``ar.v1``'s chain exactly, so the
bytes equal :func:`rlk.collectives.api.all_reduce` over any transport (and
``rlk.collectives.reference.fixed_order_sum``) on every rank: the transport copies bytes, the
arithmetic is rlk's.

Reuse: one persistent staging slot per rank and two device-side barriers per call (after every
rank wrote its slot; after every rank read all slots), so a slot is rewritten only when every
peer's fold of the previous call is done, whatever the call sequence (also when one captured
call is replayed from a CUDA graph again and again). Nothing here synchronizes the host: the
copy, the barriers and the fold are stream-ordered device work. NVLink multicast is never used
(plain peer loads).

Status: the fold kernel is tested bitwise on CPU (Triton interpreter, pointer tables of ordinary
tensors) and compiled for sm_90 and gfx942 by the L0 gate; the symmetric-memory transport needs
two or more GPUs and **has not run** (``collectives_multigpu_test.py``, requires-gpu-nvidia:2).
It is not wired into ``all_reduce``'s default path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rlk.errors import UnsupportedConfigError
from rlk.kernels.common import cdiv, interpret_flag, launch_options, round_bf16

FOLD_BLOCK = 1024
FOLD_WARPS = 4
_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


@triton.jit
def fold_pointers_kernel(out_ptr, ptrs_ptr, n, elem_offset, WORLD: tl.constexpr, IN_DTYPE: tl.constexpr,
                         OUT_BF16: tl.constexpr, VOLATILE: tl.constexpr, BLOCK: tl.constexpr,
                         INTERPRET: tl.constexpr):
    """out[i] = round(fp32(x_0[i]) + fp32(x_1[i]) + ... + fp32(x_{WORLD-1}[i])), left to right.

    ``ptrs_ptr``: int64 [WORLD], rank r's buffer address (elements of IN_DTYPE); element i of
    rank r is at ``x_r + elem_offset + i``. VOLATILE loads for peer memory written by other GPUs.
    """
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    src = offs + elem_offset
    p0 = tl.load(ptrs_ptr).to(tl.pointer_type(IN_DTYPE))
    # Reduction order: ranks 0..WORLD-1 ascending, one fp32 chain per element (ar.v1).
    acc = tl.load(p0 + src, mask=m, other=0.0, volatile=VOLATILE).to(tl.float32)
    for r in tl.static_range(1, WORLD):
        p = tl.load(ptrs_ptr + r).to(tl.pointer_type(IN_DTYPE))
        acc = acc + tl.load(p + src, mask=m, other=0.0, volatile=VOLATILE).to(tl.float32)
    if OUT_BF16:
        tl.store(out_ptr + offs, round_bf16(acc, INTERPRET), mask=m)
    else:
        tl.store(out_ptr + offs, acc, mask=m)


def fold_pointers(ptrs: torch.Tensor, numel: int, in_dtype: torch.dtype, out: torch.Tensor,
                  elem_offset: int = 0, volatile: bool = False) -> torch.Tensor:
    """Writes the rank-ordered sum of ``numel`` elements of every buffer in ``ptrs`` into ``out``.

    Args:
      ptrs: int64 [N] on the device of ``out``: buffer addresses, rank 0 first (N >= 1).
      numel: elements to sum (each buffer holds at least ``elem_offset + numel``).
      in_dtype: bf16 or fp32 (the buffers' element type).
      out: contiguous bf16 or fp32 tensor of ``numel`` elements (one RNE rounding for bf16).
    Determinism: ``ar.v1`` (fp32 chain over ranks 0..N-1, one rounding); bitwise equal to
    ``rlk.collectives.api.fold_rank_order`` of the same values.
    """
    if in_dtype not in _DTYPES or out.dtype not in _DTYPES:
        raise UnsupportedConfigError(f"fold_pointers: dtypes {in_dtype} -> {out.dtype} not in ar.v1 (bf16, fp32)")
    if ptrs.dtype != torch.int64 or ptrs.dim() != 1 or ptrs.numel() < 1 or ptrs.device != out.device:
        raise UnsupportedConfigError("fold_pointers: ptrs must be a 1-D int64 tensor of >= 1 address on out's device")
    if not out.is_contiguous() or out.numel() != numel:
        raise UnsupportedConfigError(f"fold_pointers: out must be contiguous with {numel} elements")
    if numel == 0:
        return out
    fold_pointers_kernel[(cdiv(numel, FOLD_BLOCK),)](
        out, ptrs, numel, int(elem_offset), WORLD=ptrs.numel(), IN_DTYPE=_DTYPES[in_dtype],
        OUT_BF16=out.dtype == torch.bfloat16, VOLATILE=bool(volatile), BLOCK=FOLD_BLOCK,
        INTERPRET=interpret_flag(), num_warps=FOLD_WARPS, **launch_options())
    return out


class OneShotAllReduce:
    """Fixed-order one-shot all-reduce of tensors of up to ``max_numel`` elements of ``dtype``.

    Collective construction: every rank of ``group`` (a ProcessGroup, default the world) creates
    it with the same arguments; ``device`` is this rank's GPU. Calls must be made by every rank in
    the same order with the same shapes (as for any collective).
    """

    def __init__(self, max_numel: int, dtype: torch.dtype = torch.bfloat16, group=None, device=None,
                 barrier_timeout_ms: int = 10_000):
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        if dtype not in _DTYPES:
            raise UnsupportedConfigError(f"OneShotAllReduce: dtype {dtype} not in ar.v1 (bf16, fp32)")
        if max_numel < 1:
            raise UnsupportedConfigError("OneShotAllReduce: max_numel must be >= 1")
        self.group = group if group is not None else dist.group.WORLD
        self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        if self.device.type != "cuda":
            raise UnsupportedConfigError("OneShotAllReduce: peer memory needs CUDA/HIP devices (gloo: use all_reduce)")
        self.dtype, self.max_numel, self.timeout_ms = dtype, int(max_numel), int(barrier_timeout_ms)
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed by older torch releases
            symm_mem.enable_symm_mem_for_group(self.group.group_name)
        self.buf = symm_mem.empty(self.max_numel, dtype=dtype, device=self.device)
        self.handle = symm_mem.rendezvous(self.buf, self.group.group_name)
        self.world, self.rank = self.handle.world_size, self.handle.rank
        # Peer buffer addresses in rank order (valid in this process).
        self.ptrs = torch.tensor(list(self.handle.buffer_ptrs), dtype=torch.int64, device=self.device)

    def __call__(self, t: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Rank-ordered sum of ``t`` over the group (identical bytes on every rank)."""
        out_dtype = t.dtype if out_dtype is None else out_dtype
        if t.dtype != self.dtype or t.device != self.device or t.numel() > self.max_numel:
            raise UnsupportedConfigError(
                f"OneShotAllReduce: {t.dtype} x {t.numel()} on {t.device}; this instance takes {self.dtype} "
                f"up to {self.max_numel} elements on {self.device}")
        if out_dtype not in _DTYPES:
            raise UnsupportedConfigError(f"OneShotAllReduce: out_dtype {out_dtype} not in ar.v1 (bf16, fp32)")
        n = t.numel()
        self.buf[:n].copy_(t.reshape(-1))
        # Device-side barriers (signal pads, release/acquire; a rank that never arrives traps after
        # timeout_ms instead of hanging): every slot written -> fold -> every fold done.
        self.handle.barrier(channel=0, timeout_ms=self.timeout_ms)
        out = torch.empty(n, dtype=out_dtype, device=self.device)
        fold_pointers(self.ptrs, n, self.dtype, out, volatile=True)
        self.handle.barrier(channel=1, timeout_ms=self.timeout_ms)
        return out.view(t.shape)


def _register() -> None:
    from rlk.collectives import contracts  # noqa: F401  (ar.v1 is registered there)
    from rlk.kernels import registry

    cfgs = tuple({"WORLD": w, "IN_DTYPE": "bf16", "OUT_BF16": True, "VOLATILE": True, "BLOCK": FOLD_BLOCK,
                  "INTERPRET": False, "num_warps": FOLD_WARPS, "num_stages": 1} for w in (2, 8))
    registry.register_kernel(registry.KernelEntry(
        name="collectives.fold_pointers", contract_id="ar.v1", fn=fold_pointers_kernel,
        signature={"out_ptr": "*bf16", "ptrs_ptr": "*i64", "n": "i32", "elem_offset": "i64",
                   **{k: "constexpr" for k in cfgs[0] if k not in ("num_warps", "num_stages")}},
        configs=cfgs, expects_mma=False))


_register()
