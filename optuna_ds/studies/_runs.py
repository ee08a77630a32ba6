"""A tuning's trials read as runs: their values by config, when they started, why they failed."""
from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence

from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.domain import Config
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import FailureReason
from optuna_ds.domain import Run
from optuna_ds.launcher import telling_line


def starts(trials: Sequence[FrozenTrial]) -> tuple[float, ...]:
    """When each of ``trials`` started (seconds since the epoch); empty where one has no start."""
    times = [t.datetime_start.timestamp() for t in trials if t.datetime_start is not None]
    return tuple(times) if len(times) == len(trials) else ()


_CRASHES = (FailureReason.ERROR, FailureReason.OOM, FailureReason.SCRIPT)


def failure_text(record: ExperimentRecord) -> str:
    """Why an experiment failed, each thing said once: our detail, then for a crash the line of
    its stderr that says why, unless the detail already quotes it (the last stderr line of a
    killed run is whatever it printed last, so a timeout has our detail alone)."""
    detail = record.detail or ""
    line = telling_line(record.stderr_tail or "") if record.reason in _CRASHES else ""
    if line and line[:200] not in detail:
        return f"{detail}: {line}" if detail else line
    return detail


def runs_by_config(runs: Iterable[Run]) -> dict[Config, list[float]]:
    """The values of the completed runs, by config."""
    values: dict[Config, list[float]] = {}
    for t, record in runs:
        if t.state == TrialState.COMPLETE and t.value is not None and record.config is not None:
            values.setdefault(record.config, []).append(t.value)
    return values


def read_each(trials: Iterable[FrozenTrial]) -> list[Run]:
    """Every one of ``trials``, read once (those that launched nothing too)."""
    return [Run(t, ExperimentRecord.from_trial(t)) for t in trials]


def runs_of(trial: FrozenTrial, trials: Iterable[FrozenTrial]) -> list[float]:
    """The values of every completed run of ``trial``'s config: one run is not a result when the
    noise is a few percent."""
    config = ExperimentRecord.from_trial(trial).config
    if config is None:
        return [] if trial.value is None else [trial.value]
    return runs_by_config(read_each(trials)).get(config, [])


def completed_of(trial: FrozenTrial, trials: Iterable[FrozenTrial]) -> list[FrozenTrial]:
    """Every completed run of ``trial``'s config, in the order of ``trials``."""
    config = ExperimentRecord.from_trial(trial).config
    return [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None
            and ExperimentRecord.from_trial(t).config == config]
