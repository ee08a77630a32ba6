"""Activation checkpointing as a dimension of the tuning (issue 37): the script's switch through
``arg_mappings`` (Hugging Face's ``--gradient_checkpointing``), DeepSpeed's
``activation_checkpointing`` section where the user lists its values, both checked before the
first launch; what a run logs of it; and a tuning on the simulated launcher whose physics make
checkpointing pay, or not act at all."""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from conftest import Workspace
from conftest import assert_one_line_error
from optuna_ds._errors import ConfigError
from optuna_ds.config import check_with_deepspeed
from optuna_ds.config import parse_user_config
from optuna_ds.config import set_switch
from optuna_ds.config import switch_state
from optuna_ds.domain import Config
from optuna_ds.domain import FailureReason
from optuna_ds.domain import Knobs
from optuna_ds.domain import Phase
from optuna_ds.launcher._checkpointing import read_checkpointing
from optuna_ds.launcher._classify import classify
from optuna_ds.space import build_checkpointing_space
from optuna_ds.space import build_knob_space
from optuna_ds.studies import ExperimentBuilder
from optuna_ds.studies import checkpointing_space

FLAG = "--gradient_checkpointing"
MAPPINGS = {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size", "gradient_checkpointing": FLAG}
SWITCH = Knobs({"gradient_checkpointing": True})


def _user(raw: dict[str, Any], args: list[str] | None = None, **autotuning: Any) -> Any:
    config = {"train_micro_batch_size_per_gpu": "auto", **raw, "autotuning": {"enabled": True, **autotuning}}
    return parse_user_config(config, path="/x/ds.json", script_args=args if args is not None else ["--deepspeed", "ds.json"])


def test_the_switch_is_a_dimension_where_arg_mappings_maps_it_and_the_users_arguments_leave_it_off() -> None:
    user = _user({}, arg_mappings=MAPPINGS)
    space = checkpointing_space(user)
    assert space.switch == FLAG and space.settings() == [SWITCH]
    assert not checkpointing_space(_user({})).settings()  # no mapping: the script may not take the flag
    on = _user({}, ["--deepspeed", "ds.json", FLAG], arg_mappings=MAPPINGS)
    assert on.checkpointing_on and not checkpointing_space(on).settings()  # the user's own setting runs everywhere


def test_a_switch_is_set_as_both_argparse_and_the_trainer_read_it() -> None:
    assert switch_state([FLAG], FLAG) and switch_state([f"{FLAG}=true"], FLAG) and switch_state([FLAG, "--fp16"], FLAG)
    assert not switch_state([FLAG, "False"], FLAG) and not switch_state(["--x"], FLAG)
    assert set_switch(["--a", FLAG, "False", "--b"], FLAG, True) == ["--a", "--b", FLAG]
    assert set_switch(["--a", FLAG, "--b", f"{FLAG}=1"], FLAG, False) == ["--a", "--b"]


def test_the_section_tunes_what_the_user_lists_where_it_can_act() -> None:
    section = {"cpu_checkpointing": [False, True], "partition_activations": [False, True], "number_checkpoints": 4,
               "contiguous_memory_optimization": [False, True], "profile": [False, True]}
    one = build_checkpointing_space(section, switch=None, switch_on=False, mp_size=1)
    # One model-parallel rank: nothing to partition; a profiler frees nothing.
    assert one.tuned == {"activation_checkpointing.cpu_checkpointing": [False, True]}
    assert one.settings() == [Knobs({"activation_checkpointing.cpu_checkpointing": True})]
    assert one.section({}) == {"number_checkpoints": 4}
    two = build_checkpointing_space(section, switch=FLAG, switch_on=False, mp_size=2)
    settings = two.settings()
    # Contiguous checkpoints need partitioned activations (DeepSpeed's configure() asserts it).
    assert all(dict(s).get("activation_checkpointing.partition_activations") for s in settings
               if dict(s).get("activation_checkpointing.contiguous_memory_optimization"))
    assert all(dict(s)["gradient_checkpointing"] is True for s in settings) and SWITCH in settings


@pytest.mark.parametrize(("section", "message"), [
    ({"cpu_checkpointing": [False, "yes"]}, "activation_checkpointing.cpu_checkpointing must be true, false or a list of them"),
    ({"cpu_checkpoint": True}, "DeepSpeed does not know activation_checkpointing.cpu_checkpoint; did you mean 'cpu_checkpointing'?"),
    ({"number_checkpoints": [2, 4]}, "activation_checkpointing.number_checkpoints must be a positive integer or null"),
    ("on", "activation_checkpointing must be an object"),
])
def test_bad_section_values_are_one_line_before_launch(section: Any, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        _user({"activation_checkpointing": section})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_deepspeeds_checkpointing_checks_every_listed_value() -> None:
    check_with_deepspeed(_user({"activation_checkpointing": {"cpu_checkpointing": [False, True], "partition_activations": [False, True],
                                                             "contiguous_memory_optimization": [False, True], "number_checkpoints": 8}}))
    with pytest.raises(ConfigError, match=r"^ds.json with activation_checkpointing.contiguous_memory_optimization = True: DeepSpeed's "
                                          r"checkpointing refuses it") as e:
        check_with_deepspeed(_user({"activation_checkpointing": {"contiguous_memory_optimization": [False, True]}}))
    assert "\n" not in str(e.value)


def test_the_experiment_gets_the_section_and_the_switch(tmp_path: Path) -> None:
    user = _user({"activation_checkpointing": {"cpu_checkpointing": [False, True], "number_checkpoints": 4}},
                 ["--deepspeed", "ds.json", FLAG, "False"], arg_mappings=MAPPINGS)
    builder = ExperimentBuilder(user=user, results_dir=str(tmp_path), total_gpus=1)
    space = build_knob_space(0, {}, fast=True)
    plain = builder.build(Config(stage=0, micro_batch=2), phase=Phase.MICRO_BATCH, space=space)
    # The list replaced by DeepSpeed's default; the switch off where the config does not set it.
    assert plain.ds_config["activation_checkpointing"] == {"number_checkpoints": 4} and plain.switches == {FLAG: False}
    setting = Knobs({"gradient_checkpointing": True, "activation_checkpointing.cpu_checkpointing": True})
    on = builder.build(Config(stage=0, micro_batch=8, knobs=setting), phase=Phase.MICRO_BATCH, space=space)
    assert on.ds_config["activation_checkpointing"] == {"number_checkpoints": 4, "cpu_checkpointing": True}
    assert "gradient_checkpointing" not in json.dumps(on.ds_config) and on.switches == {FLAG: True}
    assert on.name == "z0_gas1_tmbspg8_accT_gcT"
    assert builder.build_profile().ds_config["activation_checkpointing"] == {"number_checkpoints": 4}


_CONFIGURED = """\
[2026-01-01 00:00:00,000] [INFO] [checkpointing.py:1248:configure] Activation Checkpointing Information
[2026-01-01 00:00:00,000] [INFO] [checkpointing.py:1249:configure] ----Partition Activations False, CPU CHECKPOINTING True
[2026-01-01 00:00:00,000] [INFO] [checkpointing.py:1250:configure] ----contiguous Memory Checkpointing False with None total layers
[2026-01-01 00:00:00,000] [INFO] [checkpointing.py:1251:configure] ----Synchronization False
[2026-01-01 00:00:00,000] [INFO] [checkpointing.py:1252:configure] ----Profiling time in checkpointing False
"""


def test_what_deepspeeds_checkpointing_logged_is_read() -> None:
    assert read_checkpointing(_CONFIGURED) == {"partition_activations": False, "cpu_checkpointing": True,
                                               "contiguous_memory_optimization": False, "number_checkpoints": None,
                                               "synchronize_checkpoint_boundary": False, "profile": False}
    # DeepSpeed's ranks log at WARNING unless the script says otherwise: then nothing tells.
    assert read_checkpointing("[INFO] [launch.py:245:main] process 1 spawned\ntime (ms) | fwd: 1.0") is None
    assert read_checkpointing("[2026-01-01] [INFO] [config.py:1003:print] DeepSpeedEngine configuration:") == {}


@pytest.mark.parametrize(("stderr", "switches", "detail"), [
    ("ValueError: GPT2LMHeadModel does not support gradient checkpointing.", [FLAG], "GPT2LMHeadModel does not support gradient checkpointing."),
    ("[rank0]: AssertionError: Contiguous Checkpointing is only available with partitioned activations. Set partitioned activations "
     "to true in deepspeed config", [], "Contiguous Checkpointing is only available with partitioned activations"),
    ("train.py: error: unrecognized arguments: --gradient_checkpointing", [FLAG], "the script refuses --gradient_checkpointing"),
    # DeepSpeed 0.19.8's cpu_checkpointing on its CPU accelerator.
    ('[rank0]:   File "/venv/lib/python3.11/site-packages/deepspeed/runtime/activation_checkpointing/checkpointing.py", line 738, in '
     "backward\n[rank0]: RuntimeError: both arguments to linear need to be at least 1D, but they are 0D and 2D", [],
     "inside DeepSpeed's checkpointing: [rank0]: RuntimeError: both arguments"),
])
def test_a_setting_the_script_cannot_run_is_a_reason_of_its_own(stderr: str, switches: list[str], detail: str) -> None:
    reason, text = classify(returncode=1, timed_out=False, metrics=None, stdout_tail="", stderr_tail=stderr, switches=switches)
    assert reason is FailureReason.CHECKPOINTING and detail in text and reason.judges_config
    # Without the switch, the script refusing an argument fails every config alike.
    refused = classify(returncode=2, timed_out=False, metrics=None, stdout_tail="", stderr_tail="train.py: error: unrecognized arguments: --x")
    assert refused[0] is FailureReason.SCRIPT


def _workspace(ws: Workspace, **section: Any) -> str:
    return ws.config({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 0}, **section,
                      "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 32,
                                     "arg_mappings": {"gradient_checkpointing": FLAG}}})


def test_a_tuning_where_checkpointing_pays_runs_it_and_the_optimum_carries_the_flag(ws: Workspace) -> None:
    # The curve peaks at 24; without checkpointing 4 samples fit, with it 20.
    surface = {"oom_above": {"0": 4}, "checkpointing": {"flag": FLAG, "kept": 0.2}}
    p = ws.tune(_workspace(ws), surface=surface)
    assert p.returncode == 0, p.stdout + p.stderr
    runs = [entry for entry in ws.launches() if not entry.get("profile")]
    on = [entry for entry in runs if FLAG in entry["args"]]
    assert on and all(entry["mbs"] > 4 for entry in on)
    assert all(FLAG not in entry["args"] for entry in runs if entry["mbs"] <= 4)
    optimal = json.loads((ws.results / "ds_config_optimal.json").read_text())
    command = shlex.split((ws.results / "cmd_optimal.txt").read_text())
    assert FLAG in command and optimal["train_micro_batch_size_per_gpu"] > 4
    summary = (ws.results / "optuna_ds_summary.txt").read_text()
    assert "Checkpointing: the optimum uses --gradient_checkpointing" in summary and "the best config without it" in summary
    report = (ws.results / "report.html").read_text()
    assert "z0 checkpointing" in report and "Checkpointing: the optimum uses" in report


def test_a_script_that_ignores_the_switch_is_reported_once_and_explored_no_further(ws: Workspace) -> None:
    surface = {"oom_above": {"0": 4}, "checkpointing": {"flag": FLAG, "kept": 0.2, "ignored": True}}
    p = ws.tune(_workspace(ws), surface=surface)
    assert p.returncode == 0, p.stdout + p.stderr
    on = [entry for entry in ws.launches() if FLAG in entry["args"]]
    assert 1 <= len(on) <= 3
    summary = (ws.results / "optuna_ds_summary.txt").read_text()
    assert summary.count("the script never checkpoints") == 1
    assert FLAG not in shlex.split((ws.results / "cmd_optimal.txt").read_text())


def test_a_model_that_cannot_checkpoint_fails_for_its_own_reason_once(ws: Workspace) -> None:
    surface = {"oom_above": {"0": 4}, "checkpointing": {"flag": FLAG, "kept": 0.2, "unsupported": True}}
    p = ws.tune(_workspace(ws), surface=surface)
    assert p.returncode == 0, p.stdout + p.stderr
    assert len([entry for entry in ws.launches() if FLAG in entry["args"]]) == 1
    assert "does not support gradient checkpointing" in (ws.results / "optuna_ds_summary.txt").read_text()


def test_a_bad_section_value_exits_2_in_one_line(ws: Workspace) -> None:
    p = ws.tune(_workspace(ws, activation_checkpointing={"cpu_checkpointing": [False, "maybe"]}))
    assert_one_line_error(p, "activation_checkpointing.cpu_checkpointing")
    assert not ws.launches()


def test_a_listed_section_value_is_tuned_for_a_script_that_configures_deepspeeds_checkpointing(ws: Workspace) -> None:
    # The script checkpoints through DeepSpeed's API: cpu_checkpointing keeps 30% of a sample's
    # activations on the device, so 13 samples fit where 4 did; its configure() logs what it read.
    config = ws.config({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 0},
                        "activation_checkpointing": {"cpu_checkpointing": [False, True]},
                        "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 32}})
    surface = {"oom_above": {"0": 4}, "checkpointing": {"configures": True, "section_kept": 0.3}}
    p = ws.tune(config, surface=surface)
    assert p.returncode == 0, p.stdout + p.stderr
    optimal = json.loads((ws.results / "ds_config_optimal.json").read_text())
    assert optimal["activation_checkpointing"] == {"cpu_checkpointing": True} and optimal["train_micro_batch_size_per_gpu"] > 4
    summary = (ws.results / "optuna_ds_summary.txt").read_text()
    assert "Checkpointing: the optimum uses activation_checkpointing.cpu_checkpointing=true" in summary
    # Every experiment got the section without its list: DeepSpeed's default where it is not set.
    for folder in ws.results.iterdir():
        if (folder / "ds_config.json").exists() and not folder.name.startswith("profile"):
            section = json.loads((folder / "ds_config.json").read_text())["activation_checkpointing"]
            assert section in ({}, {"cpu_checkpointing": True}), (folder.name, section)
