from __future__ import annotations

import itertools
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.study import Study
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds._errors import ConfigError
from optuna_ds._optuna_compat import contains
from optuna_ds._optuna_compat import storage_of
from optuna_ds._optuna_compat import trial_id
from optuna_ds.samplers._xgboost import XGBoostSampler


def create_sampler(tuner_type: str, search_space: Mapping[str, Sequence[Any]], *, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The sampler of ``autotuning.tuner_type`` over a finite ``search_space``."""
    if tuner_type == "gridsearch":
        grid = _GridSampler(search_space, seed=seed)
        if seed is None:
            grid.reseed_rng()  # the grid's order is the same everywhere; the picks past it differ by worker
        return grid
    if tuner_type == "random":
        return _ListedRandomSampler(search_space, seed=seed)
    if tuner_type == "model_based":
        return XGBoostSampler(search_space, seed=seed)
    raise ValueError(f"unknown tuner_type {tuner_type!r}")


def check_tuner_type(tuner_type: str, *, fast: bool) -> None:
    """Refuse, before anything is launched, a knob search whose sampler cannot be built:
    ``model_based`` (DeepSpeed's default ``tuner_type``) needs xgboost, an extra, so that a CPU
    install does not pull xgboost's CUDA libraries in for a sampler only ``"fast": false`` uses."""
    import importlib.util

    if fast or tuner_type != "model_based":
        return
    try:
        found = importlib.util.find_spec("xgboost") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(
            'autotuning.tuner_type "model_based" (DeepSpeed\'s default for "fast": false) needs xgboost: '
            "pip install 'optuna-ds[xgboost]', or set tuner_type to \"gridsearch\" or \"random\""
        )


class _ListedRandomSampler(optuna.samplers.RandomSampler):
    """Optuna's random sampler, drawing each param of ``search_space`` from its list: the
    micro-batch size is an integer param of the stage's study (its micro-batch trials span
    1..max), and a knob trial must run at one of the sizes the search measured, not at any size
    between them."""

    def __init__(self, search_space: Mapping[str, Sequence[Any]], seed: int | None = None) -> None:
        super().__init__(seed=seed)
        self._lists = {k: list(v) for k, v in search_space.items()}
        self._pick = np.random.RandomState(seed)

    def reseed_rng(self) -> None:
        super().reseed_rng()
        self._pick.seed()

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution) -> Any:
        listed = [v for v in self._lists.get(param_name, ()) if contains(param_distribution, v)]
        if not listed:
            return super().sample_independent(study, trial, param_name, param_distribution)
        return listed[int(self._pick.randint(len(listed)))]


class _GridSampler(optuna.samplers.BaseSampler):
    """A grid sampler for the knob search: one trial per ``optimize`` call, many slots and
    workers on one study, and no enqueued trials.

    As Optuna's ``GridSampler``, it gives a trial the point of its number (every worker shuffles
    the grid alike, so they do not collide) unless that point is taken, else an unvisited one at
    random, and marks it in the trial's system attrs ``grid_id`` and ``search_space``. Unlike
    it, it remembers the point it gave each trial (Optuna's reads the trial back from the
    storage for each param), and it does not stop the study once the grid is taken (reading
    every trial after each): the tuner ends the search. Built on the public sampler API, since
    it would override every method of Optuna's.
    """

    def __init__(self, search_space: Mapping[str, Sequence[Any]], seed: int | None = None) -> None:
        self._search_space = {k: list(search_space[k]) for k in sorted(search_space)}
        self.param_names = list(self._search_space)
        self.points: list[tuple[Any, ...]] = list(itertools.product(*self._search_space.values()))
        np.random.RandomState(seed or 0).shuffle(self.points)  # a list of tuples shuffles in place
        self._rng = np.random.RandomState(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._given: dict[int, int] = {}  # trial id: grid id

    def reseed_rng(self) -> None:
        self._rng.seed()
        self._random.reseed_rng()

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def _unvisited(self, study: Study) -> list[int]:
        """The points no trial of this grid has run nor is running; if every one has started,
        those not finished."""
        finished, running = set(), set()
        for t in study.get_trials(deepcopy=False):
            if t.system_attrs.get("search_space") == self._search_space and "grid_id" in t.system_attrs:
                if t.state.is_finished():
                    finished.add(t.system_attrs["grid_id"])
                elif t.state == TrialState.RUNNING:
                    running.add(t.system_attrs["grid_id"])
        every = set(range(len(self.points)))
        return sorted(every - finished - running) or sorted(every - finished)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        unvisited = self._unvisited(study) or list(range(len(self.points)))
        grid_id = trial.number if trial.number in unvisited else int(self._rng.choice(unvisited))
        self.take(study, trial, grid_id)

    def take(self, study: Study, trial: FrozenTrial, grid_id: int) -> None:
        """Give ``trial`` the point ``grid_id`` and mark it so for every worker."""
        self._given[trial_id(trial)] = grid_id
        storage = storage_of(study)
        storage.set_trial_system_attr(trial_id(trial), "search_space", self._search_space)
        storage.set_trial_system_attr(trial_id(trial), "grid_id", grid_id)

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution) -> Any:
        grid_id = self._given.get(trial_id(trial))
        if grid_id is None or param_name not in self._search_space:
            return self._random.sample_independent(study, trial, param_name, param_distribution)
        return self.points[grid_id][self.param_names.index(param_name)]

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        self._given.pop(trial_id(trial), None)


def with_fixed_params(sampler: optuna.samplers.BaseSampler, params: Mapping[str, Any]) -> optuna.samplers.BaseSampler:
    """``sampler`` with ``params`` fixed for one trial.

    A grid sampler gives a trial the grid point of its number (or, past the grid's size, an
    unvisited one) and counts that point as visited once the trial ends: with other params fixed
    on top, that point would never be run. Where ``params`` is a whole point of the grid, the
    trial takes that point instead.
    """
    if isinstance(sampler, _GridSampler) and set(params) == set(sampler.param_names):
        point = tuple(params[n] for n in sampler.param_names)
        for grid_id, grid in enumerate(sampler.points):
            if grid == point:
                return _GridPoint(sampler, grid_id)
    return optuna.samplers.PartialFixedSampler(dict(params), sampler)


class _GridPoint(optuna.samplers.BaseSampler):
    """A grid sampler whose next trial takes the point ``grid_id``."""

    def __init__(self, grid: _GridSampler, grid_id: int) -> None:
        self._grid = grid
        self._grid_id = grid_id

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._grid.take(study, trial, self._grid_id)

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution) -> Any:
        return self._grid.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        self._grid.after_trial(study, trial, state, values)
