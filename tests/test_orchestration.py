"""`optuna-ds tune` and `run` end to end against the fake launcher: studies, trial attrs,
output files, resume, failures, stage heuristics, samplers."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import optuna
import pytest

from conftest import FAKE_LAUNCHER
from conftest import LAUNCHER_OPTION
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from conftest import Workspace
from conftest import assert_one_line_error

FAST = {
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
    "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}},
    "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 64},
}


def _study(ws: Workspace, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=ws.storage)


def _launched(ws: Workspace, profile: bool = False) -> list[dict]:
    return [l for l in ws.launches() if bool(l.get("profile")) == profile and not l.get("training")]


def test_fast_tuning_records_studies_trials_and_deepspeed_files(ws: Workspace) -> None:
    ws.config(FAST)
    surface = {"oom_above": {"1": 40}, "peak": 24}
    p = ws.tune(surface=surface)
    assert p.returncode == 0, p.stderr + p.stdout

    study = _study(ws, "optuna-ds-z1")
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    trials = study.get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert complete and failed
    for t in trials:
        attrs = t.user_attrs
        # A re-measurement of a config is named for how many times it ran before.
        assert re.fullmatch(rf"z1_gas1_tmbspg{t.params['train_micro_batch_size_per_gpu']}(_r\d+)?", attrs["exp_name"])
        assert set(attrs) >= {"metrics", "ds_config", "cmd", "result_dir", "phase"}
        # The user's other sections reach every experiment.
        assert attrs["ds_config"]["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
        assert attrs["ds_config"]["optimizer"]["type"] == "AdamW"
        assert attrs["ds_config"]["train_batch_size"] == attrs["micro_batch_size"]
    for t in failed:
        assert t.user_attrs["reason"] == "oom" and "CUDA out of memory" in t.user_attrs["stderr_tail"]
        assert t.params["train_micro_batch_size_per_gpu"] > 40
    # Optuna-native: each profiled step's figure an intermediate value (steps 3-5, the exit step 6),
    # the out-of-memory runs infeasible by Optuna's constraints, the profile run no longer running.
    for t in complete:
        assert sorted(t.intermediate_values) == [3, 4, 5, 6] and t.intermediate_values[6] == pytest.approx(t.value)
        assert t.constraints == {"0": 0.0, "1": 0.0}
    assert all(t.constraints == {"0": 1.0, "1": 0.0} for t in failed)
    assert _study(ws, "optuna-ds").user_attrs["profile_run"]["state"] == "finished"
    # The optimum is the planner's choice, by its estimate: near the peak, not only the highest measurement.
    choice = _study(ws, "optuna-ds").user_attrs["choice"]
    best = next(t for t in complete if t.number == choice["trial"])
    assert best.value == pytest.approx(best.user_attrs["metrics"]["throughput"])
    assert len(best.user_attrs["step_times_ms"]) == 4  # steps 3-5 the engine logged, and the one its metrics file holds
    assert 16 <= best.params["train_micro_batch_size_per_gpu"] <= 32  # the peak is at 24
    root = _study(ws, "optuna-ds")
    assert root.user_attrs["model_info"]["num_params"] == 1_000_000
    assert root.user_attrs["stage:z1"]["memory"]["stage"] == 1 and study.user_attrs["memory"]["stage"] == 1

    name = best.user_attrs["exp_name"]
    res = ws.results
    assert sorted(p.name for p in (res / name).iterdir()) == ["cmd.txt", "ds_config.json", "exp.json", "metrics.json", "stderr.log", "stdout.log"]
    assert (ws.root / "autotuning_exps" / f"{name}.json").exists()
    optimal = json.loads((res / "ds_config_optimal.json").read_text())
    assert "autotuning" not in optimal
    assert optimal["train_micro_batch_size_per_gpu"] == best.params["train_micro_batch_size_per_gpu"]
    assert optimal["zero_optimization"] == {"stage": 1, "offload_optimizer": {"device": "cpu"}}
    cmd = (res / "cmd_optimal.txt").read_text()
    assert "ds_config_optimal.json" in cmd and "train.py" in cmd
    summary = (res / "optuna_ds_summary.txt").read_text()
    assert "| z1 " in summary and "| global " in summary and name in summary
    assert f"Total number of experiments: {len(trials)}." in summary
    assert "scale the learning rate by sqrt(" in summary  # batch 2 -> the best batch
    # Why the search ended, said once, before the outcome.
    stopped = [line for line in p.stdout.splitlines() if line.startswith("the planner stopped: ")]
    assert stopped == ["the planner stopped: no experiment left is expected to pay"], p.stdout
    assert p.stdout.index(stopped[0]) < p.stdout.index("| global ")


def test_no_experiment_runs_below_min_train_batch_size(ws: Workspace) -> None:
    ws.config({**FAST, "autotuning": {**FAST["autotuning"], "min_train_batch_size": 48, "fast": False, "tuner_type": "gridsearch",
                                      "tuner_num_trials": 4}})
    p = ws.tune(surface={"oom_above": {"1": 40}, "peak": 24})
    assert p.returncode == 0, p.stderr + p.stdout
    records = [t.user_attrs for t in _study(ws, "optuna-ds-z1").get_trials() if "ds_config" in t.user_attrs]
    assert any(r["phase"] == "knobs" for r in records)
    for r in records:
        c = r["ds_config"]
        assert c["train_batch_size"] == c["train_micro_batch_size_per_gpu"] * c["gradient_accumulation_steps"] >= 48, c
    optimal = json.loads((ws.results / "ds_config_optimal.json").read_text())
    assert optimal["train_micro_batch_size_per_gpu"] * optimal["gradient_accumulation_steps"] >= 48


def test_decision_log_has_one_line_per_launch(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    # `make bench-parallel` reads it: the time from a slot becoming free to its launch, as the
    # tuning tells its observer, logged by the benchmark's driver of `optuna-ds` (in this process:
    # its observer's hook, as its main sets it).
    from optuna_ds.reporting import Progress

    ws.config(FAST)
    log = ws.root / "decisions.jsonl"
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import timed_driver

    monkeypatch.setattr(Progress, "decided", timed_driver._appender(str(log)))
    p = ws.tune(surface={"peak": 24})
    assert p.returncode == 0, p.stderr + p.stdout
    decisions = [json.loads(line) for line in log.read_text().splitlines()]
    names = sorted(l["args"][l["args"].index("--deepspeed_config") + 1].split("/")[-2] for l in _launched(ws))
    assert sorted(d["name"] for d in decisions) == names
    assert all(0 <= d["seconds"] < 60 for d in decisions)


def test_rerun_launches_nothing_and_overwrite_starts_afresh(ws: Workspace) -> None:
    ws.config(FAST)
    assert ws.tune().returncode == 0
    first = len(ws.launches())
    p = ws.tune()
    assert p.returncode == 0, p.stderr
    assert len(ws.launches()) == first, "a finished experiment ran again"
    assert "| global " in p.stdout
    p = ws.tune("ds_config.json", "--overwrite")
    assert p.returncode == 0, p.stderr
    assert len(ws.launches()) == 2 * first
    assert len(_study(ws, "optuna-ds-z1").get_trials()) == len(_launched(ws)) // 2


def test_latency_is_minimised(ws: Workspace) -> None:
    ws.config({**FAST, "autotuning": {**FAST["autotuning"], "metric": "latency"}})
    assert ws.tune(surface={"peak": 24}).returncode == 0
    study = _study(ws, "optuna-ds-z1")
    assert study.direction == optuna.study.StudyDirection.MINIMIZE
    complete = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert study.best_trial.value == min(t.value for t in complete)
    # Latency per step grows with the micro-batch: the smallest wins, unlike throughput (the
    # choice bracketed below, down to 1).
    sizes = [t.params["train_micro_batch_size_per_gpu"] for t in complete]
    assert study.best_trial.params["train_micro_batch_size_per_gpu"] == min(sizes) <= 2


def test_stages_that_cannot_fit_are_skipped_with_the_reason(ws: Workspace) -> None:
    # 2e9 fp32 parameters need 32 GB with Adam: more than this machine's memory at stage 0.
    ws.config({**FAST, "zero_optimization": {"stage": [0, 1]}})
    p = ws.tune(surface={"num_params": 2_000_000_000, "activation_mem_per_gpu": 1}, env=None)
    assert p.returncode in (0, 1), p.stderr
    summary = (ws.results / "optuna_ds_summary.txt").read_text()
    assert "z0 skipped: needs" in summary
    with pytest.raises(KeyError):
        _study(ws, "optuna-ds-z0")


def test_an_activation_estimate_that_leaves_room_nowhere_is_tried_not_believed(ws: Workspace) -> None:
    # The profile's activation per sample can be off by a factor: where it leaves room for no
    # sample at any stage, the stages whose model states fit are tried at the smallest size.
    ws.config({**FAST, "zero_optimization": {"stage": [0, 1]}})
    p = ws.tune(surface={"num_params": 1_000_000, "activation_mem_per_gpu": 10**15}, env=None)
    assert p.returncode == 0, p.stderr
    assert _launched(ws) and (ws.results / "ds_config_optimal.json").exists()


def test_all_stages_are_planned_together_and_each_outcome_has_a_reason(ws: Workspace) -> None:
    # 1e9 fp32 parameters with Adam on 4 GPUs: z0 fits micro-batches up to ~46, z3 hundreds.
    ws.config({**FAST, "zero_optimization": {"stage": "all"}})
    surface = {"base": {"0": 100, "1": 90, "2": 200, "3": 300}, "num_params": 1_000_000_000, "activation_mem_per_gpu": 200_000_000}
    p = ws.cli("tune", LAUNCHER_OPTION, FAKE_LAUNCHER, "train.py", "--deepspeed_config", "ds_config.json",
               env=ws.env(surface, LOCAL_SIZE="4"))
    assert p.returncode == 0, p.stderr
    summary = (ws.results / "optuna_ds_summary.txt").read_text()
    launched = _launched(ws)
    for stage in range(4):
        ran = any(l["stage"] == stage for l in launched)
        assert ran or f"z{stage} skipped: " in summary  # a stage not run says why
    assert all(l["include"] == "localhost:0,1,2,3" for l in launched)
    assert max(l["mbs"] for l in launched if l["stage"] == 0) < 64  # bounded by the memory model
    optimal = json.loads((ws.results / "ds_config_optimal.json").read_text())
    assert optimal["zero_optimization"]["stage"] == 3  # three times stage 0's throughput, and larger sizes fit


def test_all_stages_on_one_rank_lists_every_stage_as_deepspeed_does(ws: Workspace) -> None:
    # "all" on one device measured z0 only and said "list the stage to measure it" (issue 49):
    # DeepSpeed's "all" tunes every stage, and its summary lists each.
    ws.config({**FAST, "zero_optimization": {"stage": "all"}})
    p = ws.tune("ds_config.json", "--num_gpus", "1", surface={"num_params": 1_000_000, "activation_mem_per_gpu": 1_000_000})
    assert p.returncode == 0, p.stderr
    assert {l["stage"] for l in _launched(ws)} == {0, 1, 2, 3}
    rows = [line.split("|")[1].strip() for line in (ws.results / "summary.txt").read_text().splitlines()[2:] if line.startswith("|")]
    assert rows == ["z0", "z1", "z2", "z3", "global"]
    assert "partitions nothing" not in (ws.results / "optuna_ds_summary.txt").read_text()


def test_failures_do_not_end_the_search_and_keep_their_reason(ws: Workspace) -> None:
    ws.config({**FAST, "train_micro_batch_size_per_gpu": [2, 4, 8, 16]})
    p = ws.tune("ds_config.json", "--trial-timeout", "3", surface={"error_at": [4], "no_metrics_at": [8], "hang_at": [16]})
    assert p.returncode == 0, p.stderr
    reasons = {t.params["train_micro_batch_size_per_gpu"]: t.user_attrs.get("reason") for t in _study(ws, "optuna-ds-z1").get_trials()}
    assert reasons == {2: None, 4: "error", 8: "no-metrics", 16: "timeout"}
    assert "failed" in (ws.results / "optuna_ds_summary.txt").read_text()


def test_a_failure_no_config_can_fix_stops_the_tuning_at_once_and_runs_again_on_resume(ws: Workspace) -> None:
    ws.config({**FAST, "train_micro_batch_size_per_gpu": [2, 4, 8, 16], "autotuning": {**FAST["autotuning"], "model_info": {"num_params": 1000}}})
    argparse = "usage: train.py [-h] [--deepspeed_config DEEPSPEED_CONFIG]\ntrain.py: error: unrecognized arguments: --num_gpus 1"
    p = ws.tune(surface={"script_error": argparse})
    assert p.returncode == 1, p.stdout + p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert "unrecognized arguments: --num_gpus 1" in line and "stderr.log" in line, line
    assert len(_launched(ws)) == 1  # not once per config
    (trial,) = _study(ws, "optuna-ds-z1").get_trials()
    assert trial.user_attrs["reason"] == "script" and "unrecognized arguments" in trial.user_attrs["detail"]
    # Fixed, the same command resumes: the failed experiment runs again.
    assert ws.tune().returncode == 0
    done = {t.params["train_micro_batch_size_per_gpu"] for t in _study(ws, "optuna-ds-z1").get_trials() if t.state.name == "COMPLETE"}
    assert trial.params["train_micro_batch_size_per_gpu"] in done


def test_given_model_info_skips_the_profile_run(ws: Workspace) -> None:
    ws.config({**FAST, "autotuning": {**FAST["autotuning"], "model_info": {"num_params": 1000}}})
    assert ws.tune().returncode == 0
    assert _launched(ws, profile=True) == []


def test_a_failed_profile_run_says_the_cause_and_the_log(ws: Workspace) -> None:
    ws.config(FAST)
    p = ws.tune(surface={"profile_fail": True})
    assert p.returncode == 1
    line = p.stderr.strip().splitlines()[-1]
    assert "profile run failed" in line and line.count("ValueError: model has no parameters") == 1  # said once
    assert "profile_model_info/stderr.log" in line
    assert "Traceback" not in p.stderr.replace("Traceback (most recent call last)", "")


def test_a_tuning_that_measured_nothing_takes_the_corrected_command(ws: Workspace) -> None:
    """A first try whose profile run failed (fp16 on a CPU, a typo in the script's arguments)
    ran no experiment: the corrected config tunes, with no --overwrite. Once an experiment ran,
    another config is refused as before: what the user paid for is never dropped unasked."""
    ws.config(FAST)
    assert ws.tune(surface={"profile_fail": True}).returncode == 1
    ws.config({**FAST, "gradient_accumulation_steps": 1})  # the user edits the config
    p = ws.tune()
    assert p.returncode == 0, p.stderr
    assert (ws.results / "ds_config_optimal.json").exists()
    ws.config(FAST)
    assert_one_line_error(ws.tune(), "whose config differs in gradient_accumulation_steps", "--overwrite")


@pytest.mark.parametrize("tuner", ["gridsearch", "random", "model_based"])
def test_knob_search_with_each_sampler(ws: Workspace, tuner: str) -> None:
    config = {
        **FAST,
        "train_micro_batch_size_per_gpu": [8, 24],
        "zero_optimization": {"stage": 2, "overlap_comm": [True, False], "reduce_bucket_size": [5e7, 5e8]},
        "autotuning": {"enabled": True, "fast": False, "tuner_type": tuner, "tuner_early_stopping": 100, "tuner_num_trials": 6, "num_tuning_micro_batch_sizes": 2},
    }
    ws.config(config)
    surface = {"knob_gain": {"overlap_comm": {"true": 1.2}, "reduce_bucket_size": {"500000000.0": 1.1}}}
    p = ws.tune("ds_config.json", surface=surface)
    assert p.returncode == 0, p.stderr
    trials = _study(ws, "optuna-ds-z2").get_trials()
    knob = [t for t in trials if t.user_attrs.get("phase") == "knobs" and t.state != TrialState.PRUNED and not t.user_attrs.get("repeat")]
    assert 1 <= len(knob) <= 6
    names = [t.user_attrs["exp_name"] for t in knob]
    assert len(names) == len(set(names)), "an experiment ran twice"
    for t in knob:
        zero = t.user_attrs["ds_config"]["zero_optimization"]
        assert zero["overlap_comm"] == t.params["overlap_comm"] and zero["stage"] == 2
    if tuner == "gridsearch":
        # 2 knobs x 2 values x 2 micro-batch sizes = 8 configs, capped at tuner_num_trials.
        assert len(knob) == 6
    best = json.loads((ws.results / "ds_config_optimal.json").read_text())
    assert best["zero_optimization"]["overlap_comm"] is True
    # The planner's choice is recorded once the knob search is over, whatever it would still try.
    choice = _study(ws, "optuna-ds").user_attrs["choice"]
    assert choice["stage"] == 2 and _study(ws, "optuna-ds-z2").trials[choice["trial"]].params.get("overlap_comm") is True
    assert "chosen: " in p.stdout + p.stderr


def test_early_stopping_ends_the_knob_search(ws: Workspace) -> None:
    config = {
        **FAST,
        "train_micro_batch_size_per_gpu": [8],
        "zero_optimization": {"stage": 1, "reduce_bucket_size": [1e6, 1e7, 1e8, 1e9], "allgather_bucket_size": [1e6, 1e7, 1e8, 1e9]},
        "autotuning": {"enabled": True, "fast": False, "tuner_type": "gridsearch", "tuner_early_stopping": 2, "num_tuning_micro_batch_sizes": 1},
    }
    ws.config(config)
    assert ws.tune().returncode == 0
    knob = [t for t in _study(ws, "optuna-ds-z1").get_trials() if t.user_attrs.get("phase") == "knobs"]
    ran = [t for t in knob if not t.user_attrs.get("repeat")]
    assert len(ran) == 2  # the surface ignores these knobs: no improvement over the micro-batch phase
    # A budget the planner's candidates check before proposing: no trial was created for a setting
    # that did not run (a pruned trial means one thing: a claim that stood down).
    assert all(t.state == TrialState.COMPLETE for t in knob)


def test_run_trains_with_the_optimal_config_and_returns_its_status(ws: Workspace) -> None:
    ws.config(FAST)
    p = ws.cli("run", LAUNCHER_OPTION, FAKE_LAUNCHER, "train.py", "--deepspeed_config", "ds_config.json",
               env=ws.env({}, FAKE_DS_TRAIN_EXIT="3"), process=True)  # the training's exit status, as the process's
    assert p.returncode == 3, p.stderr
    training = [l for l in ws.launches() if l.get("training")]
    assert len(training) == 1
    assert training[0]["args"][-1].endswith("ds_config_optimal.json")
    assert "training with micro-batch" in p.stdout


def test_script_arguments_reach_the_script_literally(ws: Workspace) -> None:
    ws.config({**FAST, "train_micro_batch_size_per_gpu": [4]})
    canary = ws.root / "pwned"
    p = ws.cli("tune", LAUNCHER_OPTION, FAKE_LAUNCHER, "train.py", "--deepspeed_config", "ds_config.json",
               "--name", f"x; touch {canary}", "--glob", "*", "--var", "$HOME")
    assert p.returncode == 0, p.stderr
    args = _launched(ws)[0]["args"]
    assert args[2:] == ["--name", f"x; touch {canary}", "--glob", "*", "--var", "$HOME"]
    assert not canary.exists()


def test_overwrite_touches_only_its_own_tuning(ws: Workspace) -> None:
    """`--overwrite` of tuning NAME must not delete a tuning named NAME-zeta in the same storage."""
    import os

    ws.config(FAST)
    storage = f"sqlite:///{ws.root / 'shared.db'}"
    assert ws.tune("ds_config.json", "--storage", storage, "--study-name", "optuna-ds-zeta", "--results-dir", "other",
                   "--exps-dir", "other_exps").returncode == 0  # folders of its own: two tunings never share one
    other = optuna.load_study(study_name="optuna-ds-zeta-z1", storage=storage).get_trials()
    assert ws.tune("ds_config.json", "--storage", storage).returncode == 0
    p = ws.tune("ds_config.json", "--storage", storage, "--overwrite")
    assert p.returncode == 0, p.stderr
    assert len(optuna.load_study(study_name="optuna-ds-zeta-z1", storage=storage).get_trials()) == len(other)
    assert all(os.path.isdir(t.user_attrs["result_dir"]) and "/other/" in t.user_attrs["result_dir"] for t in other)


def test_stage3_offloads_to_cpu_when_it_does_not_fit_otherwise(ws: Workspace) -> None:
    """A model whose states do not fit one device at any stage: it runs with the optimizer states
    offloaded to the CPU, named so, and the optimal config keeps the offload section."""
    import psutil

    device = psutil.virtual_memory().total  # what DeepSpeed's CPU accelerator reports
    num_params = int(device / 16 * 1.3)  # fp32 Adam: 16 bytes a parameter, 30% too many
    ws.config({"zero_optimization": {"stage": "all"}, "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 16}})
    p = ws.tune("ds_config.json", "--num_gpus", "1", surface={"num_params": num_params, "activation_mem_per_gpu": int(device / 100)})
    assert p.returncode == 0, p.stderr + p.stdout
    launched = _launched(ws)
    assert launched and all(l["stage"] >= 1 for l in launched)
    trials = [t for s in (1, 2, 3) for t in _study(ws, f"optuna-ds-z{s}").trials if t.state == TrialState.COMPLETE]
    assert trials and all(re.sub(r"_r\d+$", "", t.user_attrs["exp_name"]).endswith(("_offload-opt", "_offload-opt-param"))
                          for t in trials)
    assert all(t.user_attrs["ds_config"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu" for t in trials)
    optimal = json.loads((ws.results / "ds_config_optimal.json").read_text())
    assert optimal["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


def test_the_users_own_offload_sections_are_kept_and_nothing_else_is_tried(ws: Workspace) -> None:
    import psutil

    device = psutil.virtual_memory().total
    nvme = {"device": "nvme", "nvme_path": "/local_nvme"}
    ws.config({"zero_optimization": {"stage": 3, "offload_param": nvme}, "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 8}})
    p = ws.tune(surface={"num_params": int(device / 16 * 1.3), "activation_mem_per_gpu": int(device / 100)})
    assert p.returncode == 0, p.stderr + p.stdout
    trials = [t for t in _study(ws, "optuna-ds-z3").trials if "exp_name" in t.user_attrs]
    assert trials and all("offload" not in t.user_attrs["exp_name"] for t in trials)
    assert all(t.user_attrs["ds_config"]["zero_optimization"]["offload_param"] == nvme for t in trials)
    assert all("offload_optimizer" not in t.user_attrs["ds_config"]["zero_optimization"] for t in trials)


def _tune_on_one_slot(ws: Workspace, surface: dict) -> subprocess.CompletedProcess:
    p = ws.cli("tune", LAUNCHER_OPTION, FAKE_LAUNCHER, "train.py", "--deepspeed_config", "ds_config.json",
               env=ws.env(surface, LOCAL_SIZE="1"))
    assert p.returncode == 0, p.stderr + p.stdout
    return p


def _knob_trials(ws: Workspace, *, stages: tuple[int, ...]) -> list[tuple[int, FrozenTrial]]:
    """The knob search's trials of ``stages`` (not the planner's re-measurements), as (stage, trial),
    in the order they started."""
    knob = [(s, t) for s in stages for t in _study(ws, f"optuna-ds-z{s}").get_trials()
            if t.user_attrs.get("phase") == "knobs" and not t.user_attrs.get("repeat")]
    return sorted(knob, key=lambda st: st[1].datetime_start)


def test_full_mode_scores_knob_settings_at_the_measured_sizes_and_early_stopping_ends_them(ws: Workspace) -> None:
    """The planner scores the sampler's knob settings at an arm's best measured sizes, beside its
    other experiments, and finds the one that pays; tuner_early_stopping ends the search."""
    ws.config({"train_micro_batch_size_per_gpu": 2,
               "zero_optimization": {"stage": [1, 2], "overlap_comm": [False, True], "reduce_bucket_size": [5e7, 5e8, 1e9]},
               "autotuning": {"enabled": True, "fast": False, "max_train_micro_batch_size_per_gpu": 64, "tuner_early_stopping": 3}})
    # Throughput peaks at 12 samples, far from the memory limit.
    surface = {"base": {"0": 100, "1": 101, "2": 102, "3": 60}, "peak": 12, "num_params": 1_000_000_000,
               "activation_mem_per_gpu": 200_000_000, "knob_gain": {"overlap_comm": {"true": 1.10}}}
    p = ws.cli("tune", LAUNCHER_OPTION, FAKE_LAUNCHER, "train.py", "--deepspeed_config", "ds_config.json",
               env=ws.env(surface, LOCAL_SIZE="4"))
    assert p.returncode == 0, p.stderr + p.stdout
    trials = {s: _study(ws, f"optuna-ds-z{s}").get_trials() for s in (1, 2)}
    for s in (1, 2):
        measured = {t.user_attrs["micro_batch_size"] for t in trials[s] if t.user_attrs.get("phase") == "micro_batch" and t.value}
        knob = [t for t in trials[s] if t.user_attrs.get("phase") == "knobs" and t.state != TrialState.PRUNED]
        assert {t.user_attrs["micro_batch_size"] for t in knob} <= measured, p.stdout
    # Early stopping: at most 3 knob runs of a stage after its last improvement, plus those the
    # other 3 slots had under way.
    ran = sorted((t for t in trials[2] if t.user_attrs.get("phase") == "knobs" and not t.user_attrs.get("repeat")
                  and t.state != TrialState.PRUNED), key=lambda t: t.datetime_complete)
    values = [t.value or 0.0 for t in ran]
    best = [t.value for t in trials[2] if t.user_attrs.get("phase") == "micro_batch" and t.value]
    improvements = [i for i, v in enumerate(values) if v > max(values[:i] + best)]
    assert ran and len(ran) <= (max(improvements, default=-1) + 1) + 3 + 3, p.stdout
    optimal = json.loads((ws.results / "ds_config_optimal.json").read_text())
    assert optimal["zero_optimization"]["stage"] == 2 and optimal["zero_optimization"]["overlap_comm"] is True, p.stdout


def test_full_mode_learns_a_knobs_effect_at_one_stage_for_the_others(ws: Workspace) -> None:
    """A knob value's effect is shared by the stages that read it: stage 2's search finds that
    overlap pays, and stage 1, ahead by default, is tried with it and chosen."""
    ws.config({"train_micro_batch_size_per_gpu": [8, 12], "zero_optimization": {"stage": [1, 2], "overlap_comm": [False, True]},
               "autotuning": {"enabled": True, "fast": False, "max_train_micro_batch_size_per_gpu": 64}})
    surface = {"base": {"0": 100, "1": 103, "2": 102, "3": 60}, "peak": 12, "num_params": 1_000_000_000,
               "activation_mem_per_gpu": 200_000_000, "knob_gain": {"overlap_comm": {"true": 1.10}}}
    p = _tune_on_one_slot(ws, surface)
    knob = _knob_trials(ws, stages=(1, 2))
    assert {s for s, t in knob if t.params["overlap_comm"] is True} == {1, 2}, p.stdout
    optimal = json.loads((ws.results / "ds_config_optimal.json").read_text())
    assert optimal["zero_optimization"]["stage"] == 1 and optimal["zero_optimization"]["overlap_comm"] is True


def test_full_mode_finds_knobs_that_put_a_stage_behind_by_default_ahead(ws: Workspace) -> None:
    """Stage 1 is 1% behind stage 2 by default and gains more from small buckets (15% to 10%):
    the search ends with stage 1 and its knobs."""
    ws.config({"train_micro_batch_size_per_gpu": [8, 12],
               "zero_optimization": {"stage": [1, 2], "reduce_bucket_size": [5e7, 5e8], "allgather_bucket_size": 5e8,
                                     "overlap_comm": False, "contiguous_gradients": True, "reduce_scatter": True},
               "autotuning": {"enabled": True, "fast": False, "tuner_type": "gridsearch"}})
    surface = {"base": {"0": 100, "1": 101, "2": 102, "3": 60}, "peak": 12, "num_params": 1_000_000_000,
               "activation_mem_per_gpu": 200_000_000, "knob_gain": {"reduce_bucket_size": {"50000000.0": 1.10}},
               "knob_gain_at": {"1": {"reduce_bucket_size": {"50000000.0": 1.05}}}}
    p = _tune_on_one_slot(ws, surface)
    optimal = json.loads((ws.results / "ds_config_optimal.json").read_text())
    assert optimal["zero_optimization"]["stage"] == 1 and optimal["zero_optimization"]["reduce_bucket_size"] == 5e7, p.stdout


def test_full_mode_searches_the_knobs_of_a_close_stage_when_the_chosen_one_has_none(ws: Workspace) -> None:
    """ZeRO-0 has no knobs to tune: stage 1, 2% behind it by default, gets the knob search, and
    its knobs put it ahead."""
    # The grid, to the end: the search finds stage 1's best knobs whatever the sampler's luck.
    ws.config({"train_micro_batch_size_per_gpu": [12], "zero_optimization": {"stage": [0, 1]},
               "autotuning": {"enabled": True, "fast": False, "tuner_type": "gridsearch", "tuner_early_stopping": 20}})
    surface = {"base": {"0": 102, "1": 100, "2": 90, "3": 60}, "peak": 12, "num_params": 1_000_000_000,
               "activation_mem_per_gpu": 200_000_000, "knob_gain": {"reduce_bucket_size": {"50000000.0": 1.10}}}
    p = _tune_on_one_slot(ws, surface)
    knob = [t for t in _study(ws, "optuna-ds-z1").get_trials() if t.user_attrs.get("phase") == "knobs"]
    assert knob and any(t.params["reduce_bucket_size"] == 5e7 for t in knob), p.stdout
    optimal = json.loads((ws.results / "ds_config_optimal.json").read_text())
    assert optimal["zero_optimization"]["stage"] == 1 and optimal["zero_optimization"]["reduce_bucket_size"] == 5e7, p.stdout


def test_full_mode_tries_a_leaner_setting_above_the_size_that_ran_out_of_memory(ws: Workspace) -> None:
    """The choice sits at the memory edge: a setting with smaller buckets leaves room, so the
    planner tries it at a size the default knobs ran out of memory at, and a larger size wins."""
    ws.config({"zero_optimization": {"stage": 2, "reduce_bucket_size": [5e7, 5e8], "contiguous_gradients": [False, True],
                                     "overlap_comm": False, "reduce_scatter": True, "allgather_bucket_size": 5e8},
               "autotuning": {"enabled": True, "fast": False, "tuner_type": "gridsearch", "tuner_early_stopping": 20}})
    surface = {"base": {"2": 100}, "peak": 48, "oom_above": {"2": 10}, "num_params": 100_000_000,
               "activation_mem_per_gpu": 200_000_000,
               "knob_room": {"contiguous_gradients": {"false": 2}, "reduce_bucket_size": {"50000000.0": 1}}}
    p = _tune_on_one_slot(ws, surface)
    trials = _study(ws, "optuna-ds-z2").get_trials()
    largest = max(t.params["train_micro_batch_size_per_gpu"] for t in trials
                  if t.state == TrialState.COMPLETE and t.user_attrs.get("phase") == "micro_batch")
    assert largest <= 10 and any(t.user_attrs.get("phase") == "micro_batch" and t.user_attrs.get("reason") == "oom" for t in trials)
    above = [t for t in trials if t.user_attrs.get("phase") == "knobs" and t.params["train_micro_batch_size_per_gpu"] > largest]
    assert any(t.state == TrialState.COMPLETE and t.params["reduce_bucket_size"] == 5e7 for t in above), p.stdout
    optimal = json.loads((ws.results / "ds_config_optimal.json").read_text())
    assert optimal["train_micro_batch_size_per_gpu"] > largest and optimal["zero_optimization"]["reduce_bucket_size"] == 5e7
    # A rerun launches nothing: the storage holds every result the planner's decisions rest on.
    launched = len(ws.launches())
    _tune_on_one_slot(ws, surface)
    assert len(ws.launches()) == launched, "a finished tuning ran again"


def test_full_mode_measures_close_knob_settings_again_and_a_rerun_launches_nothing(ws: Workspace) -> None:
    """Knob settings within the noise of each other, each measured once: the planner measures a
    finalist again as a knob experiment before it chooses, and a rerun of the finished tuning
    launches nothing (it once proposed a knob setting's re-measurement that ran without its knobs,
    then stood down on that name for ever)."""
    ws.config({"train_micro_batch_size_per_gpu": [8], "zero_optimization": {"stage": 1, "reduce_bucket_size": [5e7, 2e8, 5e8]},
               "autotuning": {"enabled": True, "fast": False, "tuner_type": "gridsearch", "num_tuning_micro_batch_sizes": 1}})
    surface = {"noise": 0.03}
    assert ws.tune(surface=surface).returncode == 0
    trials = _study(ws, "optuna-ds-z1").get_trials()
    again = [t for t in trials if t.user_attrs.get("repeat") and t.user_attrs.get("phase") == "knobs"]
    assert again, [(t.user_attrs.get("exp_name"), t.value) for t in trials]
    for t in again:
        first = [u for u in trials if u.user_attrs.get("exp_name") == t.user_attrs["exp_name"].rsplit("_r", 1)[0]]
        assert first and first[0].params == t.params
        assert t.user_attrs["ds_config"]["zero_optimization"]["reduce_bucket_size"] == t.params["reduce_bucket_size"]
    launched = len(ws.launches())
    p = ws.tune(surface=surface, timeout=60)
    assert p.returncode == 0, p.stderr
    assert len(ws.launches()) == launched, "a finished experiment ran again"


@pytest.mark.timeout(240)  # a search that never ends fails the test here
@pytest.mark.parametrize("sizes", [[500000000, 200000000], [1000000, 1048576]])
def test_full_mode_ends_whatever_notation_its_sizes_are_written_in(ws: Workspace, sizes: list[int]) -> None:
    """A knob listed as integers, as DeepSpeed's docs write sizes: ``500000000`` is DeepSpeed's
    default ``5e8`` (the search proposed one experiment for ever), and 1000000 and 1048576 are
    two configs (named alike, the second stood down as the first's duplicate), each measured."""
    ws.config({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": [1, 2], "reduce_bucket_size": sizes},
               "autotuning": {"enabled": True, "fast": False, "tuner_type": "gridsearch", "tuner_early_stopping": 1,
                              "max_train_micro_batch_size_per_gpu": 256}})
    surface = {"base": {"0": 100, "1": 101, "2": 102, "3": 60}, "peak": 130, "num_params": 1_000_000_000,
               "activation_mem_per_gpu": 200_000_000, "knob_gain": {"reduce_bucket_size": {str(float(sizes[1])): 1.05}}}
    p = ws.tune(surface=surface, env=ws.env(surface, LOCAL_SIZE="1"))
    assert p.returncode == 0, p.stderr + p.stdout
    knob = _knob_trials(ws, stages=(1, 2))
    ran = {t.user_attrs["knobs"]["reduce_bucket_size"] for _, t in knob if t.state == TrialState.COMPLETE}
    # Each value that departs from the default is measured; 5e8 is the default configs' own.
    assert {s for s in sizes if s != 500000000} <= ran <= set(sizes), p.stdout
    assert not [t for s in (1, 2) for t in _study(ws, f"optuna-ds-z{s}").get_trials() if t.state == TrialState.PRUNED], p.stdout
    assert (ws.results / "ds_config_optimal.json").exists()
    # Each trial records its config as params, one distribution per param for the whole study
    # (the dashboard's importances group trials by distribution), the offload as a categorical.
    for s in (1, 2):
        trials = _study(ws, f"optuna-ds-z{s}").get_trials()
        for name in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "offload", "reduce_bucket_size"):
            # A stage whose knob search the planner did not take records no knob param.
            assert len({repr(t.distributions[name]) for t in trials if name in t.distributions}) == (
                1 if name != "reduce_bucket_size" or any(name in t.distributions for t in trials) else 0), name
        assert all(t.params["offload"] == (t.user_attrs.get("offload") or "none") for t in trials)
        assert all(t.params["train_micro_batch_size_per_gpu"] == t.user_attrs["micro_batch_size"] for t in trials)


def test_the_planner_decides_on_one_blas_thread_and_the_process_gets_its_threads_back(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tens of rows per matrix: more BLAS threads only contend with the experiments for the cores.
    from threadpoolctl import threadpool_info

    from optuna_ds.studies import _coordinator

    def blas_threads() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before, seen = blas_threads(), []
    decide = _coordinator.plan

    def plan(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(blas_threads())
        return decide(*args, **kwargs)

    monkeypatch.setattr(_coordinator, "plan", plan)
    ws.config(FAST)
    p = ws.tune(surface={"peak": 24})
    assert p.returncode == 0, p.stderr + p.stdout
    assert seen and all(threads and set(threads) == {1} for threads in seen), seen
    assert set(blas_threads()) == set(before)  # a library loaded meanwhile (torch's) keeps its own
