"""Property: any config is either tuned or refused with one clean line, never a crash."""
from __future__ import annotations

from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from conftest import assert_tuned_or_refused


KEYS = ["enabled", "results_dir", "exps_dir", "overwrite", "metric", "start_profile_step", "end_profile_step", "fast",
        "max_train_batch_size", "min_train_micro_batch_size_per_gpu", "max_train_micro_batch_size_per_gpu", "mp_size",
        "num_tuning_micro_batch_sizes", "tuner_type", "tuner_early_stopping", "tuner_num_trials", "arg_mappings", "model_info",
        "tuner_typ", "metrics", "bogus"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3000), st.floats(allow_nan=True), st.text(max_size=8),
                    st.sampled_from(["throughput", "latency", "FLOPS", "gridsearch", "random", "model_based", "auto", "all"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=6)
mbs_values = st.one_of(st.integers(1, 64), st.lists(st.integers(1, 64), min_size=1, max_size=4), st.just("auto"), values, st.integers(-2, 0))
zero = st.dictionaries(
    st.sampled_from(["stage", "overlap_comm", "reduce_bucket_size", "offload_optimizer", "stage3_prefetch_bucket_size", "x"]),
    st.one_of(values, st.sampled_from([0, 1, 2, 3, "all", [1, 3], [0, 9]]), st.lists(st.sampled_from([True, 5e7, 5e8, 1]), max_size=3)),
    max_size=4,
)
positive = st.integers(1, 64)
typed_autotuning = st.fixed_dictionaries(
    {"enabled": st.just(True)},
    optional={
        "metric": st.sampled_from(["throughput", "latency", "FLOPS", "flops"]),
        "fast": st.booleans(),
        "tuner_type": st.sampled_from(["gridsearch", "random", "model_based"]),
        "start_profile_step": st.integers(0, 6),
        "end_profile_step": st.integers(0, 6),
        "max_train_batch_size": st.one_of(st.none(), positive),
        "min_train_micro_batch_size_per_gpu": positive,
        "max_train_micro_batch_size_per_gpu": positive,
        "mp_size": st.integers(1, 4),
        "num_tuning_micro_batch_sizes": positive,
        "arg_mappings": st.just({"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"}),
        "model_info": st.one_of(st.none(), st.fixed_dictionaries({"num_params": positive})),
    },
)
typed_zero = st.fixed_dictionaries(
    {"stage": st.sampled_from([0, 1, 2, 3, "all", [1, 3], [0, 2, 3]])},
    optional={"overlap_comm": st.sampled_from([True, [True, False]]), "reduce_bucket_size": st.sampled_from([5e8, [5e7, 5e8]]),
              "stage3_prefetch_bucket_size": st.just([1e6, 1e7]), "offload_optimizer": st.just({"device": "cpu"})},
)
typed_configs = st.fixed_dictionaries(
    {"autotuning": typed_autotuning, "zero_optimization": typed_zero},
    optional={"train_micro_batch_size_per_gpu": st.one_of(positive, st.lists(positive, min_size=1, max_size=4), st.just("auto")),
              "gradient_accumulation_steps": st.one_of(positive, st.just("auto")), "train_batch_size": st.one_of(positive, st.just("auto")),
              "fp16": st.just({"enabled": True}), "optimizer": st.sampled_from([{"type": "SGD"}, {"type": "AdamW", "params": {"lr": 1e-3}}])},
)
garbage_configs = st.fixed_dictionaries(
    {"autotuning": st.one_of(typed_autotuning, values, st.dictionaries(st.sampled_from(KEYS), values, max_size=6))},
    optional={"train_micro_batch_size_per_gpu": mbs_values, "gradient_accumulation_steps": mbs_values,
              "train_batch_size": mbs_values, "zero_optimization": st.one_of(typed_zero, zero, values)},
)
configs = st.one_of(typed_configs, garbage_configs)
args = st.lists(st.sampled_from(["--deepspeed", "ds.json", "--per_device_train_batch_size", "8", "x", "-1", "--bs=3"]), max_size=5)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=configs, extra=args)
def test_every_config_is_tuned_or_cleanly_refused(raw: dict, extra: list[str]) -> None:
    assert_tuned_or_refused(raw, script_args=["--deepspeed_config", "ds.json", *extra], gpus=2)
