"""Distribution health of a replay fixture: can a bitwise comparison on it fail at all?

A fixture whose model puts all its mass on one token (every sampled logp exactly 0.0) passes
any logp comparison whatever the kernels do; one whose model is near uniform tests only the
bulk of a flat softmax. Both say nothing a trained model would. Rule (fail closed), over the
statistics of :func:`rlk.models.qwen3.distribution.distribution_stats`:

* ``entropy_mean`` >= ``ENTROPY_MIN`` nats and <= ``ENTROPY_MAX_FRAC`` * ln V;
* ``frac_logp_zero`` (sampled logp exactly 0.0) <= ``LOGP_ZERO_MAX``;
* ``nonfinite`` (NaN/Inf in entropy or sampled logp) == 0;
* the statistics exist (a fixture without them fails: nothing is assumed healthy).

Each failure message names the statistic and its value.
"""

from __future__ import annotations

import math

ENTROPY_MIN = 0.1
ENTROPY_MAX_FRAC = 0.8
LOGP_ZERO_MAX = 0.01


def failures(stats: dict | None, vocab_size: int) -> list[str]:
    """Health failures of ``stats`` (``distribution_stats`` output) for a ``vocab_size`` model;
    empty when healthy."""
    if not stats:
        return ["distribution statistics missing (entropy_mean, frac_logp_zero not recorded)"]
    out = []
    if stats.get("rows", 0) == 0:
        out.append("distribution statistics over 0 sampled tokens")
    if stats.get("nonfinite", 0):
        out.append(f"nonfinite={stats['nonfinite']}: NaN/Inf in entropy or sampled logp")
    ent, hi = stats.get("entropy_mean"), ENTROPY_MAX_FRAC * math.log(vocab_size)
    if ent is None or not math.isfinite(ent):
        out.append(f"entropy_mean={ent} (not recorded or not finite)")
    elif ent < ENTROPY_MIN:
        out.append(f"entropy_mean={ent:.4g} nats < {ENTROPY_MIN} (degenerate: near one-hot)")
    elif ent > hi:
        out.append(f"entropy_mean={ent:.4g} nats > {ENTROPY_MAX_FRAC} ln V = {hi:.4g} (degenerate: near uniform)")
    z = stats.get("frac_logp_zero")
    if z is None or not math.isfinite(z):
        out.append(f"frac_logp_zero={z} (not recorded)")
    elif z > LOGP_ZERO_MAX:
        out.append(f"frac_logp_zero={z:.4g} > {LOGP_ZERO_MAX} (sampled logp exactly 0.0)")
    return out


def fixture_stats(fx) -> dict:
    """The fixture's recorded statistics; for a fixture recorded without them, those of its
    rollout logp alone (entropy absent, so :func:`failures` still fails it)."""
    st = fx.meta.get("distribution")
    if st:
        return st
    from rlk.models.qwen3.distribution import distribution_stats

    st = distribution_stats([], fx.rollout_logp)
    st["entropy_mean"] = None
    return st


def fixture_failures(fx) -> list[str]:
    """:func:`failures` of a :class:`~rlk.replay.fixture.Fixture` (vocabulary from its config)."""
    return failures(fixture_stats(fx), int(fx.meta["model"]["config"]["vocab_size"]))


def summary(stats: dict | None) -> str:
    """One line for gate details: entropy and sampled-logp figures."""
    if not stats:
        return "distribution: not recorded"
    def f(k):
        v = stats.get(k)
        return "None" if v is None else f"{v:.3g}"
    return (f"entropy_mean={f('entropy_mean')} nats, sampled logp mean={f('logp_mean')} p1={f('logp_p1')} "
            f"p50={f('logp_p50')} p99={f('logp_p99')}, frac_logp_zero={f('frac_logp_zero')}")
