from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from optuna_ds._errors import ConfigError
from optuna_ds.config._metric import METRICS
from optuna_ds.config._metric import Metric

TUNER_TYPES = ("gridsearch", "random", "model_based")
MODEL_INFO_KEYS = frozenset(
    {"profile", "num_params", "trainable_num_params", "hidden_size", "num_layers",
     "activation_mem_per_gpu"}
)


@dataclasses.dataclass(frozen=True)
class AutotuningConfig:
    """The ``autotuning`` section of a DeepSpeed config, validated, with DeepSpeed's documented
    defaults.

    ``overwrite`` defaults to false, as the README says (DeepSpeed's code says true and so
    deletes finished work): a tuning resumes unless asked otherwise.
    """

    enabled: bool = False
    results_dir: str = "autotuning_results"
    exps_dir: str = "autotuning_exps"
    overwrite: bool = False
    metric: str = "throughput"
    start_profile_step: int = 3
    end_profile_step: int = 5
    fast: bool = True
    max_train_batch_size: int | None = None
    min_train_batch_size: int = 1
    min_train_micro_batch_size_per_gpu: int = 1
    max_train_micro_batch_size_per_gpu: int = 1024
    mp_size: int = 1
    num_tuning_micro_batch_sizes: int = 3
    tuner_type: str = "model_based"
    tuner_early_stopping: int = 3
    tuner_num_trials: int = 50
    arg_mappings: dict[str, str] = dataclasses.field(default_factory=dict)
    model_info: dict[str, Any] | None = None

    @property
    def tuned_metric(self) -> Metric:
        """The metric named by ``metric``: its engine key and its direction."""
        return Metric.named(self.metric)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FIELDS = {f.name: f for f in dataclasses.fields(AutotuningConfig)}
_BOOL_KEYS = {"enabled", "overwrite", "fast"}
_STR_KEYS = {"results_dir", "exps_dir", "metric", "tuner_type"}
# Where DeepSpeed's engine writes an experiment's metrics and the profile run's model info: one
# path of the user's would be every experiment's, so optuna-ds sets each experiment's own.
_PER_EXPERIMENT_KEYS = {"metric_path": "metrics.json", "model_info_path": "model_info.json"}
_POSITIVE_INT_KEYS = {
    "min_train_batch_size",
    "min_train_micro_batch_size_per_gpu",
    "max_train_micro_batch_size_per_gpu",
    "mp_size",
    "num_tuning_micro_batch_sizes",
    "tuner_early_stopping",
    "tuner_num_trials",
}
_NON_NEGATIVE_INT_KEYS = {"start_profile_step", "end_profile_step"}


def _suggest(key: str, valid: Any) -> str:
    close = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_autotuning_config(section: Any, *, where: str = "autotuning") -> AutotuningConfig:
    """Validate the ``autotuning`` section and fill in defaults.

    Every problem raises :class:`ConfigError` naming the key, so the user fixes it in one go
    instead of discovering it after an hour of experiments.
    """
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise ConfigError(f"{where} must be a JSON object, got {type(section).__name__}")
    values: dict[str, Any] = {}
    for raw_key, value in section.items():
        key = raw_key.strip()
        if key in _PER_EXPERIMENT_KEYS:
            raise ConfigError(f"{where}.{key} cannot be set: each experiment writes its own {_PER_EXPERIMENT_KEYS[key]} "
                              f"in its folder under results_dir, where optuna-ds reads it; remove the key")
        if key not in _FIELDS:
            raise ConfigError(f"unknown key {where}.{raw_key}{_suggest(key, _FIELDS)}")
        name = f"{where}.{key}"
        if key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be true or false, got {value!r}")
        elif key in _STR_KEYS:
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
        elif key in _POSITIVE_INT_KEYS:
            if not _is_int(value) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        elif key in _NON_NEGATIVE_INT_KEYS:
            if not _is_int(value) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
        elif key == "max_train_batch_size":
            if value is not None and (not _is_int(value) or value < 1):
                raise ConfigError(f"{name} must be a positive integer or null, got {value!r}")
        elif key == "arg_mappings":
            value = _parse_arg_mappings(value, name)
        elif key == "model_info":
            value = _parse_model_info(value, name)
        values[key] = value

    if "metric" in values:
        metric = values["metric"].strip().lower()
        if metric not in METRICS:
            raise ConfigError(
                f"{where}.metric must be one of throughput, latency, FLOPS, got {values['metric']!r}"
                + _suggest(metric, METRICS)
            )
        values["metric"] = metric
    if "tuner_type" in values:
        tuner = values["tuner_type"].strip()
        if tuner not in TUNER_TYPES:
            raise ConfigError(
                f"{where}.tuner_type must be one of {', '.join(TUNER_TYPES)}, got {tuner!r}"
                + _suggest(tuner, TUNER_TYPES)
            )
        values["tuner_type"] = tuner
    config = AutotuningConfig(**values)
    if config.end_profile_step < config.start_profile_step:
        raise ConfigError(
            f"{where}.end_profile_step ({config.end_profile_step}) must not be before "
            f"{where}.start_profile_step ({config.start_profile_step})"
        )
    if config.max_train_micro_batch_size_per_gpu < config.min_train_micro_batch_size_per_gpu:
        raise ConfigError(
            f"{where}.max_train_micro_batch_size_per_gpu ({config.max_train_micro_batch_size_per_gpu})"
            f" is below {where}.min_train_micro_batch_size_per_gpu "
            f"({config.min_train_micro_batch_size_per_gpu})"
        )
    if config.max_train_batch_size is not None and config.max_train_batch_size < config.min_train_batch_size:
        raise ConfigError(
            f"{where}.max_train_batch_size ({config.max_train_batch_size}) is below "
            f"{where}.min_train_batch_size ({config.min_train_batch_size})"
        )
    return config


def _parse_arg_mappings(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be an object mapping config keys to script flags, got {value!r}")
    mappings: dict[str, str] = {}
    for ds_key, flag in value.items():
        # DeepSpeed's own README writes "gradient_accumulation_steps " with a trailing space.
        ds_key = ds_key.strip()
        if not isinstance(flag, str) or not flag.strip().startswith("-"):
            raise ConfigError(f"{name}.{ds_key} must be a script flag such as '--{ds_key}', got {flag!r}")
        mappings[ds_key] = flag.strip()
    return mappings


def _parse_model_info(value: Any, name: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be an object, got {value!r}")
    info: dict[str, Any] = {}
    for key, item in value.items():
        if key not in MODEL_INFO_KEYS:
            raise ConfigError(f"unknown key {name}.{key}{_suggest(key, MODEL_INFO_KEYS)}")
        if key == "profile":
            if not isinstance(item, bool):
                raise ConfigError(f"{name}.profile must be true or false, got {item!r}")
        elif item is not None and (not _is_int(item) or item < 0 or (key != "activation_mem_per_gpu" and item == 0)):
            raise ConfigError(f"{name}.{key} must be a positive integer, got {item!r}")
        info[key] = item
    return info
