"""Figures over jobs with their bootstrap intervals (placeholder until the stats module lands)."""
from __future__ import annotations

import random
from collections.abc import Callable


def bootstrap(values: list[float], statistic: Callable[[list[float]], float], *, seed: int, resamples: int = 2000,
              level: float = 0.95) -> tuple[float, float]:
    rng = random.Random(seed)
    draws = sorted(statistic([values[rng.randrange(len(values))] for _ in values]) for _ in range(resamples))
    return draws[int((1 - level) / 2 * resamples)], draws[int((1 + level) / 2 * resamples) - 1]


def bootstrap_ratio(ours: list[float], theirs: list[float], *, seed: int, resamples: int = 2000,
                    level: float = 0.95) -> tuple[float, float]:
    rng = random.Random(seed)
    n = len(ours)
    draws = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        draws.append(sum(ours[i] for i in idx) / max(1e-12, sum(theirs[i] for i in idx)))
    draws.sort()
    return draws[int((1 - level) / 2 * resamples)], draws[int((1 + level) / 2 * resamples) - 1]
