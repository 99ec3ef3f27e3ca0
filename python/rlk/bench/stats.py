"""Statistics of paired benchmark arms: medians, p95, paired bootstrap of the R/R / P/P ratio."""

from __future__ import annotations

import math
import random
from typing import Sequence


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    if not s:
        raise ValueError("median of an empty sequence")
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    s = sorted(xs)
    if not s:
        raise ValueError("percentile of an empty sequence")
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def ratio_of_medians(strict: Sequence[float], native: Sequence[float]) -> float:
    return median(strict) / median(native)


def _percentile_interval(stat, n: int, n_boot: int, seed: int, alpha: float) -> tuple[float, float]:
    """(low, high) of the percentile-bootstrap (1-alpha) interval of ``stat(indices)`` over
    ``n_boot`` seeded resamples of ``n`` indices with replacement."""
    rng = random.Random(seed)
    boots = sorted(stat([rng.randrange(n) for _ in range(n)]) for _ in range(n_boot))
    lo = boots[int(math.floor(alpha / 2 * n_boot))]
    hi = boots[min(n_boot - 1, int(math.ceil((1 - alpha / 2) * n_boot)) - 1)]
    return lo, hi


def paired_bootstrap_ratio(
    strict: Sequence[float],
    native: Sequence[float],
    n_boot: int = 10000,
    seed: int = 0,
    alpha: float = 0.05,
) -> tuple[float, float, float]:
    """Ratio of medians of paired samples and its percentile-bootstrap (1-alpha) interval.

    ``strict[i]`` and ``native[i]`` are one pair (same repetition and step index). Pairs are
    resampled together, so drifts shared by both arms cancel. Returns (ratio, low, high).
    """
    if len(strict) != len(native) or not strict:
        raise ValueError("paired samples must be non-empty and of equal length")
    lo, hi = _percentile_interval(lambda idx: median([strict[i] for i in idx]) / median([native[i] for i in idx]),
                                  len(strict), n_boot, seed, alpha)
    return ratio_of_medians(strict, native), lo, hi


def bootstrap_median(xs: Sequence[float], n_boot: int = 10000, seed: int = 0,
                     alpha: float = 0.05) -> tuple[float, float, float]:
    """Median of ``xs`` and its percentile-bootstrap (1-alpha) interval, resampling the values
    themselves (e.g. one R/R / P/P ratio per process pair: the pair is the unit, not the step).
    Returns (median, low, high); seeded, so the same input gives the same interval."""
    if not xs:
        raise ValueError("bootstrap of an empty sequence")
    lo, hi = _percentile_interval(lambda idx: median([xs[i] for i in idx]), len(xs), n_boot, seed, alpha)
    return median(xs), lo, hi
