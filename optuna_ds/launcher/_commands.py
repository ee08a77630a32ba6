from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from optuna_ds.config import replace_config_path
from optuna_ds.config import set_arg
from optuna_ds.config import set_switch
from optuna_ds.launcher._options import WHOLE_POOL_BACKENDS
from optuna_ds.launcher._options import LauncherOptions
from optuna_ds.launcher._paths import rank_log_dir
from optuna_ds.launcher._resources import Slot


def lookup(config: dict[str, Any], key: str) -> Any:
    """Find ``key`` anywhere in a nested config, as DeepSpeed's ``arg_mappings`` do."""
    if key in config:
        return config[key]
    for value in config.values():
        if isinstance(value, dict):
            found = lookup(value, key)
            if found is not None:
                return found
    return None


def shell_line(command: Sequence[str]) -> str:
    """``command`` as one shell line that runs exactly this argv when pasted."""
    return shlex.join(command)


@dataclasses.dataclass(frozen=True)
class CommandBuilder:
    """The one place that turns a config into a command line: every experiment, the profile
    run, ``cmd_optimal.txt`` and ``optuna-ds run``'s training.

    ``deepspeed_bin`` is the ``deepspeed`` runner's command. ``hostfile`` is passed to
    experiments only when the GPUs come from one (multi-node tuning).
    """

    deepspeed_bin: tuple[str, ...]
    script: str
    script_args: tuple[str, ...]
    arg_mappings: dict[str, str]
    options: LauncherOptions = LauncherOptions()
    hostfile: str | None = None

    def script_args_for(self, config: dict[str, Any], config_path: str, switches: Mapping[str, bool] | None = None) -> list[str]:
        """The script's arguments pointing at ``config_path``, with every ``arg_mappings`` flag
        set from ``config`` (nested keys included), and each switch of ``switches`` on (the bare
        flag) or off (none)."""
        args = replace_config_path(self.script_args, config_path)
        for key, flag in self.arg_mappings.items():
            value = lookup(config, key)
            if value is not None and value != "auto":
                args = set_arg(args, flag, _arg_value(value))
        for flag, on in (switches or {}).items():
            args = set_switch(args, flag, on)
        return args

    def rank_log_dir(self, experiment_name: str) -> str | None:
        if self.options.enable_each_rank_log == "None":
            return None
        return rank_log_dir(self.options.enable_each_rank_log, experiment_name)

    def experiment(self, *, name: str, config: dict[str, Any], config_path: str, slot: Slot, port: int,
                   switches: Mapping[str, bool] | None = None) -> list[str]:
        """An experiment (or the profile run) as a ``deepspeed`` runner command line: the slot's
        GPUs as ``--include``, the slot's port, every other flag as the user gave it."""
        selection: list[str] = []
        if self.hostfile:
            selection += ["--hostfile", self.hostfile]
        selection += self._slot_selection(slot)
        selection += ["--master_port", str(port)]
        if self.options.master_addr:
            selection += ["--master_addr", self.options.master_addr]
        rank_logs = self.rank_log_dir(name)
        if rank_logs is not None:
            selection += ["--enable_each_rank_log", rank_logs]
        return [*self.deepspeed_bin, *selection, *self.options.passthrough_args(), self.script,
                *self.script_args_for(config, config_path, switches)]

    def _slot_selection(self, slot: Slot) -> list[str]:
        if self.hostfile and self.options.launcher.lower() in WHOLE_POOL_BACKENDS and len(slot.hosts) > 1:
            return []  # those backends take the whole hostfile (checked when the GPUs were discovered)
        return ["--include", slot.include]

    def is_local(self, slot: Slot) -> bool:
        """Whether DeepSpeed's runner would start this slot's ranks on this node with its
        per-node launcher, without a multi-node backend."""
        return len(slot.hosts) == 1 and not self.options.force_multi

    def local_launch(self, *, name: str, config: dict[str, Any], config_path: str, slot: Slot, port: int,
                     switches: Mapping[str, bool] | None = None) -> list[str]:
        """The arguments of ``deepspeed.launcher.launch`` for a single-node experiment, as
        DeepSpeed's runner computes them (its ``main``'s local branch): the world info of the
        slot, the rendezvous, and the per-node flags."""
        from deepspeed.launcher.runner import encode_world_info

        o = self.options
        args = [
            f"--world_info={encode_world_info(slot.hosts)}",
            # Without a hostfile the runner always rendezvouses on 127.0.0.1, whatever was given.
            f"--master_addr={(o.master_addr if self.hostfile else '') or '127.0.0.1'}",
            f"--master_port={port}",
        ]
        args += [f"--{flag}" for flag in ("no_python", "module", "no_local_rank") if getattr(o, flag)]
        rank_logs = self.rank_log_dir(name)
        args.append(f"--enable_each_rank_log={rank_logs or 'None'}")
        if o.bind_cores_to_rank:
            args.append("--bind_cores_to_rank")
        if o.bind_core_list is not None:
            args.append(f"--bind_core_list={o.bind_core_list}")
        args.append(f"--log_level={o.log_level}")
        return [*args, self.script, *self.script_args_for(config, config_path, switches)]

    def training(self, *, config: dict[str, Any], config_path: str, switches: Mapping[str, bool] | None = None) -> list[str]:
        """The final training with the optimal config (and its script ``switches``): the user's
        launcher flags as given (no port unless the user gave one: DeepSpeed picks its own)."""
        return [*self.deepspeed_bin, *self.options.training_args(), self.script, *self.script_args_for(config, config_path, switches)]


def local_launch_command(launch_args: Sequence[str]) -> list[str]:
    """The per-node launcher as its own process, as DeepSpeed's runner spawns it."""
    return [sys.executable, "-u", "-m", "deepspeed.launcher.launch", *launch_args]


def _arg_value(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
