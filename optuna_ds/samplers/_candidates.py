"""Where the planner's knob settings come from: the ``tuner_type`` sampler, asked through Optuna's
sampler interface on an in-memory copy of one arm's knob trials.

The planner scores what the sampler proposes and decides (by expected gain per second, against
every other experiment); the sampler only says which settings are worth scoring. The copy holds
the arm's finished knob trials with their values, so a model-based sampler learns from them, and
the asked trials stay running while the next is asked, so no setting is proposed twice. Given
the same trials and seed every process gets the same settings: the planner's input is a function
of the storage.
"""
from __future__ import annotations

import uuid
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.distributions import CategoricalDistribution
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds._optuna_compat import contains
from optuna_ds._optuna_compat import hide_in_memory_studies
from optuna_ds.domain import Knobs
from optuna_ds.samplers._factory import create_sampler


_COPY = "optuna-ds-knob-copy-"  # the name of a copy's study: Optuna logs its creation, not the user's


def knob_candidates(tuner_type: str, tuned: Mapping[str, Sequence[Any]], trials: Sequence[FrozenTrial], *,
                    direction: StudyDirection, seed: int | None, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` settings of the knob space ``tuned`` that ``tuner_type``'s sampler proposes
    after ``trials`` (finished knob trials of one arm, their params the knobs): the grid's points
    not run yet (all of them, where ``limit`` allows), random draws, or the xgboost model's best
    predicted. Settings proposed twice (a random draw, a grid past its end) count once."""
    if not tuned:
        return []
    distributions: dict[str, BaseDistribution] = {k: CategoricalDistribution(list(v)) for k, v in sorted(tuned.items())}
    hide_in_memory_studies(_COPY)
    study = optuna.create_study(study_name=f"{_COPY}{uuid.uuid4()}", direction=direction,
                                sampler=create_sampler(tuner_type, tuned, seed=_seed(seed, trials)))
    study.add_trials([c for t in trials if (c := _copy(t, distributions)) is not None])
    seen = {Knobs(t.params) for t in trials}
    out: list[dict[str, Any]] = []
    size = 1
    for choices in tuned.values():
        size *= len(choices)
    for _ in range(4 * size):  # a random sampler draws again what it drew: a few times the space, at most
        if len(out) >= limit or len(seen) >= size:
            break
        trial = study.ask(distributions)
        params = dict(trial.params)
        if Knobs(params) not in seen:
            seen.add(Knobs(params))
            out.append(params)
    return out


def _seed(seed: int | None, trials: Sequence[FrozenTrial]) -> int:
    """A seed of the sampler's random choices that every process derives alike from the trials."""
    return ((seed or 0) * 1_000_003 + len(trials)) % 2**32


def _copy(trial: FrozenTrial, distributions: dict[str, BaseDistribution]) -> FrozenTrial | None:
    """``trial`` with only its knob params, as a finished trial of the copy; ``None`` for one
    whose params lie outside the space (another offload variant's knobs, a space since changed)."""
    params = {k: trial.params[k] for k in distributions if k in trial.params}
    if len(params) != len(distributions) or not all(contains(distributions[k], v) for k, v in params.items()):
        return None
    value = trial.value if trial.state == TrialState.COMPLETE else None
    state = TrialState.COMPLETE if value is not None else TrialState.FAIL
    return optuna.trial.create_trial(params=params, distributions=dict(distributions), value=value, state=state,
                                     user_attrs=dict(trial.user_attrs))
