"""megatron-core ``output_processor``: per-token selected-token logp (and entropy) from rlk's
fused linear-logp (contract ``logp.v2``), never megatron's logits or cross-entropy.

Use::

    logp = model(tokens, position_ids, None, labels=labels, packed_seq_params=psp,
                 output_processor=output_processor, output_processor_context={"entropy": False})

* TP=1: :func:`rlk.kernels.linear_logp.autograd.linear_logp` (autograd registered on the op).
* TP>1: each rank computes its vocabulary shard's segment statistics, the statistics are
  gathered in rank order (``ag.v1``) and merged by ``logp.v2``'s merge
  (``rlk.collectives.merge_logsumexp_stats`` with ``merge_segment_stats``): the bytes equal TP=1
  where the shards follow the contract's segmentation rule. Backward: each rank's
  ``linear_logp_bwd`` with the merged lse gives its dW shard and a partial dH, summed with
  ``ar.v1``.

Actor scoring: call under autograd; reference scoring: under ``torch.no_grad()`` (nothing saved).

Context parallelism: each CP rank's logp rows are its zigzag token rows (rows are independent,
so they equal the CP=1 rows); :func:`gather_cp` puts them back in global packed order.
"""

from __future__ import annotations

import torch

from rlk.errors import UnsupportedConfigError


def _segmentation(vocab_size: int):
    from rlk.models.qwen3.routes import logp_segmentation

    return logp_segmentation(vocab_size)


class _VocabParallelLogp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, vocab_start, vocab_real, temperature, with_entropy, seg, group):
        from rlk import collectives
        from rlk.kernels.linear_logp.autograd import SegmentStats, merge_segment_stats, segment_stats

        st, _ = segment_stats(hidden, weight, targets, vocab_start, vocab_real, temperature,
                              with_entropy, False, seg)
        fields = (st.m, st.s, st.tg) + ((st.e,) if with_entropy else ())

        def merge(per_rank):
            return merge_segment_stats([SegmentStats(p[0], p[1], p[3] if with_entropy else None, p[2])
                                        for p in per_rank])

        # Reduction order: logp.v2's merge over global segments ascending (ranks 0..N-1); the
        # transport is ag.v1 (exact copies).
        logp, lse, ent = collectives.merge_logsumexp_stats(fields, group, merge_fn=merge)
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.args = (vocab_start, vocab_real, temperature, group)
        return (logp, ent) if with_entropy else (logp, lse.new_empty((0,)))

    @staticmethod
    def backward(ctx, dlogp, dent):
        from rlk import collectives
        from rlk.kernels.linear_logp import launch

        hidden, weight, targets, lse, ent = ctx.saved_tensors
        vocab_start, vocab_real, temperature, group = ctx.args
        if ent is None:
            dent = None
        dh, dw = launch.linear_logp_bwd(
            hidden, weight, targets, lse, None if dlogp is None else dlogp.contiguous().float(),
            vocab_start, vocab_real, temperature, entropy=ent,
            dentropy=None if dent is None else dent.contiguous().float())
        # Reduction order: ar.v1 (ranks 0..N-1, fp32, one rounding) of the per-shard partials.
        dh = collectives.all_reduce(dh.contiguous(), group, out_dtype=hidden.dtype)
        return dh, dw, None, None, None, None, None, None, None


def selected_logp(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, vocab_size: int,
                  tp_group=None, temperature: float = 1.0, entropy: bool = False):
    """Selected-token logp of ``targets`` through this rank's LM-head shard.

    hidden ``[T, H]`` bf16 (replicated over TP), weight ``[V / tp, H]`` bf16 (rank r holds rows
    ``[r V/tp, (r+1) V/tp)``), targets ``[T]`` int64 global ids. Returns ``(logp [T] fp32,
    entropy [T] fp32 | None)``, identical on every rank; differentiable in hidden and weight.

    Determinism: logp.v2 (rows independent of T; TP degrees under the segmentation rule give
    the TP=1 bytes) + ag.v1 / ar.v1.
    """
    seg = _segmentation(vocab_size)
    if tp_group is None or torch.distributed.get_world_size(tp_group) == 1:
        from rlk.kernels.linear_logp.autograd import linear_logp

        out = linear_logp(hidden, weight, targets, 0, vocab_size, temperature, entropy, segmentation=seg)
        return out.logp, out.entropy
    n, r = torch.distributed.get_world_size(tp_group), torch.distributed.get_rank(tp_group)
    if weight.shape[0] * n != vocab_size:
        raise UnsupportedConfigError(f"selected_logp: shard {weight.shape[0]} x TP {n} != vocab {vocab_size}")
    from rlk.kernels.linear_logp import contract

    align, seg_v = contract.DEFAULT_SEGMENTATION if seg is None else seg
    logp, ent = _VocabParallelLogp.apply(hidden.contiguous(), weight, targets.contiguous(), r * weight.shape[0],
                                         vocab_size, float(temperature), bool(entropy), (align, seg_v), tp_group)
    return logp, (ent if entropy else None)


def output_processor(*, hidden_states, output_layer, output_weight=None, labels=None, context=None, config=None,
                     **unused):
    """megatron-core 0.19.2 ``GPTModel`` output processor (see module docstring).

    hidden_states ``[s, b, H]`` (final-normed), labels ``[b, s]`` int64 (the token each row
    scores). context (dict, optional): ``entropy`` (bool), ``temperature`` (float),
    ``vocab_size`` (int; default ``output_layer.output_size``).
    Returns logp ``[b, s]`` fp32, or ``(logp, entropy)`` with ``entropy=True``.

    Determinism: logp.v2.
    """
    ctx = dict(context or {})
    if labels is None:
        raise UnsupportedConfigError("output_processor: labels (the selected tokens) are required")
    w = output_weight if output_weight is not None else output_layer.weight
    if getattr(output_layer, "sequence_parallel", False):
        raise UnsupportedConfigError("output_processor: sequence parallel output layer is not covered")
    s, b, H = hidden_states.shape
    h = hidden_states.transpose(0, 1).reshape(b * s, H)
    targets = labels.reshape(b * s).long()
    from megatron.core import parallel_state as ps

    group = ps.get_tensor_model_parallel_group()
    vocab = int(ctx.get("vocab_size", getattr(output_layer, "output_size", w.shape[0] * ps.get_tensor_model_parallel_world_size())))
    logp, ent = selected_logp(h, w, targets, vocab_size=vocab, tp_group=group,
                              temperature=float(ctx.get("temperature", 1.0)), entropy=bool(ctx.get("entropy", False)))
    logp = logp.view(b, s)
    return (logp, ent.view(b, s)) if ctx.get("entropy", False) else logp


def loss_output_processor(*, hidden_states, output_layer, output_weight=None, labels=None, context=None,
                          **unused):
    """megatron-core 0.19.2 ``GPTModel`` output processor of the actor: the fused logp + per-token
    loss path (:func:`rlk.kernels.linear_logp.autograd.linear_logp_loss`, ``logp.v2``), never
    megatron's logits.

    hidden_states ``[s, b, H]``, labels ``[b, s]``. context (dict): ``token_loss`` (required:
    ``token_loss(logp_rows [n] fp32, lo, hi) -> [n]`` over the flattened ``b * s`` rows, as
    ``Qwen3.trainer_logp`` takes it), ``vocab_size``, ``temperature``. Returns ``(loss, logp)``:
    the fp32 sum of the per-token losses and the detached logp ``[b, s]`` fp32.

    Gradient-accumulation fusion (megatron's convention): when the LM-head weight carries an fp32
    ``main_grad`` (megatron's DDP with ``grad_reduce_in_fp32``), d_weight is accumulated into it
    during this call and the weight gets no ``.grad``; the loss's backward must then run with
    grad_out == 1 (no loss scaling after this point). TP=1 only (the fused path is single-shard).

    Determinism: logp.v2; main_grad bytes: the fp32 chain of the bf16 d_weight, continued from
    main_grad's contents.
    """
    from rlk.kernels.linear_logp.autograd import linear_logp_loss

    ctx = dict(context or {})
    if labels is None:
        raise UnsupportedConfigError("loss_output_processor: labels (the selected tokens) are required")
    token_loss = ctx.get("token_loss")
    if not callable(token_loss):
        raise UnsupportedConfigError("loss_output_processor: context['token_loss'] must be the per-token loss "
                                     "callable (logp_rows, lo, hi) -> losses")
    w = output_weight if output_weight is not None else output_layer.weight
    from megatron.core import parallel_state as ps

    if ps.get_tensor_model_parallel_world_size() != 1:
        raise UnsupportedConfigError("loss_output_processor: the fused logp + loss path is single-shard (TP=1); "
                                     "at TP>1 call output_processor and form the loss from its logp")
    s, b, H = hidden_states.shape
    h = hidden_states.transpose(0, 1).reshape(b * s, H)
    targets = labels.reshape(b * s).long().contiguous()
    vocab = int(ctx.get("vocab_size", w.shape[0]))
    main_grad = getattr(w, "main_grad", None) if w.requires_grad else None
    loss, logp = linear_logp_loss(h, w, targets, token_loss, 0, vocab, float(ctx.get("temperature", 1.0)),
                                  segmentation=_segmentation(vocab), main_grad=main_grad)
    return loss, logp.view(b, s)


def gather_cp(logp: torch.Tensor, cu_seqlens, group=None) -> torch.Tensor:
    """Every CP rank's selected-token logp rows in global packed order.

    logp ``[T / CP]`` or ``[1, T / CP]`` fp32 (this rank's zigzag rows, as the output processor
    returns them at CP > 1); cu_seqlens: the global packed offsets; group: the CP group
    (megatron's ``parallel_state.get_context_parallel_group()`` when ``None``). Returns
    ``[T]`` fp32, the same on every CP rank, detached.

    Determinism: ag.v1 (rank order, exact copies) and an index scatter (exact copies).
    """
    from rlk import collectives
    from rlk.nn.context_parallel import zigzag_merge

    if group is None:
        from megatron.core import parallel_state as ps

        group = ps.get_context_parallel_group()
    n = torch.distributed.get_world_size(group)
    local = logp.detach().reshape(-1).contiguous()
    if n == 1:
        return local
    parts = collectives.all_gather(local, group).chunk(n, 0)
    return zigzag_merge(parts, cu_seqlens)
