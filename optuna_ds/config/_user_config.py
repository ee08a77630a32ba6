"""The user's DeepSpeed config and script arguments, validated and resolved for tuning."""

from __future__ import annotations

import copy
import dataclasses
import os
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
from optuna_ds.config._json_file import load_json_file
from optuna_ds.config._sections import AUTOTP_KEY
from optuna_ds.config._sections import check_autotp_section
from optuna_ds.config._sections import check_checkpointing_section
from optuna_ds.config._sections import check_compile_section
from optuna_ds.config._sections import check_list_lengths
from optuna_ds.config._sections import check_zero_section

ALL_STAGES = (0, 1, 2, 3)
HPZ_KEY = "zero_hpz_partition_size"  # ZeRO++'s secondary partition, in ranks
# The flags a Hugging Face Trainer script resolves "auto" from: used when arg_mappings is silent.
HF_FLAGS = {MBS_KEY: "--per_device_train_batch_size", GAS_KEY: "--gradient_accumulation_steps"}
ADAM_TYPE_OPTIMIZERS = frozenset(
    {"adam", "adamw", "fusedadam", "cpuadam", "onebitadam", "zerooneadam", "onebitlamb", "lamb",
     "adagrad", "muadam", "muadamw", "lion"}
)


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


def _parse_stages(config: dict[str, Any]) -> tuple[list[int], bool]:
    """Return the stages to explore and whether the user asked for "all" of them."""
    zero = config.get(ZERO_KEY)
    if zero is None:
        return [0], False
    if not isinstance(zero, dict):
        raise ConfigError(f"{ZERO_KEY} must be an object, got {zero!r}")
    check_zero_section(zero)
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
        value = (self.autotp_section() or {}).get(AUTOTP_KEY)
        return value if type(value) is int and value > 1 else 1

    @property
    def own_train_batch_size(self) -> int | None:
        """The samples a step of the user's own config trains on, where it says: its
        ``train_batch_size`` as DeepSpeed counts it (every rank) over its own AutoTP size."""
        return None if self.train_batch_size is None else max(1, self.train_batch_size // self.own_autotp_size)

    def autotp_sizes(self) -> list[int]:
        """Every AutoTP size above 1 a config of the tuning may run: the listed ones, or the
        user's own."""
        value = (self.autotp_section() or {}).get(AUTOTP_KEY)
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


def parse_user_config(
    raw: dict[str, Any], *, path: str, script_args: Sequence[str]
) -> UserConfig:
    """Validate the user's DeepSpeed config against what tuning needs.

    ``"auto"`` values are resolved as DeepSpeed's autotuner documents: from the script
    argument that ``arg_mappings`` names, else the default.
    """
    check_list_lengths(raw)
    autotuning = parse_autotuning_config(raw.get("autotuning"))
    # An "auto" value is the Trainer's to fill from its own flag; tuned values must reach it
    # there, so that flag is the mapping unless the user names another.
    mappings = dict(autotuning.arg_mappings)
    for key, flag in HF_FLAGS.items():
        if raw.get(key) == "auto" and key not in mappings:
            mappings[key] = flag
    _check_switch_flag(mappings)
    stages, all_stages = _parse_stages(raw)
    check_compile_section(raw)
    check_checkpointing_section(raw)
    check_autotp_section(raw, mp_size=autotuning.mp_size)

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
            raise ConfigError(f"{AUTOTP_SECTION}.{AUTOTP_KEY} {tp} must divide {where}: AutoTP splits each layer over "
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
