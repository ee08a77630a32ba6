from __future__ import annotations

import collections
import dataclasses
import os
from typing import Any

from optuna_ds._errors import ResourceError

DEFAULT_HOSTFILE = "/job/hostfile"
DEFAULT_MASTER_PORT = 29500


@dataclasses.dataclass(frozen=True)
class LauncherOptions:
    """DeepSpeed launcher options, as the user gave them to ``optuna-ds``."""

    num_gpus: int = -1
    num_nodes: int = -1
    hostfile: str | None = None
    include: str = ""
    exclude: str = ""
    master_port: int = DEFAULT_MASTER_PORT
    master_addr: str = ""

    def training_args(self) -> list[str]:
        """The options to pass to ``deepspeed`` for the final training run."""
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
        args += ["--master_port", str(self.master_port)]
        return args


@dataclasses.dataclass(frozen=True)
class Slot:
    """The GPUs one experiment runs on: ``{host: [gpu ids]}``."""

    hosts: dict[str, list[int]]

    @property
    def include(self) -> str:
        return "@".join(f"{h}:{','.join(map(str, ids))}" for h, ids in self.hosts.items())

    @property
    def num_gpus(self) -> int:
        return sum(len(ids) for ids in self.hosts.values())


@dataclasses.dataclass(frozen=True)
class Resources:
    """The GPUs this tuning may use and how many one experiment takes.

    Discovery follows DeepSpeed's launcher: hostfile slots, else the local accelerator's
    device count, filtered by ``--include``/``--exclude``, then ``--num_nodes`` and
    ``--num_gpus`` give the size of one experiment.
    """

    hosts: dict[str, list[int]]
    gpus_per_node: int
    nodes_per_experiment: int
    device_memory: float
    hostfile: str | None
    multi_node: bool

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes_per_experiment

    def slots(self) -> list[Slot]:
        """Split the GPUs into disjoint slots of one experiment's size."""
        if self.nodes_per_experiment > 1:
            names = list(self.hosts)[: self.nodes_per_experiment]
            return [Slot({h: self.hosts[h][: self.gpus_per_node] for h in names})]
        out = []
        for host, ids in self.hosts.items():
            for i in range(0, len(ids) - self.gpus_per_node + 1, self.gpus_per_node):
                out.append(Slot({host: ids[i : i + self.gpus_per_node]}))
        return out

    def restricted_to(self, names: set[str]) -> Resources:
        """Only the hosts called one of ``names`` (this node, for a worker), if any is."""
        mine = {h: ids for h, ids in self.hosts.items() if h in names}
        return dataclasses.replace(self, hosts=mine) if mine else self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _accelerator() -> Any:
    from deepspeed.accelerator import get_accelerator

    return get_accelerator()


def discover_resources(options: LauncherOptions) -> Resources:
    """Resolve the launcher options into concrete GPUs, with DeepSpeed's own parsers."""
    from deepspeed.launcher import runner

    if options.num_gpus == 0 or options.num_nodes == 0:
        raise ResourceError("--num_gpus and --num_nodes must be positive")
    if (options.include or options.exclude) and (options.num_gpus > 0 or options.num_nodes > 0):
        raise ResourceError("--num_gpus/--num_nodes cannot be combined with --include/--exclude")
    hostfile = options.hostfile
    if hostfile is not None and not os.path.isfile(hostfile):
        raise ResourceError(f"hostfile {hostfile} not found")
    if hostfile is None and os.path.isfile(DEFAULT_HOSTFILE):
        hostfile = DEFAULT_HOSTFILE
    pool: dict[str, int] | None = None
    if hostfile:
        try:
            with open(hostfile) as f:
                pool = runner._parse_hostfile(f.readlines())
        except (OSError, ValueError) as e:
            raise ResourceError(f"hostfile {hostfile}: {e}") from None
    multi_node = pool is not None
    if pool is None:
        count = _accelerator().device_count()
        if count == 0:
            raise ResourceError("no GPU found: the accelerator reports 0 devices")
        pool = {"localhost": count}
    try:
        active = runner.parse_inclusion_exclusion(pool, options.include, options.exclude)
    except (ValueError, KeyError) as e:
        raise ResourceError(f"--include/--exclude: {e}") from None
    active = collections.OrderedDict((h, list(ids)) for h, ids in active.items() if ids)
    if not active:
        raise ResourceError("--include/--exclude leave no GPU to run on")

    if options.num_nodes > len(active):
        raise ResourceError(f"--num_nodes {options.num_nodes} but only {len(active)} node(s) available")
    nodes = options.num_nodes if options.num_nodes > 0 else len(active)
    fewest = min(len(ids) for ids in active.values())
    if options.num_gpus > fewest:
        raise ResourceError(f"--num_gpus {options.num_gpus} but a node has only {fewest} GPU(s)")
    per_node = options.num_gpus if options.num_gpus > 0 else fewest
    return Resources(
        hosts=dict(active),
        gpus_per_node=per_node,
        nodes_per_experiment=nodes,
        device_memory=float(_accelerator().total_memory()),
        hostfile=hostfile,
        multi_node=multi_node,
    )
