from __future__ import annotations

import dataclasses
import os
import re

from optuna_ds._errors import ResourceError

DEFAULT_HOSTFILE = "/job/hostfile"
DEFAULT_MASTER_PORT = 29500  # DeepSpeed's TORCH_DISTRIBUTED_DEFAULT_PORT
BACKENDS = ("pdsh", "openmpi", "mvapich", "slurm", "mpich", "impi")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# Backends whose DeepSpeed runner refuses --include/--exclude/--num_gpus/--num_nodes: an
# experiment on them takes every GPU of the hostfile.
WHOLE_POOL_BACKENDS = frozenset({"openmpi", "mvapich", "mpich", "impi"})
# DeepSpeed launcher flags optuna-ds cannot honour, and why (refused in one line).
REFUSED_FLAGS = {
    "--no_ssh": "each experiment is started from one node; --no_ssh needs the same command run by hand on every node",
    "--node_rank": "it only goes with --no_ssh",
    "--autotuning": "optuna-ds tune and optuna-ds run replace `deepspeed --autotuning tune|run`",
}
_CORE_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


@dataclasses.dataclass(frozen=True)
class LauncherOptions:
    """DeepSpeed launcher flags as the user gave them to ``optuna-ds``, in DeepSpeed's names.

    The GPU-selection flags (hostfile, include, exclude, num_nodes, num_gpus) define the GPUs
    the tuning may use; each experiment gets its slot of them as ``--include``. The others
    reach every experiment and the final training unchanged. ``master_port`` is ``None`` when
    not given: experiments then use DeepSpeed's default port plus the slot's index, and the
    optimal command leaves it to DeepSpeed.
    """

    num_gpus: int = -1
    num_nodes: int = -1
    hostfile: str | None = None
    include: str = ""
    exclude: str = ""
    master_port: int | None = None
    master_addr: str = ""
    launcher: str = "pdsh"
    launcher_args: str = ""
    module: bool = False
    no_python: bool = False
    no_local_rank: bool = False
    no_ssh_check: bool = False
    force_multi: bool = False
    save_pid: bool = False
    enable_each_rank_log: str = "None"
    bind_cores_to_rank: bool = False
    bind_core_list: str | None = None
    ssh_port: int | None = None
    venv_script: str | None = None
    log_level: str = "info"

    @property
    def base_port(self) -> int:
        return DEFAULT_MASTER_PORT if self.master_port is None else self.master_port

    def validate(self) -> None:
        """Refuse what DeepSpeed would refuse, before anything runs: one line naming the flag."""
        if self.num_gpus == 0 or self.num_gpus < -1:
            raise ResourceError(f"--num_gpus must be a positive number of GPUs per node, got {self.num_gpus}")
        if self.num_nodes == 0 or self.num_nodes < -1:
            raise ResourceError(f"--num_nodes must be a positive number of nodes, got {self.num_nodes}")
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise ResourceError(f"--master_port must be a port number in 1..65535, got {self.master_port}")
        if self.ssh_port is not None and not 1 <= self.ssh_port <= 65535:
            raise ResourceError(f"--ssh_port must be a port number in 1..65535, got {self.ssh_port}")
        if self.include and self.exclude:
            raise ResourceError("--include and --exclude are mutually exclusive")
        if (self.include or self.exclude) and (self.num_gpus > 0 or self.num_nodes > 0):
            raise ResourceError("--num_gpus/--num_nodes cannot be combined with --include/--exclude")
        if self.launcher.lower() not in BACKENDS:
            raise ResourceError(f"--launcher must be one of {', '.join(BACKENDS)} (DeepSpeed's multi-node backends), got {self.launcher!r}")
        if self.log_level not in LOG_LEVELS:
            raise ResourceError(f"--log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if self.module and self.no_python:
            raise ResourceError("--module and --no_python cannot be used together")
        if self.bind_core_list is not None and not _CORE_LIST.match(self.bind_core_list):
            raise ResourceError(f"--bind_core_list must look like 1,3-5,7, got {self.bind_core_list!r}")
        if self.enable_each_rank_log != "None" and os.path.isfile(self.enable_each_rank_log):
            raise ResourceError(f"--enable_each_rank_log {self.enable_each_rank_log} is a file, not a directory")
        if self.venv_script is not None and not os.path.isfile(self.venv_script):
            raise ResourceError(f"--venv_script {self.venv_script} not found")

    def passthrough_args(self) -> list[str]:
        """The flags that reach every launch unchanged, as DeepSpeed's runner spells them.

        ``--save_pid`` is left to the final training: for an experiment it would only leave
        a pid file in /tmp.
        """
        args: list[str] = []
        if self.launcher != "pdsh":
            args += ["--launcher", self.launcher]
        if self.launcher_args:
            args += ["--launcher_args", self.launcher_args]
        for flag in ("module", "no_python", "no_local_rank", "no_ssh_check", "force_multi", "bind_cores_to_rank"):
            if getattr(self, flag):
                args.append(f"--{flag}")
        if self.bind_core_list is not None:
            args += ["--bind_core_list", self.bind_core_list]
        if self.ssh_port is not None:
            args += ["--ssh_port", str(self.ssh_port)]
        if self.venv_script is not None:
            args += ["--venv_script", self.venv_script]
        if self.log_level != "info":
            args += ["--log_level", self.log_level]
        return args

    def training_args(self) -> list[str]:
        """The launcher flags of the final training run, as the user gave them."""
        args: list[str] = []
        if self.hostfile:
            args += ["--hostfile", self.hostfile]
        if self.include:
            args += ["--include", self.include]
        if self.exclude:
            args += ["--exclude", self.exclude]
        if self.num_nodes > 0:
            args += ["--num_nodes", str(self.num_nodes)]
        if self.num_gpus > 0:
            args += ["--num_gpus", str(self.num_gpus)]
        if self.master_addr:
            args += ["--master_addr", self.master_addr]
        if self.master_port is not None:
            args += ["--master_port", str(self.master_port)]
        if self.save_pid:
            args.append("--save_pid")
        if self.enable_each_rank_log != "None":
            args += ["--enable_each_rank_log", self.enable_each_rank_log]
        return args + self.passthrough_args()
