"""The experiments as the report shows them: one row per trial that claimed one, read from the
stage studies."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import FailureReason
from optuna_ds.domain import superseded
from optuna_ds.storage import stage_of
from optuna_ds.storage import tuning_study_names
from optuna_ds.studies import Optimum
from optuna_ds.studies import failure_text


@dataclasses.dataclass(frozen=True)
class ExperimentRow:
    """One experiment as the report shows it: a view of its trial and the trial's record."""

    stage: int  # its study's
    trial: FrozenTrial
    record: ExperimentRecord
    chosen: bool = False  # a run of the optimum

    @property
    def number(self) -> int:
        return self.trial.number

    @property
    def name(self) -> str:
        return self.record.exp_name or ""

    @property
    def phase(self) -> str:
        return self.record.phase.value if self.record.phase else ""

    @property
    def status(self) -> str:
        t = self.trial
        if t.state == TrialState.COMPLETE:
            return "complete"
        if self.record.duplicate_of is not None:
            return "duplicate"
        if t.state == TrialState.PRUNED and self.record.reason is FailureReason.PRUNED:
            return "pruned"  # ended early by the pruner: a measurement of fewer steps
        if t.state == TrialState.PRUNED:
            return "not launched"  # a worker's claim once tune was ending the tuning
        if t.state == TrialState.RUNNING:
            return "running"
        return self.record.reason.value if self.record.reason else "failed"

    @property
    def value(self) -> float | None:
        return self.trial.value

    @property
    def mbs(self) -> int | None:
        return self.record.config.micro_batch if self.record.config else None

    @property
    def gas(self) -> int | None:
        return self.record.config.accumulation if self.record.config else None

    @property
    def knobs(self) -> dict[str, Any]:
        return self.record.config.knob_dict if self.record.config else {}

    @property
    def slot(self) -> str:
        return self.record.slot or ""

    @property
    def start(self) -> datetime.datetime | None:
        return self.trial.datetime_start

    @property
    def end(self) -> datetime.datetime | None:
        return self.trial.datetime_complete

    @property
    def detail(self) -> str:
        if self.record.duplicate_of is not None:
            return f"same as trial {self.record.duplicate_of}"
        return failure_text(self.record)

    @property
    def result_dir(self) -> str:
        return self.record.result_dir or ""

    @property
    def peak_memory(self) -> float | None:
        """Bytes, where the accelerator reports it."""
        return self.record.peak_gpu_memory

    @property
    def duration(self) -> float | None:
        if self.start and self.end:
            return (self.end - self.start).total_seconds()
        return None


def stage_studies(storage: optuna.storages.BaseStorage, study_name: str) -> dict[int, optuna.Study]:
    out = {}
    for name in tuning_study_names(storage, study_name):
        stage = stage_of(study_name, name)
        if stage is not None:
            out[stage] = optuna.load_study(study_name=name, storage=storage)
    return dict(sorted(out.items()))


def experiment_rows(studies: dict[int, optuna.Study], best: Optimum | None = None) -> list[ExperimentRow]:
    """Every claimed experiment, the optimum's runs first (its named run leading), then by
    stage and trial."""
    rows = []
    for stage, study in studies.items():
        trials = study.get_trials(deepcopy=False)
        gone = superseded(trials)
        for t in trials:
            record = ExperimentRecord.from_trial(t)
            if record.exp_name is None or t.state == TrialState.WAITING or t.number in gone:
                continue
            rows.append(ExperimentRow(stage=stage, trial=t, record=record,
                                      chosen=best is not None and stage == best.stage and t.number in best.trials))
    return sorted(rows, key=lambda r: (not r.chosen, r.number != (best.trial_number if best else -1), r.stage, r.number))


def format_value(value: Any) -> str:
    """Knob values as people write them: integers as integers, round powers of ten as 5e8."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        mantissa, exponent = f"{value:e}".split("e")
        if float(mantissa).is_integer():
            return f"{int(float(mantissa))}e{int(exponent)}"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def visible_rows(rows: list[ExperimentRow]) -> list[ExperimentRow]:
    """What the user paid for: internal duplicates (a claim that stood down), a worker's claim
    once tune was ending the tuning launched nothing, and an experiment cut short that ran again since is
    that run's, not a failure."""
    hidden = ("duplicate", "not launched")
    again = {(r.stage, r.name) for r in rows if r.status not in (*hidden, "interrupted")}
    return [r for r in rows if r.status not in hidden and not (r.status == "interrupted" and (r.stage, r.name) in again)]
