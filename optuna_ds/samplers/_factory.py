from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.study import Study
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.samplers._xgboost import XGBoostSampler


def create_sampler(tuner_type: str, search_space: Mapping[str, Sequence[Any]], *, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The sampler of ``autotuning.tuner_type`` over a finite ``search_space``."""
    if tuner_type == "gridsearch":
        return optuna.samplers.GridSampler({k: list(v) for k, v in search_space.items()}, seed=seed)
    if tuner_type == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if tuner_type == "model_based":
        return XGBoostSampler(search_space, seed=seed)
    raise ValueError(f"unknown tuner_type {tuner_type!r}")


def with_fixed_params(sampler: optuna.samplers.BaseSampler, params: Mapping[str, Any]) -> optuna.samplers.BaseSampler:
    """``sampler`` with ``params`` fixed for one trial.

    A grid sampler gives a trial the grid point of its number (or, past the grid's size, an
    unvisited one) and counts that point as visited once the trial ends: with other params fixed
    on top, that point would never be run. Where ``params`` is a whole point of the grid, the
    trial takes that point instead.
    """
    if isinstance(sampler, optuna.samplers.GridSampler):
        names = getattr(sampler, "_param_names", None)
        grids = getattr(sampler, "_all_grids", None)
        if names is not None and grids is not None and set(params) == set(names):
            point = tuple(params[n] for n in names)
            for grid_id, grid in enumerate(grids):
                if grid == point:
                    return _GridPoint(sampler, grid_id)
    return optuna.samplers.PartialFixedSampler(dict(params), sampler)


class _GridPoint(optuna.samplers.BaseSampler):
    """A grid sampler whose next trial takes the point ``grid_id``."""

    def __init__(self, grid: optuna.samplers.GridSampler, grid_id: int) -> None:
        self._grid = grid
        self._grid_id = grid_id

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        # As GridSampler.before_trial marks the point it chose; it then leaves the trial alone.
        study._storage.set_trial_system_attr(trial._trial_id, "search_space", self._grid._search_space)
        study._storage.set_trial_system_attr(trial._trial_id, "grid_id", self._grid_id)

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution) -> Any:
        return self._grid.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        self._grid.after_trial(study, trial, state, values)
