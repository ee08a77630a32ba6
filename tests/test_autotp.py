"""AutoTP as a dimension of the tuning (issue 37): DeepSpeed's ``tensor_parallel.autotp_size``
where the user lists it, checked before the first launch; the global batch over the ranks that
train on samples of their own; DeepSpeed's throughput, which counts each sample once per rank of
its group, put right; a script that cannot run it, a reason of its own; and a tuning on the
simulated launcher whose physics make it pay."""
from __future__ import annotations

import json
from typing import Any

import optuna
import pytest

from conftest import Workspace
from conftest import assert_one_line_error
from optuna_ds._errors import ConfigError
from optuna_ds.config import check_gpus
from optuna_ds.config import check_with_deepspeed
from optuna_ds.config import parse_user_config
from optuna_ds.domain import Config
from optuna_ds.domain import FailureReason
from optuna_ds.domain import Knobs
from optuna_ds.domain import Phase
from optuna_ds.launcher._classify import classify
from optuna_ds.space import build_autotp_space
from optuna_ds.space import build_knob_space
from optuna_ds.space import distinct_batch
from optuna_ds.space import samples_per_second
from optuna_ds.studies import ExperimentBuilder

TP = "tensor_parallel.autotp_size"


def _user(raw: dict[str, Any], **autotuning: Any) -> Any:
    config = {"train_micro_batch_size_per_gpu": 4, **raw, "autotuning": {"enabled": True, **autotuning}}
    return parse_user_config(config, path="/x/ds.json", script_args=["--deepspeed_config", "ds.json"])


def test_a_list_tunes_its_sizes_above_one_against_autotp_off_and_a_number_is_the_users_own() -> None:
    space = build_autotp_space({"autotp_size": [1, 4, 2, 2], "tp_overlap_comm": True})
    assert space.sizes == (2, 4) and space.settings() == [Knobs({TP: 2}), Knobs({TP: 4})] and space.fixed_size == 1
    assert space.section({}) == {"tp_overlap_comm": True}
    assert space.section({TP: 4}) == {"tp_overlap_comm": True, "autotp_size": 4}
    own = build_autotp_space({"autotp_size": 2})
    assert not own.sizes and own.fixed_size == 2 and own.section({}) == {"autotp_size": 2}
    assert build_autotp_space({"autotp_size": [1]}).section({}) is None and not build_autotp_space(None).sizes


@pytest.mark.parametrize(("section", "message"), [
    ({"autotp_size": [1, "2"]}, "tensor_parallel.autotp_size must be a list of positive integers"),
    ({"autotp_size": []}, "tensor_parallel.autotp_size must be a list of positive integers"),
    ({"autotp_size": -2}, "tensor_parallel.autotp_size must be a non-negative integer"),
    ({"autotp_size": True}, "tensor_parallel.autotp_size must be a non-negative integer"),
    ("two", "tensor_parallel must be an object"),
])
def test_bad_sizes_are_one_line_before_launch(section: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _user({"tensor_parallel": section})


def test_deepspeeds_own_model_checks_every_listed_value_and_the_rest_of_the_section() -> None:
    check_with_deepspeed(_user({"tensor_parallel": {"autotp_size": [1, 2, 4]}}))
    with pytest.raises(ConfigError, match=r"tensor_parallel\.tp_overlap_com.*did you mean 'tp_overlap_comm'"):
        check_with_deepspeed(_user({"tensor_parallel": {"autotp_size": [1, 2], "tp_overlap_com": True}}))
    with pytest.raises(ConfigError, match="vocab_parallel_ce_backend"):
        check_with_deepspeed(_user({"tensor_parallel": {"autotp_size": [1, 2], "vocab_parallel_ce_backend": "fast"}}))


def test_a_size_must_divide_the_gpus_and_a_node_and_mp_size_is_another_model_parallelism() -> None:
    user = _user({"tensor_parallel": {"autotp_size": [1, 2, 4]}})
    check_gpus(user, total_gpus=8, gpus_per_node=4)
    with pytest.raises(ConfigError, match="autotp_size 4 must divide the 6 GPU"):
        check_gpus(user, total_gpus=6)
    with pytest.raises(ConfigError, match="autotp_size 4 must divide the 4 GPU.* and the 2 of a node"):
        check_gpus(user, total_gpus=4, gpus_per_node=2)
    with pytest.raises(ConfigError, match="beside autotuning.mp_size"):
        _user({"tensor_parallel": {"autotp_size": [1, 2]}}, mp_size=2)


def _builder(raw: dict[str, Any], gpus: int = 8, **autotuning: Any) -> ExperimentBuilder:
    return ExperimentBuilder(user=_user(raw, **autotuning), results_dir="/r", total_gpus=gpus)


def test_the_global_batch_is_over_the_ranks_that_train_on_samples_of_their_own() -> None:
    # 8 GPUs, max_train_batch_size 64: 8 a rank without AutoTP, 16 a data-parallel rank of groups of 2.
    b = _builder({"tensor_parallel": {"autotp_size": [1, 2, 4]}}, max_train_batch_size=64)
    assert b.data_parallel(1) == 8 and b.data_parallel(2) == 4 and b.data_parallel(4) == 2
    assert b.max_batch_per_gpu() == 8 and b.batch_bounds() == ((2, 16, 1), (4, 32, 1))
    # DeepSpeed 0.19.8 parses the config before its tensor-parallel groups exist: its
    # train_batch_size counts every rank, as its batch assertion requires.
    space = build_knob_space(0, {}, fast=True)
    split = b.build(Config(stage=0, micro_batch=4, accumulation=4, knobs={TP: 2}), phase=Phase.MICRO_BATCH, space=space)
    assert split.ds_config["train_batch_size"] == 4 * 4 * 8 and split.ds_config["tensor_parallel"] == {"autotp_size": 2}
    assert distinct_batch(split.ds_config) == 64
    plain = b.build(Config(stage=0, micro_batch=4, accumulation=2), phase=Phase.MICRO_BATCH, space=space)
    assert "tensor_parallel" not in plain.ds_config and distinct_batch(plain.ds_config) == 64
    # At stage 3 the dimension does not act: no section.
    z3 = b.build(Config(stage=3, micro_batch=4, accumulation=2), phase=Phase.MICRO_BATCH, space=build_knob_space(3, {}, fast=True))
    assert "tensor_parallel" not in z3.ds_config
    assert "tensor_parallel" not in b.build_profile().ds_config
    # The user's own size: every experiment, its global batch over the groups.
    own = _builder({"tensor_parallel": {"autotp_size": 2}}, max_train_batch_size=64)
    assert own.data_parallel_size == 4 and own.max_batch_per_gpu() == 16


def test_deepspeeds_throughput_is_divided_by_the_ranks_that_share_a_sample() -> None:
    split = {"train_batch_size": 64, "tensor_parallel": {"autotp_size": 2}}
    assert samples_per_second({"throughput": 200.0, "latency": 5.0}, split) == {
        "throughput": 100.0, "latency": 5.0, "throughput_deepspeed": 200.0}
    assert samples_per_second({"throughput": 200.0}, {"train_batch_size": 64}) == {"throughput": 200.0}


@pytest.mark.parametrize("stderr", [
    "AssertionError: Data inconsistency within the TP group. Please check the Dataloader implementation to ensure consistency.",
    "AssertionError: AutoTP not supported for model. Please provide policy.",
    "AssertionError: Not able to determine model policy automatically. Please provide policy.",
    'File "/x/deepspeed/module_inject/auto_tp.py", line 405, in _replace\nRuntimeError: shape mismatch',
])
def test_a_script_or_model_that_cannot_run_autotp_is_a_reason_of_its_own(stderr: str) -> None:
    reason, text = classify(returncode=1, timed_out=False, metrics=None, stdout_tail="", stderr_tail=stderr, autotp=True)
    assert reason is FailureReason.AUTOTP and text.startswith("AutoTP cannot run here")
    # The same text from a run without AutoTP says nothing of it.
    assert classify(returncode=1, timed_out=False, metrics=None, stdout_tail="", stderr_tail=stderr)[0] is FailureReason.ERROR


def _workspace(ws: Workspace, sizes: Any = (1, 2)) -> str:
    # A model of hidden size 8192: its all-reduces are a few percent of a step (the fake's model
    # of a million parameters, a few hundred wide, would spend most of it on them).
    return ws.config({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 0},
                      "tensor_parallel": {"autotp_size": list(sizes)},
                      "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 32, "model_info": {"hidden_size": 8192}}})


def _tune(ws: Workspace, config: str, surface: dict[str, Any]) -> Any:
    return ws.tune(config, "--num_gpus", "2", surface=surface, env=ws.env(surface, LOCAL_SIZE="2"))


def test_a_tuning_where_autotp_pays_runs_it_and_the_optimum_carries_it(ws: Workspace) -> None:
    # The curve peaks at 24; whole, 4 samples fit a GPU; split over 2 ranks, 10.
    surface = {"oom_above": {"0": 4}, "autotp": {"factor": 0.95, "kept": 0.4}}
    p = _tune(ws, _workspace(ws), surface)
    assert p.returncode == 0, p.stdout + p.stderr
    runs = [entry for entry in ws.launches() if not entry.get("profile") and entry["mbs"] > 0]
    split = [entry for entry in runs if entry["autotp"] == 2]
    assert split and all(entry["mbs"] > 4 for entry in split)
    optimal = json.loads((ws.results / "ds_config_optimal.json").read_text())
    assert optimal["tensor_parallel"] == {"autotp_size": 2} and optimal["train_micro_batch_size_per_gpu"] > 4
    summary = (ws.results / "optuna_ds_summary.txt").read_text()
    assert "AutoTP: the optimum splits each layer over 2 GPUs" in summary and "AutoTP 2)" in summary
    # Measured as samples trained: the engine's metrics file counts each twice, and says so.
    study = optuna.load_study(study_name="optuna-ds-z0", storage=ws.storage)
    trial = next(t for t in study.trials if t.user_attrs.get("exp_name") == summary.split("Optimum (", 1)[1].split(":", 1)[0])
    engine = json.loads((ws.results / trial.user_attrs["exp_name"] / "metrics.json").read_text())["throughput"]
    assert trial.value == pytest.approx(engine / 2)
    assert "z0 AutoTP 2" in (ws.results / "report.html").read_text()


def test_autotp_listed_with_zero_3_only_is_told_it_never_applies_there(ws: Workspace) -> None:
    config = ws.config({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3},
                        "tensor_parallel": {"autotp_size": [1, 2]},
                        "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 8, "model_info": {"hidden_size": 8192}}})
    p = _tune(ws, config, {})
    assert p.returncode == 0, p.stdout + p.stderr
    assert not [entry for entry in ws.launches() if entry.get("autotp", 1) > 1]
    summary = (ws.results / "optuna_ds_summary.txt").read_text()
    assert "AutoTP: not launched: it applies at ZeRO stages 0 to 2 only" in summary and "the tuning ran ZeRO-3 only" in summary
    assert "pays only where the model states" not in summary


def test_a_script_whose_data_differ_within_a_group_is_reported_once_and_no_size_tried_again(ws: Workspace) -> None:
    surface = {"oom_above": {"0": 4}, "autotp": {"kept": 0.4, "fails": True}}
    p = _tune(ws, _workspace(ws, (1, 2)), surface)
    assert p.returncode == 0, p.stdout + p.stderr
    assert len([entry for entry in ws.launches() if entry.get("autotp", 1) > 1]) == 1
    summary = (ws.results / "optuna_ds_summary.txt").read_text()
    assert summary.count("Data inconsistency within the TP group") == 1 and "no size tried again" in summary
    assert "tensor_parallel" not in json.loads((ws.results / "ds_config_optimal.json").read_text())


def test_a_size_that_does_not_divide_the_gpus_exits_2_in_one_line(ws: Workspace) -> None:
    p = _tune(ws, _workspace(ws, (1, 4)), {})
    assert_one_line_error(p, "tensor_parallel.autotp_size 4 must divide the 2 GPU(s)")
    assert not ws.launches()

