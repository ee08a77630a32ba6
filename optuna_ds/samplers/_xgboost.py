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

from optuna_ds._optuna_compat import contains
from optuna_ds.domain import GAS_KEY
from optuna_ds.domain import MBS_KEY
from optuna_ds.domain import ExperimentRecord

# Micro-batch size and gradient accumulation act on throughput roughly linearly: keep them so.
LINEAR_PARAMS = frozenset({MBS_KEY, GAS_KEY})


def _encode_column(name: str, values: Sequence[Any]) -> list[list[float]]:
    """Encode one parameter's values as feature columns.

    Booleans are one 0/1 column (one-hot of two values, less the redundant column); numbers
    that span a decade or more (bucket sizes, thresholds) are on a log scale, where their
    effects are smooth; micro-batch size and accumulation stay linear; anything else is
    one-hot.
    """
    distinct = list(dict.fromkeys(values))
    if all(isinstance(v, bool) for v in distinct):
        return [[float(v)] for v in values]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in distinct):
        positive = all(v > 0 for v in distinct)
        wide = positive and name not in LINEAR_PARAMS and max(distinct) / min(distinct) >= 10
        return [[math.log10(v) if wide else float(v)] for v in values]
    return [[1.0 if v == d else 0.0 for d in distinct] for v in values]


class XGBoostSampler(BaseSampler):
    """A cost-model sampler over a finite space, like DeepSpeed's ``model_based`` tuner.

    After ``n_startup_trials`` finished trials (one parameter away from the best so far, once
    there is one; else at random), an xgboost regressor trained on
    the completed trials ranks the untried candidates and the best predicted one runs next;
    with probability ``exploration`` a random untried candidate runs instead. Failed trials
    (out of memory, crashes) are information, not zeros: once there are some, an xgboost
    classifier of feasibility is trained as well and candidates it predicts to fail are
    passed over while others remain.

    The model is rebuilt from the storage at every trial: a new sampler continues a study
    without repeating what ran. A trial's pick goes from :meth:`before_trial` to its params
    within this sampler, published nowhere: optuna-ds asks it on a working copy of one arm's
    knob trials, in one process (``knob_candidates``), where a trial asked has its params before
    the next is asked, so no setting is proposed twice.

    Parameters outside ``search_space`` (or values their distribution does not hold) are
    sampled at random.

    Args:
        search_space: parameter name to its candidate values; the candidates are their product.
        n_startup_trials: random candidates before the model is used.
        exploration: share of picks made at random after the start-up.
        seed: seed of the random choices and the models.
    """

    def __init__(
        self,
        search_space: Mapping[str, Sequence[Any]],
        *,
        n_startup_trials: int = 3,
        exploration: float = 0.1,
        seed: int | None = None,
    ) -> None:
        if n_startup_trials < 1:
            raise ValueError(f"n_startup_trials must be at least 1, got {n_startup_trials}")
        if not 0.0 <= exploration <= 1.0:
            raise ValueError(f"exploration must be within [0, 1], got {exploration}")
        self._names = sorted(search_space)
        self._space = {k: list(search_space[k]) for k in self._names}
        self._candidates = [tuple(c) for c in itertools.product(*(self._space[k] for k in self._names))]
        columns = [_encode_column(k, [c[i] for c in self._candidates]) for i, k in enumerate(self._names)]
        self._features = np.array(
            [sum((col[j] for col in columns), []) for j in range(len(self._candidates))], dtype=float
        ).reshape(len(self._candidates), -1)
        self._index = {c: i for i, c in enumerate(self._candidates)}
        self._n_startup_trials = n_startup_trials
        self._exploration = exploration
        self._seed = seed
        self._rng = np.random.RandomState(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._picked: dict[tuple[str, int], int] = {}  # (study, trial number) -> its candidate

    def reseed_rng(self) -> None:
        self._rng.seed()
        self._random.reseed_rng()

    @property
    def candidates(self) -> list[dict[str, Any]]:
        return [dict(zip(self._names, c)) for c in self._candidates]

    def _index_of(self, params: Mapping[str, Any]) -> int | None:
        try:
            return self._index.get(tuple(params[k] for k in self._names))
        except (KeyError, TypeError):
            return None

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        self._single_objective(study)
        return {}

    @staticmethod
    def _single_objective(study: optuna.Study) -> None:
        if len(study.directions) > 1:
            raise ValueError("XGBoostSampler supports single-objective studies only")

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if not self._candidates or len(study.directions) > 1:
            return
        if (study.study_name, trial.number) in self._picked:
            return
        trials = study.get_trials(deepcopy=False)
        taken: set[int] = set()
        scored: list[tuple[int, float]] = []
        failed: set[int] = set()
        sign = 1.0 if study.direction == StudyDirection.MAXIMIZE else -1.0
        for t in trials:
            if t.number == trial.number:
                continue
            index = self._index_of(t.params)
            if index is None:
                continue
            if t.state in (TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED):
                taken.add(index)
            if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value):
                scored.append((index, sign * t.value))
            elif t.state == TrialState.FAIL and (reason := ExperimentRecord.from_trial(t).reason) is not None and reason.judges_config:
                # An interrupted experiment says nothing of its config: it was stopped from outside.
                failed.add(index)
        untried = [i for i in range(len(self._candidates)) if i not in taken] or list(range(len(self._candidates)))
        if len(scored) + len(failed) < self._n_startup_trials or not scored:
            choice = int(self._rng.choice(self._neighbours(scored, untried) or untried))
        elif self._rng.rand() < self._exploration:
            choice = int(self._rng.choice(untried))
        else:
            choice = self._predict_best(scored, failed, untried)
        self._picked[(study.study_name, trial.number)] = choice

    def _neighbours(self, scored: list[tuple[int, float]], untried: list[int]) -> list[int]:
        """The untried candidates one parameter away from the best so far: with few trials,
        changing one knob of the incumbent says more than a random point that changes all."""
        if not scored:
            return []
        best = self._candidates[max(scored, key=lambda s: s[1])[0]]
        return [i for i in untried if sum(a != b for a, b in zip(self._candidates[i], best)) == 1]

    def _predict_best(self, scored: list[tuple[int, float]], failed: set[int], untried: list[int]) -> int:
        import xgboost

        params = {"max_depth": 3, "eta": 0.3, "seed": self._seed or 0, "nthread": 1, "verbosity": 0}
        x = self._features[[i for i, _ in scored]]
        y = np.array([s for _, s in scored])
        model = xgboost.train(params, xgboost.DMatrix(x, label=y), num_boost_round=50)
        predictions = model.predict(xgboost.DMatrix(self._features[untried]))
        if failed:
            ok = sorted({i for i, _ in scored})
            bad = sorted(failed - set(ok))
            features = self._features[ok + bad]
            labels = np.array([1.0] * len(ok) + [0.0] * len(bad))
            # Few samples, small hessians: let the trees split on them.
            classifier = xgboost.train({**params, "objective": "binary:logistic", "min_child_weight": 0.0, "lambda": 0.1},
                                       xgboost.DMatrix(features, label=labels), num_boost_round=30)
            feasible = classifier.predict(xgboost.DMatrix(self._features[untried])) >= 0.5
            if feasible.any():
                predictions = np.where(feasible, predictions, -np.inf)
        return untried[int(np.argmax(predictions))]

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        self._single_objective(study)
        index = self._picked.get((study.study_name, trial.number))
        if index is not None and param_name in self._space:
            value = self._candidates[index][self._names.index(param_name)]
            if contains(param_distribution, value):
                return value
        return self._random.sample_independent(study, trial, param_name, param_distribution)
