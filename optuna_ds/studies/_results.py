from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.config import Metric
from optuna_ds.config import UserConfig
from optuna_ds.domain import ChoiceRecord
from optuna_ds.domain import Config
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import FailureReason
from optuna_ds.domain import Knobs
from optuna_ds.domain import RecordedResources
from optuna_ds.domain import RootRecord
from optuna_ds.domain import Run
from optuna_ds.domain import read_runs
from optuna_ds.planner import ModelCurve
from optuna_ds.planner import measured_noise
from optuna_ds.space import KnobSpace
from optuna_ds.space import distinct_batch
from optuna_ds.space import knob_defaults
from optuna_ds.storage import TuningPlan
from optuna_ds.storage import load_stage_study
from optuna_ds.storage import verdict
from optuna_ds.studies._curves import recorded_model_curves
from optuna_ds.studies._listed import Unrun
from optuna_ds.studies._listed import unrun_sizes
from optuna_ds.studies._listed import unrun_values
from optuna_ds.studies._baseline import Baseline
from optuna_ds.studies._baseline import find_baseline
from optuna_ds.studies._outcomes import AutotpOutcome
from optuna_ds.studies._outcomes import CheckpointingOutcome
from optuna_ds.studies._outcomes import IgnoredBatch
from optuna_ds.studies._outcomes import PrunedRun
from optuna_ds.studies._outcomes import Warmed
from optuna_ds.studies._outcomes import autotp_outcome
from optuna_ds.studies._outcomes import checkpointing_outcome
from optuna_ds.studies._outcomes import exits_off
from optuna_ds.studies._outcomes import ignored_batch
from optuna_ds.studies._outcomes import pruned_runs
from optuna_ds.studies._outcomes import warmed_runs
from optuna_ds.studies._runs import failure_text
from optuna_ds.studies._runs import read_each
from optuna_ds.studies._runs import runs_by_config
from optuna_ds.studies._runs import starts
from optuna_ds.studies._spend import Spend
from optuna_ds.studies._spend import spend_of

# A config whose runs scatter more than this many times the measured noise is flagged: with two
# or three runs, scatter beyond the noise itself is common (the noise is their average).
SCATTER_WARNING = 2.0


def relative_spread(runs: Sequence[float]) -> float | None:
    """The relative standard deviation of a config's runs; ``None`` for one run (or a zero mean)."""
    return statistics.stdev(runs) / mean if len(runs) > 1 and (mean := statistics.fmean(runs)) else None


def scatters(runs: Sequence[float], noise: float | None) -> bool:
    """Whether a config's runs disagree by more than the measured ``noise`` explains."""
    spread = relative_spread(runs)
    return spread is not None and noise is not None and spread > SCATTER_WARNING * noise


@dataclasses.dataclass(frozen=True)
class Noise:
    """The run-to-run noise this tuning measured, as the planner measures it (the relative
    noise of one measurement), and what it was measured from: the configs that ran more than
    once. ``value`` is ``None`` where nothing measured it."""

    value: float | None = None
    configs: int = 0  # configs that ran more than once
    runs: int = 0  # their runs

    @property
    def phrase(self) -> str:
        """The noise as every output states it."""
        if self.value is None:
            why = "no config ran twice" if not self.configs else "the repeated runs were judged stragglers"
            return f"run-to-run noise not measured: {why}"
        configs = f"{self.configs} repeated config{'s' if self.configs > 1 else ''}"
        return f"run-to-run noise {self.value:.1%}, measured from {configs}, {self.runs} runs"


@dataclasses.dataclass(frozen=True)
class Optimum:
    """A config as every view shows it: its measured runs (mean, count, spread) and, for the
    planner's choice, the planner's estimate beside them. The tuning's optimum and each stage's
    best are both :func:`leader`'s."""

    name: str  # its first run's
    config: Config
    trial_number: int  # its first run's, in the stage study
    ds_config: dict[str, Any]
    result_dir: str
    cmd: list[str]
    runs: tuple[float, ...]
    trials: tuple[int, ...] = ()  # the stage study's trials that ran it
    run_names: tuple[str, ...] = ()  # each run's experiment, as ``runs``
    run_starts: tuple[float, ...] = ()  # each run's start (seconds since the epoch), as ``runs``
    estimate: float | None = None  # the planner's, where this is its choice
    chosen: bool = False  # the planner's final choice, not the best mean so far
    regret: float | None = None  # what the planner expected its choice still to lose (a share)
    # The planner's figure for its choice, the one it judged it by: the robust level of its runs
    # (one-sided noise: a slow run among several moves it little); None elsewhere.
    level: float | None = None
    peak_memory: int | None = None  # bytes per device, the highest of its runs, where the accelerator reports it
    # Each engine timer's median over every profiled step of its runs (ms), where the engine logged them.
    timers_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @property
    def stage(self) -> int:
        return self.config.stage

    @property
    def value(self) -> float:
        """Its figure, as every view shows it: the planner's robust level of its runs where this
        is its choice and it recorded one (the figure it was chosen by), else the mean of its
        runs."""
        return self.level if self.level is not None else self.mean

    @property
    def mean(self) -> float:
        """The mean of its runs."""
        return statistics.fmean(self.runs)

    @property
    def spread(self) -> float | None:
        """The relative standard deviation of its runs; ``None`` for one run."""
        return relative_spread(self.runs)

    def best_run(self, metric: Metric) -> tuple[str, float]:
        """Its best single run, named: what DeepSpeed's summary table gives of an experiment."""
        names = self.run_names
        if len(names) != len(self.runs):
            names = (self.name,) * len(self.runs)
        best = metric.best(list(zip(self.runs, names)), key=lambda r: r[0])
        return (best[1], best[0]) if best is not None else (self.name, self.value)

    @property
    def train_batch_size(self) -> int | None:
        """The samples one optimizer step trains on (with AutoTP, not the config's own count)."""
        return distinct_batch(self.ds_config)

    def scatters(self, noise: Noise) -> bool:
        """Whether its runs disagree by more than the measured noise explains."""
        return scatters(self.runs, noise.value)

    def figure(self, metric: Metric) -> str:
        """Its measurement as every view writes it: its figure (:attr:`value`: the robust level
        or the mean, saying which), the runs and their spread, and the planner's estimate where
        it made one."""
        of = "robust level" if self.level is not None else "mean"
        runs = f"{of} of {len(self.runs)} runs, ±{self.spread:.1%}" if self.spread is not None else "one run"
        estimate = f"; planner's estimate {metric.with_unit(self.estimate)}" if self.estimate is not None else ""
        return f"{metric.with_unit(self.value)} ({runs}{estimate})"

    def warning(self, metric: Metric, noise: Noise) -> str:
        """The line that says its figure is uncertain, or ``""``."""
        if not self.scatters(noise):
            return ""
        return (f"Warning: the {len(self.runs)} runs of {self.name} scatter by {self.spread:.1%}, more than "
                f"{SCATTER_WARNING:g}x the {noise.value:.1%} run-to-run noise: its {metric.name} is uncertain.")


def leader(runs: Iterable[Run], *, metric: Metric, choice: ChoiceRecord | None = None) -> Optimum | None:
    """The best config among ``runs`` (one stage study's), the one definition of "best": the
    planner's ``choice`` where it is among them, else the config with the best mean of runs. One
    run is not a result when the noise is a few percent, so no view ranks single runs."""
    groups: dict[Config, list[Run]] = {}
    for run in runs:
        t, config = run.trial, run.record.config
        if t.state == TrialState.COMPLETE and t.value is not None and config is not None:
            groups.setdefault(config, []).append(run)
    if not groups:
        return None
    chosen = groups.get(choice.config) if choice is not None else None
    estimate, final = (choice.estimate, True) if chosen is not None and choice is not None else (None, False)
    if chosen is None:
        estimate, final = None, False
        chosen = metric.best(groups.values(), key=lambda g: statistics.fmean(r.trial.value for r in g))  # type: ignore[misc]
    assert chosen is not None
    picked = [r.trial for r in chosen]
    first, record = chosen[0]
    peaks = [p for _, r in chosen if (p := r.peak_gpu_memory)]
    timers = [ts for _, r in chosen if isinstance(ts := r.timers_ms, dict)]
    assert record.exp_name is not None and record.config is not None
    return Optimum(
        name=record.exp_name,
        config=record.config,
        trial_number=first.number,
        ds_config=record.ds_config or {},
        result_dir=record.result_dir or "",
        cmd=record.cmd or [],
        runs=tuple(float(t.value) for t in picked),  # type: ignore[arg-type]
        trials=tuple(t.number for t in picked),
        run_names=tuple(r.exp_name or record.exp_name for _, r in chosen),
        run_starts=starts(picked),
        estimate=estimate,
        chosen=final,
        regret=choice.regret if final and choice is not None else None,
        level=choice.level if final and choice is not None else None,
        peak_memory=max(peaks) if peaks else None,
        timers_ms={k: statistics.median(float(ts[k]) for ts in timers) for k in timers[0] if all(k in ts for ts in timers)} if timers else {},
    )


@dataclasses.dataclass(frozen=True)
class Measured:
    """A config that ran, by its runs: what the choice is explained against."""

    name: str  # its first run's
    config: Config
    runs: tuple[float, ...]

    @property
    def value(self) -> float:
        return statistics.fmean(self.runs)


def departures(config: Config) -> Knobs:
    """The knobs ``config`` sets otherwise than a config that leaves them out runs with
    (DeepSpeed's defaults, compared as the planner compares them): the settings a tuning found,
    not those it restates. A knob with no known default is always one."""
    defaults = knob_defaults(KnobSpace(stage=config.stage, tuned={k: [v] for k, v in config.knobs}, fixed={}))
    return Knobs(kv for kv in config.knobs if kv not in defaults.items())


def measured_configs(runs: Sequence[Run]) -> list[Measured]:
    """Every config with a completed run, named by its first run, with all its runs."""
    names: dict[Config, str] = {}
    for t, record in runs:
        if t.state == TrialState.COMPLETE and record.config is not None and record.exp_name:
            names.setdefault(record.config, record.exp_name)
    return [Measured(name=names[c], config=c, runs=tuple(v)) for c, v in runs_by_config(runs).items() if c in names]


@dataclasses.dataclass(frozen=True)
class StageResult:
    """The outcome of one ZeRO stage: tuned (with its best) or skipped (with the reason)."""

    stage: int
    status: str
    reason: str = ""
    num_experiments: int = 0  # by name, as DeepSpeed counts them: one cut short and run again is one
    num_failed: int = 0
    best: Optimum | None = None
    last_failure: str = ""

    @property
    def name(self) -> str:
        return f"z{self.stage}"


def stage_result(study: optuna.Study, stage: int, *, metric: Metric, status: str = "tuned", reason: str = "",
                 choice: ChoiceRecord | None = None) -> StageResult:
    """The outcome of the stage of ``study`` (:func:`result_of` its runs)."""
    return result_of(read_runs(study.get_trials(deepcopy=False)), stage, metric=metric, status=status, reason=reason, choice=choice)


def result_of(runs: Sequence[Run], stage: int, *, metric: Metric, status: str = "tuned", reason: str = "",
              choice: ChoiceRecord | None = None) -> StageResult:
    """The outcome of a stage from its ``runs``."""
    # An experiment the user (or a lost node) cut short, or the machine failed, is no failure of its config: it runs again.
    failed = [r for t, r in runs if t.state == TrialState.FAIL and r.reason not in (FailureReason.INTERRUPTED, FailureReason.MACHINE)]
    last_failure = ""
    if failed:
        record = failed[-1]
        # A setting's own failure has its line (Checkpointing:, AutoTP:), which says why once.
        why = failure_text(record) if record.reason not in (FailureReason.CHECKPOINTING, FailureReason.AUTOTP) else ""
        last_failure = f"{record.exp_name}: {record.reason.value if record.reason else 'failed'}" + (f": {why}" if why else "")
    return StageResult(
        stage=stage,
        status=status,
        reason=reason,
        num_experiments=len({r.exp_name for _, r in runs}),
        num_failed=len(failed),
        best=leader(runs, metric=metric, choice=choice),
        last_failure=last_failure,
    )


def measurement_noise(trials: Iterable[FrozenTrial]) -> Noise:
    """The run-to-run noise of ``trials`` (:func:`noise_of` each)."""
    return noise_of(read_each(trials))


def noise_of(runs: Iterable[Run]) -> Noise:
    """The run-to-run noise this tuning measured, as the planner measures it (relative, from the
    configs that ran more than once): one run says nothing of its noise."""
    groups = [v for v in runs_by_config(runs).values() if all(x > 0 for x in v)]
    repeated = [v for v in groups if len(v) > 1]
    noise, dof = measured_noise(groups)
    return Noise(value=noise if dof else None, configs=len(repeated), runs=sum(len(v) for v in repeated))


@dataclasses.dataclass(frozen=True)
class OptunaBest:
    """The trial Optuna calls best in the chosen stage's study (``optuna best-trial``,
    optuna-dashboard): its single highest run, which need not be the tuning's choice."""

    stage: int
    number: int
    name: str
    value: float


@dataclasses.dataclass(frozen=True)
class TuningResult:
    """Every stage's outcome and the one optimum: what the summary, the report, the dashboard
    notes and the optimal files show."""

    metric: Metric
    stages: list[StageResult]
    duration: float
    model_info: dict[str, Any]
    baseline: Baseline | None = None
    spend: Spend = Spend()
    noise: Noise = Noise()
    best: Optimum | None = None  # the planner's choice; before it chose, the best mean of runs so far
    optuna_best: OptunaBest | None = None
    device_memory: float = 0.0  # bytes per device, as the first process recorded it
    memory_margin: float = 0.0  # the share of it the choice leaves free
    measured: tuple[Measured, ...] = ()  # every config that ran, for the choice's explanation
    # The experiments an interrupt cut short (stage, trial, name): Optuna's FAIL, no failure.
    interrupted: tuple[tuple[int, int, str], ...] = ()
    checkpointing: CheckpointingOutcome | None = None  # where activation checkpointing was a dimension
    autotp: AutotpOutcome | None = None  # where AutoTP was a dimension
    warmed: tuple[Warmed, ...] = ()  # runs still warming up in their profiled window
    pruned: tuple[PrunedRun, ...] = ()  # runs the pruner ended before their window did
    # The planner's model of each arm over micro-batch sizes, as it was when it chose (rates).
    model_curves: tuple[ModelCurve, ...] = ()
    ignored_batch: IgnoredBatch | None = None  # the micro-batch size did not take effect
    # Runs whose exit step was off their window: (name, DeepSpeed's figure, the value: the median
    # of their steps').
    exit_off: tuple[tuple[str, float, float], ...] = ()
    unrun: tuple[Unrun, ...] = ()  # the values listed in zero_optimization no experiment ran with
    # The planner's verdict beside its choice: the configs a run cannot tell from it (``None``
    # where it gave none) and the noise of one run it judged them by.
    equivalent: tuple[Config, ...] | None = None
    judged_noise: float | None = None

    @property
    def num_experiments(self) -> int:
        return sum(s.num_experiments for s in self.stages)


def load_result(storage: optuna.storages.BaseStorage, plan: TuningPlan, user: UserConfig) -> TuningResult:
    """Rebuild a tuning's result from the storage alone (``optuna-ds report`` does this)."""
    a = user.autotuning
    root_study = optuna.load_study(study_name=plan.study_name, storage=storage)
    root = RootRecord.from_attrs(root_study.user_attrs)
    choice = root.choice
    results = []
    trials: dict[int, list[optuna.trial.FrozenTrial]] = {}
    runs: dict[int, list[Run]] = {}  # each trial read once
    spaces: dict[int, dict[str, Any]] = {}
    for stage in user.stages:
        entry = root.stages.get(stage)
        study = load_stage_study(storage, tuning=plan.study_name, stage=stage)
        if study is not None:
            trials[stage] = study.get_trials(deepcopy=False)
            runs[stage] = read_runs(trials[stage])
            spaces[stage] = study.user_attrs.get("knob_space") or {}
        if entry is not None and entry.status in ("skipped", "pending"):
            results.append(StageResult(stage=stage, status=entry.status, reason=entry.reason))
        elif study is not None:
            mine = choice if choice is not None and choice.stage == stage else None
            result = result_of(runs[stage], stage, metric=a.tuned_metric, choice=mine)
            if result.best is None:
                result = dataclasses.replace(result, reason="no experiment ran successfully")
            results.append(result)
        else:
            results.append(StageResult(stage=stage, status="pending", reason="not reached yet"))
    leaders = [r.best for r in results if r.best is not None]
    # The planner's choice; before it chose (an interrupted or running tuning), the best mean so far.
    best = next((b for b in leaders if b.chosen), None) or a.tuned_metric.best(leaders, key=lambda b: b.value)
    every = [r for rs in runs.values() for r in rs]
    measured = tuple(measured_configs(every))
    judged = verdict(root_study)
    resources = root.resources or RecordedResources()
    return TuningResult(
        metric=a.tuned_metric,
        stages=results,
        duration=float(root.elapsed or 0.0),
        model_info=root.model_info or {},
        baseline=find_baseline(stages=trials, order=list(user.stages),
                               skipped={r.stage: r.reason for r in results if r.status == "skipped"},
                               micro_batch_size=user.baseline_micro_batch_size, user_list=bool(user.micro_batch_sizes)),
        spend=spend_of(every, profile_seconds=root.profile_duration, gpus_per_experiment=resources.gpus_per_experiment,
                       device=resources.device),
        noise=noise_of(every),
        best=best,
        optuna_best=_optuna_best(storage, plan.study_name, best),
        device_memory=resources.device_memory,
        memory_margin=plan.memory_margin,
        measured=measured,
        interrupted=tuple((stage, t.number, r.exp_name or "") for stage, rs in runs.items() for t, r in rs
                          if t.state == TrialState.FAIL and r.reason is FailureReason.INTERRUPTED),
        checkpointing=checkpointing_outcome(every, user),
        autotp=autotp_outcome(every, user),
        warmed=tuple(warmed_runs(every)),
        pruned=tuple(pruned_runs(every)),
        model_curves=recorded_model_curves(root_study),
        exit_off=tuple(exits_off(every)),
        ignored_batch=ignored_batch(every, script_args=plan.script_args,
                                    mapped=user.arg_mappings.values()),
        equivalent=_equivalent_configs(judged, best, measured),
        judged_noise=judged[1] if judged is not None else None,
        unrun=unrun_values(user.zero_section(), fast=a.fast, spaces=spaces, trials=trials,
                           skipped={r.stage: r.reason for r in results if r.status == "skipped"})
        + unrun_sizes(user.micro_batch_sizes or (), trials=trials),
    )


def _equivalent_configs(judged: tuple[tuple[str, ...], float | None] | None, best: Optimum | None,
                        measured: Sequence[Measured]) -> tuple[Config, ...] | None:
    """The measured configs the planner judged a run cannot tell from its choice (its verdict,
    by name); ``None`` where it recorded none."""
    if judged is None or best is None or not best.chosen:
        return None
    return tuple(m.config for m in measured if m.config.name in judged[0])


def _optuna_best(storage: optuna.storages.BaseStorage, tuning: str, best: Optimum | None) -> OptunaBest | None:
    """Optuna's own best trial of the optimum's stage study, where it is another config's run."""
    study = load_stage_study(storage, tuning=tuning, stage=best.stage) if best is not None else None
    if study is None or best is None:
        return None
    try:
        trial = study.best_trial
    except ValueError:
        return None
    if trial.number in best.trials or trial.value is None:
        return None
    return OptunaBest(stage=best.stage, number=trial.number, name=ExperimentRecord.from_trial(trial).exp_name or "", value=trial.value)
