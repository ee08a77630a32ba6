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
from optuna_ds.config import format_number
from optuna_ds.domain import DEFINITIVE_FAILURES
from optuna_ds.domain import ChoiceRecord
from optuna_ds.domain import Config
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import FailureReason
from optuna_ds.domain import Knobs
from optuna_ds.domain import Phase
from optuna_ds.domain import RecordedResources
from optuna_ds.domain import RootRecord
from optuna_ds.domain import launched
from optuna_ds.launcher import telling_line
from optuna_ds.planner import Priors
from optuna_ds.planner import checkpointing_ignored
from optuna_ds.planner import measured_noise
from optuna_ds.space import KnobSpace
from optuna_ds.space import build_autotp_space
from optuna_ds.space import distinct_batch
from optuna_ds.space import knob_defaults
from optuna_ds.storage import TuningPlan
from optuna_ds.storage import load_stage_study
from optuna_ds.storage import verdict
from optuna_ds.studies._builder import checkpointing_space
from optuna_ds.studies._coordinator import observation_of
from optuna_ds.studies._listed import Unrun
from optuna_ds.studies._listed import unrun_sizes
from optuna_ds.studies._listed import unrun_values

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
    peak_memory: int | None = None  # bytes per device, the highest of its runs, where the accelerator reports it
    # Each engine timer's median over every profiled step of its runs (ms), where the engine logged them.
    timers_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @property
    def stage(self) -> int:
        return self.config.stage

    @property
    def value(self) -> float:
        """The mean of its runs: what it is compared by."""
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
        """Its measurement as every view writes it: the mean, the runs and their spread, and the
        planner's estimate where it made one."""
        runs = f"mean of {len(self.runs)} runs, ±{self.spread:.1%}" if self.spread is not None else "one run"
        estimate = f"; planner's estimate {metric.with_unit(self.estimate)}" if self.estimate is not None else ""
        return f"{metric.with_unit(self.value)} ({runs}{estimate})"

    def warning(self, metric: Metric, noise: Noise) -> str:
        """The line that says its figure is uncertain, or ``""``."""
        if not self.scatters(noise):
            return ""
        return (f"Warning: the {len(self.runs)} runs of {self.name} scatter by {self.spread:.1%}, more than "
                f"{SCATTER_WARNING:g}x the {noise.value:.1%} run-to-run noise: its {metric.name} is uncertain.")


def _starts(trials: Sequence[FrozenTrial]) -> tuple[float, ...]:
    """When each of ``trials`` started (seconds since the epoch); empty where one has no start."""
    starts = [t.datetime_start.timestamp() for t in trials if t.datetime_start is not None]
    return tuple(starts) if len(starts) == len(trials) else ()


def leader(trials: Iterable[FrozenTrial], *, metric: Metric, choice: ChoiceRecord | None = None) -> Optimum | None:
    """The best config among ``trials`` (one stage study's), the one definition of "best": the
    planner's ``choice`` where it is among them (its config; an earlier version's choice, by one
    of its runs' trial), else the config with the best mean of runs. One run is not a result when
    the noise is a few percent, so no view ranks single runs."""
    groups: dict[Config, list[FrozenTrial]] = {}
    for t in launched(trials):
        config = ExperimentRecord.from_trial(t).config
        if t.state == TrialState.COMPLETE and t.value is not None and config is not None:
            groups.setdefault(config, []).append(t)
    if not groups:
        return None
    picked = None
    if choice is not None:
        picked = (groups.get(choice.config) if choice.config is not None
                  else next((g for g in groups.values() if any(t.number == choice.trial for t in g)), None))
    estimate, final = (choice.estimate, True) if picked is not None and choice is not None else (None, False)
    if picked is None:
        estimate, final = None, False
        picked = metric.best(groups.values(), key=lambda g: statistics.fmean(t.value for t in g))  # type: ignore[misc]
    assert picked is not None
    first = picked[0]
    record = ExperimentRecord.from_trial(first)
    peaks = [p for t in picked if (p := ExperimentRecord.from_trial(t).peak_gpu_memory)]
    timers = [ts for t in picked if isinstance(ts := ExperimentRecord.from_trial(t).timers_ms, dict)]
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
        run_names=tuple(ExperimentRecord.from_trial(t).exp_name or record.exp_name
                        for t in picked),
        run_starts=_starts(picked),
        estimate=estimate,
        chosen=final,
        regret=choice.regret if final and choice is not None else None,
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


def measured_configs(trials: Iterable[FrozenTrial]) -> list[Measured]:
    """Every config with a completed run, named by its first run, with all its runs."""
    names: dict[Config, str] = {}
    for t in launched(trials):
        record = ExperimentRecord.from_trial(t)
        if t.state == TrialState.COMPLETE and record.config is not None and record.exp_name:
            names.setdefault(record.config, record.exp_name)
    return [Measured(name=names[c], config=c, runs=tuple(v)) for c, v in _runs_by_config(trials).items() if c in names]


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


def stage_result(study: optuna.Study, stage: int, *, metric: Metric, status: str = "tuned", reason: str = "",
                 choice: ChoiceRecord | None = None) -> StageResult:
    trials = launched(study.get_trials(deepcopy=False))
    # An experiment the user (or a lost node) cut short, or the machine failed, is no failure of its config: it runs again.
    failed = [t for t in trials if t.state == TrialState.FAIL
              and ExperimentRecord.from_trial(t).reason not in (FailureReason.INTERRUPTED, FailureReason.MACHINE)]
    last_failure = ""
    if failed:
        record = ExperimentRecord.from_trial(failed[-1])
        # A setting's own failure has its line (Checkpointing:, AutoTP:), which says why once.
        why = failure_text(record) if record.reason not in (FailureReason.CHECKPOINTING, FailureReason.AUTOTP) else ""
        last_failure = f"{record.exp_name}: {record.reason.value if record.reason else 'failed'}" + (f": {why}" if why else "")
    return StageResult(
        stage=stage,
        status=status,
        reason=reason,
        num_experiments=len({ExperimentRecord.from_trial(t).exp_name for t in trials}),
        num_failed=len(failed),
        best=leader(trials, metric=metric, choice=choice),
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
    values: tuple[float, ...] = ()  # those runs, where they completed
    starts: tuple[float, ...] = ()  # when each of them started (seconds since the epoch)


@dataclasses.dataclass(frozen=True)
class Spend:
    """What the tuning cost: experiments launched (the profile run included) and GPU time,
    each experiment's duration times the GPUs it ran on."""

    experiments: int = 0
    gpu_seconds: float = 0.0  # device-seconds, whatever the accelerator
    profiled: bool = False
    device: str = ""  # the accelerator's kind ("GPU", "CPU"); "" where the tuning did not record it
    gpus_per_experiment: int = 1

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600

    @property
    def noun(self) -> str:
        """One of its devices, in words: ``GPU``, ``CPU device``."""
        if self.device == "GPU":
            return "GPU"
        return f"{self.device} device" if self.device else "device"

    @property
    def hours(self) -> str:
        """The device time in words true of the accelerator: no GPU-hours from a CPU."""
        figure = format_number(self.gpu_hours, 3)
        if self.device == "GPU":
            return f"{figure} GPU-hours"
        return f"{figure} device-hours" + (f" ({self.device})" if self.device else "")


def experiment_seconds(trial: FrozenTrial) -> float | None:
    """How long a trial's experiment ran: the runner's measure, else (an interrupted one) the
    trial's wall time; ``None`` when it launched nothing."""
    record = ExperimentRecord.from_trial(trial)
    if record.duration is not None:
        return float(record.duration)
    if record.launched and trial.datetime_start and trial.datetime_complete:
        return (trial.datetime_complete - trial.datetime_start).total_seconds()
    return None


def tuning_spend(trials: Iterable[FrozenTrial], *, profile_seconds: float | None, gpus_per_experiment: int,
                 device: str = "") -> Spend:
    seconds = [s for t in launched(trials) if (s := experiment_seconds(t)) is not None]
    if profile_seconds is not None:
        seconds.append(profile_seconds)
    return Spend(experiments=len(seconds), gpu_seconds=sum(seconds) * gpus_per_experiment, profiled=profile_seconds is not None,
                 device=device, gpus_per_experiment=gpus_per_experiment)


def _runs_by_config(trials: Iterable[FrozenTrial]) -> dict[Config, list[float]]:
    """The values of the completed runs, by config."""
    values: dict[Config, list[float]] = {}
    for t in trials:
        config = ExperimentRecord.from_trial(t).config
        if t.state == TrialState.COMPLETE and t.value is not None and config is not None:
            values.setdefault(config, []).append(t.value)
    return values


def runs_of(trial: FrozenTrial, trials: Iterable[FrozenTrial]) -> list[float]:
    """The values of every completed run of ``trial``'s config: one run is not a result when the
    noise is a few percent."""
    config = ExperimentRecord.from_trial(trial).config
    if config is None:
        return [] if trial.value is None else [trial.value]
    return _runs_by_config(trials).get(config, [])


def _completed_of(trial: FrozenTrial, trials: Iterable[FrozenTrial]) -> list[FrozenTrial]:
    """Every completed run of ``trial``'s config, in the order of ``trials``."""
    config = ExperimentRecord.from_trial(trial).config
    return [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None
            and ExperimentRecord.from_trial(t).config == config]


def measurement_noise(trials: Iterable[FrozenTrial]) -> Noise:
    """The run-to-run noise this tuning measured, as the planner measures it (relative, from the
    configs that ran more than once): one run says nothing of its noise."""
    groups = [v for v in _runs_by_config(trials).values() if all(x > 0 for x in v)]
    repeated = [v for v in groups if len(v) > 1]
    noise, dof = measured_noise(groups)
    return Noise(value=noise if dof else None, configs=len(repeated), runs=sum(len(v) for v in repeated))


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
        return Baseline(stage=stage, micro_batch_size=micro_batch_size, reason=f"z{stage} was skipped: {skipped.get(stage, '') if stage is not None else ''}",
                        listed=listed)
    assert stage is not None
    runs = [(t, r) for t in stages.get(stage, []) if t.state != TrialState.PRUNED and (r := ExperimentRecord.from_trial(t)).claimed
            and r.phase is Phase.MICRO_BATCH and r.config is not None and r.config.micro_batch == micro_batch_size]
    done = [(t, r) for t, r in runs if t.state == TrialState.COMPLETE] or [(t, r) for t, r in runs if r.reason in DEFINITIVE_FAILURES]
    if not done:
        why = "it has not run yet" if stage in stages else f"z{stage} has not started"
        if any(t.state == TrialState.COMPLETE for t in stages.get(stage, [])):
            why = "it is above the largest size predicted to fit"
        return Baseline(stage=stage, micro_batch_size=micro_batch_size, reason=why, listed=listed)
    t, record = done[0]
    assert record.exp_name is not None
    status = "complete" if t.state == TrialState.COMPLETE or record.reason is None else record.reason.value
    complete = t.state == TrialState.COMPLETE and record.config is not None
    completed = _completed_of(t, stages.get(stage, [])) if complete else []
    values = [float(c.value) for c in completed]  # type: ignore[arg-type]
    return Baseline(stage=stage, micro_batch_size=micro_batch_size, name=record.exp_name,
                    value=statistics.fmean(values) if values else t.value, status=status,
                    reason="" if status == "complete" else f"it failed ({status})", listed=listed, runs=max(1, len(values)),
                    values=tuple(values), starts=_starts(completed))


@dataclasses.dataclass(frozen=True)
class OptunaBest:
    """The trial Optuna calls best in the chosen stage's study (``optuna best-trial``,
    optuna-dashboard): its single highest run, which need not be the tuning's choice."""

    stage: int
    number: int
    name: str
    value: float


@dataclasses.dataclass(frozen=True)
class CheckpointingOutcome:
    """What a tuning found of activation checkpointing, where it was a dimension: the script
    flag of its switch ("" where the section alone is tuned), its launches, the settings the
    script ignored (the setting named, and what shows it) and the runs that failed for a
    reason of the setting (the experiment, and why)."""

    switch: str = ""
    runs: int = 0
    ignored: tuple[tuple[str, str], ...] = ()
    failed: tuple[tuple[str, str], ...] = ()

    def named(self, knobs: Iterable[tuple[str, Any]]) -> str:
        """A checkpointing setting as the user sets it: the script flag, the section's keys."""
        return ", ".join(self.switch if k == "gradient_checkpointing" and self.switch else f"{k}={_json(v)}" for k, v in knobs)


def _json(value: Any) -> str:
    return "true" if value is True else "false" if value is False else str(value)


def checkpointing_outcome(trials: Sequence[FrozenTrial], user: UserConfig) -> CheckpointingOutcome | None:
    """The tuning's checkpointing outcome from its trials (``None`` where it was no dimension):
    what the planner reads of its runs (:func:`~optuna_ds.planner.checkpointing_ignored`) is
    what the summary says."""
    space = checkpointing_space(user)
    if not space.settings():
        return None
    metric = user.autotuning.tuned_metric
    observations = [o for t in launched(trials) if (o := observation_of(t, metric=metric, dead={})) is not None]
    outcome = CheckpointingOutcome(switch=space.switch)
    why = checkpointing_ignored(observations, Priors())
    failed = [(r.exp_name or "", failure_text(r)) for t in launched(trials) if t.state == TrialState.FAIL
              and (r := ExperimentRecord.from_trial(t)).reason is FailureReason.CHECKPOINTING]
    return dataclasses.replace(outcome, runs=sum(1 for o in observations if o.knobs.checkpointing),
                               ignored=tuple((outcome.named([kv]), text) for kv, text in why.items()), failed=tuple(failed))


@dataclasses.dataclass(frozen=True)
class AutotpOutcome:
    """What a tuning found of AutoTP, where it was a dimension: the sizes tried, its launches
    and the runs that failed for a reason of its own (the experiment, and why: said once, as no
    size is tried again)."""

    sizes: tuple[int, ...] = ()
    runs: int = 0
    failed: tuple[tuple[str, str], ...] = ()


def autotp_outcome(trials: Sequence[FrozenTrial], user: UserConfig) -> AutotpOutcome | None:
    """The tuning's AutoTP outcome from its trials; ``None`` where it was no dimension."""
    space = build_autotp_space(user.autotp_section())
    if not space.sizes:
        return None
    metric = user.autotuning.tuned_metric
    observations = [o for t in launched(trials) if (o := observation_of(t, metric=metric, dead={})) is not None]
    failed = [(r.exp_name or "", failure_text(r)) for t in launched(trials) if t.state == TrialState.FAIL
              and (r := ExperimentRecord.from_trial(t)).reason is FailureReason.AUTOTP]
    return AutotpOutcome(sizes=space.sizes, runs=sum(1 for o in observations if o.knobs.autotp > 1), failed=tuple(failed[:1]))


@dataclasses.dataclass(frozen=True)
class Warmed:
    """A run whose step times still fell across its profiled window: measured again later in
    the run (``windows``: each launch's steps, the figure's last), ``settled`` where they then
    held."""

    name: str
    windows: tuple[tuple[int, int], ...]
    fell: float  # the fall across its first window, as a share
    settled: bool


def warmed_runs(trials: Iterable[FrozenTrial]) -> list[Warmed]:
    """The runs of ``trials`` that were still warming up in their profiled window, oldest first."""
    found = []
    for t in launched(trials):
        record = ExperimentRecord.from_trial(t)
        warmup = record.warmup or {}
        windows = [w for w in warmup.get("windows", []) if isinstance(w, dict)]
        if windows and record.exp_name:
            steps = tuple((int(w["steps"][0]), int(w["steps"][1])) for w in windows)
            found.append(Warmed(name=record.exp_name, windows=steps, fell=float(windows[0]["fell"]),
                                settled=bool(warmup.get("settled"))))
    return found


def exits_off(trials: Iterable[FrozenTrial]) -> list[tuple[str, float, float]]:
    """The runs whose exit step was off their window: name, DeepSpeed's figure, and the value
    (the median of their steps' figures)."""
    found = []
    for t in launched(trials):
        record = ExperimentRecord.from_trial(t)
        if t.state == TrialState.COMPLETE and t.value is not None and record.engine_figure is not None:
            found.append((record.exp_name or "", float(record.engine_figure), float(t.value)))
    return found


@dataclasses.dataclass(frozen=True)
class IgnoredBatch:
    """Two runs of one config but for its micro-batch size whose forward pass took about the same
    time, though one trained at least ``_IGNORED_RATIO`` times the other's micro-batch: the
    script did not train the size the config set (its own batch flag, not in ``arg_mappings``,
    or a size of its own), and every figure counted samples it did not train."""

    small: str  # the two experiments' names
    large: str
    small_mbs: int
    large_mbs: int
    small_fwd_ms: float  # the forward pass of one micro-step, the fastest of its runs' profiled steps
    large_fwd_ms: float
    flag: str = ""  # the script's own batch argument as given (``--batch_size 8``), if any


# A forward pass of 4 times the samples in less than 1.1 times the time: no device is that idle
# at the smaller size and still worth tuning (docs/steps.md).
_IGNORED_RATIO = 4
_IGNORED_GROWTH = 1.1


def _batch_flag(script_args: Sequence[str], mapped: Iterable[str]) -> str:
    """The script's own batch-size argument, as given, where it has one that ``arg_mappings``
    does not map (so no experiment sets it): ``--batch_size 8``."""
    mapped = set(mapped)
    for i, arg in enumerate(script_args):
        flag, _, value = arg.partition("=")
        if flag.startswith("-") and "batch" in flag.lower() and flag not in mapped:
            if not value and i + 1 < len(script_args) and not script_args[i + 1].startswith("-"):
                value = script_args[i + 1]
            return f"{flag} {value}".strip()
    return ""


def ignored_batch(trials: Iterable[FrozenTrial], *, script_args: Sequence[str] = (),
                  mapped: Iterable[str] = ()) -> IgnoredBatch | None:
    """Evidence that the micro-batch size did not take effect (:class:`IgnoredBatch`): of the
    runs of one config but for its micro-batch size and accumulation, the smallest size against
    one at least ``_IGNORED_RATIO`` times larger whose fastest forward pass grew less than
    ``_IGNORED_GROWTH`` times, by DeepSpeed's own timers (a step's wait on a loaded machine only
    lengthens it; runs recorded before the fastest was kept: their median); ``None`` where no
    such pair ran."""
    forward: dict[Config, list[float]] = {}
    names: dict[Config, str] = {}
    for t in launched(trials):
        record = ExperimentRecord.from_trial(t)
        fwd = (record.fastest_ms or record.timers_ms or {}).get("fwd")
        ran = t.state == TrialState.COMPLETE and record.config is not None
        if ran and record.config is not None and isinstance(fwd, (int, float)) and fwd > 0:
            forward.setdefault(record.config, []).append(float(fwd) / record.config.accumulation)
            names.setdefault(record.config, record.exp_name or record.config.name)
    groups: dict[Config, list[Config]] = {}
    for config in forward:
        alike = dataclasses.replace(config, micro_batch=1, accumulation=1)
        groups.setdefault(alike, []).append(config)
    for configs in groups.values():
        configs.sort(key=lambda c: c.micro_batch)
        small = configs[0]
        for large in reversed(configs):
            if large.micro_batch < _IGNORED_RATIO * small.micro_batch:
                break
            fs, fl = min(forward[small]), min(forward[large])
            if fl < _IGNORED_GROWTH * fs:
                return IgnoredBatch(small=names[small], large=names[large],
                                    small_mbs=small.micro_batch, large_mbs=large.micro_batch,
                                    small_fwd_ms=fs, large_fwd_ms=fl, flag=_batch_flag(script_args, mapped))
    return None


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
    spaces: dict[int, dict[str, Any]] = {}
    for stage in user.stages:
        entry = root.stages.get(stage)
        study = load_stage_study(storage, tuning=plan.study_name, stage=stage)
        if study is not None:
            trials[stage] = study.get_trials(deepcopy=False)
            spaces[stage] = study.user_attrs.get("knob_space") or {}
        if entry is not None and entry.status in ("skipped", "pending"):
            results.append(StageResult(stage=stage, status=entry.status, reason=entry.reason))
        elif study is not None:
            mine = choice if choice is not None and choice.stage == stage else None
            result = stage_result(study, stage, metric=a.tuned_metric, choice=mine)
            if result.best is None:
                result = dataclasses.replace(result, reason="no experiment ran successfully")
            results.append(result)
        else:
            results.append(StageResult(stage=stage, status="pending", reason="not reached yet"))
    leaders = [r.best for r in results if r.best is not None]
    # The planner's choice; before it chose (an interrupted or running tuning), the best mean so far.
    best = next((b for b in leaders if b.chosen), None) or a.tuned_metric.best(leaders, key=lambda b: b.value)
    every = [t for ts in trials.values() for t in ts]
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
        spend=tuning_spend(every, profile_seconds=root.profile_duration, gpus_per_experiment=resources.gpus_per_experiment,
                           device=resources.device),
        noise=measurement_noise(every),
        best=best,
        optuna_best=_optuna_best(storage, plan.study_name, best),
        device_memory=resources.device_memory,
        memory_margin=plan.memory_margin,
        measured=measured,
        interrupted=tuple((stage, t.number, r.exp_name or "") for stage, ts in trials.items() for t in launched(ts)
                          if t.state == TrialState.FAIL and (r := ExperimentRecord.from_trial(t)).reason is FailureReason.INTERRUPTED),
        checkpointing=checkpointing_outcome(every, user),
        autotp=autotp_outcome(every, user),
        warmed=tuple(warmed_runs(every)),
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
