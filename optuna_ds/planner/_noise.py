"""The run-to-run noise of one measurement, and a config's level from its runs, under noise with
a heavy tail on the slow side (stragglers)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from collections.abc import Sequence

import numpy as np

from optuna_ds.planner._settings import Priors

# The prior of the run-to-run noise (relative sd of one run): log-normal, centred at 2%, a factor
# 2.2 either way (docs/planner.md, The surrogate's priors). Stragglers: ``Priors.straggler_*``.
_NOISE_GRID = np.geomspace(0.002, 0.2, 61)
_NOISE_LOGPRIOR = -0.5 * (np.log(_NOISE_GRID / 0.02) / 0.8) ** 2


def measured_noise(groups: Iterable[Sequence[float]], *, priors: Priors = Priors()) -> tuple[float, int]:
    """The relative noise of one measurement from the runs of each config (positive values, one
    sequence per config): the posterior geometric mean under the belief above, and the degrees
    of freedom it rests on (runs beyond each config's first; 0: the belief alone, nothing
    measured). The planner and the summary both report this figure."""
    logs = [np.sort(np.log(np.asarray(v, dtype=float))) for v in groups if len(v) > 1]
    log_post = _NOISE_LOGPRIOR.copy()
    log_sigma = np.log(_NOISE_GRID)
    branches = []
    for v in logs:
        # Either every run is a plain draw, or the slowest is a straggler and the rest are.
        plain = -(len(v) - 1) * (log_sigma + 0.5 * math.log(2 * math.pi)) - np.sum((v - v.mean()) ** 2) / (2.0 * _NOISE_GRID**2)
        rest = v[1:]
        straggler = (-(len(rest) - 1) * (log_sigma + 0.5 * math.log(2 * math.pi))
                     - np.sum((rest - rest.mean()) ** 2) / (2.0 * _NOISE_GRID**2) - math.log(priors.straggler_range))
        plain, straggler = math.log(1 - priors.straggler_p) + plain, math.log(priors.straggler_p) + straggler
        branches.append((len(v), plain, straggler))
        log_post = log_post + np.logaddexp(plain, straggler)
    w = np.exp(log_post - log_post.max())
    w /= w.sum()
    # The runs the figure rests on: a group's slowest run counts as much as it is believed plain;
    # a repeat judged a straggler measured nothing.
    dof = 0.0
    for n, plain, straggler in branches:
        p_plain = float(w @ (1.0 / (1.0 + np.exp(np.clip(straggler - plain, -50, 50)))))
        dof += (n - 1) - (1.0 - p_plain)
    dof = int(round(dof))
    return float(np.exp(w @ np.log(_NOISE_GRID))), dof


def robust_level(runs: Sequence[float], noise: float, *, priors: Priors = Priors()) -> float:
    """The log level of a config from its runs (positive values) under one-sided noise: each run
    is a plain draw about the level (relative sd ``noise``) or, with probability
    ``priors.straggler_p``, a straggler anywhere within ``priors.straggler_range`` below it; the
    likeliest level. Runs that agree give their mean; a slow one among them moves it little
    (the mean of the others), where their mean would drop by its share; one run gives itself."""
    y = np.log(np.asarray(runs, dtype=float))
    sd, width, p = max(noise, 1e-4), priors.straggler_range, priors.straggler_p
    mu = np.linspace(y.min() - 4.0 * sd, y.max() + 4.0 * sd, 801)
    dev = (y[None, :] - mu[:, None]) / sd
    plain = math.log(1.0 - p) - 0.5 * dev**2 - math.log(sd * math.sqrt(2.0 * math.pi))
    slow = math.log(p / width) + _log_between(dev, dev + width / sd)
    return float(mu[int(np.argmax(np.logaddexp(plain, slow).sum(axis=1)))])


def _log_between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``log(Phi(b) - Phi(a))`` for ``a < b``, exact far in the tails."""
    from scipy.special import log_ndtr

    # By symmetry, on the side where the difference of the two tails is not a difference of ones.
    flip = a > 0
    lo, hi = np.where(flip, -b, a), np.where(flip, -a, b)
    top = log_ndtr(hi)
    return np.asarray(top + np.log1p(-np.exp(np.minimum(log_ndtr(lo) - top, -1e-16))))
