from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

_CANDIDATE_ATTR = "xgboost:candidate"


def _encode_column(values: Sequence[Any]) -> list[list[float]]:
    """Encode one parameter's values: booleans 0/1, wide positive ranges (bucket sizes) on a
    log scale, other numbers as is, anything else one-hot."""
    distinct = list(dict.fromkeys(values))
    if all(isinstance(v, bool) for v in distinct):
        return [[float(v)] for v in values]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in distinct):
        positive = all(v > 0 for v in distinct)
        wide = positive and max(distinct) / min(distinct) >= 100
        return [[math.log10(v) if wide else float(v)] for v in values]
    return [[1.0 if v == d else 0.0 for d in distinct] for v in values]


class XGBoostSampler(BaseSampler):
    """A cost-model sampler over a finite space, like DeepSpeed's ``model_based`` tuner.

    After ``n_startup_trials`` random picks, an xgboost regressor trained on the study's
    finished trials ranks the untried candidates and the best predicted one runs next; with
    probability ``exploration`` a random untried candidate runs instead. The model is rebuilt
    from the storage on every trial, so any number of workers can share one study. A candidate
    being run by another worker is published in the trial's system attrs and skipped.

    Args:
        search_space: parameter name to its candidate values; the candidates are their product.
        n_startup_trials: random candidates before the model is used.
        exploration: share of picks made at random after the start-up.
        seed: seed of the random choices and the model.
    """

    def __init__(
        self,
        search_space: Mapping[str, Sequence[Any]],
        *,
        n_startup_trials: int = 3,
        exploration: float = 0.1,
        seed: int | None = None,
    ) -> None:
        self._names = sorted(search_space)
        self._space = {k: list(search_space[k]) for k in self._names}
        self._candidates = [tuple(c) for c in itertools.product(*(self._space[k] for k in self._names))]
        columns = [_encode_column([c[i] for c in self._candidates]) for i in range(len(self._names))]
        self._features = np.array([sum((col[j] for col in columns), []) for j in range(len(self._candidates))])
        self._n_startup_trials = n_startup_trials
        self._exploration = exploration
        self._seed = seed
        self._rng = np.random.RandomState(seed)

    def reseed_rng(self) -> None:
        self._rng.seed()

    @property
    def candidates(self) -> list[dict[str, Any]]:
        return [dict(zip(self._names, c)) for c in self._candidates]

    def _index_of(self, params: Mapping[str, Any]) -> int | None:
        try:
            return self._candidates.index(tuple(params[k] for k in self._names))
        except (KeyError, ValueError):
            return None

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if _CANDIDATE_ATTR in trial.system_attrs or "fixed_params" in trial.system_attrs:
            return
        trials = study._storage.get_all_trials(study._study_id, deepcopy=False)
        taken: set[int] = set()
        scored: list[tuple[int, float]] = []
        sign = 1.0 if study.direction == StudyDirection.MAXIMIZE else -1.0
        for t in trials:
            index = t.system_attrs.get(_CANDIDATE_ATTR)
            if index is None:
                index = self._index_of(t.params)
            if index is None or t._trial_id == trial._trial_id:
                continue
            if t.state in (TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED):
                taken.add(index)
            if t.state == TrialState.COMPLETE and t.value is not None:
                scored.append((index, sign * t.value))
        untried = [i for i in range(len(self._candidates)) if i not in taken]
        if not untried:
            untried = list(range(len(self._candidates)))
        if len(scored) < self._n_startup_trials or self._rng.rand() < self._exploration:
            choice = int(self._rng.choice(untried))
        else:
            choice = self._predict_best(scored, untried)
        study._storage.set_trial_system_attr(trial._trial_id, _CANDIDATE_ATTR, choice)

    def _predict_best(self, scored: list[tuple[int, float]], untried: list[int]) -> int:
        import xgboost

        x = self._features[[i for i, _ in scored]]
        y = np.array([s for _, s in scored])
        params = {"max_depth": 3, "eta": 0.3, "seed": self._seed or 0, "nthread": 1, "verbosity": 0}
        model = xgboost.train(params, xgboost.DMatrix(x, label=y), num_boost_round=50)
        predictions = model.predict(xgboost.DMatrix(self._features[untried]))
        return untried[int(np.argmax(predictions))]

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        index = trial.system_attrs.get(_CANDIDATE_ATTR)
        if index is None or param_name not in self._space:
            return optuna.samplers.RandomSampler(seed=self._seed).sample_independent(
                study, trial, param_name, param_distribution
            )
        return self._candidates[index][self._names.index(param_name)]
