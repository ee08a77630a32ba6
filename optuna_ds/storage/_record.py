from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from optuna.trial import FrozenTrial

from optuna_ds.launcher import Experiment
from optuna_ds.launcher import ExperimentResult
from optuna_ds.launcher import FailureReason
from optuna_ds.launcher import Phase

SetUserAttr = Callable[[str, Any], None]


@dataclasses.dataclass(frozen=True)
class ExperimentRecord:
    """One experiment as its trial's user attrs store it: the one place their keys are named.

    Each field is stored under its own name, so the field names are the storage's keys: stored
    tunings, the report, other workers and optuna-dashboard read them, so they never change.
    A field the trial does not hold is ``None`` (``False`` for the marks).

    The record is written in parts, each by whoever knows it, with :meth:`write`: the claim
    before the run (:meth:`claim`), the processes as they start, the result after the run
    (:meth:`outcome`), and the marks of a trial that launched nothing or whose process died.
    ``exp_name`` is the last field, so it is always written last: the other processes read a
    trial that has ``exp_name`` as fully claimed, every other attr of its claim in place.
    """

    # The claim, written before the run (with exp_name, below).
    phase: Phase | None = None
    micro_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    train_batch_size: int | None = None
    ds_config: dict[str, Any] | None = None
    result_dir: str | None = None
    slot: str | None = None  # the GPUs it ran on, as ``--include`` names them
    offload: str | None = None  # the offload variant the planner added, by its label
    repeat: int | None = None  # a re-measurement: how many times the config ran before
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
    reason: FailureReason | None = None
    detail: str | None = None
    stderr_tail: str | None = None
    # The marks: a claim that stood down, a knob search that was over, a dead driver's trial.
    duplicate_of: int | None = None  # the trial that has this experiment
    early_stopped: bool = False
    # Failed because its process died, not for its config; a trial that died before its claim is
    # lost with no exp_name (it launched nothing: no experiment to run again or to report).
    lost: bool = False
    recovered: str | None = None  # its process died, but the experiment finished: why kept
    # Last: the claim (see above).
    exp_name: str | None = None

    @classmethod
    def claim(cls, experiment: Experiment, *, slot: str, offload: str = "", repeat: int = 0, mark: str = "") -> ExperimentRecord:
        """What a trial publishes before it runs ``experiment`` on ``slot`` with the token ``mark``."""
        return cls(
            offload=offload or None,
            repeat=repeat or None,
            mark=mark or None,
            phase=experiment.phase,
            micro_batch_size=experiment.micro_batch_size,
            gradient_accumulation_steps=experiment.gradient_accumulation_steps,
            train_batch_size=experiment.ds_config.get("train_batch_size"),
            ds_config=experiment.ds_config,
            result_dir=experiment.result_dir,
            slot=slot,
            exp_name=experiment.name,
        )

    @classmethod
    def outcome(cls, result: ExperimentResult) -> ExperimentRecord:
        """What users look for after a run: the metrics, the command, and for a failure its
        reason and the last lines of stderr."""
        failed = result.reason is not None
        return cls(
            lost=result.reason is FailureReason.INTERRUPTED,  # lost to the node: runs again, a bounded number of times
            metrics=result.metrics,
            cmd=result.cmd,
            duration=round(result.duration, 3),
            returncode=result.returncode,
            peak_gpu_memory=result.peak_memory,
            reason=result.reason,
            detail=result.detail if failed else None,
            stderr_tail=result.stderr_tail if failed else None,
        )

    @classmethod
    def from_trial(cls, trial: FrozenTrial) -> ExperimentRecord:
        attrs = trial.user_attrs
        values = {key: attrs[key] for key in _KEYS if key in attrs}
        if "phase" in values:
            values["phase"] = Phase(values["phase"])
        if "reason" in values:
            values["reason"] = FailureReason(values["reason"])
        return cls(**values)

    def attrs(self) -> dict[str, Any]:
        """The user attrs of the fields this record sets (those not at their default), in field
        order, so ``exp_name`` last."""
        attrs = {}
        for field in _FIELDS:
            value = getattr(self, field.name)
            if value != field.default:
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
_KEYS = tuple(f.name for f in _FIELDS)
