"""Layer 5: the commands that run a tuning, each a call: :func:`tune`, :func:`work` (a worker
on another node), :func:`report`, :func:`run_training`."""

from optuna_ds._tune._interrupts import TuningInterrupted
from optuna_ds._tune._outputs import TuneOutcome
from optuna_ds._tune._outputs import report
from optuna_ds._tune._training import run_training
from optuna_ds._tune._tune import TuneOptions
from optuna_ds._tune._tune import tune
from optuna_ds._tune._worker import WorkerOptions
from optuna_ds._tune._worker import work

__all__ = ["TuneOptions", "TuneOutcome", "TuningInterrupted", "WorkerOptions", "report", "run_training", "tune", "work"]
