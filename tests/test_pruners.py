"""`tuner_early_stopping`, the knob search's budget: what counts as an improvement."""
from __future__ import annotations

import datetime

import optuna
import pytest

from optuna_ds.pruners import TunerEarlyStopping


def _study(values: list[float], direction: str = "maximize") -> optuna.Study:
    study = optuna.create_study(direction=direction)
    start = datetime.datetime(2026, 1, 1)
    for i, v in enumerate(values):
        trial = optuna.trial.create_trial(value=v)
        trial.datetime_start = start + datetime.timedelta(minutes=i)
        trial.datetime_complete = start + datetime.timedelta(minutes=i, seconds=30)
        study.add_trial(trial)
    return study


@pytest.mark.parametrize("direction, values", [("maximize", [100.0, 100.5, 100.8]), ("minimize", [100.0, 99.5, 99.2])])
def test_a_gain_within_the_noise_does_not_prolong_the_search(direction: str, values: list[float]) -> None:
    study = _study(values, direction)
    # Every trial beat the one before: by Deepspeed's rule the search goes on.
    assert not TunerEarlyStopping(2).exhausted(study)
    # With 1% noise, gains of 0.5% are no evidence: two trials without an improvement end it.
    assert TunerEarlyStopping(2, min_improvement=0.01).exhausted(study)
    # A gain beyond the noise counts.
    larger = _study(values + [values[-1] * (1.02 if direction == "maximize" else 0.98)], direction)
    assert not TunerEarlyStopping(2, min_improvement=0.01).exhausted(larger)


def test_trials_about_to_start_count_against_the_budget() -> None:
    # Settings handed to slots are not trials yet: k slots asking at once would start k - 1
    # trials beyond tuner_num_trials if only the stored ones counted.
    study = _study([100.0, 101.0])
    assert not TunerEarlyStopping(100, max_trials=3).exhausted(study)
    assert TunerEarlyStopping(100, max_trials=3).exhausted(study, pending=1)
