"""Activation checkpointing as a dimension of the tuning (issue 37): it frees most of the
activation memory of a sample for one more forward pass, so a larger micro-batch size may fit
and win.

Two ways reach it, one per kind of script:

- The script's own switch, where ``autotuning.arg_mappings`` maps ``gradient_checkpointing`` to
  its flag (``--gradient_checkpointing``, the Hugging Face Trainer's; Megatron-style scripts name
  theirs ``--checkpoint-activations``): on is the bare flag, off its absence, which both the
  Trainer's parser and a ``store_true`` flag read so. Proposed by default there, as the micro-batch
  size is mapped: the user's mapping says the script takes it. Where the user's arguments turn
  it on already, it is their setting and no dimension.
- The ``activation_checkpointing`` section DeepSpeed's checkpointing API reads
  (``deepspeed.checkpointing.configure(mpu, deepspeed_config=...)``; the engine never does): it
  sets how the checkpoints of a script that calls ``deepspeed.checkpointing.checkpoint`` are kept,
  not whether it recomputes. Tuned only where the user lists a key's values, as for the ZeRO
  keys: ``cpu_checkpointing`` (the checkpoints in host memory), ``partition_activations`` and
  ``contiguous_memory_optimization`` (partitions over the model-parallel ranks, so only where
  ``mp_size`` > 1: with one, each partition is the whole tensor). ``number_checkpoints`` is a
  count of the model's checkpoints, never a dimension; ``synchronize_checkpoint_boundary`` and
  ``profile`` free nothing and only cost, so a list of them tunes nothing (DeepSpeed's default runs).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
from collections.abc import Mapping
from typing import Any

from optuna_ds.domain import CHECKPOINTING_SECTION
from optuna_ds.domain import CHECKPOINTING_SWITCH
from optuna_ds.domain import Knobs

# The section's keys whose lists are a dimension, and those that act only between
# model-parallel ranks (DeepSpeed partitions the checkpoints over them).
SECTION_DIMENSIONS = ("cpu_checkpointing", "partition_activations", "contiguous_memory_optimization")
MODEL_PARALLEL_ONLY = frozenset({"partition_activations", "contiguous_memory_optimization"})
# Keys whose lists tune nothing: a barrier and a profiler, which free no memory.
SECTION_COST_ONLY = frozenset({"synchronize_checkpoint_boundary", "profile"})
NUMBER_CHECKPOINTS = "number_checkpoints"


@functools.cache
def section_defaults() -> dict[str, Any]:
    """DeepSpeed's defaults of the ``activation_checkpointing`` section, from its own table."""
    from deepspeed.runtime.activation_checkpointing.config import ACT_CHKPT_DEFAULT

    return dict(ACT_CHKPT_DEFAULT)


def knob_path(key: str) -> str:
    """A section key as the knob a config sets (``activation_checkpointing.cpu_checkpointing``)."""
    return f"{CHECKPOINTING_SECTION}.{key}"


def checkpointing_defaults() -> dict[str, Any]:
    """What a config that leaves each checkpointing knob out runs with: the switch off, the
    section at DeepSpeed's defaults."""
    return {CHECKPOINTING_SWITCH: False, **{knob_path(k): v for k, v in section_defaults().items()}}


def valid(section: Mapping[str, Any]) -> bool:
    """Whether DeepSpeed's ``configure()`` accepts the section's values: contiguous checkpoints
    need partitioned activations and ``number_checkpoints`` (it asserts both)."""
    if section.get("contiguous_memory_optimization") is True:
        return section.get("partition_activations") is True and section.get(NUMBER_CHECKPOINTS) is not None
    return True


@dataclasses.dataclass(frozen=True)
class CheckpointingSpace:
    """The checkpointing settings a tuning may try. ``switch`` is the script flag that turns
    checkpointing on ("" where none is tuned); ``tuned`` maps each checkpointing knob tuned to
    its values (the switch's ``[False, True]``, a section key's list); ``fixed`` is the user's
    section with its lists taken out: every experiment gets it."""

    switch: str = ""
    tuned: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    fixed: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"switch": self.switch, "tuned": self.tuned, "fixed": self.fixed}

    def settings(self) -> list[Knobs]:
        """Every setting to try, each as the knobs it departs from the defaults by: with a
        switch, each turns it on (the section acts in a checkpointing run only), alone and with
        each combination of the section's lists; without, each combination but the defaults.
        A combination DeepSpeed's ``configure()`` refuses is none."""
        defaults = checkpointing_defaults()
        keys = [k for k in self.tuned if k != CHECKPOINTING_SWITCH]
        out: list[Knobs] = []
        for values in itertools.product(*(self.tuned[k] for k in keys)):
            chosen = dict(zip(keys, values))
            if not valid(self.section(chosen) or {}):
                continue
            setting = {k: v for k, v in chosen.items() if v != defaults.get(k)}
            if self.switch:
                setting[CHECKPOINTING_SWITCH] = True
            if setting and Knobs(setting) not in out:
                out.append(Knobs(setting))
        return out

    def section(self, knobs: Mapping[str, Any]) -> dict[str, Any] | None:
        """The ``activation_checkpointing`` section of a config that sets ``knobs``: the user's
        values, then the knobs'; ``None`` where neither sets one."""
        mine = {k.split(".", 1)[1]: v for k, v in knobs.items() if k.startswith(CHECKPOINTING_SECTION + ".")}
        if self.fixed is None and not mine:
            return None
        return {**copy.deepcopy(self.fixed or {}), **mine}

    def switch_value(self, knobs: Mapping[str, Any]) -> bool | None:
        """Whether a config that sets ``knobs`` turns the script's switch on; ``None`` where no
        switch is tuned (the user's arguments stay as they are)."""
        return bool(knobs.get(CHECKPOINTING_SWITCH, False)) if self.switch else None


def build_checkpointing_space(section: Any, *, switch: str | None, switch_on: bool, mp_size: int) -> CheckpointingSpace:
    """The checkpointing space of a config whose ``activation_checkpointing`` section is
    ``section`` (checked by the config: a dict or ``None``), whose ``arg_mappings`` map the
    switch to ``switch`` (``None``: not mapped), ``switch_on`` where the user's arguments turn it
    on already, with ``mp_size`` model-parallel ranks."""
    tuned: dict[str, list[Any]] = {}
    if switch and not switch_on:
        tuned[CHECKPOINTING_SWITCH] = [False, True]
    fixed: dict[str, Any] | None = None
    if isinstance(section, dict):
        fixed = {}
        for key, value in section.items():
            if not isinstance(value, list):
                fixed[key] = copy.deepcopy(value)
                continue
            choices = list(dict.fromkeys(value))
            acts = key in SECTION_DIMENSIONS and (mp_size > 1 or key not in MODEL_PARALLEL_ONLY)
            if len(choices) == 1:
                fixed[key] = choices[0]
            elif acts:
                tuned[knob_path(key)] = choices
    return CheckpointingSpace(switch=(switch or "") if CHECKPOINTING_SWITCH in tuned else "", tuned=tuned, fixed=fixed)
