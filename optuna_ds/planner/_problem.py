from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from typing import Any

from optuna_ds.domain import Config
from optuna_ds.domain import Knobs as Knobs  # the planner's modules take it from here
from optuna_ds.domain import KnobsLike
from optuna_ds.domain import accumulation_for


@dataclasses.dataclass(frozen=True, order=True)
class Arm:
    """One throughput curve over the micro-batch size: a ZeRO stage with its offload variant.

    ``free`` is the device memory less the analytic estimate of the model states (parameters,
    gradients, optimizer states) at this stage: what activations, buffers and the CUDA context
    share. ``buffers`` is what its communication buckets are expected to take of that. ``cap``
    is the largest micro-batch size the config allows. ``knobs`` is the arm's knob space (each
    tuned knob with its values; none in fast mode) and ``knob_defaults`` what a config that
    leaves the knobs out runs with: a setting is scored by how it departs from those. ``kept``
    is the share of a sample's activation memory a config of it holds (below 1 with activation
    checkpointing or AutoTP: the memory model's estimate for the setting). ``autotp`` holds, for
    each AutoTP size the arm may run, ``(size, free, cap)``: the room its smaller model states
    leave and the largest size its batch bounds allow (:meth:`sharded`).
    """

    stage: int
    offload: str = ""
    free: float = dataclasses.field(default=0.0, compare=False)
    cap: int = dataclasses.field(default=1024, compare=False)
    buffers: float = dataclasses.field(default=0.0, compare=False)
    knobs: tuple[tuple[str, tuple[Any, ...]], ...] = dataclasses.field(default=(), compare=False)
    knob_defaults: Knobs = dataclasses.field(default=Knobs(), compare=False)
    kept: float = dataclasses.field(default=1.0, compare=False)
    autotp: tuple[tuple[int, float, int], ...] = dataclasses.field(default=(), compare=False)

    @property
    def key(self) -> tuple[int, str]:
        return (self.stage, self.offload)

    @property
    def label(self) -> str:
        return f"z{self.stage}" + (f" {self.offload}" if self.offload else "")

    @property
    def autotp_sizes(self) -> tuple[int, ...]:
        return tuple(size for size, _, _ in self.autotp)

    def sharded(self, size: int) -> Arm:
        """The arm as a config of it with AutoTP ``size`` sees it: its room and its cap."""
        for t, free, cap in self.autotp:
            if t == size:
                return dataclasses.replace(self, free=free, cap=cap)
        return self

    def departures(self, knobs: Iterable[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
        """The values of ``knobs`` that differ from what a default config of this arm runs
        with, compared as values: each in its one form (:class:`Knobs`), DeepSpeed's default
        ``5e8`` is the user's ``500000000``."""
        return tuple(kv for kv in knobs if kv not in self.knob_defaults)


@dataclasses.dataclass(frozen=True)
class KnobSetting:
    """A knob setting to score at an arm: a whole setting of the arm's tuned knobs, and what its
    communication buffers take of a GPU's memory (``None``: as the default config's). A leaner
    setting leaves room for a larger micro-batch, which may pay more than the knobs cost."""

    knobs: Knobs
    buffers: float | None = None


@dataclasses.dataclass(frozen=True)
class Problem:
    """What the planner knows before any experiment: the arms in the user's stage order, the
    micro-batch sizes allowed, and the memory figures of the profile run."""

    arms: tuple[Arm, ...]
    device_memory: float
    floor: int = 1
    sizes: tuple[int, ...] | None = None  # the user's list of micro-batch sizes: only these
    baseline: int | None = None  # the user's own size: measured first, at the first arm
    per_sample: float | None = None  # the profile's activation memory of one sample
    explicit: bool = False  # the user listed the stages: each that fits is measured
    max_experiments: int = 40
    # The batch bounds that set each size's gradient accumulation (:func:`accumulation_for`).
    max_batch: int | None = None
    min_batch: int = 1
    accumulation: int = 1
    gpus: int = 1  # the data-parallel GPUs of one experiment: knobs shape their collectives
    knob_sizes: int = 3  # knob settings are tried at an arm's this many best sizes (num_tuning_micro_batch_sizes)
    nodes: int = 1  # the nodes one experiment's ranks span: what ZeRO++ saves is inter-node bandwidth
    params: float = 0.0  # the model's parameters (the profile's; 0: unknown)
    # The activation-checkpointing settings to try at every arm, each the knobs it departs from
    # the defaults by (:mod:`optuna_ds.planner._checkpointing`); none: no such dimension.
    checkpointing: tuple[Knobs, ...] = ()
    # The AutoTP settings to try at the arms that can run them (``Arm.autotp``), and each size's
    # bounds on ``mbs * gas`` of one data-parallel rank, ``(size, max_batch, min_batch)``: its
    # ranks share a batch, so fewer ranks take the global one (:mod:`optuna_ds.planner._autotp`).
    autotp: tuple[Knobs, ...] = ()
    autotp_batch: tuple[tuple[int, int | None, int], ...] = ()
    hidden: int = 0  # the model's hidden size, where the user's model_info gives it (0: unknown)
    # The real training's samples (``--train-samples``/``--train-steps``), where the tuned metric
    # is throughput: what prices a launch (:func:`~optuna_ds.planner.launch_price`); ``None``: ``min_gain``.
    train_samples: float | None = None

    def arm(self, key: tuple[int, str]) -> Arm | None:
        return next((a for a in self.arms if a.key == key), None)

    def config(self, arm: Arm | tuple[int, str], mbs: int, knobs: KnobsLike = ()) -> Config:
        """The config of ``arm`` at size ``mbs``, with the accumulation the batch bounds give it."""
        stage, offload = arm.key if isinstance(arm, Arm) else arm
        knobs = Knobs(knobs)
        max_batch, min_batch = self.max_batch, self.min_batch
        for size, high, low in self.autotp_batch:
            if size == knobs.autotp:
                max_batch, min_batch = high, low
        accumulation = accumulation_for(mbs, max_batch=max_batch, min_batch=min_batch, default=self.accumulation)
        return Config(stage=stage, offload=offload, micro_batch=mbs, accumulation=accumulation, knobs=knobs)


class Status(enum.Enum):
    OK = "ok"
    OOM = "oom"
    FAILED = "failed"  # any other failure: it says nothing of memory
    RUNNING = "running"


class _OfConfig:
    """The config's fields, read through: what the planner's internals look at."""

    config: Config

    @property
    def stage(self) -> int:
        return self.config.stage

    @property
    def mbs(self) -> int:
        return self.config.micro_batch

    @property
    def offload(self) -> str:
        return self.config.offload

    @property
    def knobs(self) -> Knobs:
        return self.config.knobs

    @property
    def arm(self) -> tuple[int, str]:
        return self.config.arm


@dataclasses.dataclass(frozen=True)
class Observation(_OfConfig):
    """One experiment of ``config``, finished or running. ``score`` is the metric made positive
    and higher-better (a latency is inverted); ``seconds`` the experiment's duration (of a
    running one, how long it has run so far, ``None`` if unknown); ``repeat`` how many times
    its config ran before it (a re-measurement's is 1 or more); ``memory`` the peak memory of
    one of its GPUs in bytes, where the accelerator reports it; ``timers`` DeepSpeed's step
    timers (ms: ``fwd``, ``bwd``, ``bwd_allreduce``, ``step``, ...), where it logged them: what
    a lever can save is read from them (:func:`~optuna_ds.planner.communication_share`), and
    whether checkpointing recomputed; ``checkpointing`` what DeepSpeed's checkpointing logged
    it configured (empty: nothing, where its ranks log at INFO; ``None``: the output cannot
    tell); ``reason`` a failure's (``FailureReason`` value)."""

    config: Config
    status: Status
    score: float | None = None
    seconds: float | None = None
    repeat: int = 0
    memory: float | None = None
    timers: tuple[tuple[str, float], ...] = ()
    checkpointing: tuple[tuple[str, Any], ...] | None = None
    reason: str | None = None


@dataclasses.dataclass(frozen=True)
class Proposal(_OfConfig):
    """An experiment to start. ``repeat`` is how many times the config already ran: a
    re-measurement has ``repeat >= 1``."""

    config: Config
    repeat: int = 0
    why: str = ""


@dataclasses.dataclass(frozen=True)
class Choice(_OfConfig):
    """The config the planner would choose now: the best by the model's estimate among those
    that ran, not the highest single measurement."""

    config: Config
    estimate: float  # the model's score for it
    measured: float  # the robust level of its runs (robust_level): the figure it is judged and shown by


@dataclasses.dataclass(frozen=True)
class Decision:
    """The planner's answer: experiments to start now (at most one per free slot), or none;
    ``done`` once nothing left is worth an experiment and nothing is running."""

    proposals: tuple[Proposal, ...]
    done: bool
    choice: Choice | None
    noise: float | None  # the relative noise of one measurement: measured where noise_runs > 0, else assumed
    reason: str = ""
    noise_runs: int = 0  # the repeated runs the noise was measured from (runs beyond each config's first)
    # The measured configs a run cannot tell from the choice: their mean within one noise
    # deviation of the difference from the choice's, the choice first. A plateau is an answer.
    equivalent: tuple[Config, ...] = ()
    # Once done: what the choice is still expected to lose (a share of throughput) to the best
    # config measured or left untried (:func:`~optuna_ds.planner._planner.regret`).
    regret: float | None = None
