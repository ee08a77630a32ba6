"""The shape every throughput curve shares over the micro-batch size: a fixed cost per step
amortised over the batch, and a slowdown under memory pressure, on a grid of its parameters."""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from optuna_ds.planner._settings import Priors

# The shape of a throughput curve over the micro-batch size m: ``m / (m + h)`` (a fixed cost
# per step amortised over the batch: h is the size at half efficiency), times a slowdown under
# memory pressure (``Priors.pressure_*``). Every arm shares the shape; each has its own scale.
# h, smooth in its effect, steps by 65%.
_H = np.geomspace(0.25, 512.0, 16)


class Grid(NamedTuple):
    """The shape's components: each one's h, pressure onset, loss at a full device, whether the
    pressure is of the arm's own room (else of the device), and its log prior."""

    h: np.ndarray
    theta: np.ndarray
    loss: np.ndarray
    fill: np.ndarray
    logp: np.ndarray


@functools.lru_cache(maxsize=8)
def _grid(onset: tuple[float, float, int], losses: tuple[float, ...], none: float) -> Grid:
    """The components for the pressure priors (:class:`Priors`): every h without pressure
    (weight ``none``), and with each onset and loss, by either share (the rest, evenly)."""
    thetas = np.linspace(*onset)
    rows: list[tuple[float, float, float, bool, float]] = []
    for hv in _H:
        rows.append((hv, 1.0, 0.0, False, none))
        rows += [(hv, t, lv, by_fill, (1 - none) / (2 * len(thetas) * len(losses)))
                 for by_fill in (False, True) for t in thetas for lv in losses]
    h, theta, loss, fill, prior = (np.array(c) for c in zip(*rows))
    return Grid(h, theta, loss, fill.astype(bool), np.log(prior / prior.sum()))


def grid_of(priors: Priors) -> Grid:
    """The grid of ``priors``: built once per distinct pressure prior, shared by every model."""
    return _grid(priors.pressure_onset, priors.pressure_losses, priors.pressure_none)


def shape(sizes: np.ndarray, shares: np.ndarray, fills: np.ndarray, grid: Grid, combos: np.ndarray | slice = slice(None)) -> np.ndarray:
    """``(combos, points)``: the log of the curve's shape under each combination of h, pressure
    onset and loss: the loss grows linearly from the onset to a full device (or room)."""
    m = np.asarray(sizes, dtype=float)[None, :]
    s = np.where(grid.fill[combos, None], np.asarray(fills, dtype=float)[None, :], np.asarray(shares, dtype=float)[None, :])
    h, theta, loss = grid.h[combos, None], grid.theta[combos, None], grid.loss[combos, None]
    over = np.clip((s - theta) / np.maximum(1.0 - theta, 1e-9), 0.0, None)
    return np.asarray(np.log(m / (m + h)) + np.log(np.maximum(1.0 - loss * over, 0.05)))
