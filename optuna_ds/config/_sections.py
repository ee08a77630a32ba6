"""Checks of the config's sections that DeepSpeed checks late or not at all: the lists a tuning
searches, the ZeRO, activation checkpointing, AutoTP and compile sections; each refusal one line."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from typing import Any

from optuna_ds._errors import ConfigError
from optuna_ds.domain import AUTOTP_SECTION
from optuna_ds.domain import CHECKPOINTING_SECTION
from optuna_ds.domain import MBS_KEY
from optuna_ds.domain import ZERO_KEY

# The most values one list of the config may hold: each is a setting to search, an experiment of
# its own (a stage's knob search runs autotuning.tuner_num_trials of them, 50 by default), and
# Optuna compares a choice list whole at every trial, so a longer list is refused, not searched.
MAX_LISTED = 100


def check_list_lengths(raw: dict[str, Any]) -> None:
    """Refuse a list the tuning would search that holds more than :data:`MAX_LISTED` values, in
    one line naming it, before any of its values is read."""
    for name, values in _searched_lists(raw):
        if len(values) > MAX_LISTED:
            raise ConfigError(f"{name} lists {len(values)} values, more than the {MAX_LISTED} a "
                              "tuning searches (each is an experiment of its own): list at most "
                              f"{MAX_LISTED}")


def _searched_lists(raw: dict[str, Any]) -> Iterator[tuple[str, list[Any]]]:
    """The lists of ``raw`` a tuning may search, each with its key path: the micro-batch sizes,
    and those of the ZeRO section (its stages, its knobs, its offload sections' keys), the
    checkpointing section and the AutoTP section."""
    if isinstance(raw.get(MBS_KEY), list):
        yield MBS_KEY, raw[MBS_KEY]
    zero = raw.get(ZERO_KEY)
    sections = [(key, raw.get(key)) for key in (ZERO_KEY, CHECKPOINTING_SECTION, AUTOTP_SECTION)]
    if isinstance(zero, dict):
        sections += [(f"{ZERO_KEY}.{key}", zero.get(key)) for key in sorted(_ZERO_SECTIONS)]
    for where, section in sections:
        if isinstance(section, dict):
            yield from ((f"{where}.{key}", value) for key, value in section.items()
                        if isinstance(value, list))


# zero_optimization keys whose type DeepSpeed checks only once the engine starts: checked here,
# so that a typo fails in one line before the profile run instead of as every experiment.
_ZERO_NUMBERS = frozenset({
    "reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "sub_group_size", "prefetch_bucket_size",
    "param_persistence_threshold", "max_live_parameters", "max_reuse_distance", "zero_hpz_partition_size",
})
_ZERO_BOOLS = frozenset({
    "overlap_comm", "contiguous_gradients", "reduce_scatter", "allgather_partitions", "round_robin_gradients",
    "elastic_checkpoint", "load_from_fp32_weights", "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters", "use_multi_rank_bucket_allreduce",
    "zero_quantized_weights", "zero_quantized_gradients", "zero_quantized_nontrainable_weights",
})
# The switches of an offload section, listed the same way (``"pin_memory": [true, false]``).
_OFFLOAD_BOOLS = frozenset({"pin_memory", "super_offload", "pipeline_read", "pipeline_write", "fast_init"})
_ZERO_SECTIONS = frozenset({"offload_optimizer", "offload_param"})
_OFFLOAD_DEVICES = ("cpu", "nvme", "none")


def check_zero_section(zero: dict[str, Any]) -> None:
    """Types of the ZeRO keys we tune or pass on: a value, or a list of values to tune."""
    for key, value in zero.items():
        name = f"{ZERO_KEY}.{key}"
        if key in _ZERO_SECTIONS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(f'{name} must be an object such as {{"device": "cpu"}}, got {value!r}')
            device = value.get("device", "none")
            if device not in _OFFLOAD_DEVICES:
                raise ConfigError(f"{name}.device must be one of {', '.join(_OFFLOAD_DEVICES)}, got {device!r}")
            for sub, v in value.items():
                if sub in _OFFLOAD_BOOLS and not all(isinstance(b, bool) for b in (v if isinstance(v, list) else [v])):
                    raise ConfigError(f"{name}.{sub} must be true, false or a list of them, got {v!r}")
            continue
        values = value if isinstance(value, list) else [value]
        if key in _ZERO_NUMBERS:
            bad = [v for v in values if v != "auto" and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf"))]
            if bad:
                raise ConfigError(f'{name} must be a non-negative number, a list of them, or "auto", got {value!r}')
        elif key in _ZERO_BOOLS:
            if not all(isinstance(v, bool) for v in values):
                raise ConfigError(f"{name} must be true, false or a list of them, got {value!r}")


# The ``activation_checkpointing`` section (DeepSpeed's ``ACT_CHKPT_DEFAULT``): its switches may
# be listed to tune them; DeepSpeed reads each with ``get_scalar_param``, which takes any value
# and ignores an unknown key, so both are checked here.
_CHECKPOINTING_BOOLS = ("partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                        "synchronize_checkpoint_boundary", "profile")
_NUMBER_CHECKPOINTS = "number_checkpoints"


def check_checkpointing_section(raw: dict[str, Any]) -> None:
    """Types of the ``activation_checkpointing`` keys: a switch is true, false or a list of them
    (its values to tune); ``number_checkpoints`` is a count, one value; an unknown key, which
    DeepSpeed would ignore without a word, is refused."""
    section = raw.get(CHECKPOINTING_SECTION)
    if section is None:
        return
    if not isinstance(section, dict):
        raise ConfigError(f'{CHECKPOINTING_SECTION} must be an object such as {{"cpu_checkpointing": [false, true]}}, got {section!r}')
    known = (*_CHECKPOINTING_BOOLS, _NUMBER_CHECKPOINTS)
    for key, value in section.items():
        name = f"{CHECKPOINTING_SECTION}.{key}"
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else f" (it knows {', '.join(known)})"
            raise ConfigError(f"DeepSpeed does not know {name}{hint}")
        if key == _NUMBER_CHECKPOINTS:
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be a positive integer or null (the model's checkpoints: one value), got {value!r}")
        elif not (isinstance(value, bool) or (isinstance(value, list) and value and all(isinstance(v, bool) for v in value))):
            raise ConfigError(f"{name} must be true, false or a list of them, got {value!r}")


AUTOTP_KEY = "autotp_size"


def check_autotp_section(raw: dict[str, Any], *, mp_size: int) -> None:
    """Types of the ``tensor_parallel`` section's ``autotp_size``: a size (0 or 1: off), or a list
    of sizes to tune; DeepSpeed's own model checks the rest of the section (and every listed
    size) in :func:`~optuna_ds.config.check_with_deepspeed`. A list beside ``autotuning.mp_size``
    is refused: AutoTP builds its own tensor-parallel groups, ``mp_size`` says the script's
    model parallelism does."""
    section = raw.get(AUTOTP_SECTION)
    if section is None:
        return
    if not isinstance(section, dict):
        raise ConfigError(f'{AUTOTP_SECTION} must be an object such as {{"{AUTOTP_KEY}": [1, 2]}}, got {section!r}')
    value = section.get(AUTOTP_KEY)
    name = f"{AUTOTP_SECTION}.{AUTOTP_KEY}"
    if isinstance(value, list):
        if not value or not all(type(v) is int and v >= 1 for v in value):
            raise ConfigError(f"{name} must be a list of positive integers (sizes to tune, 1 for off), got {value!r}")
        if mp_size > 1 and any(v > 1 for v in value):
            raise ConfigError(f"{name} is tuned beside autotuning.mp_size ({mp_size}): AutoTP builds its own tensor-parallel "
                              "groups; tune it with mp_size 1")
    elif value is not None and not (type(value) is int and value >= 0):
        raise ConfigError(f"{name} must be a non-negative integer (0 or 1: off) or a list of sizes to tune, got {value!r}")


def check_compile_section(raw: dict[str, Any]) -> None:
    """A list in ``compile`` is refused, saying why: DeepCompile is no dimension (the config
    alone compiles nothing: DeepSpeed acts on it only in ``engine.compile()``, which the script
    must call), and DeepSpeed's own refusal of a list there names no reason."""
    section = raw.get("compile")
    for key, value in (section.items() if isinstance(section, dict) else ()):
        if isinstance(value, list):
            raise ConfigError(f"compile.{key} = {json.dumps(value)}: optuna-ds does not tune "
                              "DeepCompile (the config alone compiles nothing: DeepSpeed acts on it "
                              "only in engine.compile(), which your script must call, so its runs "
                              "would measure noise); set it to one value")
