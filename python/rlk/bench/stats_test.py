import pytest

from rlk.bench import stats


def test_median_and_percentile():
    assert stats.median([3, 1, 2]) == 2
    assert stats.median([4, 1, 2, 3]) == 2.5
    assert stats.percentile([1, 2, 3, 4, 5], 95) == pytest.approx(4.8)
    with pytest.raises(ValueError):
        stats.median([])


def test_bootstrap_interval_contains_true_ratio_and_is_deterministic():
    native = [100.0 + (i % 7) for i in range(60)]
    strict = [0.9 * x for x in native]
    r, lo, hi = stats.paired_bootstrap_ratio(strict, native, n_boot=2000, seed=1)
    assert r == pytest.approx(0.9)
    assert lo <= 0.9 <= hi and hi - lo < 0.02
    assert stats.paired_bootstrap_ratio(strict, native, n_boot=2000, seed=1) == (r, lo, hi)


def test_bootstrap_interval_widens_with_noise():
    native = [100.0] * 40
    strict = [80.0 + (30.0 if i % 2 else 0.0) for i in range(40)]
    _, lo, hi = stats.paired_bootstrap_ratio(strict, native, n_boot=2000)
    assert hi - lo > 0.1


def test_bootstrap_rejects_unpaired():
    with pytest.raises(ValueError):
        stats.paired_bootstrap_ratio([1.0], [1.0, 2.0])


def test_bootstrap_median_over_units():
    xs = [0.8, 0.9, 0.85, 0.88, 0.82]
    m, lo, hi = stats.bootstrap_median(xs, n_boot=2000, seed=3)
    assert m == 0.85 and min(xs) <= lo <= m <= hi <= max(xs)
    assert stats.bootstrap_median(xs, n_boot=2000, seed=3) == (m, lo, hi)
    # One unit far off moves the upper bound, not the median: the interval is over units.
    m2, _, hi2 = stats.bootstrap_median(xs[:-1] + [1.5], n_boot=2000, seed=3)
    assert m2 == 0.88 and hi2 == 1.5
    assert stats.bootstrap_median([2.0], n_boot=10) == (2.0, 2.0, 2.0)
    # With more units the interval of the median lies strictly inside the range of the values.
    m3, lo3, hi3 = stats.bootstrap_median([float(i) for i in range(21)], n_boot=2000, seed=0)
    assert m3 == 10.0 and 4.0 < lo3 < 10.0 < hi3 < 16.0
    with pytest.raises(ValueError):
        stats.bootstrap_median([])
