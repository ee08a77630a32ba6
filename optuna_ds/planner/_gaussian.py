"""Normal-distribution helpers of the surrogate: its expected gain, tails and quadrature."""

from __future__ import annotations

import math

import numpy as np

NODES, NODE_WEIGHTS = np.polynomial.hermite_e.hermegauss(9)
NODE_WEIGHTS = NODE_WEIGHTS / NODE_WEIGHTS.sum()


def logsumexp(a: np.ndarray) -> np.ndarray:
    """``log(sum(exp(a), axis=1))``, safely."""
    top = a.max(axis=1, keepdims=True)
    return np.asarray(top[:, 0] + np.log(np.exp(a - top).sum(axis=1)))


def heaviest(w: np.ndarray, limit: int) -> np.ndarray:
    """The indices of the heaviest components holding 99% of the weight, at most ``limit``: the
    knowledge gradient is quadratic in their number."""
    order = np.argsort(-w)
    n = int(np.searchsorted(np.cumsum(w[order]), 0.99 * w.sum())) + 1
    return order[: min(n, limit)]


def gain(mean: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """``E[max(0, x)]`` for ``x ~ N(mean, sd^2)``."""
    z = mean / sd
    return np.asarray(mean * norm_cdf(z) + sd * _norm_pdf(z))


def _norm_pdf(z: np.ndarray) -> np.ndarray:
    return np.asarray(np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi))


def norm_cdf(z: np.ndarray) -> np.ndarray:
    from scipy.special import ndtr

    return np.asarray(ndtr(z))
