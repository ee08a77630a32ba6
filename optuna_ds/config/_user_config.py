from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import os
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

from optuna_ds._errors import ConfigError
from optuna_ds.config._autotuning import AutotuningConfig, parse_autotuning_config
from optuna_ds.config._script_args import find_arg, find_config_path, switch_state
from optuna_ds.domain import AUTOTP_SECTION
from optuna_ds.domain import CHECKPOINTING_SECTION
from optuna_ds.domain import CHECKPOINTING_SWITCH
from optuna_ds.domain import GAS_KEY
from optuna_ds.domain import MBS_KEY
from optuna_ds.domain import TBS_KEY
from optuna_ds.domain import ZERO_KEY

ALL_STAGES = (0, 1, 2, 3)
HPZ_KEY = "zero_hpz_partition_size"  # ZeRO++'s secondary partition, in ranks
# The flags a Hugging Face Trainer script resolves "auto" from: used when arg_mappings is silent.
HF_FLAGS = {MBS_KEY: "--per_device_train_batch_size", GAS_KEY: "--gradient_accumulation_steps"}
ADAM_TYPE_OPTIMIZERS = frozenset(
    {"adam", "adamw", "fusedadam", "cpuadam", "onebitadam", "zerooneadam", "onebitlamb", "lamb",
     "adagrad", "muadam", "muadamw", "lion"}
)


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def load_json_file(path: str, *, what: str = "DeepSpeed config") -> dict[str, Any]:
    """Read a JSON object, with one-line errors that say where the file is broken."""
    if not os.path.exists(path):
        raise ConfigError(f"{what} {path} not found")
    if os.path.isdir(path):
        raise ConfigError(f"{what} {path} is a directory, not a JSON file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} {path} cannot be read: {e}") from None
    try:
        data = json.loads(text, object_pairs_hook=_reject_duplicates)
    except RecursionError:
        raise ConfigError(f"{what} {path} is nested too deeply") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what} {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:
        raise ConfigError(f"{what} {path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must hold a JSON object, not {type(data).__name__}")
    if _depth(data) > MAX_DEPTH:
        raise ConfigError(f"{what} {path} is nested more than {MAX_DEPTH} levels deep")
    return data


MAX_DEPTH = 64  # DeepSpeed configs nest three or four levels; copying a deeper one could overflow the stack


def _depth(data: Any) -> int:
    deepest, todo = 0, [(data, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            todo.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


# The most values one list of the config may hold: each is a setting to search, an experiment of
# its own (a stage's knob search runs autotuning.tuner_num_trials of them, 50 by default), and
# Optuna compares a choice list whole at every trial, so a longer list is refused, not searched.
MAX_LISTED = 100


def _check_list_lengths(raw: dict[str, Any]) -> None:
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


def _int_or_auto(config: dict[str, Any], key: str, *, allow_list: bool) -> int | list[int] | str | None:
    if key not in config:
        return None
    value = config[key]
    if value == "auto":
        return "auto"
    if isinstance(value, bool):
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(f"{key} must be a positive integer, got {value}")
        return value
    if allow_list and isinstance(value, list):
        if not value or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
            raise ConfigError(f"{key} must be a list of positive integers, got {value!r}")
        return sorted(set(value))
    expected = "a positive integer, a list of them, or \"auto\"" if allow_list else 'a positive integer or "auto"'
    raise ConfigError(f"{key} must be {expected}, got {value!r}")


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


def _check_zero_section(zero: dict[str, Any]) -> None:
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


def _check_checkpointing_section(raw: dict[str, Any]) -> None:
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


_AUTOTP_KEY = "autotp_size"


def _check_autotp_section(raw: dict[str, Any], *, mp_size: int) -> None:
    """Types of the ``tensor_parallel`` section's ``autotp_size``: a size (0 or 1: off), or a list
    of sizes to tune; DeepSpeed's own model checks the rest of the section (and every listed
    size) in :func:`~optuna_ds.config.check_with_deepspeed`. A list beside ``autotuning.mp_size``
    is refused: AutoTP builds its own tensor-parallel groups, ``mp_size`` says the script's
    model parallelism does."""
    section = raw.get(AUTOTP_SECTION)
    if section is None:
        return
    if not isinstance(section, dict):
        raise ConfigError(f'{AUTOTP_SECTION} must be an object such as {{"{_AUTOTP_KEY}": [1, 2]}}, got {section!r}')
    value = section.get(_AUTOTP_KEY)
    name = f"{AUTOTP_SECTION}.{_AUTOTP_KEY}"
    if isinstance(value, list):
        if not value or not all(type(v) is int and v >= 1 for v in value):
            raise ConfigError(f"{name} must be a list of positive integers (sizes to tune, 1 for off), got {value!r}")
        if mp_size > 1 and any(v > 1 for v in value):
            raise ConfigError(f"{name} is tuned beside autotuning.mp_size ({mp_size}): AutoTP builds its own tensor-parallel "
                              "groups; tune it with mp_size 1")
    elif value is not None and not (type(value) is int and value >= 0):
        raise ConfigError(f"{name} must be a non-negative integer (0 or 1: off) or a list of sizes to tune, got {value!r}")


def _parse_stages(config: dict[str, Any]) -> tuple[list[int], bool]:
    """Return the stages to explore and whether the user asked for "all" of them."""
    zero = config.get(ZERO_KEY)
    if zero is None:
        return [0], False
    if not isinstance(zero, dict):
        raise ConfigError(f"{ZERO_KEY} must be an object, got {zero!r}")
    _check_zero_section(zero)
    stage = zero.get("stage", 0)
    if stage == "all":
        return list(ALL_STAGES), True
    stages = stage if isinstance(stage, list) else [stage]
    # 1.0 is stage 1 for DeepSpeed too; normalised here, so names and studies say z1, never z1.0.
    stages = [int(s) if isinstance(s, float) and s.is_integer() else s for s in stages]
    if not stages or not all(type(s) is int and s in ALL_STAGES for s in stages):
        raise ConfigError(f'{ZERO_KEY}.stage must be 0, 1, 2, 3, a list of them, or "all", got {stage!r}')
    return sorted(set(stages)), False


@dataclasses.dataclass(frozen=True)
class UserConfig:
    """The user's DeepSpeed config and script arguments, with everything tuning needs resolved.

    ``raw`` is kept verbatim so the sections we do not tune (optimizer, fp16, offload...)
    reach every generated experiment config unchanged.
    """

    path: str
    raw: dict[str, Any]
    autotuning: AutotuningConfig
    stages: list[int]
    all_stages: bool
    micro_batch_sizes: list[int] | None
    min_micro_batch_size: int
    gradient_accumulation_steps: int
    train_batch_size: int | None
    arg_mappings: dict[str, str]
    precision: str
    # The one micro-batch size the user's config trains with (an int, or "auto" resolved from
    # the script): the baseline the tuning compares the optimum with. None for a list or none.
    baseline_micro_batch_size: int | None = None
    # The user's arguments turn the checkpointing switch arg_mappings maps on already: their
    # setting, kept in every experiment, and no dimension.
    checkpointing_on: bool = False

    @property
    def checkpointing_switch(self) -> str | None:
        """The script flag ``arg_mappings`` maps ``gradient_checkpointing`` to, if any."""
        return self.arg_mappings.get(CHECKPOINTING_SWITCH)

    def checkpointing_section(self) -> dict[str, Any] | None:
        section = self.raw.get(CHECKPOINTING_SECTION)
        return copy.deepcopy(section) if isinstance(section, dict) else None

    def autotp_section(self) -> dict[str, Any] | None:
        section = self.raw.get(AUTOTP_SECTION)
        return copy.deepcopy(section) if isinstance(section, dict) else None

    @property
    def own_autotp_size(self) -> int:
        """The AutoTP size the user's own config runs with (a number in ``tensor_parallel``; 1: off)."""
        value = (self.autotp_section() or {}).get(_AUTOTP_KEY)
        return value if type(value) is int and value > 1 else 1

    @property
    def own_train_batch_size(self) -> int | None:
        """The samples a step of the user's own config trains on, where it says: its
        ``train_batch_size`` as DeepSpeed counts it (every rank) over its own AutoTP size."""
        return None if self.train_batch_size is None else max(1, self.train_batch_size // self.own_autotp_size)

    def autotp_sizes(self) -> list[int]:
        """Every AutoTP size above 1 a config of the tuning may run: the listed ones, or the
        user's own."""
        value = (self.autotp_section() or {}).get(_AUTOTP_KEY)
        return sorted({v for v in (value if isinstance(value, list) else [value]) if isinstance(v, int) and v > 1})

    @property
    def optimizer_type(self) -> str | None:
        optimizer = self.raw.get("optimizer")
        if isinstance(optimizer, dict) and isinstance(optimizer.get("type"), str):
            return optimizer["type"]
        return None

    @property
    def adam_type_optimizer(self) -> bool:
        """Adam-type unless the config names a non-adaptive one; a client optimizer counts as Adam."""
        kind = self.optimizer_type
        return kind is None or kind.lower() in ADAM_TYPE_OPTIMIZERS

    def zero_section(self) -> dict[str, Any]:
        zero = self.raw.get(ZERO_KEY)
        return copy.deepcopy(zero) if isinstance(zero, dict) else {}


def _precision(raw: dict[str, Any], script_args: Sequence[str]) -> str:
    """fp16, bf16 or fp32; an "auto" switch follows the Trainer's --fp16/--bf16 flag."""
    for key in ("fp16", "bf16", "bfloat16"):
        section = raw.get(key)
        enabled = section.get("enabled") if isinstance(section, dict) else None
        if enabled is True or (enabled == "auto" and f"--{key}" in script_args):
            return "fp16" if key == "fp16" else "bf16"
    return "fp32"


def _from_script(script_args: Sequence[str], mappings: dict[str, str], key: str) -> int | None:
    flag = mappings.get(key)
    if flag is None:
        return None
    found = find_arg(script_args, flag)
    if found is None:
        return None
    value = found[1]
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"script argument {flag} must be a positive integer, got {value!r}")
    return int(value)


def _check_switch_flag(mappings: dict[str, str]) -> None:
    """Refuse a checkpointing switch mapped to a flag another key sets (through ``mappings``,
    or a Trainer's own batch flags): turning the switch on or off would rewrite that flag."""
    flag = mappings.get(CHECKPOINTING_SWITCH)
    if flag is None:
        return
    for key, other in {**HF_FLAGS, **mappings}.items():
        if key != CHECKPOINTING_SWITCH and other == flag:
            raise ConfigError(f"autotuning.arg_mappings maps {CHECKPOINTING_SWITCH} to {flag}, the flag of {key}: the switch "
                              "needs a flag of its own (the script's, such as --gradient_checkpointing)")


def _check_compile_section(raw: dict[str, Any]) -> None:
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


def parse_user_config(
    raw: dict[str, Any], *, path: str, script_args: Sequence[str]
) -> UserConfig:
    """Validate the user's DeepSpeed config against what tuning needs.

    ``"auto"`` values are resolved as DeepSpeed's autotuner documents: from the script
    argument that ``arg_mappings`` names, else the default.
    """
    _check_list_lengths(raw)
    autotuning = parse_autotuning_config(raw.get("autotuning"))
    # An "auto" value is the Trainer's to fill from its own flag; tuned values must reach it
    # there, so that flag is the mapping unless the user names another.
    mappings = dict(autotuning.arg_mappings)
    for key, flag in HF_FLAGS.items():
        if raw.get(key) == "auto" and key not in mappings:
            mappings[key] = flag
    _check_switch_flag(mappings)
    stages, all_stages = _parse_stages(raw)
    _check_compile_section(raw)
    _check_checkpointing_section(raw)
    _check_autotp_section(raw, mp_size=autotuning.mp_size)

    mbs = _int_or_auto(raw, MBS_KEY, allow_list=True)
    from_args = _from_script(script_args, mappings, MBS_KEY)
    micro_batch_sizes: list[int] | None = None
    baseline: int | None = None
    if isinstance(mbs, list):
        micro_batch_sizes = mbs
        min_mbs = mbs[0]
    elif isinstance(mbs, int):
        min_mbs = baseline = mbs
    else:
        baseline = from_args
        min_mbs = from_args or autotuning.min_train_micro_batch_size_per_gpu

    gas_value = _int_or_auto(raw, GAS_KEY, allow_list=False)
    if isinstance(gas_value, int):
        gas = gas_value
    else:
        gas = _from_script(script_args, mappings, GAS_KEY) or 1

    tbs_value = _int_or_auto(raw, TBS_KEY, allow_list=False)
    tbs = tbs_value if isinstance(tbs_value, int) else _from_script(script_args, mappings, TBS_KEY)

    if micro_batch_sizes is None and min_mbs > autotuning.max_train_micro_batch_size_per_gpu:
        raise ConfigError(
            f"{MBS_KEY} ({min_mbs}) is above autotuning.max_train_micro_batch_size_per_gpu "
            f"({autotuning.max_train_micro_batch_size_per_gpu})"
        )
    return UserConfig(
        arg_mappings=mappings,
        precision=_precision(raw, script_args),
        path=path,
        raw=raw,
        autotuning=autotuning,
        stages=stages,
        all_stages=all_stages,
        micro_batch_sizes=micro_batch_sizes,
        min_micro_batch_size=min_mbs,
        gradient_accumulation_steps=gas,
        train_batch_size=tbs,
        baseline_micro_batch_size=baseline,
        checkpointing_on=CHECKPOINTING_SWITCH in mappings and switch_state(script_args, mappings[CHECKPOINTING_SWITCH]),
    )


def check_gpus(user: UserConfig, *, total_gpus: int, gpus_per_node: int | None = None) -> None:
    """What the config says about the GPUs of one experiment, checked once they are known:
    ``mp_size`` and each ZeRO++ ``zero_hpz_partition_size`` must divide them, each AutoTP size
    them and the GPUs of a node (``gpus_per_node``; DeepSpeed's mesh asserts the first, a
    tensor-parallel group that spans nodes runs its per-layer all-reduces over the slowest link),
    and a fixed micro-batch, accumulation and global batch must agree, as DeepSpeed's engine
    requires (they would otherwise be silently reinterpreted)."""
    mp = user.autotuning.mp_size
    if mp > total_gpus or total_gpus % mp:
        raise ConfigError(f"autotuning.mp_size ({mp}) must divide the {total_gpus} GPU(s) of one experiment")
    per_node = gpus_per_node or total_gpus
    for tp in user.autotp_sizes():
        if total_gpus % tp or per_node % tp:
            where = f"the {total_gpus} GPU(s) of one experiment" + (f" and the {per_node} of a node" if per_node != total_gpus else "")
            raise ConfigError(f"{AUTOTP_SECTION}.{_AUTOTP_KEY} {tp} must divide {where}: AutoTP splits each layer over "
                              "that many ranks of a node")
    hpz = user.zero_section().get(HPZ_KEY)
    for size in hpz if isinstance(hpz, list) else [hpz]:
        # DeepSpeed splits the ranks into groups of min(size, ranks), asserting they divide them.
        if isinstance(size, (int, float)) and not isinstance(size, bool) and size >= 1 and total_gpus % min(int(size), total_gpus):
            raise ConfigError(f"{ZERO_KEY}.{HPZ_KEY} ({size:g}) must divide the {total_gpus} GPU(s) of one experiment "
                              "(DeepSpeed groups the ranks by it): use the GPUs of a node or a divisor of them")
    _check_batch_cap(user, data_parallel=max(1, total_gpus // (mp * user.own_autotp_size)))
    mbs, gas, tbs = (user.raw.get(k) for k in (MBS_KEY, GAS_KEY, TBS_KEY))
    if isinstance(mbs, int) and isinstance(gas, int) and isinstance(tbs, int) and not any(type(v) is bool for v in (mbs, gas, tbs)):
        dp = total_gpus // mp
        if tbs != mbs * gas * dp:
            raise ConfigError(
                f"{TBS_KEY} ({tbs}) is not {MBS_KEY} ({mbs}) x {GAS_KEY} ({gas}) x {dp} data-parallel GPU(s) "
                f"= {mbs * gas * dp}: fix one of them, or leave {TBS_KEY} out"
            )


def _check_batch_cap(user: UserConfig, *, data_parallel: int) -> None:
    """Refuse ``max_train_batch_size`` below the samples a step of the user's own config trains
    on, or below the smallest micro-batch the config allows on every data-parallel rank: no
    config could keep to it, and the user's own would be compared with configs that do."""
    cap = user.autotuning.max_train_batch_size
    if cap is None:
        return
    name = "autotuning.max_train_batch_size"
    mbs, gas = user.baseline_micro_batch_size, user.gradient_accumulation_steps
    own = None if mbs is None else mbs * gas * data_parallel
    if own is not None and own > cap:
        raise ConfigError(
            f"{name} ({cap}) is below the {own} samples a step of your config ({MBS_KEY} {mbs} x "
            f"{GAS_KEY} {gas} x {data_parallel} data-parallel GPU(s)): raise it to at least {own}, "
            f"or lower {MBS_KEY}")
    least = user.min_micro_batch_size * data_parallel
    if least > cap:
        raise ConfigError(
            f"{name} ({cap}) is below the {least} samples a step of the smallest config ({MBS_KEY} "
            f"{user.min_micro_batch_size} x {data_parallel} data-parallel GPU(s)): raise it to at "
            f"least {least}")


def load_user_config(script_args: Sequence[str]) -> UserConfig:
    """Find, read and validate the DeepSpeed config named in the script arguments."""
    _, path = find_config_path(script_args)
    raw = load_json_file(path)
    return parse_user_config(raw, path=os.path.abspath(path), script_args=script_args)
