from __future__ import annotations

import json

import pytest

from optuna_ds._errors import ConfigError
from optuna_ds.domain import Config
from optuna_ds.domain import Knobs
from optuna_ds.domain import Offload
from optuna_ds.space import build_knob_space
from optuna_ds.space import default_tuning_space
from optuna_ds.space import estimate_memory
from optuna_ds.space import knob_defaults
from optuna_ds.space import user_offloads


def test_default_spaces_come_from_deepspeed() -> None:
    from deepspeed.autotuning import constants

    z1 = default_tuning_space(1)
    assert z1 == {k: v for k, v in constants.DEFAULT_TUNING_SPACE_ZERO_1["zero_optimization"].items() if k != "stage"}
    assert default_tuning_space(0) == {}


def test_stage3_space_tunes_stage3_knobs_not_ignored_ones() -> None:
    z3 = default_tuning_space(3, hidden_size=1024)
    assert "allgather_bucket_size" not in z3 and "reduce_scatter" not in z3
    assert round(0.9 * 1024 * 1024) in z3["stage3_prefetch_bucket_size"]
    odd = default_tuning_space(3, hidden_size=1023)["stage3_prefetch_bucket_size"]
    assert all(float(v).is_integer() for v in odd)  # DeepSpeed's config model refuses a fractional element count
    assert 10240.0 in z3["stage3_param_persistence_threshold"]
    assert "stage3_max_live_parameters" in z3


def test_user_value_fixes_a_knob_and_list_tunes_it() -> None:
    user = {"stage": 1, "reduce_bucket_size": [5e7, 5e8], "allgather_bucket_size": 5e8, "offload_optimizer": {"device": "cpu"}}
    space = build_knob_space(1, user, fast=False)
    assert space.tuned == {"reduce_bucket_size": [5e7, 5e8]}
    assert space.fixed == {"allgather_bucket_size": 5e8, "offload_optimizer": {"device": "cpu"}}
    assert space.size == 2


def test_fast_mode_tunes_no_knobs_but_keeps_fixed_sections() -> None:
    space = build_knob_space(2, {"overlap_comm": [True, False], "offload_optimizer": {"device": "cpu"}}, fast=True)
    assert space.tuned == {}
    assert space.fixed == {"offload_optimizer": {"device": "cpu"}}


def test_stage3_only_overrides_skip_lower_stages() -> None:
    user = {"stage3_prefetch_bucket_size": [1e6, 1e7], "offload_param": {"device": "cpu"}}
    assert "stage3_prefetch_bucket_size" not in build_knob_space(1, user, fast=False).tuned
    assert "offload_param" not in build_knob_space(2, user, fast=False).fixed
    z3 = build_knob_space(3, user, fast=False)
    assert z3.tuned["stage3_prefetch_bucket_size"] == [1e6, 1e7] and z3.fixed["offload_param"] == {"device": "cpu"}


def test_empty_list_is_an_error() -> None:
    with pytest.raises(ConfigError, match="zero_optimization.overlap_comm must not be an empty list"):
        build_knob_space(2, {"overlap_comm": []}, fast=False)


def test_names_are_deepspeed_style_and_identify_configs() -> None:
    assert Config(stage=1, micro_batch=3).name == "z1_gas1_tmbspg3"
    config = Config(stage=2, micro_batch=8, accumulation=2, knobs={"reduce_bucket_size": 5e8, "overlap_comm": True})
    assert config.name == "z2_gas2_tmbspg8_ocT_rbs5e8"
    assert Config(stage=2, micro_batch=8, accumulation=2, knobs={"reduce_bucket_size": 5e7}).name != Config(stage=2, micro_batch=8, accumulation=2, knobs={"reduce_bucket_size": 5e8}).name
    # Colliding acronyms fall back to the full keys.
    collide = Config(stage=1, micro_batch=1, knobs={"a_b": 1, "ab_bb": 2}).name
    assert "a_b1" in collide and "ab_bb2" in collide
    # The offload variant and a re-measurement are named after the knobs: stored tunings match them.
    offloaded = Config(stage=3, micro_batch=4, offload="offload-opt-param", knobs={"overlap_comm": True})
    assert offloaded.run_name(2) == "z3_gas1_tmbspg4_ocT_offload-opt-param_r2" and offloaded.run_name() == offloaded.name


def test_a_config_is_one_identity_whatever_its_knobs_order_or_missing_offload() -> None:
    a = Config(stage=2, micro_batch=8, offload=None, knobs={"reduce_bucket_size": 5e8, "overlap_comm": True})
    b = Config(stage=2, micro_batch=8, offload="", knobs=(("overlap_comm", True), ("reduce_bucket_size", 5e8)))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a.knobs == (("overlap_comm", True), ("reduce_bucket_size", 5e8)) and a.knob_dict == {"overlap_comm": True, "reduce_bucket_size": 5e8}
    assert a.offload == "" and a.offload is Offload.NONE and a.arm == (2, "")
    assert Config(stage=2, micro_batch=8, accumulation=2) != Config(stage=2, micro_batch=8)


def test_a_number_has_one_form_from_the_parse_to_the_record() -> None:
    # JSON's 5e8 and DeepSpeed's docs' 500000000: one value to DeepSpeed, so one to every layer.
    written = Config(stage=1, micro_batch=4, knobs={"reduce_bucket_size": 5e8})
    typed = Config(stage=1, micro_batch=4, knobs={"reduce_bucket_size": 500000000})
    assert written == typed and written.name == typed.name and written.to_attrs() == typed.to_attrs()
    assert written.knobs == (("reduce_bucket_size", 500000000),) and type(written.knob_dict["reduce_bucket_size"]) is int
    assert Knobs({"b": 1.5, "a": True, "c": "auto"}) == (("a", True), ("b", 1.5), ("c", "auto"))
    space = build_knob_space(1, {"reduce_bucket_size": [500000000, 5e8, 2e8], "allgather_bucket_size": 5e8}, fast=False)
    assert space.tuned["reduce_bucket_size"] == [500000000, 200000000] and space.fixed["allgather_bucket_size"] == 500000000
    assert all(type(v) is int for values in build_knob_space(2, {}, fast=False).tuned.values() for v in values if not isinstance(v, bool))
    assert knob_defaults(space) == {"reduce_bucket_size": 500000000} and type(knob_defaults(space)["reduce_bucket_size"]) is int


def test_a_name_tells_configs_apart_where_its_short_form_does_not() -> None:
    # Two significant digits write both 1e6: the name carries a digest of the exact values.
    mega = Config(stage=1, micro_batch=4, knobs={"reduce_bucket_size": 1000000})
    mebi = Config(stage=1, micro_batch=4, knobs={"reduce_bucket_size": 1048576})
    assert mega.name == "z1_gas1_tmbspg4_rbs1e6"  # exact: unchanged, as stored tunings hold it
    assert mebi.name.startswith("z1_gas1_tmbspg4_rbs1e6_") and mebi.name != mega.name
    assert Config(stage=1, micro_batch=4, knobs={"reduce_bucket_size": 1048576.0}).name == mebi.name
    assert Config(stage=1, micro_batch=4, knobs={"x": "a b"}).name != Config(stage=1, micro_batch=4, knobs={"x": "ab"}).name


def test_the_config_is_stored_by_one_serialiser_and_read_back() -> None:
    config = Config(stage=3, micro_batch=4, offload="offload-opt", accumulation=2, knobs={"overlap_comm": True, "reduce_bucket_size": 5e8})
    attrs = config.to_attrs()
    assert attrs == {"stage": 3, "micro_batch_size": 4, "gradient_accumulation_steps": 2, "offload": "offload-opt",
                     "knobs": {"overlap_comm": True, "reduce_bucket_size": 500000000}}
    assert Config.from_attrs(json.loads(json.dumps(attrs))) == config
    assert Config.from_attrs({"stage": 0, "micro_batch_size": 2}) == Config(stage=0, micro_batch=2)
    assert Config.from_attrs({"exp_name": "x"}) is None


def test_memory_estimate_partitions_by_stage() -> None:
    kw = dict(num_params=1_000_000_000, trainable_params=None, activation_per_sample=1e9, device_memory=80e9, num_gpus=8, precision="fp16")
    z0, z1, z2, z3 = (estimate_memory(stage=s, **kw) for s in range(4))
    assert z0.instantiation == pytest.approx(2e9 + 2e9 + 12e9)
    assert z1.optimizer == pytest.approx(12e9 / 8) and z1.gradients == pytest.approx(2e9)
    assert z2.gradients == pytest.approx(2e9 / 8)
    assert z3.params == pytest.approx(2e9 / 8)
    assert z0.max_micro_batch_size == int((80e9 - 16e9) // 1e9)
    assert z0.max_micro_batch_size < z1.max_micro_batch_size < z2.max_micro_batch_size < z3.max_micro_batch_size


def test_memory_estimate_frozen_params_offload_and_misfit() -> None:
    base = dict(num_params=1_000_000_000, activation_per_sample=1e8, device_memory=16e9, num_gpus=1, precision="fp32")
    full = estimate_memory(stage=0, trainable_params=None, **base)
    assert not full.fits  # 4 + 4 + 8 bytes per parameter: 16 GB
    peft = estimate_memory(stage=0, trainable_params=10_000_000, **base)
    assert peft.fits and peft.gradients == pytest.approx(4e7)
    offload = estimate_memory(stage=3, trainable_params=None, zero={"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}, **base)
    assert offload.params == 0 and offload.optimizer == 0 and offload.gradients == 0 and offload.fits


def test_offloaded_optimizer_takes_the_gradients_off_the_gpu() -> None:
    # A 12.7B-parameter model on one 24 GB GPU: with parameters and optimizer offloaded at ZeRO-3
    # nothing of the model states stays (DeepSpeed's estimator: the largest layer), so the arm is
    # offered; its fp16 gradients (25 GB) are on the host with the optimizer.
    base = dict(num_params=12_700_000_000, trainable_params=None, activation_per_sample=1e8, device_memory=24e9,
                num_gpus=1, precision="fp16")
    both = {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    assert estimate_memory(stage=3, zero=both, **base).fits
    # The optimizer alone: the 16-bit parameters stay, as DeepSpeed's estimator counts them (2 bytes each).
    z2 = estimate_memory(stage=2, zero={"offload_optimizer": {"device": "cpu"}}, **dict(base, num_params=10**9))
    assert z2.instantiation == pytest.approx(2e9)
    assert not estimate_memory(stage=3, zero={"offload_optimizer": {"device": "cpu"}}, **base).fits


def test_offload_variants_and_knob_defaults() -> None:
    space = build_knob_space(3, {}, fast=False, hidden_size=1024)
    offloaded = space.with_offload("offload-opt")
    assert offloaded.fixed["offload_optimizer"]["device"] == "cpu" and "offload_param" not in offloaded.fixed
    assert offloaded.to_dict() == {"stage": 3, "tuned": offloaded.tuned, "fixed": offloaded.fixed, "offload": "offload-opt",
                                   "offload_tuned": {}}
    assert user_offloads({"offload_param": {"device": "nvme"}}) and not user_offloads({"stage": 3})
    # What a config that leaves the tuned knobs out runs with: stage 3 overlaps by default, stage 2 not.
    assert knob_defaults(space)["overlap_comm"] is True and knob_defaults(build_knob_space(2, {}, fast=False))["overlap_comm"] is False
    assert knob_defaults(build_knob_space(2, {}, fast=False)).keys() == build_knob_space(2, {}, fast=False).tuned.keys()
    assert knob_defaults(build_knob_space(1, {}, fast=True)) == {}


def test_overlap_makes_the_buckets_take_four_and_a_half_times_their_size() -> None:
    base = dict(num_params=10**9, trainable_params=None, activation_per_sample=1e6, device_memory=8e10, num_gpus=8, precision="fp16")
    plain = estimate_memory(stage=2, zero={}, **base)
    assert estimate_memory(stage=2, zero={"overlap_comm": True}, **base).buffers == 4.5 * plain.buffers
    assert estimate_memory(stage=2, zero={"reduce_bucket_size": 5e7, "allgather_bucket_size": 5e7}, **base).buffers == plain.buffers / 10
