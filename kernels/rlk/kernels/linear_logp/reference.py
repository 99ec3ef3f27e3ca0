"""Plain-torch specification of ``logp.v2`` (tests and benchmarks only; kernels never import it).

Casting contract: hidden [T, H] and weight [V_local, H] are bf16; logits are computed from the
bf16 values in ``dtype`` (fp64 for accuracy references) without rounding to bf16, scaled by
1/temperature; columns >= vocab_real (global) are -inf; logp = x[target] - logsumexp(x),
entropy = -sum p log p. The kernels compute the same quantities in fp32 with the fixed orders
written in ``contract.py``; they match this reference to fp32 rounding, not bitwise.
"""

from __future__ import annotations

import torch


def logits_ref(hidden, weight, vocab_start=0, vocab_real=None, temperature=1.0, dtype=torch.float64):
    """[T, V_local] logits in ``dtype``: (hidden @ weight.T) / temperature, padding at -inf."""
    V_local = weight.shape[0]
    vocab_real = V_local + vocab_start if vocab_real is None else vocab_real
    x = (hidden.to(dtype) @ weight.to(dtype).T) / temperature
    cols = torch.arange(V_local, device=x.device) + vocab_start
    return x.masked_fill((cols >= vocab_real)[None, :], float("-inf"))


def linear_logp_ref(hidden, weight, targets, vocab_start=0, vocab_real=None, temperature=1.0,
                    dtype=torch.float64):
    """(logp [T], lse [T], entropy [T]) in ``dtype`` for one shard holding every target
    (vocab_start=0 and the full vocabulary for the usual test)."""
    x = logits_ref(hidden, weight, vocab_start, vocab_real, temperature, dtype)
    lse = torch.logsumexp(x, dim=-1)
    logp_all = x - lse[:, None]
    p = logp_all.exp()
    ent = -(p * torch.where(p > 0, logp_all, torch.zeros_like(logp_all))).sum(-1)
    logp = logp_all.gather(1, (targets - vocab_start)[:, None]).squeeze(1)
    return logp, lse, ent


def linear_logp_grads_ref(hidden, weight, targets, dlogp, dlse=None, dentropy=None, vocab_real=None,
                          temperature=1.0, dtype=torch.float64):
    """(d_hidden [T, H], d_weight [V, H]) in ``dtype`` by autograd through the fp64 reference."""
    h = hidden.detach().to(dtype).requires_grad_(True)
    w = weight.detach().to(dtype).requires_grad_(True)
    logp, lse, ent = linear_logp_ref(h, w, targets, 0, vocab_real, temperature, dtype)
    loss = (logp * dlogp.to(dtype)).sum()
    if dlse is not None:
        loss = loss + (lse * dlse.to(dtype)).sum()
    if dentropy is not None:
        loss = loss + (ent * dentropy.to(dtype)).sum()
    dh, dw = torch.autograd.grad(loss, (h, w))
    return dh, dw


def native_linear_logp(hidden, weight, targets, temperature=1.0):
    """The native route benchmarked against: bf16 matmul logits, fp32 log_softmax, gather."""
    logits = hidden @ weight.T
    lp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return lp.gather(1, targets[:, None]).squeeze(1)
