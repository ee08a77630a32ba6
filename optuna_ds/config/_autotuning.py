from __future__ import annotations

import difflib
import typing
from typing import Annotated
from typing import Any

import pydantic
from pydantic import AfterValidator
from pydantic import ConfigDict
from pydantic import Field
from pydantic import ValidationInfo
from pydantic.fields import FieldInfo
from pydantic import field_validator
from pydantic import model_validator
from pydantic_core import ErrorDetails
from typing_extensions import TypedDict

from optuna_ds._errors import ConfigError
from optuna_ds.config._metric import METRICS
from optuna_ds.config._metric import Metric

TUNER_TYPES = ("gridsearch", "random", "model_based")
# Where DeepSpeed's engine writes an experiment's metrics and the profile run's model info: one
# path of the user's would be every experiment's, so optuna-ds sets each experiment's own.
_PER_EXPERIMENT_KEYS = {"metric_path": "metrics.json", "model_info_path": "model_info.json"}
# Keys DeepSpeed's README documents as null by default: null means the default.
_NULL_IS_DEFAULT = ("results_dir", "exps_dir", "arg_mappings")


def _suggest(key: str, valid: Any) -> str:
    close = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


def _script_flag(value: str) -> str:
    if not value.strip().startswith("-"):
        raise ValueError(f"must be a script flag such as '--per_device_train_batch_size', got {value!r}")
    return value.strip()


Bool = Annotated[bool, Field(description="true or false")]
PositiveInt = Annotated[int, Field(ge=1, description="a positive integer")]
NonNegativeInt = Annotated[int, Field(ge=0, description="a non-negative integer")]
Folder = Annotated[str, AfterValidator(_non_empty), Field(description="a non-empty string")]
OptionalPath = Annotated[str | None, Field(description="a string or null")]
ScriptFlag = Annotated[str, AfterValidator(_script_flag), Field(description="a script flag such as '--per_device_train_batch_size'")]


@pydantic.with_config(ConfigDict(extra="forbid", strict=True))
class ModelInfo(TypedDict, total=False):
    """``autotuning.model_info``: what the user knows of the model, sparing the profile run."""

    profile: Bool
    num_params: Annotated[int | None, Field(ge=1, description="a positive integer")]
    trainable_num_params: Annotated[int | None, Field(ge=1, description="a positive integer")]
    hidden_size: Annotated[int | None, Field(ge=1, description="a positive integer")]
    num_layers: Annotated[int | None, Field(ge=1, description="a positive integer")]
    activation_mem_per_gpu: Annotated[int | None, Field(ge=0, description="a non-negative integer")]  # 0: none measured


class AutotuningConfig(pydantic.BaseModel):
    """The ``autotuning`` section of a DeepSpeed config, typed, with DeepSpeed's documented
    defaults: every key of its README. Parse it with :func:`parse_autotuning_config`, whose
    errors are one line naming the key.

    ``overwrite`` defaults to false, as the README says (DeepSpeed's code says true and so
    deletes finished work): a tuning resumes unless asked otherwise.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    enabled: Bool = False
    results_dir: Folder = "autotuning_results"
    exps_dir: Folder = "autotuning_exps"
    overwrite: Bool = False
    metric: Annotated[str, Field(description="one of throughput, latency, FLOPS")] = "throughput"
    start_profile_step: NonNegativeInt = 3
    end_profile_step: NonNegativeInt = 5
    fast: Bool = True
    max_train_batch_size: Annotated[int | None, Field(ge=1, description="a positive integer or null")] = None
    min_train_batch_size: PositiveInt = 1
    min_train_micro_batch_size_per_gpu: PositiveInt = 1
    max_train_micro_batch_size_per_gpu: PositiveInt = 1024
    mp_size: PositiveInt = 1
    num_tuning_micro_batch_sizes: PositiveInt = 3
    tuner_type: Annotated[str, Field(description="one of gridsearch, random, model_based")] = "model_based"
    tuner_early_stopping: PositiveInt = 3
    tuner_num_trials: PositiveInt = 50
    arg_mappings: Annotated[dict[str, ScriptFlag], Field(description="an object mapping config keys to script flags")] = {}
    model_info: Annotated[ModelInfo | None, Field(description="an object")] = None
    metric_path: OptionalPath = None
    model_info_path: OptionalPath = None

    @model_validator(mode="before")
    @classmethod
    def _as_written(cls, section: dict[str, Any]) -> dict[str, Any]:
        # DeepSpeed's own README writes "gradient_accumulation_steps " with a trailing space.
        section = {k.strip() if isinstance(k, str) else k: v for k, v in section.items()}
        if isinstance(section.get("arg_mappings"), dict):
            section["arg_mappings"] = {k.strip() if isinstance(k, str) else k: v for k, v in section["arg_mappings"].items()}
        return {k: v for k, v in section.items() if not (k in _NULL_IS_DEFAULT and v is None)}

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        metric = value.strip().lower()
        if metric not in METRICS:
            raise ValueError(f"must be one of throughput, latency, FLOPS, got {value!r}{_suggest(metric, METRICS)}")
        return metric

    @field_validator("tuner_type")
    @classmethod
    def _known_tuner(cls, value: str) -> str:
        tuner = value.strip()
        if tuner not in TUNER_TYPES:
            raise ValueError(f"must be one of {', '.join(TUNER_TYPES)}, got {tuner!r}{_suggest(tuner, TUNER_TYPES)}")
        return tuner

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> AutotuningConfig:
        w = (info.context or {}).get("where", "autotuning")
        if self.end_profile_step < self.start_profile_step:
            raise ValueError(f"{w}.end_profile_step ({self.end_profile_step}) must not be before "
                             f"{w}.start_profile_step ({self.start_profile_step})")
        if self.max_train_micro_batch_size_per_gpu < self.min_train_micro_batch_size_per_gpu:
            raise ValueError(f"{w}.max_train_micro_batch_size_per_gpu ({self.max_train_micro_batch_size_per_gpu}) is below "
                             f"{w}.min_train_micro_batch_size_per_gpu ({self.min_train_micro_batch_size_per_gpu})")
        if self.max_train_batch_size is not None and self.max_train_batch_size < self.min_train_batch_size:
            raise ValueError(f"{w}.max_train_batch_size ({self.max_train_batch_size}) is below "
                             f"{w}.min_train_batch_size ({self.min_train_batch_size})")
        return self

    @property
    def tuned_metric(self) -> Metric:
        """The metric named by ``metric``: its engine key and its direction."""
        return Metric.named(self.metric)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


def parse_autotuning_config(section: Any, *, where: str = "autotuning") -> AutotuningConfig:
    """Validate the ``autotuning`` section and fill in defaults.

    Every problem raises :class:`ConfigError` in one line naming the key (with a did-you-mean
    for an unknown one), so the user fixes it before an hour of experiments, not after.
    """
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise ConfigError(f"{where} must be a JSON object, got {type(section).__name__}")
    for key in section:
        if isinstance(key, str) and key.strip() in _PER_EXPERIMENT_KEYS:
            raise ConfigError(f"{where}.{key.strip()} cannot be set: each experiment writes its own "
                              f"{_PER_EXPERIMENT_KEYS[key.strip()]} in its folder under results_dir, where optuna-ds reads it; "
                              "remove the key")
    try:
        return AutotuningConfig.model_validate(section, context={"where": where})
    except pydantic.ValidationError as e:
        raise ConfigError(_one_line(e.errors()[0], where)) from None


def _one_line(error: ErrorDetails, where: str) -> str:
    """pydantic's first error as the user reads it: the key, what it must be, what it is."""
    loc = [str(part) for part in error["loc"]]
    name = ".".join([where, *loc])
    if error["type"] == "extra_forbidden":
        parent = ModelInfo.__annotations__ if loc[:1] == ["model_info"] else AutotuningConfig.model_fields
        return f"unknown key {name}{_suggest(loc[-1], parent)}"
    if error["type"] == "value_error":  # ours, which say what they got
        message = str(error["ctx"]["error"])
        return f"{name} {message}" if loc else message
    return f"{name} must be {_expected(loc)}, got {error['input']!r}"


def _expected(loc: list[str]) -> str:
    """The ``description`` of the field at ``loc``: what a value there must be."""
    if loc[0] == "arg_mappings" and len(loc) > 1:
        hint: Any = ScriptFlag
    elif loc[0] == "model_info" and len(loc) > 1:
        hint = typing.get_type_hints(ModelInfo, include_extras=True).get(loc[1])
    else:
        field = AutotuningConfig.model_fields.get(loc[0])
        return field.description if field is not None and field.description else "valid"
    described = [m.description for m in getattr(hint, "__metadata__", ()) if isinstance(m, FieldInfo) and m.description]
    return described[0] if described else "valid"
