"""GRPO's arithmetic: group advantages, the clipped importance-ratio loss, ratio statistics.

Plain torch on small host tensors (rewards, per-token logp); no kernel runs here. The actor loss
is handed to the model as a per-token callable (:func:`token_loss_fn`), so the strict route's
fused LM head + loss path (``logp.v2``) takes it unchanged.
"""

from __future__ import annotations

import math

import torch

from rlk.errors import UnsupportedConfigError


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages: ``(r - mean(group)) / (std(group) + eps)`` within each group.

    Args:
      rewards: ``[N]`` float, ``N`` a multiple of ``group_size``; groups are consecutive blocks of
        ``group_size`` samples (the samples of one prompt).
      group_size: samples per prompt, at least 2 (one sample has no group statistics).
      eps: added to the standard deviation, so a group of equal rewards gets advantage 0.
    Returns:
      ``[N]`` fp32. The standard deviation is the sample one (Bessel's correction), as TRL's
      GRPO trainer computes it.
    """
    r = torch.as_tensor(rewards, dtype=torch.float32).flatten()
    if group_size < 2:
        raise UnsupportedConfigError(f"group_size must be >= 2 (got {group_size})")
    if r.numel() == 0 or r.numel() % group_size:
        raise UnsupportedConfigError(f"{r.numel()} rewards do not split into groups of {group_size}")
    if not torch.isfinite(r).all():
        raise UnsupportedConfigError("rewards hold NaN or Inf")
    g = r.view(-1, group_size)
    mean = g.mean(dim=1, keepdim=True)
    std = g.std(dim=1, keepdim=True)
    return ((g - mean) / (std + eps)).flatten()


def clipped_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                       clip_eps: float, n_tokens: int) -> torch.Tensor:
    """PPO's clipped surrogate, per token: ``-min(ratio * A, clip(ratio, 1-eps, 1+eps) * A) / n``.

    Args:
      logp: ``[T]`` fp32, the trainer's selected-token logp (differentiable).
      old_logp: ``[T]`` fp32, the behaviour policy's logp (strict: the rollout's, reused).
      adv: ``[T]`` fp32, each token's sequence advantage.
      mask: ``[T]`` bool, rows that are response tokens; other rows give loss 0 and gradient 0.
      clip_eps: the clipping range (0.2 in PPO).
      n_tokens: the normalizer, the response tokens of the whole batch (token-level mean, so a
        micro-batch's losses add up to the batch's).
    Returns:
      ``[T]`` fp32 per-token losses; ``ratio = exp(logp - old_logp)`` (fp32) on masked-in rows.
    """
    if n_tokens < 1:
        raise UnsupportedConfigError(f"n_tokens must be >= 1 (got {n_tokens})")
    m = mask.to(torch.bool)
    # Rows outside the mask get ratio exp(0): no inf * 0 from their (unused) logp.
    ratio = torch.exp(torch.where(m, logp - old_logp, torch.zeros_like(logp)))
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv)
    return torch.where(m, -surrogate, torch.zeros_like(surrogate)) / float(n_tokens)


def token_loss_fn(old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, clip_eps: float, n_tokens: int):
    """``token_loss(logp_rows, lo, hi)`` for :meth:`rlk.models.qwen3.Qwen3.trainer_logp`: the
    clipped loss of rows ``[lo, hi)`` over packed rows ``old_logp`` / ``adv`` / ``mask`` ``[T]``."""

    def fn(lp, lo, hi):
        return clipped_token_loss(lp, old_logp[lo:hi], adv[lo:hi], mask[lo:hi], clip_eps, n_tokens)

    return fn


def ratio_stats(train_logp: list[torch.Tensor], rollout_logp: list[torch.Tensor], clip_eps: float | None = None) -> dict:
    """Importance-ratio figures of one step: ``ratio = exp(logp_train - logp_rollout)`` per token.

    Returns ``tokens``; ``ratio_not_one`` (tokens whose fp32 ratio is not exactly 1.0);
    ``logp_mismatch`` (tokens whose logp differ in any bit: stricter, since a difference below
    half an ulp of 1.0 still gives ratio 1.0); ``ratio_min`` / ``ratio_max``; ``abs_dev``: min,
    mean, p01, p50, p99 and max of ``|ratio - 1|``; ``clip_fraction`` (tokens outside
    ``[1-eps, 1+eps]``) when ``clip_eps`` is given.
    """
    if len(train_logp) != len(rollout_logp):
        raise UnsupportedConfigError(f"{len(train_logp)} trainer sequences vs {len(rollout_logp)} rollout sequences")
    for i, (a, b) in enumerate(zip(train_logp, rollout_logp)):
        if a.shape != b.shape:
            raise UnsupportedConfigError(f"sequence {i}: trainer logp {tuple(a.shape)} vs rollout {tuple(b.shape)}")
    t = torch.cat([x.detach().float().cpu().flatten() for x in train_logp])
    r = torch.cat([x.detach().float().cpu().flatten() for x in rollout_logp])
    ratio = torch.exp(t - r)
    dev = (ratio - 1.0).abs().double()
    out = {"tokens": int(t.numel()), "ratio_not_one": int((ratio != 1.0).sum()),
           "logp_mismatch": int((t != r).sum())}
    if t.numel():
        q = torch.quantile(dev, torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64)).tolist()
        out.update(ratio_min=float(ratio.min()), ratio_max=float(ratio.max()),
                   abs_dev={"min": float(dev.min()), "mean": float(dev.mean()), "p01": q[0], "p50": q[1],
                            "p99": q[2], "max": float(dev.max())})
        if clip_eps is not None:
            out["clip_fraction"] = float(((ratio < 1 - clip_eps) | (ratio > 1 + clip_eps)).float().mean())
    if not all(math.isfinite(v) for v in (out.get("ratio_min", 0.0), out.get("ratio_max", 0.0))):
        raise UnsupportedConfigError("importance ratio is NaN or Inf (a logp is not finite)")
    return out
