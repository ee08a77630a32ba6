from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PlannerSettings:
    """The settings of the planner's search, passed to :func:`~optuna_ds.planner.plan` as a
    value (as Optuna's samplers take theirs), so a benchmark or a caller varies them without
    touching module state.

    Args:
        min_gain:
            An experiment is worth its launch while it is expected to beat the best by this
            share (of throughput), and a finalist is measured again while that is expected to
            improve the choice by as much.
        margin:
            Gains are counted only beyond this share: smaller ones are within what one
            measurement can tell.
        noise_margin:
            ... or beyond this multiple of the measured noise of one run, where that is larger:
            a gain well within one run's noise is not one a run can show, and without this
            bound a tuning whose runs scatter by 10% walks a plateau size by size (41 launches
            on one benchmark job, 16 with it).
        hopeless_oom:
            Sizes this likely to run out of memory are not candidates.
        bracket:
            Before the search ends, the chosen size has a measured neighbour on each side
            within this factor (or that side is ruled out by memory, the user's bounds or the
            sizes listed): an optimum between two measured sizes is then found.
        max_remeasures:
            Re-measurements of finalists in one tuning, at most.
        plausible_z:
            A config whose measured mean lies this many noise deviations below the best
            measured one is not chosen, whatever the model estimates for it.
        growth:
            Candidate sizes above 64 step by this factor.
        noise_after:
            Once this many runs succeeded and no config ran twice, the best so far runs again:
            the noise is measured, not inferred from how well the model fits, and every later
            decision weighs gains against it.
        batch_gain:
            A slot free while other experiments run takes the candidate of highest expected
            gain per second while that gain (per run of the usual length) is at least this,
            and while the tuning goes on anyway (see :mod:`optuna_ds.planner._batch`): such a
            run costs GPU-seconds but no wall time, and saves a round where the search would
            have waited for its result. Between 0 and ``min_gain``: the lower, the more
            GPU-hours a tuning spends to finish sooner; at ``min_gain`` a batch holds what the
            sequential search would run, plus every stage once. With one slot it never acts.
    """

    min_gain: float = 0.002
    margin: float = 0.005
    noise_margin: float = 0.25
    hopeless_oom: float = 0.98
    bracket: float = 1.25
    max_remeasures: int = 3
    plausible_z: float = 2.0
    growth: float = 1.04
    noise_after: int = 3
    batch_gain: float = 0.0005
