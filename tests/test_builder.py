from __future__ import annotations

from optuna_ds.config import parse_user_config
from optuna_ds.domain import Config
from optuna_ds.domain import Phase
from optuna_ds.domain import accumulation_for
from optuna_ds.space import build_knob_space
from optuna_ds.studies import ExperimentBuilder


def _builder(raw: dict, gpus: int = 4) -> ExperimentBuilder:
    user = parse_user_config(raw, path="ds.json", script_args=["--deepspeed_config", "ds.json"])
    return ExperimentBuilder(user=user, results_dir="/r", total_gpus=gpus)


def _gas(b: ExperimentBuilder, mbs: int) -> int:
    """The accumulation of a size, as the planner's problem gives it (``Problem.config``), from the builder's bounds."""
    return accumulation_for(mbs, max_batch=b.max_batch_per_gpu(), min_batch=b.min_batch_per_gpu(),
                            default=b._user.gradient_accumulation_steps)


RAW = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "fp16": {"enabled": True},
    "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
    "zero_optimization": {"stage": [1, 2], "overlap_comm": [True, False], "offload_optimizer": {"device": "cpu"}},
    "autotuning": {"enabled": True, "start_profile_step": 2, "end_profile_step": 4},
}


def test_experiment_config_is_the_users_with_tuned_values() -> None:
    b = _builder(RAW)
    space = build_knob_space(2, RAW["zero_optimization"], fast=False)
    exp = b.build(Config(stage=2, micro_batch=8, accumulation=2, knobs={"overlap_comm": True}), phase=Phase.KNOBS, space=space)
    c = exp.ds_config
    assert exp.name == "z2_gas2_tmbspg8_ocT"
    assert (c["train_micro_batch_size_per_gpu"], c["gradient_accumulation_steps"], c["train_batch_size"]) == (8, 2, 64)
    assert c["zero_optimization"] == {"stage": 2, "overlap_comm": True, "offload_optimizer": {"device": "cpu"}}
    assert c["fp16"] == {"enabled": True} and c["optimizer"]["type"] == "Adam"
    assert c["autotuning"] == {"enabled": True, "metric_path": "/r/z2_gas2_tmbspg8_ocT/metrics.json", "start_profile_step": 2, "end_profile_step": 4}


def test_gradient_accumulation_follows_max_train_batch_size() -> None:
    b = _builder({**RAW, "autotuning": {"enabled": True, "max_train_batch_size": 256}})
    assert b.max_batch_per_gpu() == 64
    assert [_gas(b, m) for m in (1, 8, 16, 48, 64, 100)] == [64, 8, 4, 1, 1, 1]
    # Without a bound the user's accumulation stays.
    assert _gas(_builder(RAW), 16) == 2


def test_no_experiment_is_below_min_train_batch_size() -> None:
    # As max_train_batch_size bounds the global batch (micro-batch x accumulation x data-parallel
    # GPUs) from above, min_train_batch_size bounds it from below, by accumulating more.
    b = _builder({**RAW, "autotuning": {"enabled": True, "min_train_batch_size": 100}}, gpus=4)
    assert [_gas(b, m) for m in (1, 3, 8, 25, 64)] == [25, 9, 4, 2, 2]  # the user's 2 where it is enough
    assert all(b.train_batch_size(m, _gas(b, m)) >= 100 for m in range(1, 80))
    both = _builder({**RAW, "autotuning": {"enabled": True, "min_train_batch_size": 192, "max_train_batch_size": 256}}, gpus=4)
    assert [_gas(both, m) for m in (1, 16, 48, 64)] == [64, 4, 1, 1]
    assert all(192 <= both.train_batch_size(m, _gas(both, m)) <= 256 for m in (1, 2, 4, 8, 16, 32, 48, 64))
    assert _gas(both, 40) == 2  # 1 would be 160: the floor wins over the bound (320)


def test_users_train_batch_size_bounds_the_global_batch() -> None:
    b = _builder({**RAW, "train_batch_size": 32, "gradient_accumulation_steps": 2}, gpus=4)
    assert _gas(b, 4) == 2 and b.train_batch_size(4, 2) == 32


def test_auto_train_batch_size_is_left_to_the_script() -> None:
    b = _builder({**RAW, "train_batch_size": "auto"})
    exp = b.build(Config(stage=1, micro_batch=4, accumulation=_gas(b, 4)), phase=Phase.MICRO_BATCH, space=build_knob_space(1, {}, fast=True))
    assert exp.ds_config["train_batch_size"] == "auto"


def test_profile_run_keeps_offload_and_uses_minimum_memory() -> None:
    exp = _builder(RAW).build_profile()
    c = exp.ds_config
    assert c["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    assert c["train_micro_batch_size_per_gpu"] == 1
    assert c["autotuning"]["model_info"] == {"profile": True}
    assert c["autotuning"]["model_info_path"] == "/r/profile_model_info/model_info.json"
