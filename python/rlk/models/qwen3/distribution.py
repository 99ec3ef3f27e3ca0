"""Next-token distribution statistics: how trained-like a model's output distribution is.

One definition, used by the weight-recipe tests, the offline calibration tool, every replay
fixture (its rollout's own sampled tokens) and the gate's health rule
(:mod:`rlk.replay.health`):

* ``entropy``: per row, ``-sum_v p_v log p_v`` of the fp32 softmax of the row's logits (nats);
* ``sampled_logp``: per row, the logp of a token sampled from that row's distribution (seeded).

:func:`distribution_stats` reduces the two vectors to ``entropy_mean`` (and p10/p50/p90),
sampled-logp ``logp_mean``, ``logp_std``, ``logp_p1``, ``logp_p50``, ``logp_p99``,
``frac_logp_zero`` (the fraction exactly 0.0: a row so peaked that its logp rounds to zero
shows nothing in a bitwise comparison) and ``nonfinite`` (NaN/Inf count in either vector).
"""

from __future__ import annotations

import math

import torch

STATS_FORMAT = "rlk.distribution_stats.v1"


def row_entropy(logits: torch.Tensor, chunk_rows: int = 256) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits)`` per row: ``logits [T, V]`` -> ``[T]`` fp32.

    fp32 ``log_softmax``; rows in chunks of ``chunk_rows`` (bounded workspace at V = 151936).
    Not bit-relevant anywhere: a statistic, never compared bitwise.
    """
    out = []
    for lo in range(0, logits.shape[0], chunk_rows):
        lsm = torch.log_softmax(logits[lo:lo + chunk_rows].float(), dim=-1)
        out.append(-(lsm.exp() * lsm).sum(-1))
    return torch.cat(out) if out else torch.zeros(0, device=logits.device)


def sample_rows(logits: torch.Tensor, generator: torch.Generator, chunk_rows: int = 256):
    """``(entropy [T], tokens [T] int64, sampled_logp [T])`` of fp32 ``logits [T, V]``.

    Tokens are drawn as the replay rollout draws them (Gumbel-max: ``argmax(softmax / q)``,
    ``q ~ Exp(1)`` from ``generator``); ``sampled_logp`` is the fp32 ``log_softmax`` at the token.
    """
    ents, toks, lps = [], [], []
    for lo in range(0, logits.shape[0], chunk_rows):
        x = logits[lo:lo + chunk_rows].float()
        lsm = torch.log_softmax(x, dim=-1)
        ents.append(-(lsm.exp() * lsm).sum(-1))
        q = torch.empty_like(x).exponential_(generator=generator)
        t = (torch.softmax(x, dim=-1) / q).argmax(dim=-1)
        toks.append(t)
        lps.append(lsm.gather(1, t[:, None])[:, 0])
    return torch.cat(ents), torch.cat(toks), torch.cat(lps)


def _q(x: torch.Tensor, q: float) -> float:
    return float(torch.quantile(x.double(), q)) if x.numel() else float("nan")


def distribution_stats(entropy, sampled_logp) -> dict:
    """Summary of per-row ``entropy`` and ``sampled_logp`` (tensors or lists of tensors, any
    device; concatenated). Non-finite values are counted in ``nonfinite`` and left out of the
    other figures. Returns plain floats (JSON-able); see the module docstring for the keys."""
    def flat(v):
        if isinstance(v, (list, tuple)):
            v = torch.cat([torch.as_tensor(t).reshape(-1).float().cpu() for t in v]) if v else torch.zeros(0)
        return torch.as_tensor(v).reshape(-1).float().cpu()

    e, lp = flat(entropy), flat(sampled_logp)
    fe, fl = torch.isfinite(e), torch.isfinite(lp)
    e, lpf = e[fe], lp[fl]
    return {
        "format": STATS_FORMAT,
        "rows": int(lp.numel()),
        "entropy_rows": int(fe.numel()),
        "nonfinite": int((~fe).sum() + (~fl).sum()),
        "entropy_mean": float(e.mean()) if e.numel() else float("nan"),
        "entropy_p10": _q(e, 0.10), "entropy_p50": _q(e, 0.50), "entropy_p90": _q(e, 0.90),
        "logp_mean": float(lpf.mean()) if lpf.numel() else float("nan"),
        "logp_std": float(lpf.std()) if lpf.numel() > 1 else 0.0,
        "logp_p1": _q(lpf, 0.01), "logp_p50": _q(lpf, 0.50), "logp_p99": _q(lpf, 0.99),
        "frac_logp_zero": float((lp == 0).sum()) / lp.numel() if lp.numel() else float("nan"),
    }


def random_prompts(vocab_size: int, sequences: int = 4, length: int = 64, seed: int = 0) -> list[list[int]]:
    """The fixed prompt set of the recipe measurements: ``sequences`` uniform random token lists."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (length,), generator=g).tolist() for _ in range(sequences)]


@torch.no_grad()
def measure(model, prompts: list[list[int]], seed: int = 0, skip_first: int = 1) -> dict:
    """:func:`distribution_stats` of ``model``'s next-token distribution over ``prompts``.

    One forward of the packed prompts (:meth:`Qwen3.final_hidden`), fp32 logits
    ``hidden @ lm_head.T`` (the same on either route), one seeded sample per row. The first
    ``skip_first`` positions of each prompt are left out (a one-token context says little).
    """
    dev = model.device
    cu = [0]
    for p in prompts:
        cu.append(cu[-1] + len(p))
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.int64, device=dev)
    h = model.final_hidden(ids, torch.tensor(cu, dtype=torch.int32, device=dev))
    keep = torch.tensor([j for a, b in zip(cu, cu[1:]) for j in range(a + skip_first, b)], device=dev)
    h = h.index_select(0, keep).float()
    w = model.w["lm_head.weight"].float()
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    ents, lps = [], []
    for lo in range(0, h.shape[0], 256):
        e, _, lp = sample_rows(h[lo:lo + 256] @ w.T, g)
        ents.append(e)
        lps.append(lp)
    out = distribution_stats(ents, lps)
    out["ln_vocab"] = math.log(model.cfg.vocab_size)
    return out
