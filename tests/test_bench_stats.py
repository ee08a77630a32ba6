"""Bootstrap intervals of the benchmarks' figures over jobs (benchmarks/stats.py)."""
from __future__ import annotations

import random
import statistics

import pytest

import stats


def _shares(n: int, *, seed: int) -> list[float]:
    """Shares of the optimum as a search leaves them: most near 1, a tail below."""
    rng = random.Random(seed)
    return [min(1.0, 1.0 - abs(rng.gauss(0.0, 0.02)) - (rng.random() < 0.1) * rng.uniform(0.02, 0.2)) for _ in range(n)]


def test_quantile_interpolates_as_the_inclusive_method() -> None:
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    assert stats.quantile(values, 0.0) == 1.0
    assert stats.quantile(values, 1.0) == 9.0
    assert stats.quantile([1.0, 2.0], 0.25) == pytest.approx(1.25)
    assert [stats.quantile(values, q / 4) for q in (1, 2, 3)] == pytest.approx(statistics.quantiles(values, n=4, method="inclusive"))


def test_mean_interval_holds_the_estimate_and_is_deterministic() -> None:
    shares = _shares(60, seed=1)
    interval = stats.mean(shares, seed=7)
    assert interval.estimate == pytest.approx(statistics.fmean(shares))
    assert interval.low < interval.estimate < interval.high
    assert interval.estimate in interval
    assert stats.mean(shares, seed=7) == interval
    assert stats.mean(shares, seed=8) != interval  # another seed, other resamples


def test_interval_shrinks_with_more_jobs() -> None:
    rng = random.Random(2)
    jobs = [rng.gauss(0.95, 0.03) for _ in range(400)]
    few, many = stats.mean(jobs[:25], seed=0), stats.mean(jobs, seed=0)
    assert many.width < 0.5 * few.width  # sqrt(400 / 25) = 4 times narrower in expectation
    assert stats.percentile(jobs, seed=0).width < 0.7 * stats.percentile(jobs[:25], seed=0).width


def test_intervals_cover_the_true_mean_about_as_often_as_their_level() -> None:
    # 60 draws of 40 jobs from a known distribution: a 95% interval should hold the true mean
    # on most of them, a 50% one on about half.
    rng = random.Random(11)
    draws = [[rng.gauss(0.95, 0.03) for _ in range(40)] for _ in range(60)]
    wide = sum(0.95 in stats.mean(d, seed=i, resamples=400) for i, d in enumerate(draws)) / len(draws)
    narrow = sum(0.95 in stats.mean(d, seed=i, resamples=400, level=0.5) for i, d in enumerate(draws)) / len(draws)
    assert wide >= 0.85
    assert 0.3 <= narrow <= 0.7


def test_percentile_is_the_p5_with_an_interval_inside_the_values() -> None:
    shares = _shares(80, seed=4)
    interval = stats.percentile(shares, seed=0)
    assert interval.estimate == pytest.approx(stats.quantile(shares, 0.05))
    assert min(shares) <= interval.low <= interval.estimate <= interval.high <= max(shares)
    assert stats.percentile(shares, q=0.5, seed=0).estimate == pytest.approx(statistics.median(shares))


def test_share_within_counts_jobs_at_least_99pc() -> None:
    shares = [1.0, 0.99, 0.995, 0.98, 0.5]
    interval = stats.share_within(shares, seed=0)
    assert interval.estimate == pytest.approx(3 / 5)
    assert 0.0 <= interval.low <= interval.estimate <= interval.high <= 1.0
    assert stats.share_within(shares, tolerance=0.05, seed=0).estimate == pytest.approx(4 / 5)
    every = stats.share_within([1.0] * 30, seed=0)
    assert (every.estimate, every.low, every.high) == (1.0, 1.0, 1.0)


def test_ratio_of_sums_resamples_jobs_as_pairs() -> None:
    theirs = [5, 12, 30, 8, 21, 14, 9, 40]
    exact = stats.ratio_of_sums([0.5 * d for d in theirs], theirs, seed=0)
    assert (exact.estimate, exact.low, exact.high) == (0.5, 0.5, 0.5)  # a constant ratio on every job: no spread
    rng = random.Random(5)
    ours = [max(1, round(d * rng.uniform(0.2, 0.6))) for d in theirs]
    interval = stats.ratio_of_sums(ours, theirs, seed=0)
    assert interval.estimate == pytest.approx(sum(ours) / sum(theirs))
    assert interval.low < interval.estimate < interval.high
    assert 0.2 <= interval.low and interval.high <= 0.6


def test_paired_difference_detects_a_known_difference_that_separate_intervals_miss() -> None:
    rng = random.Random(6)
    base = [rng.uniform(0.5, 1.0) for _ in range(50)]  # jobs far apart
    better = [b + 0.01 + rng.gauss(0.0, 0.002) for b in base]  # one change, the same on every job
    difference = stats.paired_difference(better, base, seed=0)
    assert difference.estimate == pytest.approx(statistics.fmean(better) - statistics.fmean(base))
    assert difference.above(0.0)
    assert 0.01 in difference
    assert stats.paired_difference(base, better, seed=0).below(0.0)
    # Each variant's mean alone: their intervals overlap, the jobs' spread hides the change.
    ours, theirs = stats.mean(better, seed=0), stats.mean(base, seed=0)
    assert ours.low < theirs.high


def test_paired_difference_does_not_detect_a_zero_difference() -> None:
    rng = random.Random(7)
    base = [rng.uniform(0.5, 1.0) for _ in range(50)]
    noise = [rng.uniform(0.001, 0.02) for _ in range(25)]
    same = [b + e for b, e in zip(base, noise + [-e for e in noise])]  # as much better on half the jobs as worse on the rest
    difference = stats.paired_difference(same, base, seed=0)
    assert difference.estimate == pytest.approx(0.0, abs=1e-12)
    assert 0.0 in difference
    assert not difference.above(0.0) and not difference.below(0.0)


def test_format_interval() -> None:
    interval = stats.Interval(estimate=0.98823, low=0.98011, high=0.99404)
    assert stats.format_interval(interval) == "0.9882 [0.9801, 0.9940]"
    assert str(interval) == "0.9882 [0.9801, 0.9940]"
    assert stats.format_interval(interval, digits=2) == "0.99 [0.98, 0.99]"


def test_contract_violations_raise() -> None:
    with pytest.raises(ValueError):
        stats.mean([], seed=0)
    with pytest.raises(ValueError):
        stats.mean([1.0], seed=0, resamples=0)
    with pytest.raises(ValueError):
        stats.mean([1.0], seed=0, level=1.0)
    with pytest.raises(ValueError):
        stats.percentile([1.0], q=1.5, seed=0)
    with pytest.raises(ValueError):
        stats.paired_difference([1.0, 2.0], [1.0], seed=0)
    with pytest.raises(ValueError):
        stats.ratio_of_sums([1.0, 2.0], [3.0, 0.0], seed=0)
