"""DeepSpeed as the experiments run it: its ``deepspeed`` runner found, the experiment runner
built on it, and torch's extension build locks checked before anything waits on one."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence

from optuna_ds._errors import ConfigError
from optuna_ds.config import UserConfig
from optuna_ds.launcher import CommandBuilder
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import LauncherOptions
from optuna_ds.launcher import Resources
from optuna_ds.launcher import Spawn
from optuna_ds.launcher import stale_build_locks
from optuna_ds.storage import TuningPlan


def resolve_deepspeed_bin(path: str | None) -> list[str]:
    """The ``deepspeed`` runner command: ``--deepspeed-bin``, else the one on PATH or beside this Python."""
    if path is None:
        beside = os.path.join(os.path.dirname(sys.executable), "deepspeed")
        found = shutil.which("deepspeed") or (beside if os.access(beside, os.X_OK) else None)
        if found is None:
            raise ConfigError("'deepspeed' not found on PATH: install deepspeed or pass --deepspeed-bin PATH")
        return [found]
    if not os.path.isfile(path):
        found = shutil.which(path)
        if found is None:
            raise ConfigError(f"--deepspeed-bin {path} not found")
        path = found
    if path.endswith(".py"):
        return [sys.executable, os.path.abspath(path)]
    if not os.access(path, os.X_OK):
        raise ConfigError(f"--deepspeed-bin {path} is not executable")
    return [os.path.abspath(path)]


def is_deepspeed_runner(command: Sequence[str]) -> bool:
    """Whether ``command`` is DeepSpeed's own ``deepspeed`` entry point (its console script),
    so that its per-node launcher can be started directly for single-node experiments."""
    try:
        with open(command[-1], "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b"from deepspeed.launcher.runner import main" in head


def _commands(plan: TuningPlan, user: UserConfig, resources: Resources, deepspeed_bin: list[str], options: LauncherOptions) -> CommandBuilder:
    return CommandBuilder(
        deepspeed_bin=tuple(deepspeed_bin),
        script=plan.script,
        script_args=tuple(plan.script_args),
        arg_mappings=dict(user.arg_mappings),
        options=options,
        hostfile=resources.hostfile if resources.multi_node else None,
    )


def experiment_runner(plan: TuningPlan, user: UserConfig, resources: Resources, deepspeed_bin: list[str],
                      options: LauncherOptions, *, spawn: Spawn | None = None) -> ExperimentRunner:
    """The runner of the tuning's experiments; ``spawn`` starts each launcher (a real process by default)."""
    return ExperimentRunner(
        commands=_commands(plan, user, resources, deepspeed_bin, options),
        master_port=options.base_port,
        metric_key=user.autotuning.tuned_metric.key,
        exps_dir=plan.exps_dir,
        local_start=is_deepspeed_runner(deepspeed_bin) and spawn is None,
        spawn=spawn,
    )


def check_build_locks() -> None:
    """A stale build lock is one line now, not every experiment timed out waiting on it. Not in
    a worker: its extension folder may be shared (NFS) with the node whose experiment is
    building the op, a process this node cannot see."""
    stale = stale_build_locks()
    if stale:
        raise ConfigError(f"torch's extension build lock {stale[0]} was left by an interrupted build (no process holds it): every "
                          "experiment would wait on it until it times out; remove it and run again")
