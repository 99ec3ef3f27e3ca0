"""Core attention over packed ``thd`` sequences for megatron-core's *local* spec (the native
trainer, :mod:`rlk.integrations.megatron.native`: the P/P trainer of
:mod:`rlk.integrations.production` and the RL loop's native arm).

megatron-core 0.19.2's local ``DotProductAttention`` refuses ``PackedSeqParams`` and
materializes ``[b, h, s, s]`` scores over a padded ``[b, s]`` batch; a megatron user on an H200
packs sequences and runs a flash kernel (TransformerEngine's, which this stack does not carry).
:class:`VarlenCoreAttention` fills the spec's ``core_attention`` slot with torch's own varlen
flash attention instead; RoPE, the QKV split, the norms and the linears stay megatron's.

Backends (:func:`varlen_causal_attention`):

* ``torch_varlen_flash`` (CUDA): ``torch.nn.attention.varlen.varlen_attn``. Causal is
  ``window_size=(-1, 0)`` (torch derives ``is_causal = window_size == (-1, 0)``; left unbounded,
  right 0); a build whose signature has ``is_causal`` gets ``is_causal=True``. GQA: with an
  ``enable_gqa`` argument the K/V heads go in as they are; without one K/V heads are expanded
  with ``repeat_interleave`` (query head j reads K/V group ``j // (nh / ng)``, megatron's own
  grouping), which costs ``nh / ng`` times the K/V activation memory.
* ``sdpa_per_sequence_cpu_fallback`` (no CUDA; the CPU tests): one
  ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` per packed sequence, K/V
  expanded the same way. A stand-in for the tests only: never selected on a GPU.

Determinism: none promised (the native arm's reference); the flash kernel's backward is not
run-to-run bitwise.
"""

from __future__ import annotations

import functools
import inspect

import torch

from rlk.errors import UnsupportedConfigError

FLASH = "torch_varlen_flash"
CPU_FALLBACK = "sdpa_per_sequence_cpu_fallback"


def _varlen_attn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as e:  # torch too old: no packed flash attention to measure
        raise UnsupportedConfigError(f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn "
                                     f"({e}); the native arm needs it on CUDA") from e
    return varlen_attn


@functools.lru_cache(maxsize=None)
def flash_convention() -> dict:
    """How :func:`varlen_causal_attention` calls this torch's ``varlen_attn``: ``causal`` (the
    keyword used) and ``gqa`` (``"enable_gqa"`` or ``"repeat_interleave"``)."""
    params = inspect.signature(_varlen_attn()).parameters
    if "is_causal" in params:
        causal = "is_causal=True"
    elif "window_size" in params:
        causal = "window_size=(-1, 0)"
    else:
        raise UnsupportedConfigError(f"varlen_attn{tuple(params)}: neither is_causal nor window_size")
    return {"causal": causal, "gqa": "enable_gqa" if "enable_gqa" in params else "repeat_interleave"}


def backend_for(device: torch.device) -> str:
    return FLASH if device.type == "cuda" else CPU_FALLBACK


def varlen_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_seqlen: int,
                            scale: float) -> torch.Tensor:
    """Causal attention of each packed sequence with itself.

    Args:
      q: ``[T, nh, D]``; k, v: ``[T, ng, D]`` (``nh % ng == 0``), bf16.
      cu: ``[B+1]`` int32 cumulative sequence starts (``cu[-1] == T``), on q's device.
      max_seqlen: the longest sequence (host int).
      scale: softmax scale.
    Returns:
      ``[T, nh, D]`` in q's dtype.
    """
    T, nh, D = q.shape
    ng = k.shape[1]
    if k.shape != (T, ng, D) or v.shape != k.shape or nh % ng:
        raise UnsupportedConfigError(f"varlen attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if backend_for(q.device) == CPU_FALLBACK:
        return _sdpa_per_sequence(q, k, v, cu, scale)
    conv = flash_convention()
    if conv["gqa"] == "repeat_interleave" and nh != ng:
        k, v = k.repeat_interleave(nh // ng, dim=1), v.repeat_interleave(nh // ng, dim=1)
    kw: dict = {"scale": scale}
    if conv["causal"] == "is_causal=True":
        kw["is_causal"] = True
    else:
        kw["window_size"] = (-1, 0)  # a tuple: torch tests ``window_size == (-1, 0)``
    if conv["gqa"] == "enable_gqa":
        kw["enable_gqa"] = nh != ng
    cu = cu.to(torch.int32)
    return _varlen_attn()(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, int(max_seqlen), int(max_seqlen),
                          **kw)


def _sdpa_per_sequence(q, k, v, cu, scale):
    import torch.nn.functional as F

    nh, ng = q.shape[1], k.shape[1]
    outs = []
    bounds = cu.tolist()
    for a, b in zip(bounds, bounds[1:]):
        qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))  # [h, s, D]
        if nh != ng:
            ks, vs = ks.repeat_interleave(nh // ng, dim=0), vs.repeat_interleave(nh // ng, dim=0)
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale).transpose(0, 1))
    return torch.cat(outs, dim=0)


class VarlenCoreAttention(torch.nn.Module):
    """megatron's ``core_attention`` slot over packed sequences (module docstring).

    Built by megatron's ``SelfAttention`` as ``(config=, layer_number=, attn_mask_type=,
    attention_type=, cp_comm_type=, softmax_scale=, pg_collection=)``; called as ``(q [t, nh, D],
    k/v [t, ng, D], attention_mask, attn_mask_type=, attention_bias=, packed_seq_params=)``
    (megatron squeezes the batch dimension of ``thd`` input and has applied RoPE) and returns
    ``[t, nh * D]``. Only causal self-attention, TP=1 head counts, CP=1 and unpadded
    ``cu_seqlens`` are covered; anything else raises.
    """

    def __init__(self, config, layer_number: int = 1, attn_mask_type=None, attention_type: str = "self",
                 cp_comm_type=None, softmax_scale=None, pg_collection=None, **kwargs):
        super().__init__()
        from megatron.core.transformer.enums import AttnMaskType

        if attn_mask_type not in (None, AttnMaskType.causal, AttnMaskType.padding_causal):
            raise UnsupportedConfigError(f"VarlenCoreAttention: attn_mask_type {attn_mask_type} (only causal)")
        if attention_type != "self":
            raise UnsupportedConfigError(f"VarlenCoreAttention: attention_type {attention_type!r} (only self)")
        if int(getattr(config, "context_parallel_size", 1) or 1) != 1:
            raise UnsupportedConfigError("VarlenCoreAttention: context parallelism is not covered")
        if int(getattr(config, "tensor_model_parallel_size", 1) or 1) != 1:
            raise UnsupportedConfigError("VarlenCoreAttention: TP > 1 is not covered")
        self.layer_number = layer_number
        self.head_dim = int(config.kv_channels)
        self.scale = float(softmax_scale) if softmax_scale is not None else self.head_dim ** -0.5

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        if attention_bias is not None:
            raise UnsupportedConfigError("VarlenCoreAttention: attention_bias is not covered")
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            raise UnsupportedConfigError("VarlenCoreAttention takes packed sequences only "
                                         "(PackedSeqParams(qkv_format='thd', ...))")
        cu, kv = packed_seq_params.cu_seqlens_q, packed_seq_params.cu_seqlens_kv
        # The same tensor object needs no comparison (torch.equal would read a bool back: one host
        # sync per layer, a cost no production trainer pays).
        if packed_seq_params.cu_seqlens_q_padded is not None or (kv is not None and kv is not cu
                                                                 and not torch.equal(kv, cu)):
            raise UnsupportedConfigError("VarlenCoreAttention: padded / cross cu_seqlens are not covered")
        if packed_seq_params.max_seqlen_q is None:
            raise UnsupportedConfigError("VarlenCoreAttention: PackedSeqParams.max_seqlen_q is required")
        out = varlen_causal_attention(query, key, value, cu, int(packed_seq_params.max_seqlen_q), self.scale)
        return out.reshape(out.shape[0], -1)

    def extra_repr(self) -> str:
        return f"layer={self.layer_number}, head_dim={self.head_dim}, backend=torch varlen flash (CPU: sdpa)"
