"""Hostile configs: every key of the config and its autotuning section, with values of every
type. A config is either accepted, and then tunable without an error of ours, or refused
with a :class:`ConfigError` (the CLI's one line and exit status 2)."""

from __future__ import annotations

import string

import pytest

from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from conftest import assert_tuned_or_refused
from conftest import safe_component
from optuna_ds._errors import ConfigError
from optuna_ds.config import AutotuningConfig
from optuna_ds.config import parse_user_config
from optuna_ds.config._sections import _ZERO_BOOLS
from optuna_ds.config._sections import _ZERO_NUMBERS
from optuna_ds.domain import Config

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([0, 1, 2, 3, 4, 1024, -1]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1.0, 2.0, 0.5, 5e8]),
    st.text(max_size=12), st.sampled_from(["auto", "all", "cpu", "throughput", "latency", "FLOPS", "random", "../.."]),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)
_AUTOTUNING_KEYS = sorted(AutotuningConfig.model_fields)
_ZERO_KEYS = sorted(_ZERO_NUMBERS | _ZERO_BOOLS | {"stage", "offload_optimizer", "offload_param", "../x_y", "a/b"})
_TOP_KEYS = ["train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "fp16", "bf16", "optimizer"]


@st.composite
def configs(draw: st.DrawFn) -> dict:
    auto = draw(st.dictionaries(st.sampled_from(_AUTOTUNING_KEYS), _VALUES, max_size=6))
    if draw(st.booleans()):
        auto["enabled"] = True
    zero = draw(st.dictionaries(st.sampled_from(_ZERO_KEYS), _VALUES, max_size=5))
    config = draw(st.dictionaries(st.sampled_from(_TOP_KEYS), _VALUES, max_size=4))
    config["autotuning"] = auto if draw(st.integers(0, 9)) else draw(_VALUES)
    if draw(st.integers(0, 5)):
        config["zero_optimization"] = zero
    return config


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), gpus=st.integers(1, 8), args=st.lists(st.sampled_from(["--per_device_train_batch_size", "4", "x", "-1", "--fp16"]), max_size=3))
def test_a_config_is_refused_in_one_line_or_tuned(config: dict, gpus: int, args: list[str]) -> None:
    assert_tuned_or_refused(config, script_args=args, gpus=gpus)


_KEYS = st.text(alphabet=string.printable + "é\0", min_size=1, max_size=30)
_KNOB_VALUES = st.one_of(st.booleans(), st.integers(), st.integers(10**299, 10**400), st.floats(), st.floats(allow_nan=False), st.text(string.printable, max_size=10))


@settings(max_examples=300, deadline=None)
@given(a=st.dictionaries(_KEYS, _KNOB_VALUES, max_size=4), b=st.dictionaries(_KEYS, _KNOB_VALUES, max_size=4))
def test_experiment_names_are_safe_identities(a: dict, b: dict) -> None:
    name_a = Config(stage=1, micro_batch=2, knobs=a).name
    name_b = Config(stage=1, micro_batch=2, knobs=b).name
    assert safe_component(name_a) and safe_component(name_b)
    if name_a == name_b:
        # The same name must mean the same config (as the names show values, up to their format).
        assert sorted(a) == sorted(b)


def test_a_control_character_in_a_key_is_shown_escaped_on_one_line() -> None:
    with pytest.raises(ConfigError) as error:
        parse_user_config({"autotuning": {"\n\x1b[2J": 1}}, path="ds_config.json", script_args=[])
    assert "\n" not in str(error.value) and "\x1b" not in str(error.value)
    assert "autotuning.\\x1b[2J" in str(error.value)  # the key as stripped of its blank, escaped
