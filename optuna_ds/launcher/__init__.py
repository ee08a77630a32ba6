"""Layer 4: launching DeepSpeed experiments on GPUs and classifying what happened."""

from optuna_ds.launcher._classify import OOM_PATTERNS
from optuna_ds.launcher._classify import classify
from optuna_ds.launcher._classify import telling_line
from optuna_ds.launcher._experiment import Experiment
from optuna_ds.launcher._experiment import ExperimentResult
from optuna_ds.launcher._experiment import FailureReason
from optuna_ds.launcher._experiment import Phase
from optuna_ds.launcher._gpu_memory import PeakGpuMemory
from optuna_ds.launcher._gpu_memory import gpu_memory_support
from optuna_ds.launcher._resources import LauncherOptions
from optuna_ds.launcher._resources import Resources
from optuna_ds.launcher._resources import Slot
from optuna_ds.launcher._resources import discover_resources
from optuna_ds.launcher._slots import Lease
from optuna_ds.launcher._slots import SlotPool
from optuna_ds.launcher._runner import ExperimentInterrupted
from optuna_ds.launcher._runner import ExperimentRunner
from optuna_ds.launcher._runner import deferred_signals
from optuna_ds.launcher._runner import kill_process_group

__all__ = [
    "Experiment",
    "ExperimentInterrupted",
    "ExperimentResult",
    "ExperimentRunner",
    "FailureReason",
    "LauncherOptions",
    "Lease",
    "OOM_PATTERNS",
    "PeakGpuMemory",
    "Phase",
    "Resources",
    "Slot",
    "SlotPool",
    "classify",
    "deferred_signals",
    "discover_resources",
    "gpu_memory_support",
    "kill_process_group",
    "telling_line",
]
