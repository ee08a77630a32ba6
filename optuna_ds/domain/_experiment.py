"""One experiment: the DeepSpeed run of a config, and what happened to it."""
from __future__ import annotations

import dataclasses
import enum
from typing import Any

from optuna_ds.domain._config import Config


class FailureReason(str, enum.Enum):
    """Why an experiment produced no metric. Stored on the trial, shown in the summary."""

    OOM = "oom"
    ERROR = "error"
    TIMEOUT = "timeout"
    NO_METRICS = "no-metrics"
    BAD_METRICS = "bad-metrics"  # a metrics file that is not JSON, or a metric that is not a positive finite number
    INTERRUPTED = "interrupted"  # stopped by the user, a dead worker, or lost (its exit status with the launch server): runs again
    PORT = "port"  # no rendezvous port free on the node, or its port taken at bind: the node's state; stops the tuning, runs again on resume
    SCRIPT = "script"  # failed whatever the config (the script's arguments, imports, files): stops the tuning, runs again on resume
    UNSUPPORTED = "unsupported"  # a setting this accelerator cannot run (an op DeepSpeed has no kernel for here): the setting's, not the stage's or the size's
    CHECKPOINTING = "checkpointing"  # the script or its model cannot checkpoint activations as set: the setting's, not the stage's or the size's
    AUTOTP = "autotp"  # AutoTP cannot shard the script's model, or its data differ within a tensor-parallel group: the setting's
    MACHINE = "machine"  # the machine's, not the config's (a disk full, a folder read-only, a node lost): stops the tuning, runs again on resume
    PRUNED = "pruned"  # ended before its window did, its steps clearly below the incumbent's (docs/steps.md): its partial figure kept

    @property
    def judges_config(self) -> bool:
        """Whether the failure says something about the config: the experiment is not run again."""
        return self not in (FailureReason.INTERRUPTED, FailureReason.SCRIPT, FailureReason.PORT, FailureReason.MACHINE)


class Phase(str, enum.Enum):
    """Why an experiment ran: the model's profile, a micro-batch size (the planner's), or a knob
    setting (the knob search's)."""

    PROFILE = "profile"
    MICRO_BATCH = "micro_batch"
    KNOBS = "knobs"


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One DeepSpeed run: its config, made a complete ``ds_config``, and where its files go.

    ``name`` is the identity of the run (:meth:`Config.run_name`; the profile run has its own).
    """

    name: str
    phase: Phase
    config: Config
    ds_config: dict[str, Any]
    result_dir: str
    # Script switches the config sets, by flag (the checkpointing switch ``arg_mappings`` maps):
    # on is the bare flag, off its absence.
    switches: dict[str, bool] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Its description, as its folder's ``exp.json`` and DeepSpeed's ``exps_dir`` hold it."""
        return {"name": self.name, "phase": self.phase.value, **self.config.to_attrs(), "ds_config": self.ds_config,
                "result_dir": self.result_dir}


@dataclasses.dataclass(frozen=True)
class ExperimentResult:
    """What happened to one experiment; ``reason`` is set exactly when it failed."""

    name: str
    returncode: int | None
    duration: float
    cmd: list[str]
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    reason: FailureReason | None = None
    detail: str = ""
    stderr_tail: str = ""
    peak_memory: int | None = None  # bytes, the most any of its GPUs used, where NVML reports it
    # The engine's per-step timer lines on rank 0 (ms by timer), oldest first: what it measured
    # step by step besides the one step its metrics file holds.
    logged_steps: tuple[dict[str, float], ...] = ()
    # What DeepSpeed's checkpointing logged it configured (``activation_checkpointing``'s keys),
    # where the script configured it: a section the run's script never read is seen so.
    checkpointing: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None
