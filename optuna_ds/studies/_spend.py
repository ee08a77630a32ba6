"""What a tuning cost in experiments and device time."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from optuna.trial import FrozenTrial

from optuna_ds.config import format_number
from optuna_ds.domain import Run
from optuna_ds.domain import read_runs


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


def experiment_seconds(run: Run) -> float | None:
    """How long a run's experiment ran: the runner's measure, else (an interrupted one) the
    trial's wall time; ``None`` when it launched nothing."""
    trial, record = run
    if record.duration is not None:
        return float(record.duration)
    if record.launched and trial.datetime_start and trial.datetime_complete:
        return (trial.datetime_complete - trial.datetime_start).total_seconds()
    return None


def tuning_spend(trials: Iterable[FrozenTrial], *, profile_seconds: float | None, gpus_per_experiment: int,
                 device: str = "") -> Spend:
    """What ``trials`` cost (:func:`spend_of` their runs)."""
    return spend_of(read_runs(trials), profile_seconds=profile_seconds, gpus_per_experiment=gpus_per_experiment, device=device)


def spend_of(runs: Iterable[Run], *, profile_seconds: float | None, gpus_per_experiment: int, device: str = "") -> Spend:
    """What ``runs`` cost, with the profile run's ``profile_seconds``."""
    seconds = [s for run in runs if (s := experiment_seconds(run)) is not None]
    if profile_seconds is not None:
        seconds.append(profile_seconds)
    return Spend(experiments=len(seconds), gpu_seconds=sum(seconds) * gpus_per_experiment, profiled=profile_seconds is not None,
                 device=device, gpus_per_experiment=gpus_per_experiment)
