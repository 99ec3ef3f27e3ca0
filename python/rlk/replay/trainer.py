"""Trainer pattern: re-score prompt + response as packed varlen sequences (megatron-core style).

Each sequence is ``prompt + response`` (all of it, as a trainer feeds it); row ``t`` gives the
logp of token ``t + 1``; the response logp of sequence ``b`` sits at rows
``p_b - 1 .. p_b + r_b - 2`` of that sequence.
"""

from __future__ import annotations

import dataclasses
import time

import torch


@dataclasses.dataclass
class Packed:
    ids: torch.Tensor  # [T] int64
    cu_seqlens: torch.Tensor  # [B+1] int32
    targets: torch.Tensor  # [T] int64 (next token; 0 at each sequence's last row)
    loss_mask: torch.Tensor  # [T] bool: row predicts a response token
    order: list[int]  # request index of each packed sequence
    prompt_lens: list[int]
    response_lens: list[int]
    host_cu: list[int] | None = None  # cu_seqlens on the host (no device read to use it)


def pack(prompts: list[list[int]], responses: list[list[int]], order: list[int] | None = None, device="cpu") -> Packed:
    order = list(range(len(prompts))) if order is None else list(order)
    ids, tg, mask, cu = [], [], [], [0]
    for i in order:
        seq = list(prompts[i]) + list(responses[i])
        p = len(prompts[i])
        ids += seq
        tg += seq[1:] + [0]
        mask += [p - 1 <= t < len(seq) - 1 for t in range(len(seq))]
        cu.append(cu[-1] + len(seq))
    return Packed(
        ids=torch.tensor(ids, dtype=torch.int64, device=device),
        cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=device),
        targets=torch.tensor(tg, dtype=torch.int64, device=device),
        loss_mask=torch.tensor(mask, dtype=torch.bool, device=device),
        order=order, prompt_lens=[len(prompts[i]) for i in order], response_lens=[len(responses[i]) for i in order],
        host_cu=cu)


def response_logp(pk: Packed, logp: torch.Tensor, n: int) -> list[torch.Tensor]:
    """Per request index (``0..n-1``), its response logp ``[r]`` taken from packed rows."""
    out: list[torch.Tensor | None] = [None] * n
    cu = pk.host_cu if pk.host_cu is not None else pk.cu_seqlens.tolist()
    for j, i in enumerate(pk.order):
        p, r = pk.prompt_lens[j], pk.response_lens[j]
        out[i] = logp[cu[j] + p - 1: cu[j] + p - 1 + r]
    return out


def response_rows(pk: Packed, per_request: list[torch.Tensor]) -> torch.Tensor:
    """The inverse of :func:`response_logp`: packed ``[T]`` fp32 host rows holding each request's
    response values (``per_request[i]``: ``[r_i]``) at its logp rows, 0 elsewhere."""
    from rlk.errors import UnsupportedConfigError

    out = torch.zeros(pk.ids.shape[0], dtype=torch.float32)
    cu = pk.host_cu if pk.host_cu is not None else pk.cu_seqlens.tolist()
    for j, i in enumerate(pk.order):
        a, r = cu[j] + pk.prompt_lens[j] - 1, pk.response_lens[j]
        if tuple(per_request[i].shape) != (r,):
            raise UnsupportedConfigError(f"sequence {i}: {tuple(per_request[i].shape)} values for {r} response tokens")
        out[a:a + r] = per_request[i].detach().float().cpu()
    return out


def score(model, prompts, responses, *, actor=False, order=None, microbatch_tokens=None, probes=None):
    """Trainer logp of every response; see :func:`_score`. Token ids are range-checked on the host
    and ``cu_seqlens`` is built there, so launches run under ``host_validated`` (no device reads)."""
    from rlk.kernels.common import host_validated
    from rlk.replay.rollout import check_tokens

    check_tokens(model.cfg.vocab_size, prompts, responses)
    longest = max((len(p) + len(r) for p, r in zip(prompts, responses)), default=0)
    if longest > model.cfg.max_position_embeddings:
        from rlk.errors import UnsupportedConfigError

        raise UnsupportedConfigError(f"a sequence of {longest} tokens exceeds max_position_embeddings "
                                     f"{model.cfg.max_position_embeddings}")
    with host_validated():
        return _score(model, prompts, responses, actor=actor, order=order, microbatch_tokens=microbatch_tokens,
                      probes=probes)


def _score(model, prompts, responses, *, actor=False, order=None, microbatch_tokens=None, probes=None):
    """Trainer logp of every response (list per request) plus grads (actor) and seconds.

    ``microbatch_tokens`` splits the packed batch into consecutive groups of whole sequences of
    at most that many tokens (as a trainer's micro-batches); with ``actor`` the gradients of the
    groups are summed in group order.
    """
    n = len(prompts)
    order = list(range(n)) if order is None else list(order)
    groups, cur, tok = [], [], 0
    for i in order:
        L = len(prompts[i]) + len(responses[i])
        if cur and microbatch_tokens and tok + L > microbatch_tokens:
            groups.append(cur)
            cur, tok = [], 0
        cur.append(i)
        tok += L
    groups.append(cur)
    out: list[torch.Tensor | None] = [None] * n
    grads = None
    t0 = time.perf_counter()
    for gi in groups:
        pk = pack(prompts, responses, gi, device=model.device)
        pr = {} if probes is not None else None
        lp, g = model.trainer_logp(pk.ids, pk.cu_seqlens, pk.targets, actor=actor, loss_mask=pk.loss_mask, probes=pr,
                                   host_cu=pk.host_cu)
        for i, t in enumerate(response_logp(pk, lp, n)):
            if t is not None:
                out[i] = t
        if probes is not None:
            probes.append((pk, pr))
        if g is not None:
            grads = g if grads is None else {k: grads[k] + g[k] for k in grads}
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return out, grads, time.perf_counter() - t0
