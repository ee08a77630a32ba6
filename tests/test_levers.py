"""The levers DeepSpeed added after its autotuner (issue 37): ZeRO++ and the offload variants,
each a dimension only where it acts, checked by DeepSpeed before launch, and a setting the
accelerator cannot run failed for a reason of its own."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import run_in_process
from optuna_ds._errors import ConfigError
from optuna_ds.config import check_gpus
from optuna_ds.config import check_with_deepspeed
from optuna_ds.config import parse_user_config
from optuna_ds.domain import Config
from optuna_ds.domain import FailureReason
from optuna_ds.domain import Phase
from optuna_ds.launcher._classify import classify
from optuna_ds.space import build_knob_space
from optuna_ds.space import knob_defaults
from optuna_ds.studies._builder import ExperimentBuilder

ZEROPP = {"zero_quantized_weights", "zero_quantized_gradients", "zero_hpz_partition_size"}
SUPER = "offload_optimizer.super_offload"


def _user(zero: dict[str, Any], **raw: Any) -> Any:
    return parse_user_config({"zero_optimization": zero, "autotuning": {"enabled": True, "fast": False}, **raw}, path="/x/ds.json", script_args=[])


def test_zeropp_is_a_dimension_only_at_stage_3_between_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    from optuna_ds.space import _levers

    # Where the accelerator has no quantizer kernels (DeepSpeed's CPU one), qwZ and qgZ are no
    # dimension: every rank raises, then hangs until the trial's timeout.
    monkeypatch.setattr(_levers, "quantizer_kernels", lambda: False)
    assert build_knob_space(3, {}, fast=False, ranks=16, ranks_per_node=8).tuned.keys() & ZEROPP == {"zero_hpz_partition_size"}
    monkeypatch.setattr(_levers, "quantizer_kernels", lambda: True)
    assert not ZEROPP & build_knob_space(3, {}, fast=False, ranks=1).tuned.keys()
    assert not ZEROPP & build_knob_space(2, {}, fast=False, ranks=16, ranks_per_node=8).tuned.keys()
    one_node = build_knob_space(3, {}, fast=False, ranks=8, ranks_per_node=8).tuned
    # On one node ZeRO++ saves no inter-node bandwidth (the secondary partition would be the
    # primary one, DeepSpeed reduces the gradients unquantized whatever qgZ says): no launch on it.
    assert not ZEROPP & one_node.keys()
    two_nodes = build_knob_space(3, {}, fast=False, ranks=16, ranks_per_node=8).tuned
    assert two_nodes["zero_hpz_partition_size"] == [1, 8] and two_nodes["zero_quantized_gradients"] == [False, True]
    one_node_lists = build_knob_space(3, {"zero_quantized_gradients": [False, True], "zero_hpz_partition_size": [1, 2]}, fast=False,
                                      ranks=8, ranks_per_node=8).tuned
    assert "zero_quantized_gradients" not in one_node_lists and one_node_lists["zero_hpz_partition_size"] == [1, 2]
    assert not build_knob_space(3, {}, fast=True, ranks=16, ranks_per_node=8).tuned


def test_user_lists_of_zeropp_tune_where_they_act_and_read_numbers_in_one_form() -> None:
    user = {"zero_quantized_weights": [True, False], "zero_hpz_partition_size": [4, 4.0, 8e0], "zero_quantized_gradients": False}
    space = build_knob_space(3, user, fast=False, ranks=16, ranks_per_node=8)
    assert space.tuned["zero_quantized_weights"] == [True, False]
    assert space.tuned["zero_hpz_partition_size"] == [4, 8] and all(type(v) is int for v in space.tuned["zero_hpz_partition_size"])
    assert "zero_quantized_gradients" not in space.tuned and space.fixed["zero_quantized_gradients"] is False
    # One rank: nothing to quantize between ranks, so the list tunes nothing (DeepSpeed's default runs).
    alone = build_knob_space(3, user, fast=False, ranks=1)
    assert not ZEROPP & alone.tuned.keys() and "zero_quantized_weights" not in alone.fixed
    # Stages 1 and 2 pass none of them to their optimizer: dropped, lists and values.
    assert not ZEROPP & {*build_knob_space(2, user, fast=False, ranks=16).tuned, *build_knob_space(2, user, fast=False, ranks=16).fixed}
    assert build_knob_space(3, {"zero_hpz_partition_size": [8, 8.0]}, fast=False, ranks=16, ranks_per_node=8).fixed["zero_hpz_partition_size"] == 8


def test_offload_settings_are_dimensions_only_with_offload() -> None:
    zero = {"offload_optimizer": {"device": "cpu", "pin_memory": [True, False], "super_offload": [False, True]},
            "offload_param": {"device": "cpu", "pin_memory": [False, True]}}
    z3 = build_knob_space(3, zero, fast=False, superchip=False)
    assert z3.tuned["offload_optimizer.pin_memory"] == [True, False] and z3.tuned[SUPER] == [False, True]
    assert z3.tuned["offload_param.pin_memory"] == [False, True]
    assert z3.fixed["offload_optimizer"] == {"device": "cpu"} and z3.fixed["offload_param"] == {"device": "cpu"}
    # SuperOffload is ZeRO-3's; parameter offload too.
    z1 = build_knob_space(1, zero, fast=False)
    assert z1.tuned.keys() & {SUPER, "offload_param.pin_memory"} == set() and "offload_optimizer.pin_memory" in z1.tuned
    # No offload: its settings set nothing.
    none = build_knob_space(3, {"offload_optimizer": {"device": "none", "pin_memory": [True, False]}}, fast=False)
    assert not any(k.startswith("offload_") for k in none.tuned)
    assert not any(k.startswith("offload_") for k in build_knob_space(3, zero, fast=True).tuned)


def test_superoffload_is_proposed_for_stage3_cpu_offload_on_a_superchip_only() -> None:
    mine = {"offload_optimizer": {"device": "cpu"}}
    assert build_knob_space(3, mine, fast=False, superchip=True).tuned[SUPER] == [False, True]
    assert SUPER not in build_knob_space(3, mine, fast=False, superchip=False).tuned
    assert SUPER not in build_knob_space(2, mine, fast=False, superchip=True).tuned
    assert SUPER not in build_knob_space(3, {"offload_optimizer": {"device": "nvme"}}, fast=False, superchip=True).tuned
    # The offload variants the planner adds: their arms tune it, the arm without offload does not.
    space = build_knob_space(3, {}, fast=False, superchip=True)
    assert SUPER not in space.tuned and space.dimensions[SUPER] == [False, True]
    for label in ("offload-opt", "offload-opt-param"):
        arm = space.with_offload(label)
        assert arm.tuned[SUPER] == [False, True] and knob_defaults(arm)[SUPER] is False
    assert space.with_offload("") is space
    assert not build_knob_space(3, {}, fast=False, superchip=False).offload_tuned


def test_knob_defaults_are_deepspeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    from optuna_ds.space import _levers

    monkeypatch.setattr(_levers, "quantizer_kernels", lambda: True)  # a GPU node's
    space = build_knob_space(3, {"offload_optimizer": {"device": "cpu", "pin_memory": [False, True]}}, fast=False, ranks=16,
                             ranks_per_node=8, superchip=True)
    defaults = knob_defaults(space)
    assert defaults["zero_quantized_weights"] is False and defaults["zero_quantized_gradients"] is False
    assert defaults["zero_hpz_partition_size"] == 1 and defaults["offload_optimizer.pin_memory"] is True and defaults[SUPER] is False
    assert defaults.keys() == space.tuned.keys()


def test_a_dotted_knob_reaches_its_section_of_the_experiments_config(tmp_path: Path) -> None:
    user = _user({"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": [True, False]}, "zero_quantized_weights": [False, True]})
    space = build_knob_space(3, user.zero_section(), fast=False, ranks=2, ranks_per_node=2)
    builder = ExperimentBuilder(user=user, results_dir=str(tmp_path), total_gpus=2)
    config = Config(stage=3, micro_batch=2, knobs={"offload_optimizer.pin_memory": False, "zero_quantized_weights": True})
    zero = builder.build(config, phase=Phase.KNOBS, space=space).ds_config["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": False} and zero["zero_quantized_weights"] is True
    assert space.fixed["offload_optimizer"] == {"device": "cpu"}, "the space's own section is not written to"


@pytest.mark.parametrize("ranks", [2, 16])
def test_every_value_proposed_is_one_deepspeeds_config_model_accepts(ranks: int) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    space = build_knob_space(3, {}, fast=False, ranks=ranks, ranks_per_node=8, superchip=True)
    for offload in ("", "offload-opt", "offload-opt-param"):
        arm = space.with_offload(offload)
        for key, values in arm.tuned.items():
            for value in values:
                zero = {**arm.zero_section({key: value}), "stage": 3}
                DeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "train_batch_size": 1, "zero_optimization": zero})


@pytest.mark.parametrize(("zero", "message"), [
    ({"stage": 3, "zero_quantized_weights": [False, "maybe"]}, "zero_optimization.zero_quantized_weights must be true, false"),
    ({"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": [True, 1]}}, "zero_optimization.offload_optimizer.pin_memory must be true"),
    ({"stage": 3, "offload_optimizer": {"device": ["cpu", "none"]}}, "zero_optimization.offload_optimizer.device must be one of"),
])
def test_bad_lever_values_are_one_line_before_launch(zero: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        _user(zero)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_deepspeed_checks_every_value_listed_inside_an_offload_section() -> None:
    ok = {"stage": 3, "zero_quantized_weights": [False, True], "zero_hpz_partition_size": [1, 8],
          "offload_optimizer": {"device": "cpu", "pin_memory": [True, False], "super_offload": [False, True], "ratio": [1.0, 0.5]}}
    check_with_deepspeed(_user(ok))
    bad = {**ok, "offload_optimizer": {"device": "cpu", "ratio": [1.0, 1.5]}}
    with pytest.raises(ConfigError, match=r"^ds.json: DeepSpeed rejects zero_optimization.offload_optimizer.ratio = 1.5: ") as e:
        check_with_deepspeed(_user(bad))
    assert "\n" not in str(e.value)
    # Partial offload is ZeRO-3's: DeepSpeed asserts it, at the stage that lists it.
    with pytest.raises(ConfigError, match=r"at ZeRO stage 1 with zero_optimization.offload_optimizer.ratio = 0.5: DeepSpeed rejects"):
        check_with_deepspeed(_user({"stage": [1, 3], "offload_optimizer": {"device": "cpu", "ratio": [1.0, 0.5]}}))
    with pytest.raises(ConfigError, match=r"DeepSpeed rejects zero_optimization.zero_hpz_partition_size = 2.5: .*integer"):
        check_with_deepspeed(_user({"stage": 3, "zero_hpz_partition_size": [1, 2.5]}))


def test_hpz_must_divide_the_gpus_of_an_experiment() -> None:
    check_gpus(_user({"stage": 3, "zero_hpz_partition_size": [1, 4, 8, 32]}), total_gpus=16)
    with pytest.raises(ConfigError, match=r"^zero_optimization.zero_hpz_partition_size \(3\) must divide the 16 GPU\(s\)"):
        check_gpus(_user({"stage": 3, "zero_hpz_partition_size": [1, 3.0]}), total_gpus=16)
    with pytest.raises(ConfigError, match="must divide"):
        check_gpus(_user({"stage": 3, "zero_hpz_partition_size": 6}), total_gpus=16)


def test_a_bad_lever_exits_2_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": [1.0, 2.0]}},
              "autotuning": {"enabled": True}}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    p = run_in_process(["tune", "--num_gpus", "1", "train.py", "--deepspeed_config", "ds.json"],
                       cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "offload_optimizer.ratio = 2.0" in lines[0] and "Traceback" not in p.stderr


# What DeepSpeed 0.19.8 prints on the CPU accelerator for zero_quantized_weights (its quantizer
# has no CPU kernel) and for super_offload (asserted CUDA-only).
_QUANTIZER_ON_CPU = """\
[rank0]:   File "/venv/lib/python3.12/site-packages/deepspeed/runtime/zero/partition_parameters.py", line 865, in __init__
[rank0]:     CUDAQuantizer.quantizer_cuda_module = deepspeed.ops.op_builder.QuantizerBuilder().load()
[rank0]:   File "/venv/lib/python3.12/site-packages/deepspeed/ops/op_builder/cpu/no_impl.py", line 21, in load
[rank0]:     raise ValueError("This op had not been implemented on CPU backend.")
[rank0]: ValueError: This op had not been implemented on CPU backend.
"""
_SUPER_OFFLOAD_ON_CPU = """\
[rank0]:     _validate_superoffload_accelerator()
[rank0]: AssertionError: SuperOffload only supports NVIDIA CUDA GPUs, but found accelerator 'cpu'.
"""


@pytest.mark.parametrize(("stderr", "detail"), [
    (_QUANTIZER_ON_CPU, "not supported here: DeepSpeed's Quantizer op: This op had not been implemented on CPU backend."),
    (_SUPER_OFFLOAD_ON_CPU, "not supported here: SuperOffload only supports NVIDIA CUDA GPUs, but found accelerator 'cpu'."),
])
def test_a_setting_the_accelerator_cannot_run_is_a_reason_of_its_own(stderr: str, detail: str) -> None:
    reason, text = classify(returncode=1, timed_out=False, metrics=None, stdout_tail="", stderr_tail=stderr)
    assert reason is FailureReason.UNSUPPORTED and text == detail
    assert reason.judges_config  # the setting fails wherever it runs here: never run again
    # DeepSpeed's ranks hung after the quantizer's error until the trial timeout killed them: its reason still.
    hung, text = classify(returncode=-15, timed_out=True, metrics=None, stdout_tail="", stderr_tail=stderr)
    assert hung is FailureReason.UNSUPPORTED and text.startswith(detail) and "hung" in text
    assert classify(returncode=1, timed_out=False, metrics=None, stdout_tail="", stderr_tail="ValueError: x")[0] is FailureReason.ERROR


def test_deepcompile_is_no_dimension() -> None:
    for stage in range(4):
        space = build_knob_space(stage, {}, fast=False, ranks=16, ranks_per_node=8, superchip=True)
        assert not any("compile" in k for k in space.dimensions)
