"""Layer 2: launching DeepSpeed experiments on GPUs and classifying what happened."""

from optuna_ds.launcher._classify import BadMetrics
from optuna_ds.launcher._classify import classify
from optuna_ds.launcher._classify import is_measurement
from optuna_ds.launcher._classify import read_metrics
from optuna_ds.launcher._classify import read_tail
from optuna_ds.launcher._classify import telling_line
from optuna_ds.launcher._commands import CommandBuilder
from optuna_ds.launcher._commands import shell_line
from optuna_ds.launcher._environment import child_environment
from optuna_ds.launcher._gpu_memory import PeakGpuMemory
from optuna_ds.launcher._gpu_memory import gpu_memory_support
from optuna_ds.launcher._ops import build_cpu_ops
from optuna_ds.launcher._ops import cpu_op_sources
from optuna_ds.launcher._ops import cpu_ops_to_build
from optuna_ds.launcher._ops import extensions_root
from optuna_ds.launcher._ops import watching_build
from optuna_ds.launcher._ops import ops_environment
from optuna_ds.launcher._ops import release_build_locks
from optuna_ds.launcher._ops import stale_build_locks
from optuna_ds.launcher._options import REFUSED_FLAGS
from optuna_ds.launcher._options import LauncherOptions
from optuna_ds.launcher._parent_death import dies_with_this_process
from optuna_ds.launcher._paths import ExperimentFiles
from optuna_ds.launcher._paths import ResultsFiles
from optuna_ds.launcher._ports import check_ports
from optuna_ds.launcher._resources import Resources
from optuna_ds.launcher._resources import Slot
from optuna_ds.launcher._resources import device_kind
from optuna_ds.launcher._resources import discover_resources
from optuna_ds.launcher._resources import import_deepspeed
from optuna_ds.launcher._resources import local_host_names
from optuna_ds.launcher._live import Judge
from optuna_ds.launcher._runner import ExperimentInterrupted
from optuna_ds.launcher._runner import ExperimentRunner
from optuna_ds.launcher._runner import Spawn
from optuna_ds.launcher._runner import deferred_signals
from optuna_ds.launcher._runner import kill_process_group
from optuna_ds.launcher._slots import Lease
from optuna_ds.launcher._slots import SlotPool
from optuna_ds.launcher._steps import StepMeasurement
from optuna_ds.launcher._steps import measure_steps
from optuna_ds.launcher._steps import later_window
from optuna_ds.launcher._steps import profile_window
from optuna_ds.launcher._steps import profiled_steps
from optuna_ds.launcher._steps import still_falling
from optuna_ds.launcher._steps import step_time_ms
from optuna_ds.launcher._steps import read_finished
from optuna_ds.launcher._steps import read_step_timers
from optuna_ds.launcher._tracking import MARK_VAR
from optuna_ds.launcher._tracking import end_marked
from optuna_ds.launcher._tracking import new_mark

__all__ = [
    "Judge",
    "BadMetrics",
    "CommandBuilder",
    "ExperimentFiles",
    "REFUSED_FLAGS",
    "ResultsFiles",
    "shell_line",
    "ExperimentInterrupted",
    "ExperimentRunner",
    "LauncherOptions",
    "MARK_VAR",
    "Lease",
    "PeakGpuMemory",
    "Resources",
    "Slot",
    "StepMeasurement",
    "measure_steps",
    "step_time_ms",
    "profiled_steps",
    "later_window",
    "profile_window",
    "still_falling",
    "read_finished",
    "read_step_timers",
    "read_tail",
    "SlotPool",
    "Spawn",
    "check_ports",
    "child_environment",
    "classify",
    "build_cpu_ops",
    "cpu_op_sources",
    "cpu_ops_to_build",
    "extensions_root",
    "watching_build",
    "deferred_signals",
    "dies_with_this_process",
    "end_marked",
    "gpu_memory_support",
    "device_kind",
    "discover_resources",
    "import_deepspeed",
    "is_measurement",
    "kill_process_group",
    "local_host_names",
    "new_mark",
    "ops_environment",
    "release_build_locks",
    "stale_build_locks",
    "read_metrics",
    "telling_line",
]
