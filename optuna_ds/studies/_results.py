from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Iterable
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.config import Metric
from optuna_ds.launcher import FailureReason
from optuna_ds.launcher import Phase
from optuna_ds.launcher import telling_line
from optuna_ds.planner import measured_noise
from optuna_ds.storage import ExperimentRecord

# Failures that say something about the config itself; anything else (an interrupt, a dead
# worker, a script that fails whatever the config) leaves the experiment to be run again.
DEFINITIVE_FAILURES = frozenset(r for r in FailureReason if r.judges_config)


def is_finished_experiment(trial: FrozenTrial) -> bool:
    """Whether the trial's experiment has a result that must never be paid for again."""
    if trial.state == TrialState.COMPLETE:
        return True
    return trial.state == TrialState.FAIL and ExperimentRecord.from_trial(trial).reason in DEFINITIVE_FAILURES


def given_up(trials: list[FrozenTrial]) -> dict[str, FrozenTrial]:
    """Experiments lost twice: their worker died while running them (killed, or no heartbeat
    for the grace period), or the node lost their runs (see :meth:`ExperimentRunner.run`):
    retried once, then counted as failed so they cannot kill workers or use GPUs forever."""
    lost: dict[str, list[FrozenTrial]] = {}
    for t in trials:
        if t.state != TrialState.FAIL:
            continue
        record = ExperimentRecord.from_trial(t)
        if record.exp_name is not None and (record.lost or record.reason is None):
            lost.setdefault(record.exp_name, []).append(t)
    return {name: ts[-1] for name, ts in lost.items() if len(ts) >= 2}


def launched(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Trials that ran an experiment (duplicates and early-stopped asks launch nothing)."""
    return [t for t in trials if t.state != TrialState.PRUNED and ExperimentRecord.from_trial(t).claimed]


@dataclasses.dataclass(frozen=True)
class BestExperiment:
    name: str
    stage: int
    value: float
    trial_number: int
    ds_config: dict[str, Any]
    result_dir: str
    cmd: list[str]
    micro_batch_size: int
    gradient_accumulation_steps: int
    runs: int = 1  # how many runs ``value`` is the mean of (the planner measures finalists again)

    @property
    def train_batch_size(self) -> int | None:
        value = self.ds_config.get("train_batch_size")
        return value if isinstance(value, int) else None

    @classmethod
    def from_trial(cls, trial: FrozenTrial, stage: int) -> BestExperiment:
        record = ExperimentRecord.from_trial(trial)
        assert trial.value is not None and record.exp_name is not None
        return cls(
            name=record.exp_name,
            stage=stage,
            value=trial.value,
            trial_number=trial.number,
            ds_config=record.ds_config or {},
            result_dir=record.result_dir or "",
            cmd=record.cmd or [],
            micro_batch_size=int(record.micro_batch_size or 0),
            gradient_accumulation_steps=int(record.gradient_accumulation_steps or 1),
        )


@dataclasses.dataclass(frozen=True)
class StageResult:
    """The outcome of one ZeRO stage: tuned (with its best) or skipped (with the reason)."""

    stage: int
    status: str
    reason: str = ""
    num_experiments: int = 0
    num_failed: int = 0
    best: BestExperiment | None = None
    last_failure: str = ""

    @property
    def name(self) -> str:
        return f"z{self.stage}"


def stage_result(study: optuna.Study, stage: int, *, status: str = "tuned", reason: str = "") -> StageResult:
    trials = launched(study.get_trials(deepcopy=False))
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    best = None
    if complete:
        pick = max if study.direction == optuna.study.StudyDirection.MAXIMIZE else min
        best = BestExperiment.from_trial(pick(complete, key=lambda t: t.value), stage)
    failed = [t for t in trials if t.state == TrialState.FAIL]
    last_failure = ""
    if failed:
        record = ExperimentRecord.from_trial(failed[-1])
        reason = record.reason.value if record.reason else "failed"
        # stderr says why a run crashed; a timeout or a missing metric is said by our own detail
        # (the last stderr line of a killed run is whatever it printed last).
        crashed = record.reason in (FailureReason.ERROR, FailureReason.OOM, FailureReason.SCRIPT)
        line = telling_line(record.stderr_tail or "") if crashed else record.detail or ""
        last_failure = f"{record.exp_name}: {reason}" + (f": {line}" if line else "")
    return StageResult(
        stage=stage,
        status=status,
        reason=reason,
        num_experiments=len(trials),
        num_failed=len(failed),
        best=best,
        last_failure=last_failure,
    )


@dataclasses.dataclass(frozen=True)
class Baseline:
    """The user's own config (their stage and micro-batch size) as this tuning measured it;
    ``reason`` says why there is no measurement."""

    stage: int | None
    micro_batch_size: int | None
    name: str = ""
    value: float | None = None
    status: str = ""  # "complete", a failure reason, or "" when it did not run
    reason: str = ""
    listed: tuple[int, ...] = ()  # the stages the user's config lists
    runs: int = 1  # how many runs ``value`` is the mean of


@dataclasses.dataclass(frozen=True)
class Spend:
    """What the tuning cost: experiments launched (the profile run included) and GPU time,
    each experiment's duration times the GPUs it ran on."""

    experiments: int = 0
    gpu_seconds: float = 0.0
    profiled: bool = False

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600


def experiment_seconds(trial: FrozenTrial) -> float | None:
    """How long a trial's experiment ran: the runner's measure, else (an interrupted one) the
    trial's wall time; ``None`` when it launched nothing."""
    record = ExperimentRecord.from_trial(trial)
    if record.duration is not None:
        return float(record.duration)
    if record.launched and trial.datetime_start and trial.datetime_complete:
        return (trial.datetime_complete - trial.datetime_start).total_seconds()
    return None


def tuning_spend(trials: Iterable[FrozenTrial], *, profile_seconds: float | None, gpus_per_experiment: int) -> Spend:
    seconds = [s for t in launched(list(trials)) if (s := experiment_seconds(t)) is not None]
    if profile_seconds is not None:
        seconds.append(profile_seconds)
    return Spend(experiments=len(seconds), gpu_seconds=sum(seconds) * gpus_per_experiment, profiled=profile_seconds is not None)


def _config_identity(ds_config: dict[str, Any]) -> str:
    config = {k: v for k, v in ds_config.items() if k != "autotuning"}
    return json.dumps(config, sort_keys=True)


def _runs_by_config(trials: Iterable[FrozenTrial]) -> dict[str, list[float]]:
    """The values of the completed runs, by config (re-measurements differ only in their name
    and metrics file, which ``_config_identity`` leaves out)."""
    values: dict[str, list[float]] = {}
    for t in trials:
        ds_config = ExperimentRecord.from_trial(t).ds_config
        if t.state == TrialState.COMPLETE and t.value is not None and ds_config is not None:
            values.setdefault(_config_identity(ds_config), []).append(t.value)
    return values


def runs_of(trial: FrozenTrial, trials: Iterable[FrozenTrial]) -> list[float]:
    """The values of every completed run of ``trial``'s config: one run is not a result when the
    noise is a few percent."""
    ds_config = ExperimentRecord.from_trial(trial).ds_config
    if ds_config is None:
        return [] if trial.value is None else [trial.value]
    return _runs_by_config(trials).get(_config_identity(ds_config), [])


def measurement_noise(trials: Iterable[FrozenTrial]) -> tuple[float | None, int]:
    """The run-to-run noise this tuning measured, as the planner measures it (relative, from the
    configs that ran more than once), and the repeated runs it rests on; ``(None, 0)`` when no
    config ran twice, since one run says nothing of its noise."""
    groups = [v for v in _runs_by_config(trials).values() if all(x > 0 for x in v)]
    noise, runs = measured_noise(groups)
    return (noise, runs) if runs else (None, 0)


def noise_phrase(noise: float | None, runs: int) -> str:
    """The noise as every output states it: the figure with what it was measured from, or that
    it was not measured."""
    if noise is None or not runs:
        return "run-to-run noise not measured: no config ran twice"
    return f"run-to-run noise {noise:.1%}, measured from {runs} repeated run{'s' if runs > 1 else ''}"


def find_baseline(*, stages: dict[int, list[FrozenTrial]], order: list[int], skipped: dict[int, str],
                  micro_batch_size: int | None, user_list: bool) -> Baseline:
    """The user's config in this tuning: the first stage the tuning explored (their stage when
    they gave one) at their micro-batch size, which that stage runs first."""
    listed = tuple(order)
    explored = [s for s in order if s not in skipped]
    stage = explored[0] if explored else (order[0] if order else None)
    if micro_batch_size is None:
        why = ("your config lists micro-batch sizes, so it has no single baseline" if user_list
               else "your config gives no micro-batch size (set one, or map \"auto\" to a script flag)")
        return Baseline(stage=stage, micro_batch_size=None, reason=why, listed=listed)
    if not explored:
        return Baseline(stage=stage, micro_batch_size=micro_batch_size, reason=f"z{stage} was skipped: {skipped.get(stage, '')}",
                        listed=listed)
    assert stage is not None
    runs = [(t, r) for t in stages.get(stage, []) if t.state != TrialState.PRUNED and (r := ExperimentRecord.from_trial(t)).claimed
            and r.phase is Phase.MICRO_BATCH and r.micro_batch_size == micro_batch_size]
    done = [(t, r) for t, r in runs if t.state == TrialState.COMPLETE] or [(t, r) for t, r in runs if r.reason in DEFINITIVE_FAILURES]
    if not done:
        why = "it has not run yet" if stage in stages else f"z{stage} has not started"
        if any(t.state == TrialState.COMPLETE for t in stages.get(stage, [])):
            why = "it is above the largest size predicted to fit"
        return Baseline(stage=stage, micro_batch_size=micro_batch_size, reason=why, listed=listed)
    t, record = done[0]
    assert record.exp_name is not None
    status = "complete" if t.state == TrialState.COMPLETE or record.reason is None else record.reason.value
    values = runs_of(t, stages.get(stage, [])) if t.state == TrialState.COMPLETE else []
    return Baseline(stage=stage, micro_batch_size=micro_batch_size, name=record.exp_name,
                    value=statistics.fmean(values) if values else t.value, status=status,
                    reason="" if status == "complete" else f"it failed ({status})", listed=listed, runs=max(1, len(values)))


@dataclasses.dataclass(frozen=True)
class TuningResult:
    """Every stage's outcome and the global best: what the summary and optimal files show."""

    metric: Metric
    stages: list[StageResult]
    duration: float
    model_info: dict[str, Any]
    baseline: Baseline | None = None
    spend: Spend = Spend()
    noise: float | None = None  # relative noise of one measurement, measured from repeated configs
    noise_runs: int = 0  # the repeated runs (beyond each config's first) the noise was measured from
    chosen: BestExperiment | None = None  # the planner's choice, by its estimate


    @property
    def num_experiments(self) -> int:
        return sum(s.num_experiments for s in self.stages)

    @property
    def best(self) -> BestExperiment | None:
        """The planner's choice; without one (an older or unfinished tuning) the best measured."""
        if self.chosen is not None:
            return self.chosen
        return self.metric.best((s.best for s in self.stages if s.best is not None), key=lambda b: b.value)
