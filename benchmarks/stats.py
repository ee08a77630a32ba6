"""Figures over jobs with percentile-bootstrap intervals: how far a benchmark's figure could move
with another draw of jobs from the same generator.

Every figure is a statistic of per-job values; its interval resamples the jobs with replacement
(a seeded ``random.Random``, ``resamples`` times) and takes the statistic's ``(1 - level) / 2``
and ``(1 + level) / 2`` quantiles over the resamples. Figures of two values per job (a ratio of
sums, a paired difference) resample the jobs' pairs together, so a job's two values stay paired.
Pure functions of their arguments: the same values and seed give the same interval.
"""
from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

RESAMPLES = 2000
LEVEL = 0.95


@dataclasses.dataclass(frozen=True)
class Interval:
    """A figure over the jobs (``estimate``, the statistic of all of them) and its bootstrap
    interval ``[low, high]``."""

    estimate: float
    low: float
    high: float

    @property
    def width(self) -> float:
        return self.high - self.low

    def above(self, value: float) -> bool:
        """The whole interval lies above ``value``: the figure exceeds it beyond the interval."""
        return self.low > value

    def below(self, value: float) -> bool:
        """The whole interval lies below ``value``."""
        return self.high < value

    def __contains__(self, value: float) -> bool:
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return format_interval(self)


def format_interval(interval: Interval, *, digits: int = 4) -> str:
    """``estimate [low, high]`` with ``digits`` decimals: ``0.9882 [0.9801, 0.9940]``."""
    return f"{interval.estimate:.{digits}f} [{interval.low:.{digits}f}, {interval.high:.{digits}f}]"


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 <= q <= 1) of ``values``, interpolated linearly between the two
    closest ranks (numpy's default, ``statistics.quantiles``' inclusive method)."""
    if not values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def bootstrap(jobs: Sequence[T], statistic: Callable[[Sequence[T]], float], *, seed: int = 0,
              resamples: int = RESAMPLES, level: float = LEVEL) -> Interval:
    """``statistic`` of ``jobs`` (one item per job) with its percentile-bootstrap interval at
    ``level``: ``resamples`` resamples of as many jobs as given, drawn with replacement by
    ``random.Random(seed)``. Raises ValueError for no jobs, no resamples or a level outside (0, 1)."""
    if not jobs:
        raise ValueError("a figure over no jobs")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level {level} outside (0, 1)")
    rng = random.Random(seed)
    n = len(jobs)
    draws = [statistic([jobs[i] for i in rng.choices(range(n), k=n)]) for _ in range(resamples)]
    tail = (1.0 - level) / 2.0
    return Interval(estimate=statistic(jobs), low=quantile(draws, tail), high=quantile(draws, 1.0 - tail))


def mean(values: Sequence[float], *, seed: int = 0, resamples: int = RESAMPLES, level: float = LEVEL) -> Interval:
    """The mean of the per-job ``values`` (a share of the optimum, say) with its interval."""
    return bootstrap(values, _mean, seed=seed, resamples=resamples, level=level)


def percentile(values: Sequence[float], *, q: float = 0.05, seed: int = 0, resamples: int = RESAMPLES,
               level: float = LEVEL) -> Interval:
    """The ``q`` quantile of the per-job ``values`` (:func:`quantile`; the default the 5th
    percentile, a figure of the worse jobs) with its interval."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    return bootstrap(values, lambda sample: quantile(sample, q), seed=seed, resamples=resamples, level=level)


def share_within(shares: Sequence[float], *, tolerance: float = 0.01, seed: int = 0, resamples: int = RESAMPLES,
                 level: float = LEVEL) -> Interval:
    """The fraction of jobs whose share of the optimum is at least ``1 - tolerance`` (default:
    within 1%, 0.99 itself counted) with its interval."""
    threshold = 1.0 - tolerance
    return bootstrap([1.0 if s >= threshold else 0.0 for s in shares], _mean, seed=seed, resamples=resamples, level=level)


def ratio_of_sums(numerators: Sequence[float], denominators: Sequence[float], *, seed: int = 0,
                  resamples: int = RESAMPLES, level: float = LEVEL) -> Interval:
    """``sum(numerators) / sum(denominators)`` over the same jobs (our launches over DeepSpeed's,
    the i-th of each the same job) with its interval, each job's pair resampled together. Every
    denominator must be positive (a job where the reference launched nothing has no ratio):
    raises ValueError otherwise, or for lists of different lengths."""
    pairs = _pairs(numerators, denominators)
    if any(d <= 0 for _, d in pairs):
        raise ValueError("a ratio of sums needs every denominator positive")
    return bootstrap(pairs, lambda sample: sum(a for a, _ in sample) / sum(b for _, b in sample),
                     seed=seed, resamples=resamples, level=level)


def paired_difference(ours: Sequence[float], theirs: Sequence[float], *, seed: int = 0, resamples: int = RESAMPLES,
                      level: float = LEVEL) -> Interval:
    """The mean of ``ours[i] - theirs[i]``, two variants' values on the same jobs, with its
    interval, each job's pair resampled together: the job-to-job spread that both share cancels.
    ``.above(0)`` says ours is higher beyond the interval, ``.below(0)`` lower; an interval
    holding 0 says nothing. Raises ValueError for lists of different lengths."""
    return bootstrap([a - b for a, b in _pairs(ours, theirs)], _mean, seed=seed, resamples=resamples, level=level)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _pairs(first: Sequence[float], second: Sequence[float]) -> list[tuple[float, float]]:
    if len(first) != len(second):
        raise ValueError(f"paired values of different lengths: {len(first)} and {len(second)}")
    return list(zip(first, second))
