"""The levers DeepSpeed added after its autotuner's space (2022): ZeRO++ and the offload
variants, each a dimension only where it can act on the job.

DeepCompile (``"compile": {"deepcompile": true}``) is no dimension: the config alone compiles
nothing. DeepSpeed 0.19.8 acts on it only in ``engine.compile()``, which the script must call;
without it the engine logs "DeepCompile is enabled but engine.compile() has not been called;
executing without DeepCompile" and runs as before, so every launch spent on it would measure
noise. A user who calls ``compile()`` can still list it in their config.
"""
from __future__ import annotations

import functools
import platform
import typing
from typing import Any

# ZeRO++ (DeepSpeed's ZeRO++ tutorial; zero/config.py): quantized weights for the all-gather
# (qwZ), quantized gradients for the reduce-scatter (qgZ), and a secondary partition of the
# parameters of ``zero_hpz_partition_size`` ranks (hpZ). Stage 3 only: stages 1 and 2 pass none
# of them to their optimizer.
ZEROPP = ("zero_quantized_weights", "zero_quantized_gradients", "zero_hpz_partition_size")
# Stores the frozen weights quantized (LoRA): it changes what trains, so it is never proposed,
# only tuned where the user lists it.
ZEROPP_STORED = "zero_quantized_nontrainable_weights"
SUPER_OFFLOAD = "offload_optimizer.super_offload"
# An offload key that selects an offload variant, not a setting of one: the planner's arms.
OFFLOAD_DEVICE = "device"


def zeropp_space(stage: int, *, ranks: int, ranks_per_node: int) -> dict[str, list[Any]]:
    """The ZeRO++ dimensions proposed at ``stage`` for ``ranks`` data-parallel ranks,
    ``ranks_per_node`` to a node.

    ZeRO++ is proposed where the ranks span nodes: what it saves is inter-node bandwidth. qwZ
    quantizes the all-gather of the weights (ZeRO-3, more than one rank); qgZ acts only where
    the ranks span nodes: on one node DeepSpeed 0.19.8's stage 3 reduces the
    gradients unquantized whatever the setting (``num_nodes > 1`` in ``__avg_scatter_grads``).
    hpZ keeps a secondary copy of the parameters within ``zero_hpz_partition_size`` ranks, so
    the backward all-gather stays there: DeepSpeed's tutorial sets it to the GPUs of a node, and
    it pays only where the ranks span nodes (on one node the secondary group is the primary).
    """
    if stage != 3 or ranks <= 1 or not spans_nodes(ranks=ranks, ranks_per_node=ranks_per_node):
        # Within one node the collectives run over its own links (NVLink, PCIe), which ZeRO++
        # was not made for: it trades quantization work for inter-node bandwidth, and a job
        # where it cannot pay spends no launch on it (a list of it still tunes it).
        return {}
    space: dict[str, list[Any]] = {"zero_hpz_partition_size": [1, ranks_per_node]}
    # The quantizers are CUDA kernels: DeepSpeed's CPU accelerator raises "not implemented on
    # CPU backend" in every rank, which then hang until the trial's timeout.
    if quantizer_kernels():
        space.update(zero_quantized_weights=[False, True], zero_quantized_gradients=[False, True])
    return space


@functools.cache
def quantizer_kernels() -> bool:
    """Whether DeepSpeed's accelerator here has the quantizer kernels ZeRO++'s qwZ and qgZ run
    (not its CPU accelerator)."""
    from deepspeed.accelerator import get_accelerator

    return str(get_accelerator().device_name()) != "cpu"


def spans_nodes(*, ranks: int, ranks_per_node: int) -> bool:
    return ranks > ranks_per_node >= 1 and ranks % ranks_per_node == 0


def offload_space(stage: int, section: dict[str, Any], *, superchip: bool) -> dict[str, list[Any]]:
    """The offload dimensions proposed for a config whose ``offload_optimizer`` is ``section``.

    SuperOffload (``offload_config.py``: "high performance CPU offloading for Superchips. Only
    valid with ZeRO Stage 3"; its optimizer asserts a CUDA accelerator) is proposed for ZeRO-3
    optimizer offload to the CPU on a Grace-Hopper-class node. ``pin_memory`` is never
    proposed: DeepSpeed defaults it on, its docs say it is required for asynchronous
    full-bandwidth transfers and to turn it off only where ``ulimit -l`` or RAM forbid it, so
    turning it off never buys speed; it is tuned where the user lists it.
    """
    if stage != 3 or not superchip or section.get(OFFLOAD_DEVICE) != "cpu" or "super_offload" in section:
        return {}
    return {SUPER_OFFLOAD: [False, True]}


def is_superchip() -> bool:
    """Whether this node is a Superchip (an Arm CPU beside CUDA GPUs, GH200/GB200), where
    DeepSpeed's SuperOffload is meant to run."""
    if platform.machine().lower() not in ("aarch64", "arm64"):
        return False
    from deepspeed.accelerator import get_accelerator

    return str(get_accelerator().device_name()) == "cuda"


def applies(path: str, *, stage: int, ranks: int, ranks_per_node: int) -> bool:
    """Whether a list under ``path`` (dotted, inside ``zero_optimization``) is a dimension at
    ``stage`` with ``ranks`` data-parallel ranks: ZeRO++ and SuperOffload act at stage 3 only,
    ZeRO++ only between ranks, qgZ only between nodes (see :func:`zeropp_space`)."""
    if path == "zero_quantized_gradients":
        return stage == 3 and spans_nodes(ranks=ranks, ranks_per_node=ranks_per_node)
    if path in (*ZEROPP, ZEROPP_STORED):
        return stage == 3 and (ranks > 1 or path == ZEROPP_STORED)
    if path == SUPER_OFFLOAD:
        return stage == 3
    return True


@functools.cache
def deepspeed_default(path: str) -> Any:
    """DeepSpeed's default for ``zero_optimization.<path>`` (dotted), read from its config
    models: what a config that leaves the key out runs with."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from pydantic import BaseModel

    model: Any = DeepSpeedZeroConfig
    *sections, key = path.split(".")
    for name in sections:
        annotation = model.model_fields[name].annotation
        model = next(c for c in (annotation, *typing.get_args(annotation)) if isinstance(c, type) and issubclass(c, BaseModel))
    return model.model_fields[key].default
