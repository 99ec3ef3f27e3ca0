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
