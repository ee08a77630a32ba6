from __future__ import annotations

import inspect
import json
import re

import pydantic
import pytest

from optuna_ds.config import AutotuningConfig
from optuna_ds.config import find_config_path
from optuna_ds.config import load_json_file
from optuna_ds.config import parse_autotuning_config
from optuna_ds.config import parse_user_config
from optuna_ds.config import replace_config_path
from optuna_ds.config import set_arg
from optuna_ds._errors import ConfigError


def test_defaults_follow_deepspeeds_readme() -> None:
    c = parse_autotuning_config({"enabled": True})
    assert (c.metric, c.start_profile_step, c.end_profile_step, c.fast) == ("throughput", 3, 5, True)
    assert (c.tuner_type, c.tuner_early_stopping, c.tuner_num_trials) == ("model_based", 3, 50)
    assert (c.num_tuning_micro_batch_sizes, c.mp_size, c.max_train_batch_size) == (3, 1, None)
    assert c.overwrite is False  # the README's default, not the code's
    assert (c.results_dir, c.exps_dir) == ("autotuning_results", "autotuning_exps")


@pytest.mark.parametrize(
    ("metric", "key", "direction"),
    [("throughput", "throughput", "maximize"), ("latency", "latency", "minimize"), ("FLOPS", "FLOPS_per_gpu", "maximize"), ("flops", "FLOPS_per_gpu", "maximize")],
)
def test_metric_keys_and_directions(metric: str, key: str, direction: str) -> None:
    c = parse_autotuning_config({"metric": metric})
    assert (c.tuned_metric.key, c.tuned_metric.direction) == (key, direction)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"tuner_typ": "random"}, "unknown key autotuning.tuner_typ; did you mean 'tuner_type'?"),
        ({"metric": "speed"}, "autotuning.metric must be one of throughput, latency, FLOPS"),
        ({"tuner_type": "bayes"}, "autotuning.tuner_type must be one of gridsearch, random, model_based"),
        ({"start_profile_step": 6, "end_profile_step": 5}, "autotuning.end_profile_step (5) must not be before autotuning.start_profile_step (6)"),
        ({"min_train_micro_batch_size_per_gpu": -1}, "autotuning.min_train_micro_batch_size_per_gpu must be a positive integer"),
        ({"fast": "yes"}, "autotuning.fast must be true or false"),
        ({"max_train_batch_size": 0}, "autotuning.max_train_batch_size must be a positive integer or null"),
        ({"tuner_num_trials": 2.5}, "autotuning.tuner_num_trials must be a positive integer"),
        ({"enabled": 1}, "autotuning.enabled must be true or false"),
        ({"arg_mappings": {"train_micro_batch_size_per_gpu": "per_device"}}, "autotuning.arg_mappings.train_micro_batch_size_per_gpu must be a script flag"),
        ({"model_info": {"num_param": 5}}, "unknown key autotuning.model_info.num_param; did you mean 'num_params'?"),
        ({"max_train_micro_batch_size_per_gpu": 2, "min_train_micro_batch_size_per_gpu": 4}, "max_train_micro_batch_size_per_gpu (2) is below"),
        ([], "autotuning must be a JSON object"),
        # Typed by the model: each key's type, what it got, and an unknown key's nearest name.
        ({"mp_size": "2"}, "autotuning.mp_size must be a positive integer, got '2'"),
        ({"tuner_num_trials": True}, "autotuning.tuner_num_trials must be a positive integer, got True"),
        ({"start_profile_step": -1}, "autotuning.start_profile_step must be a non-negative integer, got -1"),
        ({"results_dir": 3}, "autotuning.results_dir must be a non-empty string, got 3"),
        ({"exps_dir": " "}, "autotuning.exps_dir must be a non-empty string, got ' '"),
        ({"arg_mappings": ["--lr"]}, "autotuning.arg_mappings must be an object mapping config keys to script flags, got ['--lr']"),
        ({"arg_mappings": {"train_batch_size": 8}}, "autotuning.arg_mappings.train_batch_size must be a script flag"),
        ({"model_info": {"num_params": "1B"}}, "autotuning.model_info.num_params must be a positive integer, got '1B'"),
        ({"model_info": {"activation_mem_per_gpu": -1}}, "autotuning.model_info.activation_mem_per_gpu must be a non-negative integer, got -1"),
        ({"model_info": {"profile": "yes"}}, "autotuning.model_info.profile must be true or false, got 'yes'"),
        ({"num_tuning_micro_batch_size": 3}, "unknown key autotuning.num_tuning_micro_batch_size; did you mean 'num_tuning_micro_batch_sizes'?"),
        ({"max_train_batch_size": 4, "min_train_batch_size": 8}, "autotuning.max_train_batch_size (4) is below autotuning.min_train_batch_size (8)"),
        ({"metric_path": "m.json"}, "autotuning.metric_path cannot be set: each experiment writes its own metrics.json"),
        ({"model_info_path": None}, "autotuning.model_info_path cannot be set: each experiment writes its own model_info.json"),
    ],
)
def test_invalid_autotuning_sections_name_the_key(section: object, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as e:
        parse_autotuning_config(section)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_every_key_deepspeed_reads_is_typed_and_nulls_are_the_defaults() -> None:
    """Each key DeepSpeed's autotuner reads from the section (its constants) is one of ours;
    the README writes ``null`` for the folders and arg_mappings: their defaults."""
    from deepspeed.autotuning import config as ds_config

    read = re.findall(r"get_(?:scalar|dict)_param\(\s*autotuning_dict,\s*(AUTOTUNING_[A-Z_]+)", inspect.getsource(ds_config))
    keys = {getattr(ds_config, name) for name in read} | {ds_config.MODEL_INFO}
    assert keys == set(AutotuningConfig.model_fields)
    c = parse_autotuning_config({"enabled": True, "results_dir": None, "exps_dir": None, "arg_mappings": None})
    assert (c.results_dir, c.exps_dir, c.arg_mappings) == ("autotuning_results", "autotuning_exps", {})
    with pytest.raises(pydantic.ValidationError):  # frozen: what was checked stays so
        c.enabled = False  # type: ignore[misc]


def test_arg_mapping_keys_are_stripped() -> None:
    # DeepSpeed's own README writes the key with a trailing space.
    c = parse_autotuning_config({"arg_mappings": {"gradient_accumulation_steps ": "--gradient_accumulation_steps"}})
    assert c.arg_mappings == {"gradient_accumulation_steps": "--gradient_accumulation_steps"}


def _user(raw: dict, args: list[str] | None = None):
    return parse_user_config(raw, path="ds.json", script_args=args or ["--deepspeed_config", "ds.json"])


def test_stages_int_list_all_and_missing() -> None:
    assert _user({}).stages == [0]
    assert _user({"zero_optimization": {"stage": 2}}).stages == [2]
    assert _user({"zero_optimization": {"stage": [3, 1]}}).stages == [1, 3]
    u = _user({"zero_optimization": {"stage": "all"}})
    assert (u.stages, u.all_stages) == ([0, 1, 2, 3], True)
    with pytest.raises(ConfigError, match="zero_optimization.stage must be"):
        _user({"zero_optimization": {"stage": 4}})


def test_auto_values_resolve_through_arg_mappings() -> None:
    raw = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "autotuning": {"enabled": True, "arg_mappings": {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size", "gradient_accumulation_steps": "--gradient_accumulation_steps"}},
    }
    u = _user(raw, ["--deepspeed", "ds.json", "--per_device_train_batch_size=8", "--gradient_accumulation_steps", "2"])
    assert (u.min_micro_batch_size, u.gradient_accumulation_steps) == (8, 2)
    # Without the argument the documented defaults apply.
    u = _user(raw, ["--deepspeed", "ds.json"])
    assert (u.min_micro_batch_size, u.gradient_accumulation_steps) == (1, 1)


def test_micro_batch_int_is_minimum_list_is_exact() -> None:
    assert _user({"train_micro_batch_size_per_gpu": 4}).min_micro_batch_size == 4
    u = _user({"train_micro_batch_size_per_gpu": [16, 1, 4]})
    assert (u.micro_batch_sizes, u.min_micro_batch_size) == ([1, 4, 16], 1)
    with pytest.raises(ConfigError, match="train_micro_batch_size_per_gpu must be"):
        _user({"train_micro_batch_size_per_gpu": 0})
    with pytest.raises(ConfigError, match="gradient_accumulation_steps must be"):
        _user({"gradient_accumulation_steps": [1, 2]})


def test_precision_and_optimizer_kind() -> None:
    assert _user({"bf16": {"enabled": True}}).precision == "bf16"
    # "auto" follows the Trainer's flag.
    assert _user({"fp16": {"enabled": "auto"}}, ["--deepspeed", "ds.json", "--fp16"]).precision == "fp16"
    assert _user({"fp16": {"enabled": "auto"}}).precision == "fp32"
    assert _user({}).precision == "fp32"
    assert _user({"optimizer": {"type": "SGD"}}).adam_type_optimizer is False
    assert _user({"optimizer": {"type": "AdamW"}}).adam_type_optimizer is True


def test_config_path_in_script_args() -> None:
    assert find_config_path(["--deepspeed", "a.json"]) == (1, "a.json")
    assert find_config_path(["--deepspeed_config=b.json"]) == (0, "b.json")
    # A bare --deepspeed is DeepSpeed's switch; the config follows --deepspeed_config.
    assert find_config_path(["--deepspeed", "--deepspeed_config", "c.json"]) == (2, "c.json")
    with pytest.raises(ConfigError, match="no DeepSpeed config in the script arguments"):
        find_config_path(["--lr", "1"])
    assert replace_config_path(["--x", "1", "--deepspeed_config=b.json"], "/r/d.json") == ["--x", "1", "--deepspeed_config=/r/d.json"]


def test_set_arg_copies_and_keeps_the_form() -> None:
    args = ["--per_device_train_batch_size", "8", "--gas=1"]
    assert set_arg(args, "--per_device_train_batch_size", "16") == ["--per_device_train_batch_size", "16", "--gas=1"]
    assert set_arg(args, "--gas", "4") == ["--per_device_train_batch_size", "8", "--gas=4"]
    assert set_arg(args, "--new", "2")[-2:] == ["--new", "2"]
    assert args == ["--per_device_train_batch_size", "8", "--gas=1"]  # never mutated


def test_json_errors_say_where(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "a": 1,\n  "b": \n}')
    with pytest.raises(ConfigError, match=r"is not valid JSON: Expecting value at line 4 column 1"):
        load_json_file(str(bad))
    dup = tmp_path / "dup.json"
    dup.write_text(json.dumps({"a": 1})[:-1] + ', "a": 2}')
    with pytest.raises(ConfigError, match="duplicate key 'a'"):
        load_json_file(str(dup))
    with pytest.raises(ConfigError, match="not found"):
        load_json_file(str(tmp_path / "missing.json"))


def test_auto_values_without_mappings_use_the_trainers_flags() -> None:
    """Tuned values must reach a Hugging Face script even when arg_mappings is silent."""
    raw = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "autotuning": {"enabled": True}}
    u = _user(raw, ["--deepspeed", "ds.json", "--per_device_train_batch_size", "6", "--gradient_accumulation_steps", "3"])
    assert u.arg_mappings == {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size", "gradient_accumulation_steps": "--gradient_accumulation_steps"}
    assert (u.min_micro_batch_size, u.gradient_accumulation_steps) == (6, 3)
    # The user's own mapping wins; concrete values need none.
    raw["autotuning"]["arg_mappings"] = {"train_micro_batch_size_per_gpu": "--batch"}
    assert _user(raw).arg_mappings["train_micro_batch_size_per_gpu"] == "--batch"
    assert _user({"train_micro_batch_size_per_gpu": 4, "autotuning": {"enabled": True}}).arg_mappings == {}


def _checked(raw: dict) -> None:
    from optuna_ds.config import check_with_deepspeed

    check_with_deepspeed(_user({**raw, "autotuning": {"enabled": True}}))


def test_deepspeed_checks_every_tuned_value_at_every_stage() -> None:
    # Valid: "all" stages, tuned lists, the Trainer's "auto" values, stage-3 knobs.
    _checked({"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto", "fp16": {"enabled": "auto"},
              "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
              "zero_optimization": {"stage": "all", "overlap_comm": [True, False], "reduce_bucket_size": [5e8, 1e8],
                                    "stage3_max_live_parameters": [1e9, 2e9], "offload_optimizer": {"device": "cpu"}}})
    # The last value of one list, and a stage the list of stages names: each is checked.
    with pytest.raises(ConfigError, match=r"allgather_bucket_size = 0\.5"):
        _checked({"zero_optimization": {"stage": [1, 2], "overlap_comm": [True, False], "allgather_bucket_size": [5e8, 2e8, 0.5]}})
    with pytest.raises(ConfigError, match="did you mean 'overlap_comm'"):
        _checked({"zero_optimization": {"stage": "all", "overlap_com": [True, False]}})


def test_a_top_level_key_deepspeed_never_reads_is_refused() -> None:
    # Read only because another section is there, or read through keys(): known.
    _checked({"optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, "scheduler": {"type": "WarmupLR"}, "steps_per_print": 5,
              "gradient_clipping": "auto", "data_efficiency": {"enabled": False}, "bfloat16": {"enabled": False}})
    with pytest.raises(ConfigError, match=r"^ds.json: DeepSpeed does not know train_micro_batch_size_per_gp; "
                                          r"did you mean 'train_micro_batch_size_per_gpu'\?$"):
        _checked({"train_micro_batch_size_per_gp": 4})
    with pytest.raises(ConfigError, match=r"does not know xyzzy \(it would ignore it\): remove it$"):
        _checked({"xyzzy": "auto"})  # refused though the Trainer would fill it


@pytest.mark.parametrize(("zero", "message"), [
    ({"stage": "all", "reduce_bucket_size": [5e8, "5e7"]}, "zero_optimization.reduce_bucket_size must be a non-negative number"),
    ({"stage": 3, "stage3_prefetch_bucket_size": ["big"]}, "zero_optimization.stage3_prefetch_bucket_size must be a non-negative number"),
    ({"stage": 2, "overlap_comm": [1, 0]}, "zero_optimization.overlap_comm must be true, false or a list of them"),
    ({"stage": 2, "offload_optimizer": [{"device": "cpu"}, {"device": "none"}]}, "zero_optimization.offload_optimizer must be an object"),
])
def test_tuning_space_overrides_are_typed_before_launch(zero: dict, message: str) -> None:
    """A list in zero_optimization overrides the knob's tuned values: each must be of the knob's type."""
    with pytest.raises(ConfigError) as e:
        _user({"zero_optimization": zero, "autotuning": {"enabled": True, "fast": False}})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_list_of_deepcompile_is_refused_saying_why() -> None:
    # Issue 49: DeepSpeed's bare "Input should be a valid boolean" named no reason.
    raw = {"train_micro_batch_size_per_gpu": 2, "compile": {"deepcompile": [False, True]}, "autotuning": {"enabled": True}}
    with pytest.raises(ConfigError) as e:
        parse_user_config(raw, path="ds.json", script_args=[])
    assert str(e.value).startswith("compile.deepcompile = [false, true]: optuna-ds does not tune DeepCompile (the config alone "
                                   "compiles nothing: DeepSpeed acts on it only in engine.compile()")
    assert "\n" not in str(e.value)
    parse_user_config({**raw, "compile": {"deepcompile": True}}, path="ds.json", script_args=[])  # one value is the user's
