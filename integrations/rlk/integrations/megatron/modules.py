r"""rlk modules in megatron-core's layer-spec slots: thin adapters, no arithmetic of their own.

Every floating-point operation below is an rlk op (``rlk.kernels.<op>.autograd``) or an rlk
fixed-order collective (``rlk.nn.tensor_parallel`` over ``rlk.collectives``); the adapters only
reshape, slice and copy. Constructor and call signatures are megatron-core 0.19.2's (``../shared/ENGINES.md``):

| slot | class | contract |
| --- | --- | --- |
| ``linear_qkv`` | :class:`RlkQKVLinear` | gemm.bf16.v1 over rlk's ``[Q\|K\|V]`` rows (+ ar.v1 on dx at TP>1) |
| ``linear_fc1`` | :class:`RlkColumnParallelLinear` | gemm.bf16.v1 (+ ar.v1 on dx at TP>1) |
| ``linear_proj``, ``linear_fc2`` | :class:`RlkRowParallelLinear` | gemm.bf16.v1 + ar.v1 (TP>1) |
| ``core_attention`` | :class:`RlkCoreAttention` | rope.v1 + attn.v2 (+ ag.v1 / rs.v1 at CP>1) |
| every norm | :class:`RlkRMSNorm` | rmsnorm.v1 |
| ``activation_func`` | :class:`RlkSwiGLU` | swiglu.v1 |
| ``embedding.word_embeddings`` (swapped after build) | :class:`RlkVocabParallelEmbedding` | embedding.v1 (+ ar.v1) |

Tensors are bf16 (the contracts' dtype); megatron's activations are ``[s, b, h]`` with the
packed ``thd`` format (``b == 1``) for variable-length sequences.
"""

from __future__ import annotations

import torch

from rlk.errors import UnsupportedConfigError


# Context-parallel degrees covered: rlk.nn.context_parallel's zigzag layout (every packed
# sequence a multiple of 2*CP tokens).
CP_SIZES = (1, 2, 4, 8)
# cp_comm_type values matching rlk's CP attention (K/V all-gathered with ag.v1).
CP_COMM_TYPES = (None, "all_gather", "allgather")


def check_cp_lengths(cu_seqlens, cp: int) -> None:
    """Raises ``UnsupportedConfigError`` unless every packed sequence of ``cu_seqlens`` is a
    multiple of ``2 * cp`` tokens (the zigzag layout: rank r holds chunks r and 2*CP-1-r)."""
    if cp not in CP_SIZES:
        raise UnsupportedConfigError(f"context parallelism: CP={cp} (strict covers CP in {CP_SIZES})")
    cu = [int(v) for v in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
    bad = [b - a for a, b in zip(cu[:-1], cu[1:]) if (b - a) % (2 * cp)]
    if bad:
        raise UnsupportedConfigError(f"context parallelism CP={cp}: packed sequence lengths {bad} are not multiples "
                                     f"of 2*CP={2 * cp} (pad each sequence to a multiple of 2*CP; padded "
                                     "cu_seqlens are not covered)")


def cp_token_index(cu_seqlens, cp: int, rank: int) -> torch.Tensor:
    """Global token indices of CP ``rank``'s rows ([T / cp] int64): per packed sequence, zigzag
    chunks ``rank`` and ``2*cp-1-rank`` of ``len / (2*cp)`` tokens (the indices megatron's
    ``get_batch_on_this_cp_rank`` takes from TransformerEngine's ``thd_get_partitioned_indices``).
    Index the packed tokens, labels and loss mask with it (exact copies); ``cu_seqlens`` stays
    global."""
    from rlk.nn.context_parallel import zigzag_positions

    check_cp_lengths(cu_seqlens, cp)
    return zigzag_positions(cu_seqlens, cp, rank)


def _tp(tp_group) -> tuple[object, int, int]:
    """(group, world size, rank) of the tensor-parallel group (megatron's when ``None``)."""
    if tp_group is None:
        from megatron.core import parallel_state as ps

        tp_group = ps.get_tensor_model_parallel_group()
    n = torch.distributed.get_world_size(tp_group)
    r = torch.distributed.get_rank(tp_group)
    return tp_group, n, r


def _device(config):
    """Where parameters are built: the host under ``use_cpu_initialization``, else the current GPU."""
    if config is None or getattr(config, "use_cpu_initialization", True):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _param(shape, config, init_method=None) -> torch.nn.Parameter:
    """A parameter of ``shape``; zeros when there is no init method or the config says
    ``perform_initialization=False`` (weights loaded afterwards, as megatron's own layers do)."""
    w = torch.empty(*shape, dtype=config.params_dtype, device=_device(config))
    with torch.no_grad():
        if init_method is not None and getattr(config, "perform_initialization", True):
            init_method(w)
        else:
            w.zero_()
    return torch.nn.Parameter(w)


def _no_bias(cls: str, bias: bool) -> None:
    if bias:
        raise UnsupportedConfigError(f"{cls}: bias=True is not covered (Qwen3 linears have none)")


class RlkColumnParallelLinear(torch.nn.Module):
    """``y = x @ W_r.T`` with ``W [out, in]`` split along ``out`` over TP ranks; returns ``(y, None)``.

    x ``[..., in]`` bf16 (replicated); y ``[..., out / tp]`` bf16.

    Determinism: gemm.bf16.v1 (columns equal TP=1 at every TP degree); the input gradient's
    cross-rank sum is ar.v1.
    """

    def __init__(self, input_size: int, output_size: int, *, config, init_method=None, bias: bool = False,
                 gather_output: bool = False, skip_bias_add: bool = True, is_expert: bool = False,
                 tp_comm_buffer_name=None, tp_group=None, stride: int = 1, name=None, **kwargs):
        super().__init__()
        _no_bias(type(self).__name__, bias)
        if gather_output or is_expert:
            raise UnsupportedConfigError(f"{type(self).__name__}: gather_output/is_expert not covered")
        self.tp_group, self.tp, self.rank = _tp(tp_group)
        if output_size % self.tp:
            raise UnsupportedConfigError(f"{name}: output size {output_size} not divisible by TP={self.tp}")
        self.input_size, self.output_size, self.stride, self.name = input_size, output_size, stride, name
        self.weight = _param((output_size // self.tp, input_size), config, init_method)
        self.bias = None
        self.sequence_parallel = False

    def forward(self, x: torch.Tensor, *args, **kwargs):
        from rlk.kernels.gemm import autograd as gemm

        if self.tp > 1:
            from rlk.nn.tensor_parallel import copy_to_tp

            x = copy_to_tp(x, self.tp_group)
        return gemm.linear(x, self.weight), None

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_size}, tp={self.tp}, stride={self.stride}"


def qkv_order(groups: int, group_size: int, head_dim: int) -> torch.Tensor:
    """Row indices ``order`` with ``W[order]`` = the ``[Q|K|V]`` rows of a weight ``W`` in
    megatron's per-query-group interleave (``[q_g (group_size * head_dim), k_g, v_g]`` for each
    of ``groups`` groups)."""
    per, qd = (group_size + 2) * head_dim, group_size * head_dim
    base = torch.arange(groups, dtype=torch.int64)[:, None] * per
    q = (base + torch.arange(qd)).reshape(-1)
    k = (base + qd + torch.arange(head_dim)).reshape(-1)
    v = (base + qd + head_dim + torch.arange(head_dim)).reshape(-1)
    return torch.cat([q, k, v])


class _Permute(torch.autograd.Function):
    """``t.index_select(dim, idx)`` for a permutation ``idx``, whose backward gathers the
    gradient back with the inverse permutation: exact both ways (autograd's own backward of an
    index would add the gradient into zeros, which turns a -0.0 into +0.0)."""

    @staticmethod
    def forward(ctx, t, dim: int, idx, inv):
        ctx.dim = dim
        ctx.save_for_backward(inv)
        return t.index_select(dim, idx)

    @staticmethod
    def backward(ctx, g):
        (inv,) = ctx.saved_tensors
        return g.index_select(ctx.dim, inv), None, None, None


class RlkQKVLinear(RlkColumnParallelLinear):
    """megatron's ``linear_qkv`` with the weight in megatron's interleaved rows (its checkpoint
    layout), computed over rlk's ``[Q|K|V]`` rows: ``y = (x @ W[order].T)[..., inv]``.

    Why: the input gradient ``dx = dy @ W`` reduces over the QKV rows, in the order the rows
    are stored. rlk's trainer (and vLLM's layout) stores ``[Q|K|V]``; megatron interleaves per
    query group. Over the interleaved rows the K walk of ``gemm.bf16.v1`` would add the same
    products in another order and give other bits (measured on the H200; the CPU interpreter's
    fp64 chunk sums hide it). The forward's columns are unchanged (each output column is its own
    dot product), the weight gradient's rows are a permutation of the same row sums, and the
    input gradient is the trainer's. At TP > 1 each rank's groups are permuted locally.
    """

    def __init__(self, input_size: int, output_size: int, *, config, **kwargs):
        super().__init__(input_size, output_size, config=config, **kwargs)
        groups, heads, d = config.num_query_groups, config.num_attention_heads, config.kv_channels
        if groups % self.tp or heads % groups or output_size != (heads + 2 * groups) * d:
            raise UnsupportedConfigError(f"{type(self).__name__}: output {output_size} is not (heads {heads} + 2 x "
                                         f"groups {groups}) x head_dim {d} split over TP={self.tp}")
        order = qkv_order(groups // self.tp, heads // groups, d).to(self.weight.device)
        self.register_buffer("qkv_order", order, persistent=False)
        self.register_buffer("qkv_inverse", torch.argsort(order), persistent=False)

    def forward(self, x: torch.Tensor, *args, **kwargs):
        from rlk.kernels.gemm import autograd as gemm

        if self.tp > 1:
            from rlk.nn.tensor_parallel import copy_to_tp

            x = copy_to_tp(x, self.tp_group)
        order, inv = self.qkv_order, self.qkv_inverse  # on the weight's device (moved with the module)
        w = _Permute.apply(self.weight, 0, order, inv)
        y = gemm.linear(x, w)
        return _Permute.apply(y, y.dim() - 1, inv, order), None


class RlkRowParallelLinear(torch.nn.Module):
    """``y = sum_r x_r @ W_r.T`` with ``W [out, in]`` split along ``in``; returns ``(y, None)``.

    x ``[..., in / tp]`` bf16 (``input_is_parallel``); y ``[..., out]`` bf16 (replicated). TP=1:
    one gemm with its bf16 output. TP>1: each rank's fp32 partial (gemm, no rounding) summed in
    rank order, one rounding (``rlk.nn.tensor_parallel.reduce_from_tp``).

    Determinism: gemm.bf16.v1 + ar.v1; bitwise on every rank and run to run; equal to TP=1 only
    where ``rlk.nn.tensor_parallel.row_parallel_matches_tp1`` holds.
    """

    def __init__(self, input_size: int, output_size: int, *, config, init_method=None, bias: bool = False,
                 input_is_parallel: bool = True, skip_bias_add: bool = True, is_expert: bool = False,
                 tp_comm_buffer_name=None, tp_group=None, name=None, **kwargs):
        super().__init__()
        _no_bias(type(self).__name__, bias)
        if not input_is_parallel or is_expert:
            raise UnsupportedConfigError(f"{type(self).__name__}: only input_is_parallel=True, non-expert")
        self.tp_group, self.tp, self.rank = _tp(tp_group)
        if input_size % self.tp:
            raise UnsupportedConfigError(f"{name}: input size {input_size} not divisible by TP={self.tp}")
        self.input_size, self.output_size, self.name = input_size, output_size, name
        self.weight = _param((output_size, input_size // self.tp), config, init_method)
        self.bias = None
        self.sequence_parallel = False

    def forward(self, x: torch.Tensor, *args, **kwargs):
        from rlk.kernels.gemm import autograd as gemm

        if self.tp == 1:
            return gemm.linear(x, self.weight), None
        from rlk.nn.tensor_parallel import reduce_from_tp

        lead = x.shape[:-1]
        partial = gemm.gemm(x.reshape(-1, x.shape[-1]).contiguous(), self.weight, out_fp32=True)
        # Reduction order: ar.v1 (ranks 0..N-1 in fp32, one rounding to bf16).
        y = reduce_from_tp(partial, self.tp_group, torch.bfloat16)
        return y.reshape(*lead, self.output_size), None

    def backward_dw(self) -> None:
        """megatron's delayed-wgrad hook: rlk computes dW in the autograd backward (nothing deferred)."""

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_size}, tp={self.tp}"


class RlkRMSNorm(torch.nn.Module):
    """RMSNorm over the last dim of any ``[..., hidden_size]`` bf16 tensor (layer norms and the
    per-head q/k norms alike). Built as ``(config=, hidden_size=, eps=)``.

    Determinism: rmsnorm.v1 (rows batch-invariant; the same bytes as rlk's fused add+norm).
    """

    def __init__(self, config=None, hidden_size: int = 0, eps: float = 1e-6, **kwargs):
        super().__init__()
        if config is not None and getattr(config, "normalization", "RMSNorm") != "RMSNorm":
            raise UnsupportedConfigError(f"RlkRMSNorm: normalization {config.normalization!r} is not RMSNorm")
        self.hidden_size, self.eps = int(hidden_size), float(eps)
        dtype = config.params_dtype if config is not None else torch.bfloat16
        self.weight = torch.nn.Parameter(torch.ones(self.hidden_size, dtype=dtype, device=_device(config)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from rlk.kernels.rowops import autograd as rowops

        y = rowops.rms_norm(x.reshape(-1, self.hidden_size), self.weight, self.eps)
        return y.view(x.shape)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"


class RlkSwiGLU(torch.nn.Module):
    """``silu(gate) * up`` of ``[..., 2F]`` (``[gate | up]`` per rank) -> ``[..., F]``.

    Determinism: swiglu.v1 (elementwise, one rounding).
    """

    def __init__(self, config=None, **kwargs):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from rlk.kernels.rowops import autograd as rowops

        y = rowops.swiglu(x.reshape(-1, x.shape[-1]))
        return y.view(*x.shape[:-1], x.shape[-1] // 2)


def positions_from_cu(cu: torch.Tensor, total: int) -> torch.Tensor:
    """Positions restarting at 0 in each packed sequence: ``[total]`` int64 (exact integer ops)."""
    lens = (cu[1:] - cu[:-1]).long()
    starts = torch.repeat_interleave(cu[:-1].long(), lens)
    return torch.arange(total, device=cu.device) - starts


class RlkCoreAttention(torch.nn.Module):
    """Causal self-attention over packed sequences, RoPE applied inside (the model is built with
    ``position_embedding_type="none"``).

    Call: ``(q [t, nh_local, D], k/v [t, ng_local, D], attention_mask, attn_mask_type=,
    attention_bias=None, packed_seq_params=PackedSeqParams(qkv_format="thd", cu_seqlens_q=...))``
    -> ``[t, nh_local * D]`` bf16. Without packed_seq_params, ``[s, 1, nh, D]`` is one sequence.
    Positions restart at 0 in each sequence (as the trainer pattern's).

    Context parallelism (``config.context_parallel_size`` = CP > 1, megatron's convention): ``t``
    is this CP rank's ``T / CP`` rows in the zigzag layout (per sequence, chunks r and 2*CP-1-r;
    ``spec.cp_token_index``) and ``cu_seqlens_q`` stays the global packed offsets (each length a
    multiple of 2*CP); without packed_seq_params the ``s`` local rows are one sequence of
    ``s * CP`` tokens. RoPE takes each row's global position; the attention is
    ``rlk.nn.context_parallel.cp_local_row_attention`` over the CP group of ``pg_collection``
    (megatron's ``parallel_state.get_context_parallel_group()`` when absent).

    Determinism: rope.v1 then attn.v2 (rows byte-identical to the rollout's paged kernels). At
    CP > 1: K/V gathered with ag.v1 (exact copies), every output row equal to CP=1 bitwise;
    dK/dV partials merged with rs.v1 (bitwise run to run at a given CP, not promised equal to
    CP=1).
    """

    def __init__(self, config, layer_number: int = 1, attn_mask_type=None, attention_type: str = "self",
                 cp_comm_type=None, softmax_scale=None, pg_collection=None, *, rope_theta: float,
                 max_positions: int, **kwargs):
        super().__init__()
        from megatron.core.transformer.enums import AttnMaskType

        if attn_mask_type not in (None, AttnMaskType.causal, AttnMaskType.padding_causal):
            raise UnsupportedConfigError(f"RlkCoreAttention: attn_mask_type {attn_mask_type} (only causal)")
        if attention_type != "self":
            raise UnsupportedConfigError(f"RlkCoreAttention: attention_type {attention_type!r} (only self)")
        self.cp = int(getattr(config, "context_parallel_size", 1) or 1)
        self.cp_group = None
        if self.cp > 1:
            if self.cp not in CP_SIZES:
                raise UnsupportedConfigError(f"RlkCoreAttention: CP={self.cp} (strict covers CP in {CP_SIZES})")
            if cp_comm_type not in CP_COMM_TYPES:
                raise UnsupportedConfigError(f"RlkCoreAttention: cp_comm_type {cp_comm_type!r} (rlk's CP attention "
                                             "all-gathers K/V with ag.v1: None or 'all_gather')")
            group = getattr(pg_collection, "cp", None) if pg_collection is not None else None
            if group is None:
                from megatron.core import parallel_state as ps

                group = ps.get_context_parallel_group()
            if torch.distributed.get_world_size(group) != self.cp:
                raise UnsupportedConfigError(f"RlkCoreAttention: CP group of {torch.distributed.get_world_size(group)} "
                                             f"ranks but context_parallel_size={self.cp}")
            self.cp_group, self.cp_rank = group, torch.distributed.get_rank(group)
        self.head_dim = int(config.kv_channels)
        self.scale = float(softmax_scale) if softmax_scale is not None else self.head_dim ** -0.5
        self.layer_number, self.rope_theta, self.max_positions = layer_number, float(rope_theta), int(max_positions)
        from rlk.kernels.rowops import autograd as rowops

        # rope.v1's table (host fp64, one cast to fp32), built once here, outside the forward.
        self._rope = rowops.rope_table(self.max_positions, self.head_dim, self.rope_theta, "cpu")

    def _table(self, device):
        if self._rope[0].device != device:  # an exact copy to the activations' device
            self._rope = tuple(t.to(device) for t in self._rope)
        return self._rope

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        from rlk.kernels.attention import autograd as attention
        from rlk.kernels.rowops import autograd as rowops

        if attention_bias is not None:
            raise UnsupportedConfigError("RlkCoreAttention: attention_bias is not covered")
        if packed_seq_params is not None:
            if packed_seq_params.qkv_format != "thd":
                raise UnsupportedConfigError(f"RlkCoreAttention: qkv_format {packed_seq_params.qkv_format!r} (only thd)")
            kv = packed_seq_params.cu_seqlens_kv
            if packed_seq_params.cu_seqlens_q_padded is not None or (
                    kv is not None and not torch.equal(kv, packed_seq_params.cu_seqlens_q)):
                raise UnsupportedConfigError("RlkCoreAttention: padded / cross cu_seqlens are not covered")
            cu = packed_seq_params.cu_seqlens_q.to(torch.int32)
            q, k, v = query, key, value
        else:
            if query.dim() != 4 or query.shape[1] != 1:
                raise UnsupportedConfigError("RlkCoreAttention: without packed_seq_params the batch must be 1 "
                                             f"([s, 1, nh, D]); got {tuple(query.shape)}")
            q, k, v = query[:, 0], key[:, 0], value[:, 0]
            cu = torch.tensor([0, q.shape[0] * self.cp], dtype=torch.int32, device=q.device)
        T = q.shape[0]
        lens = cu[1:] - cu[:-1]
        max_seqlen = int(lens.max())
        if max_seqlen > self.max_positions:
            raise UnsupportedConfigError(f"RlkCoreAttention: sequence of {max_seqlen} > max positions {self.max_positions}")
        if self.cp > 1:
            return self._cp_forward(q, k, v, cu, packed_seq_params is not None)
        pos = positions_from_cu(cu, T)
        cos, sin = self._table(q.device)
        q = rowops.apply_rope(q, pos, cos, sin)
        k = rowops.apply_rope(k, pos, cos, sin)
        out = attention.varlen_attention(q, k, v.contiguous(), cu, max_seqlen, self.scale)
        out = out.reshape(T, -1)
        return out if packed_seq_params is not None else out.unsqueeze(1)

    def _cp_forward(self, q, k, v, cu, packed: bool):
        """CP > 1: this rank's zigzag rows against the whole sequence (see the class docstring)."""
        from rlk.nn.context_parallel import cp_local_row_attention
        from rlk.kernels.rowops import autograd as rowops

        T = q.shape[0]
        total = int(cu[-1])
        if T * self.cp != total:
            raise UnsupportedConfigError(f"RlkCoreAttention: {T} local rows x CP={self.cp} != {total} tokens in "
                                         "cu_seqlens (pass the global cu_seqlens and this rank's zigzag rows)")
        idx = cp_token_index(cu, self.cp, self.cp_rank).to(q.device)  # raises unless lengths % 2*CP == 0
        pos = positions_from_cu(cu, total)[idx]  # each local row's position in its sequence
        cos, sin = self._table(q.device)
        q = rowops.apply_rope(q, pos, cos, sin)
        k = rowops.apply_rope(k, pos, cos, sin)
        # Reduction order: attn.v2 rows (K/V gathered with ag.v1); backward dK/dV with rs.v1.
        out, _ = cp_local_row_attention(q, k, v.contiguous(), cu, self.scale, self.cp_group)
        out = out.reshape(T, -1)
        return out if packed else out.unsqueeze(1)

    def extra_repr(self) -> str:
        return (f"layer={self.layer_number}, head_dim={self.head_dim}, rope_theta={self.rope_theta}"
                + (f", cp={self.cp}" if self.cp > 1 else ""))


class RlkVocabParallelEmbedding(torch.nn.Module):
    """``weight[ids]`` with the vocabulary in equal contiguous shards over TP ranks; replaces
    megatron's ``embedding.word_embeddings`` after build (same parameter name and shape).

    ids ``[b, s]`` int64 -> ``[b, s, H]`` bf16 (replicated). The owner copies the row, the others
    contribute -0.0 and ar.v1 sums (the owner's bytes, sign of zero included).

    Determinism: embedding.v1 (+ ar.v1 at TP>1); exact, equal to TP=1 at every degree.
    """

    def __init__(self, weight: torch.nn.Parameter, tp_group=None):
        super().__init__()
        self.tp_group, self.tp, self.rank = _tp(tp_group)
        self.weight = weight
        self.vocab_per_rank = weight.shape[0]
        self.vocab_start = self.rank * self.vocab_per_rank

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        from rlk.kernels.rowops import autograd as rowops

        ids = input_ids.reshape(-1).long()
        if self.tp == 1:
            rows = rowops.embedding(ids, self.weight)
        else:
            from rlk.nn.tensor_parallel import reduce_from_tp

            local = ids - self.vocab_start
            owned = (local >= 0) & (local < self.vocab_per_rank)
            r = rowops.embedding(torch.where(owned, local, torch.zeros_like(local)), self.weight)
            neg_zero = torch.full((), -0.0, dtype=r.dtype, device=r.device)
            # Reduction order: ar.v1; one rank holds the value, the others -0.0 (the identity).
            rows = reduce_from_tp(torch.where(owned[:, None], r, neg_zero), self.tp_group, r.dtype)
        return rows.view(*input_ids.shape, self.weight.shape[1])

    def extra_repr(self) -> str:
        return f"vocab_local={self.vocab_per_rank}, start={self.vocab_start}, tp={self.tp}"


RLK_MODULES = (RlkColumnParallelLinear, RlkQKVLinear, RlkRowParallelLinear, RlkRMSNorm, RlkSwiGLU, RlkCoreAttention,
               RlkVocabParallelEmbedding)
