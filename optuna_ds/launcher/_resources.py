from __future__ import annotations

import collections
import dataclasses
import functools
import os
import socket
from typing import Any

from optuna_ds._errors import ResourceError
from optuna_ds.launcher._options import DEFAULT_HOSTFILE
from optuna_ds.launcher._options import LauncherOptions
from optuna_ds.launcher._options import WHOLE_POOL_BACKENDS

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

    def restricted_to(self, names: frozenset[str] | set[str]) -> Resources:
        """Only the hosts called one of ``names`` (this node, for a worker), if any is."""
        mine = {h: ids for h, ids in self.hosts.items() if h in names}
        return dataclasses.replace(self, hosts=mine) if mine else self


@functools.cache
def local_host_names() -> frozenset[str]:
    """The names a hostfile or slot may give this node (cached: ``getfqdn`` may ask DNS)."""
    name = socket.gethostname()
    return frozenset({name, name.split(".")[0], socket.getfqdn(), "localhost", "127.0.0.1"})


def _accelerator() -> Any:
    from deepspeed.accelerator import get_accelerator

    return get_accelerator()


def device_kind() -> str:
    """What the accelerator's devices are, in words for people: ``GPU`` for CUDA (and ROCm),
    else DeepSpeed's accelerator name (``CPU``, ``XPU``, ``HPU``...)."""
    name = str(_accelerator().device_name())
    return "GPU" if name == "cuda" else name.upper()


def import_deepspeed() -> None:
    """Import what :func:`discover_resources` needs from DeepSpeed (and so torch): seconds of
    CPU, more on a node busy with experiments. A worker does it while it waits for the tuning's
    plan, so it joins as soon as the plan is stored."""
    from deepspeed.accelerator import get_accelerator  # noqa: F401
    from deepspeed.launcher import runner  # noqa: F401


def discover_resources(options: LauncherOptions) -> Resources:
    """Resolve the launcher options into concrete GPUs, with DeepSpeed's own parsers."""
    from deepspeed.launcher import runner

    options.validate()
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
    include = options.include
    if pool is None:
        try:
            count = _accelerator().device_count()
        except OSError as e:  # DeepSpeed's CPU accelerator runs numactl from PATH to count devices
            raise ResourceError(f"cannot count the accelerator's devices: {e}") from None
        if count == 0:
            raise ResourceError("no GPU found: the accelerator reports 0 devices")
        visible = visible_devices()
        include = include_of_visible_devices(options, visible)
        # Ids are the machine's, as the runner counts them with the variable unset.
        pool = {"localhost": max([count, *(i + 1 for i in visible)])}
    try:
        active = runner.parse_inclusion_exclusion(pool, include, options.exclude)
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
        raise ResourceError(f"--num_gpus {options.num_gpus} but a node has only {fewest} GPU(s)"
                            + (_cpu_devices(options.num_gpus) if not multi_node else ""))
    per_node = options.num_gpus if options.num_gpus > 0 else fewest
    resources = Resources(
        hosts=dict(active),
        gpus_per_node=per_node,
        nodes_per_experiment=nodes,
        device_memory=float(_accelerator().total_memory()),
        hostfile=hostfile,
        multi_node=multi_node,
    )
    _check_backend(options, resources)
    return resources


def _cpu_devices(wanted: int) -> str:
    """On DeepSpeed's CPU accelerator, where its devices come from: its NUMA nodes, or
    ``LOCAL_SIZE``; ``""`` on any other accelerator."""
    if str(_accelerator().device_name()) != "cpu":
        return ""
    return (": on DeepSpeed's CPU accelerator a node's devices are its NUMA nodes, or LOCAL_SIZE "
            f"of them where set (LOCAL_SIZE={wanted} runs {wanted} processes)")


def visible_devices() -> list[int]:
    """The ids in the accelerator's ``CUDA_VISIBLE_DEVICES`` (or its like), if set."""
    name = _accelerator().visible_devices_envs()[0]
    value = os.environ.get(name, "").strip()
    try:
        return [int(x) for x in value.split(",")] if value else []
    except ValueError:
        raise ResourceError(f"{name}={value!r} is not a list of device ids") from None


def include_of_visible_devices(options: LauncherOptions, visible: list[int]) -> str:
    """DeepSpeed's runner on one node: ``CUDA_VISIBLE_DEVICES`` becomes ``--include
    localhost:<ids>`` unless a selection flag was given, in which case it is ignored."""
    if not visible or options.include or options.exclude or options.num_nodes > 1 or options.num_gpus > 0:
        return options.include
    return "localhost:" + ",".join(map(str, visible))


def _check_backend(options: LauncherOptions, resources: Resources) -> None:
    """A multi-node experiment runs through ``--launcher``'s backend: refuse a split of the GPUs
    that DeepSpeed's backend cannot express, now rather than at every experiment."""
    from deepspeed.launcher import runner

    backend = options.launcher.lower()
    slots = resources.slots()
    if not resources.multi_node or not slots or not any(len(s.hosts) > 1 or options.force_multi for s in slots):
        return
    if backend in WHOLE_POOL_BACKENDS and slots[0].hosts != resources.hosts:
        raise ResourceError(
            f"--launcher {backend} cannot select GPUs (DeepSpeed's {backend} backend refuses --include/--num_gpus): "
            "an experiment must use every GPU of the hostfile"
        )
    backend_class = runner.LAUNCHER_CLASSES.get(backend)
    validate = getattr(backend_class, "validate_active_resources", None)
    if validate is not None:
        for slot in slots:
            try:
                validate(slot.hosts)
            except ValueError as e:
                raise ResourceError(f"--launcher {backend}: {e}") from None
