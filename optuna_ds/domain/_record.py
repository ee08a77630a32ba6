"""An experiment as its trial stores it, and the predicates that read it.

The predicates read Optuna's public trial types (``FrozenTrial``, ``TrialState``): a record is
a trial's user attrs, and whether its experiment finished is the trial's state.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any
from typing import NamedTuple

from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.domain._config import Config
from optuna_ds.domain._experiment import Experiment
from optuna_ds.domain._experiment import ExperimentResult
from optuna_ds.domain._experiment import FailureReason
from optuna_ds.domain._experiment import Phase

SetUserAttr = Callable[[str, Any], None]


@dataclasses.dataclass(frozen=True)
class ExperimentRecord:
    """One experiment as its trial's user attrs store it: the one place their keys are named.

    Each field is stored under its own name, so the field names are the storage's keys: stored
    tunings, the report, other workers and optuna-dashboard read them, so they never change.
    The config is stored field by field, as :meth:`Config.to_attrs` writes it (``stage``,
    ``micro_batch_size``, ``gradient_accumulation_steps``, ``offload`` and ``knobs``, the last two
    only when set), and read back by :meth:`Config.from_attrs` (which reads a trial an earlier
    version stored too). A field the trial does not hold is ``None`` (``False`` for the
    marks).

    The record is written in parts, each by whoever knows it, with :meth:`write`: the claim
    before the run (:meth:`claim`), the processes as they start, the result after the run
    (:meth:`outcome`), and the marks of a trial that launched nothing or whose process died.
    ``exp_name`` is the last field, so it is always written last: the other processes read a
    trial that has ``exp_name`` as fully claimed, every other attr of its claim in place.
    """

    # The claim, written before the run (with exp_name, below).
    phase: Phase | None = None
    config: Config | None = None
    train_batch_size: int | None = None
    ds_config: dict[str, Any] | None = None
    result_dir: str | None = None
    slot: str | None = None  # the GPUs it ran on, as ``--include`` names them
    repeat: int | None = None  # a re-measurement: how many times the config ran before
    timeout: float | None = None  # the trial timeout it ran under (s): one that timed out runs again under a longer one
    # The token its launch's processes carry (the launcher's MARK_VAR) and its folder's exp.json
    # names: kept here, where no other launch can rewrite it, to tell its processes and files.
    mark: str | None = None
    # The processes: the driver's that took the trial (first), the experiment's once launched.
    worker: dict[str, Any] | None = None
    experiment_process: dict[str, Any] | None = None
    # The result, written after the run; the failure's fields only for a failure.
    metrics: dict[str, Any] | None = None
    cmd: list[str] | None = None
    duration: float | None = None
    returncode: int | None = None
    peak_gpu_memory: int | None = None  # bytes, where the accelerator reports it
    # The profiled steps the trial's value is the median of (ms each, the exit step last), and
    # each engine timer's median and minimum over them: absent where the engine logged no step
    # (its one-step figure is the value then).
    step_times_ms: list[float] | None = None
    timers_ms: dict[str, float] | None = None
    fastest_ms: dict[str, float] | None = None
    # Where its step times still fell across the profiled window (its warm-up not over): each
    # launch's window and fall, the last the figure's; "settled" whether its last window held.
    warmup: dict[str, Any] | None = None
    # DeepSpeed's own figure where the value is not it: its exit step took less than half or more
    # than twice the median of its window, and the value is the median of its steps' figures.
    engine_figure: float | None = None
    # What DeepSpeed's checkpointing logged it configured, where the script configured it.
    checkpointing: dict[str, Any] | None = None
    reason: FailureReason | None = None
    detail: str | None = None
    stderr_tail: str | None = None
    # A run ended early by the pruner (reason "pruned"): its partial figure (the median of the
    # profiled steps it logged), their count, and the incumbent and bar it was judged against.
    pruned: dict[str, Any] | None = None
    # The marks: a claim that stood down, a dead driver's trial.
    duplicate_of: int | None = None  # the trial that has this experiment
    ended_by: dict[str, Any] | None = None  # the tune process ending the tuning when a worker claimed it
    # Failed because its process died, not for its config; a trial that died before its claim is
    # lost with no exp_name (it launched nothing: no experiment to run again or to report).
    lost: bool = False
    recovered: str | None = None  # its process died, but the experiment finished: why kept
    # Last: the claim (see above).
    exp_name: str | None = None

    @classmethod
    def claim(cls, experiment: Experiment, *, slot: str, repeat: int = 0, mark: str = "",
              timeout: float | None = None) -> ExperimentRecord:
        """What a trial publishes before it runs ``experiment`` on ``slot`` with the token ``mark``
        under the trial timeout ``timeout``."""
        return cls(
            repeat=repeat or None,
            timeout=timeout,
            mark=mark or None,
            phase=experiment.phase,
            config=experiment.config,
            train_batch_size=experiment.ds_config.get("train_batch_size"),
            ds_config=experiment.ds_config,
            result_dir=experiment.result_dir,
            slot=slot,
            exp_name=experiment.name,
        )

    @classmethod
    def outcome(cls, result: ExperimentResult, *, step_times_ms: list[float] | None = None,
                timers_ms: dict[str, float] | None = None, fastest_ms: dict[str, float] | None = None,
                warmup: dict[str, Any] | None = None,
                engine_figure: float | None = None) -> ExperimentRecord:
        """What users look for after a run: the metrics, the steps its value is made of, the
        command, and for a failure its reason and the last lines of stderr."""
        failed = result.reason is not None
        return cls(
            step_times_ms=step_times_ms or None,
            timers_ms=timers_ms or None,
            fastest_ms=fastest_ms or None,
            warmup=warmup,
            engine_figure=engine_figure,
            lost=result.reason is FailureReason.INTERRUPTED,  # lost to the node: runs again, a bounded number of times
            metrics=result.metrics,
            cmd=result.cmd,
            duration=round(result.duration, 3),
            returncode=result.returncode,
            peak_gpu_memory=result.peak_memory,
            checkpointing=result.checkpointing,
            reason=result.reason,
            detail=result.detail if failed else None,
            stderr_tail=result.stderr_tail if failed else None,
        )

    @classmethod
    def from_trial(cls, trial: FrozenTrial) -> ExperimentRecord:
        attrs = trial.user_attrs
        values: dict[str, Any] = {key: attrs[key] for key in _KEYS if key in attrs}
        if "phase" in values:
            values["phase"] = Phase(values["phase"])
        if "reason" in values:
            values["reason"] = FailureReason(values["reason"])
        return cls(config=Config.from_attrs(attrs), **values)

    def attrs(self) -> dict[str, Any]:
        """The user attrs of the fields this record sets (those not at their default), in field
        order, so ``exp_name`` last."""
        attrs: dict[str, Any] = {}
        for field in _FIELDS:
            value = getattr(self, field.name)
            if isinstance(value, Config):
                attrs.update(value.to_attrs())
            elif value != field.default:
                attrs[field.name] = value.value if isinstance(value, (Phase, FailureReason)) else value
        return attrs

    def write(self, set_user_attr: SetUserAttr) -> None:
        """Store :meth:`attrs` one by one, ``exp_name`` last; ``set_user_attr`` is a trial's, or a
        storage's bound to a trial id."""
        for key, value in self.attrs().items():
            set_user_attr(key, value)

    @property
    def claimed(self) -> bool:
        """Whether the trial published its whole claim."""
        return self.exp_name is not None

    @property
    def launched(self) -> bool:
        """Whether the experiment's process was started."""
        return self.experiment_process is not None


_FIELDS = dataclasses.fields(ExperimentRecord)
_KEYS = tuple(f.name for f in _FIELDS if f.name != "config")


# Failures that say something about the config itself; anything else (an interrupt, a dead
# worker, a script that fails whatever the config) leaves the experiment to be run again.
DEFINITIVE_FAILURES = frozenset(r for r in FailureReason if r.judges_config)


def timed_out_sooner(trial: FrozenTrial, *, timeout: float | None) -> bool:
    """Whether the trial's experiment timed out under a shorter trial timeout than ``timeout``
    (``None``: none): it may finish under this one. The timeout it ran under is its record's."""
    if timeout is None or trial.state != TrialState.FAIL:
        return False
    record = ExperimentRecord.from_trial(trial)
    if record.reason is not FailureReason.TIMEOUT:
        return False
    return record.timeout is not None and float(record.timeout) < timeout


def is_finished_experiment(trial: FrozenTrial, *, timeout: float | None = None) -> bool:
    """Whether the trial's experiment has a result that must never be paid for again under the
    trial timeout ``timeout`` (``None``: whatever the timeout); one that timed out under a
    shorter timeout has none (:func:`timed_out_sooner`)."""
    if trial.state == TrialState.COMPLETE:
        return True
    return (trial.state == TrialState.FAIL and ExperimentRecord.from_trial(trial).reason in DEFINITIVE_FAILURES
            and not timed_out_sooner(trial, timeout=timeout))


class Run(NamedTuple):
    """A trial read once: the trial and the record its user attrs hold (:func:`read_runs`)."""

    trial: FrozenTrial
    record: ExperimentRecord


def _read(trials: Iterable[FrozenTrial]) -> list[Run]:
    return [Run(t, ExperimentRecord.from_trial(t)) for t in trials]


def _superseded(runs: list[Run]) -> set[int]:
    recovered = {r.mark for _, r in runs if r.recovered and r.mark}
    return {t.number for t, r in runs if t.state == TrialState.FAIL and not r.recovered and r.mark in recovered}


def superseded(trials: Iterable[FrozenTrial]) -> set[int]:
    """The numbers of the failed trials whose launch (``mark``) another trial recovered: a trial
    failed as stale while its experiment ran on, whose process then kept the result in a trial
    of its own. The launch is that trial's; the stale one counts for nothing, not as a failure."""
    return _superseded(_read(trials))


def given_up(trials: Iterable[FrozenTrial]) -> dict[str, FrozenTrial]:
    """Experiments lost twice, by name: their worker died while running them (killed, or no
    heartbeat for the grace period), or the node lost their runs: retried once, then counted as
    failed so they cannot kill workers or use GPUs forever. A claim lost before its launch
    (the worker died between the two) ran nothing that could have killed it: not counted."""
    trials = list(trials)
    gone = superseded(trials)
    lost: dict[str, list[FrozenTrial]] = {}
    for t in trials:
        if t.state != TrialState.FAIL or t.number in gone:
            continue
        record = ExperimentRecord.from_trial(t)
        if record.exp_name is not None and record.launched and (record.lost or record.reason is None):
            lost.setdefault(record.exp_name, []).append(t)
    return {name: ts[-1] for name, ts in lost.items() if len(ts) >= 2}


def read_runs(trials: Iterable[FrozenTrial]) -> list[Run]:
    """The trials that ran an experiment (a duplicate, pruned as it stood down, launched nothing;
    a superseded trial's launch is another's; a run the pruner ended early ran), each read once."""
    runs = _read(trials)
    gone = _superseded(runs)
    return [r for r in runs if (r.trial.state != TrialState.PRUNED or r.record.reason is FailureReason.PRUNED)
            and r.record.claimed and r.trial.number not in gone]


def launched(trials: Iterable[FrozenTrial]) -> list[FrozenTrial]:
    """The trials that ran an experiment (:func:`read_runs`)."""
    return [r.trial for r in read_runs(trials)]


def was_pruned(trial: FrozenTrial) -> bool:
    """Whether ``trial`` is a run the pruner ended early (not a claim that stood down, which Optuna
    marks pruned too)."""
    return trial.state == TrialState.PRUNED and ExperimentRecord.from_trial(trial).reason is FailureReason.PRUNED
