from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Memory per GPU needed to instantiate training at one ZeRO stage, in bytes.

    Parameters count in full; gradients and optimizer states count only trainable parameters
    (frozen PEFT weights have neither). Stage 1 partitions optimizer states over the
    data-parallel ranks, stage 2 gradients too, stage 3 parameters too; offloaded states
    leave the GPU. ``buffers`` are the communication buckets ZeRO allocates: not part of
    :attr:`instantiation` (DeepSpeed's own estimate leaves them out, and so does the decision
    whether a stage fits), but where the planner expects a stage's memory beyond its states.
    ZeRO++'s hpZ secondary partition counts there too: DeepSpeed allocates it at the first
    forward's all-gather, not at instantiation, and it moves with a knob setting as buckets do.
    """

    stage: int
    params: float
    gradients: float
    optimizer: float
    activation_per_sample: float
    device_memory: float
    max_micro_batch_size: int
    buffers: float = 0.0

    @property
    def instantiation(self) -> float:
        return self.params + self.gradients + self.optimizer

    @property
    def fits(self) -> bool:
        return self.max_micro_batch_size >= 1

    @property
    def states_fit(self) -> bool:
        """The model states alone fit: whether one sample's activations fit too rests on the
        profile's activation estimate, which can be off by a factor."""
        return self.instantiation < self.device_memory

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["instantiation"] = self.instantiation
        return d


def _offloaded(zero: dict[str, Any], key: str) -> bool:
    section = zero.get(key)
    return isinstance(section, dict) and section.get("device", "none") not in ("none", None)


def estimate_memory(
    *,
    stage: int,
    num_params: int,
    trainable_params: int | None,
    activation_per_sample: float | None,
    device_memory: float,
    num_gpus: int,
    mp_size: int = 1,
    precision: str = "fp32",
    adam_type: bool = True,
    zero: dict[str, Any] | None = None,
) -> MemoryEstimate:
    """Estimate the memory of one GPU at ``stage``; ``max_micro_batch_size`` is what remains
    for activations divided by the activation memory of one sample (0: does not fit).

    Without an activation measurement the micro-batch bound is left to the real OOM edge:
    ``max_micro_batch_size`` is then a large sentinel when the states fit.
    """
    zero = zero or {}
    trainable = num_params if trainable_params is None else trainable_params
    dp = max(1, num_gpus // mp_size)
    half = precision in ("fp16", "bf16")
    param_bytes = 2 if half else 4
    # Adam keeps two fp32 moments; mixed precision adds an fp32 master copy of the weights.
    optim_bytes = (8 if adam_type else 4) + (4 if half else 0)

    params = num_params * param_bytes / mp_size
    gradients = trainable * param_bytes / mp_size
    optimizer = trainable * optim_bytes / mp_size
    if stage >= 1:
        optimizer /= dp
    if stage >= 2:
        gradients /= dp
    if stage >= 3:
        params /= dp
    if stage >= 1 and _offloaded(zero, "offload_optimizer"):
        # The optimizer on the host takes the gradients there too, bucket by bucket (the buckets
        # are ``buffers``): DeepSpeed's own estimators count only the 16-bit parameters on the GPU
        # with ``cpu_offload`` (``estimate_zero2/3_model_states_mem_needs``).
        optimizer = gradients = 0.0
    if stage >= 3 and _offloaded(zero, "offload_param"):
        params = 0.0
    buffers = 0.0
    if stage >= 1:
        buffers += _number(zero.get("reduce_bucket_size"), 5e8) * param_bytes
    if stage in (1, 2):
        buffers += _number(zero.get("allgather_bucket_size"), 5e8) * param_bytes
        if zero.get("overlap_comm") is True:
            # DeepSpeed's ZeRO docs: with overlap_comm, the buckets take 4.5 times their size
            # (5e8-element buckets in fp16: 9 GB).
            buffers *= 4.5
    if stage >= 3 and not _offloaded(zero, "offload_param"):
        buffers += hpz_secondary(num_params / mp_size, zero.get("zero_hpz_partition_size"), param_bytes=param_bytes)

    free = device_memory - (params + gradients + optimizer)
    if free <= 0:
        max_mbs = 0
    elif activation_per_sample and activation_per_sample > 0:
        max_mbs = int(free // activation_per_sample)
    else:
        max_mbs = 1 << 30
    return MemoryEstimate(
        stage=stage,
        params=params,
        gradients=gradients,
        optimizer=optimizer,
        activation_per_sample=float(activation_per_sample or 0.0),
        device_memory=float(device_memory),
        max_micro_batch_size=max_mbs,
        buffers=buffers,
    )


def hpz_secondary(num_params: float, hpz: Any, *, param_bytes: int) -> float:
    """Bytes per GPU of ZeRO++'s hpZ secondary partition: with ``zero_hpz_partition_size`` > 1,
    each rank keeps the parameters partitioned over its hpZ group a second time, in the
    parameters' dtype (``_partition_param_sec``: ``numel / num_ranks_in_param_group`` elements), so
    the backward all-gather stays within the group. With ``offload_param`` DeepSpeed puts it
    beside the primary partition, off the GPU; a list (a tuned knob) or 1 holds none."""
    if not isinstance(hpz, (int, float)) or isinstance(hpz, bool) or hpz <= 1:
        return 0.0
    return num_params * param_bytes / hpz


def _number(value: Any, default: float) -> float:
    """A bucket size as configured; lists (a tuned knob) and "auto" count as the default."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default
