"""The headline: the user's own config -> the optimum, how much faster, and what it cost, as
measured in the tuning (fake launcher); and --scale-lr."""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
import shlex

import optuna
import pytest
from optuna.trial import TrialState

from conftest import FAKE_LAUNCHER
from conftest import LAUNCHER_OPTION
from conftest import Workspace
from conftest import assert_one_line_error
from optuna_ds.config import Metric
from optuna_ds.config import format_number
from optuna_ds.domain import Config
from optuna_ds.domain import ExperimentRecord
from optuna_ds.reporting import headline
from optuna_ds.studies import Baseline
from optuna_ds.studies import Noise
from optuna_ds.studies import Spend
from optuna_ds.studies import StageResult
from optuna_ds.studies import TuningResult
from optuna_ds.studies._results import measurement_noise

CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
    "zero_optimization": {"stage": 1},
    "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 64},
}
SURFACE = {"oom_above": {"1": 40}, "duration": 0.4}


def _trials(ws: Workspace, stage: int = 1) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=f"optuna-ds-z{stage}", storage=ws.storage).get_trials()


def test_headline_compares_the_users_config_with_the_optimum_and_counts_device_hours(ws: Workspace) -> None:
    ws.config(CONFIG)
    p = ws.tune("ds_config.json", "--num_gpus", "2", surface=SURFACE,
                env=ws.env(SURFACE, LOCAL_SIZE="2", OPTUNA_DS_LOCK_DIR=str(ws.root / "locks")))
    assert p.returncode == 0, p.stderr + p.stdout
    trials = _trials(ws)
    mine = [t for t in trials if t.params.get("train_micro_batch_size_per_gpu") == 2]
    assert mine[0].number == 0  # the user's size ran, first
    # One slot: the headline's runs, alternately, until each config ran twice (the next test).
    assert "measuring your config and the optimum alike" in p.stdout
    mine_mean = sum(t.value for t in mine) / len(mine)
    of_runs = " (mean of 2 runs)" if len(mine) == 2 else ""
    # The optimum is the planner's choice (by its estimate), a config that ran.
    choice = optuna.load_study(study_name="optuna-ds", storage=ws.storage).user_attrs["choice"]
    best = next(t for t in trials if t.number == choice["trial"])
    assert best.state == TrialState.COMPLETE
    summary = (ws.results / "optuna_ds_summary.txt").read_text().splitlines()
    assert summary[0] == f"Your config (z1, micro-batch 2): {format_number(mine_mean)} samples/s{of_runs}.", summary[0]
    # ...by the figure the planner chose it by (the best so far runs twice: the noise is measured on it),
    # with the planner's estimate beside them: the figure the tuning printed when it chose.
    from optuna_ds.studies._runs import runs_of

    runs = runs_of(best, trials)
    mean = sum(runs) / len(runs)
    # The figure the planner chose it by: its runs' robust level (one run: the run itself).
    level = choice["level"]
    assert len(runs) > 1 or level == pytest.approx(runs[0], rel=1e-3)
    shown = f"robust level of {len(runs)} runs, ±" if len(runs) > 1 else "one run; "
    name = best.user_attrs["exp_name"]
    figure = summary[1].split("gradient accumulation 1): ", 1)[1].split(")", 1)[0] + ")"
    assert summary[1].startswith(f"Optimum ({name}: z1, micro-batch {best.params['train_micro_batch_size_per_gpu']}, "
                                 f"gradient accumulation 1): {format_number(level)} samples/s ({shown}"), summary[1]
    assert f"planner's estimate {format_number(choice['estimate'])} samples/s)" in summary[1]
    if len(mine) >= 2 and len(runs) >= 2:
        assert f"{format_number(mean / mine_mean, 3)}x " in summary[1] or f"({format_number(mean / mine_mean, 3)}x by the means" in summary[1]
    else:  # a factor rests on two runs of each, measured alike
        assert "; no speed-up factor: your config ran " in summary[1] and "faster" not in summary[1]
    assert f"chosen: {name}: {figure}; run-to-run noise " in p.stdout
    # The chosen stage's row of DeepSpeed's table agrees with the headline.
    assert any(line.startswith("| z1 ") and f" {format_number(mean)} | " in line and f" {name} " in line for line in summary)
    # Device time from the launcher's own record of every launch, the profile run included, times
    # the 2 devices of each experiment; on CPU, not called GPU-hours.
    launches = [entry for entry in ws.launches() if not entry.get("training")]
    assert len(launches) == len([t for t in trials if t.state != TrialState.PRUNED]) + 1
    launched_seconds = sum(entry["end"] - entry["start"] for entry in launches)
    match = summary[2]
    assert match.startswith(f"Spent: {len(launches)} experiment(s) (the profile run included), ") and match.endswith(" device-hours (CPU).")
    hours = float(match.split(", ")[1].split(" device-hours")[0])
    assert 2 * launched_seconds / 3600 <= hours * 1.005
    assert hours <= 2 * (launched_seconds + 1.0 * len(launches)) / 3600  # each launch's interpreter start at most
    assert "GPU" not in "\n".join(summary)
    page = (ws.results / "report.html").read_text()
    assert summary[0] in page
    import optuna_dashboard

    note = optuna_dashboard.get_note(optuna.load_study(study_name="optuna-ds-z1", storage=ws.storage))
    assert "\n**Your config (z1, micro-batch 2)" in note and "```" not in note
    assert "\n| tuning_space   |   num_experiments |" in note and "\n| z1 " in note


def test_the_users_size_runs_as_the_baseline_even_at_the_smallest_size(ws: Workspace) -> None:
    ws.config({**CONFIG, "train_micro_batch_size_per_gpu": 1})
    p = ws.tune(surface=SURFACE)
    assert p.returncode == 0, p.stderr
    first = _trials(ws)[0]
    assert first.params["train_micro_batch_size_per_gpu"] == 1 and first.state == TrialState.COMPLETE
    runs = [t.value for t in _trials(ws) if t.params["train_micro_batch_size_per_gpu"] == 1 and t.value is not None]
    of_runs = " (mean of 2 runs)" if len(runs) == 2 else ""
    assert f"Your config (z1, micro-batch 1): {format_number(sum(runs) / len(runs))} samples/s{of_runs}." in p.stdout


def test_runs_taken_beside_others_are_measured_again_alike(ws: Workspace) -> None:
    """Two slots: the user's config ran beside another experiment, so the headline's two configs
    run again side by side, on two slots at once, until each ran twice."""
    ws.config(CONFIG)
    p = ws.tune("ds_config.json", "--num_gpus", "1", surface=SURFACE,
                env=ws.env(SURFACE, LOCAL_SIZE="2", OPTUNA_DS_LOCK_DIR=str(ws.root / "locks")))
    assert p.returncode == 0, p.stderr + p.stdout
    trials = _trials(ws)
    mine = [t for t in trials if t.params.get("train_micro_batch_size_per_gpu") == 2]
    assert mine[0].number == 0
    # The opening fills both slots (your size and its noise replicate, or another size).
    first = trials[0]
    assert any(t.number != 0 and t.datetime_start < first.datetime_complete for t in trials)
    choice = optuna.load_study(study_name="optuna-ds", storage=ws.storage).user_attrs["choice"]
    chosen = next(t for t in trials if t.number == choice["trial"]).params["train_micro_batch_size_per_gpu"]
    assert chosen != 2 and "measuring your config and the optimum alike" in p.stdout
    assert len(mine) >= 2 and "(your config, measured alike with the optimum)" in p.stdout
    alike = {int(n) for n in re.findall(r"trial (\d+): running \S+ on \S+ \((?:your config|the optimum), measured alike", p.stdout)}
    pair = sorted((t for t in trials if t.number in alike), key=lambda t: t.datetime_start)[:2]
    assert sorted(t.params["train_micro_batch_size_per_gpu"] for t in pair) == sorted([2, chosen])  # one of each
    assert pair[1].datetime_start < pair[0].datetime_complete  # side by side


def test_one_slot_buys_the_runs_a_speed_up_factor_needs(ws: Workspace) -> None:
    """``make example`` printed no factor: on one slot every run was taken alone, so the tuning
    bought no run, and the user's config had run once. The headline's rule wants two runs of
    each, interleaved: the tuning buys the missing ones, the fewest launches."""
    ws.config(CONFIG)
    p = ws.tune(surface=SURFACE)
    assert p.returncode == 0, p.stderr + p.stdout
    trials = sorted((t for t in _trials(ws) if t.datetime_start is not None), key=lambda t: t.datetime_start)
    assert all(b.datetime_start >= a.datetime_complete for a, b in zip(trials, trials[1:]))  # one slot
    choice = optuna.load_study(study_name="optuna-ds", storage=ws.storage).user_attrs["choice"]
    chosen = next(t for t in trials if t.number == choice["trial"]).params["train_micro_batch_size_per_gpu"]
    assert chosen != 2

    def starts(mbs: int) -> list[datetime.datetime]:
        return [t.datetime_start for t in trials if t.state == TrialState.COMPLETE and t.params["train_micro_batch_size_per_gpu"] == mbs]

    mine, its = starts(2), starts(chosen)
    assert len(mine) >= 2 and len(its) >= 2 and min(mine) < max(its) and min(its) < max(mine)
    summary = (ws.results / "optuna_ds_summary.txt").read_text().splitlines()
    assert "no speed-up factor" not in summary[1] and re.search(r"[0-9.]+x (faster|as fast)", summary[1]), summary[1]
    # The fewest launches: a run of yours right after the optimum's last run needs no run of the
    # optimum again; otherwise one pair.
    alike = {int(n) for n in re.findall(r"trial (\d+): running \S+ on \S+ \((?:your config|the optimum), measured alike", p.stdout)}
    bought = [t for t in trials if t.number in alike]
    earlier = trials[:len(trials) - len(bought)]
    assert bought == trials[len(earlier):]  # after the search
    its_earlier = [t for t in earlier if t.state == TrialState.COMPLETE and t.params["train_micro_batch_size_per_gpu"] == chosen]
    expected = 1 if earlier[-1] in its_earlier and len(its_earlier) >= 2 else 2
    assert len(bought) == expected, (len(bought), p.stdout)
    assert bought[0].params["train_micro_batch_size_per_gpu"] == 2


def test_a_config_without_one_size_says_why_there_is_no_baseline(ws: Workspace) -> None:
    ws.config({**CONFIG, "train_micro_batch_size_per_gpu": [4, 8], "zero_optimization": {"stage": [1, 2]}})
    p = ws.tune(surface=SURFACE)
    assert p.returncode == 0, p.stderr
    summary = (ws.results / "optuna_ds_summary.txt").read_text()
    assert summary.startswith("Your config (z1, the first stage explored of [1, 2]): not measured, "
                              "your config lists micro-batch sizes, so it has no single baseline.")
    assert "x faster" not in summary


def test_noise_is_measured_only_from_configs_run_more_than_once() -> None:
    def trial(value: float, mbs: int) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(value=value, user_attrs=ExperimentRecord(config=Config(stage=0, micro_batch=mbs)).attrs())

    assert measurement_noise([trial(100.0, 2), trial(200.0, 4)]) == Noise()
    noise = measurement_noise([trial(100.0, 2), trial(104.0, 2), trial(200.0, 4), trial(201.0, 4)])
    # Two repeated configs, differing by 4% and 0.5%: a noise of a couple of percent, the same
    # figure the planner works with.
    assert noise.configs == 2 and noise.runs == 4 and 0.01 < noise.value < 0.035
    assert noise.phrase == f"run-to-run noise {noise.value:.1%}, measured from 2 repeated configs, 4 runs"
    assert Noise().phrase == "run-to-run noise not measured: no config ran twice"
    result = TuningResult(metric=Metric.named("latency"), stages=[StageResult(stage=0, status="tuned")], duration=1.0,
                          model_info={}, baseline=Baseline(stage=0, micro_batch_size=2, name="a", value=30.0, status="complete"),
                          spend=Spend(experiments=3, gpu_seconds=7200.0, profiled=False, device="GPU"), noise=noise)
    lines = headline(result)
    assert lines[0] == "Your config (z0, micro-batch 2): 30 ms."
    assert lines[1] == "Optimum: none, no experiment ran successfully."
    assert lines[2] == "Spent: 3 experiment(s), 2 GPU-hours."


def test_the_headline_compares_the_means_of_the_runs_not_one_lucky_run() -> None:
    from optuna_ds.studies import Optimum
    from optuna_ds.studies._runs import runs_of

    def trial(value: float, mbs: int, name: str) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(value=value, user_attrs=ExperimentRecord(config=Config(stage=0, micro_batch=mbs),
                                                                                  exp_name=name).attrs())

    trials = [trial(110.0, 8, "z0_mbs8"), trial(100.0, 8, "z0_mbs8_r1"), trial(96.0, 4, "z0_mbs4"), trial(50.0, 2, "z0_mbs2")]
    assert runs_of(trials[1], trials) == [110.0, 100.0] and runs_of(trials[3], trials) == [50.0]
    best = Optimum(name="z0_mbs8", config=Config(stage=0, micro_batch=8), trial_number=0, ds_config={}, result_dir="", cmd=[],
                   runs=(110.0, 100.0), trials=(0, 1), estimate=104.0, chosen=True, run_starts=(10.0, 30.0))
    base = Baseline(stage=0, micro_batch_size=4, name="z0_mbs4", value=96.0, status="complete", runs=2, values=(95.0, 97.0),
                    starts=(0.0, 20.0))
    result = TuningResult(metric=Metric.named("throughput"), stages=[StageResult(stage=0, status="tuned", best=best)], duration=1.0,
                          model_info={}, baseline=base,
                          spend=Spend(experiments=4, gpu_seconds=3600.0, profiled=False), noise=Noise(0.07, 1, 2), best=best)
    lines = headline(result)
    assert lines[0] == "Your config (z0, micro-batch 4): 96 samples/s (mean of 2 runs)."
    assert lines[1] == ("Optimum (z0_mbs8: z0, micro-batch 8, gradient accumulation 1): 105 samples/s (mean of 2 runs, ±6.7%; "
                        "planner's estimate 104 samples/s), 0.95-1.3x as fast (1.09x by the means of their runs, give or take twice "
                        "the noise); run-to-run noise 7.0%, measured from 1 repeated config, 2 runs.")
    # 7% noise over two runs of each: the factor is a range, then narrower with more runs.
    more = dataclasses.replace(result, baseline=dataclasses.replace(result.baseline, runs=40), noise=Noise(0.02, 1, 2))
    assert ", 1.09x faster; run-to-run noise 2.0%" in headline(more)[1]
    assert lines[2] == "Spent: 4 experiment(s), 1 device-hours."  # a tuning that did not record its accelerator
    assert len(lines) == 3  # 6.7% is within twice the noise: no warning


def test_scale_lr_writes_the_scaled_learning_rate_and_names_the_rule(ws: Workspace) -> None:
    ws.config(CONFIG)
    p = ws.tune("ds_config.json", "--scale-lr", surface=SURFACE)
    assert p.returncode == 0, p.stderr
    optimal = json.loads((ws.results / "ds_config_optimal.json").read_text())
    batch = optimal["train_batch_size"]
    assert batch != 2
    assert optimal["optimizer"]["params"]["lr"] == pytest.approx(0.001 * math.sqrt(batch / 2))
    comment, command = (ws.results / "cmd_optimal.txt").read_text().splitlines()
    assert comment == (f"# learning rate scaled by sqrt({batch}/2) = {math.sqrt(batch / 2):.4g} (an Adam-type optimizer; "
                       f"batch 2 -> {batch}): optimizer.params.lr 0.001 -> {0.001 * math.sqrt(batch / 2):.6g}")
    assert "ds_config_optimal.json" in command
    assert comment[2:] in (ws.results / "optuna_ds_summary.txt").read_text()


def test_scale_lr_on_an_auto_learning_rate_scales_the_script_flag(ws: Workspace) -> None:
    ws.config({**CONFIG, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})
    p = ws.cli("tune", LAUNCHER_OPTION, FAKE_LAUNCHER, "--scale-lr", "train.py", "--deepspeed_config", "ds_config.json",
               "--learning_rate", "5e-5", surface=SURFACE)
    assert p.returncode == 0, p.stderr
    optimal = json.loads((ws.results / "ds_config_optimal.json").read_text())
    assert optimal["optimizer"]["params"]["lr"] == "auto"
    factor = math.sqrt(optimal["train_batch_size"] / 2)
    command = shlex.split((ws.results / "cmd_optimal.txt").read_text().splitlines()[1])
    assert float(command[command.index("--learning_rate") + 1]) == pytest.approx(5e-5 * factor, rel=1e-5)
    # Without --scale-lr the advice stays a printed line and nothing is scaled.
    p = ws.cli("tune", LAUNCHER_OPTION, FAKE_LAUNCHER, "train.py", "--deepspeed_config", "ds_config.json",
               "--learning_rate", "5e-5", surface=SURFACE)
    assert p.returncode == 0, p.stderr
    assert "scale the learning rate by sqrt(" in p.stdout
    command = shlex.split((ws.results / "cmd_optimal.txt").read_text())
    assert command[command.index("--learning_rate") + 1] == "5e-5"


def _memory_result(peak: int | None, *, budget_metric: str = "throughput") -> TuningResult:
    from optuna_ds.studies import Optimum

    best = Optimum(name="z1_gas1_tmbspg8", config=Config(stage=1, micro_batch=8), trial_number=3, ds_config={}, result_dir="",
                   cmd=[], runs=(200.0, 200.0), trials=(3, 5), chosen=True, peak_memory=peak, run_starts=(10.0, 30.0))
    return TuningResult(metric=Metric.named(budget_metric), stages=[StageResult(stage=1, status="tuned", best=best)], duration=1.0,
                        model_info={}, baseline=Baseline(stage=1, micro_batch_size=2, name="z1_gas1_tmbspg2", value=50.0,
                                                         status="complete", runs=2, values=(50.0, 50.0), starts=(0.0, 20.0)),
                        spend=Spend(experiments=5, gpu_seconds=2 * 3600.0, device="GPU", gpus_per_experiment=2),
                        noise=Noise(0.01, 1, 2), best=best, device_memory=80 * 2**30, memory_margin=0.05)


def test_the_optimums_peak_memory_against_the_devices_and_the_margin() -> None:
    lines = headline(_memory_result(60 * 2**30))
    assert lines[-1] == ("Memory: z1_gas1_tmbspg8 peaks at 60.0 GiB of 80.0 GiB per GPU (75%); the margin keeps 5% free "
                         "(--memory-margin): a run above 76.0 GiB counts as out of memory.")
    assert headline(_memory_result(None))[-1] == ("Memory: the peak is not measured on this GPU (NVML reports NVIDIA GPUs only); "
                                                  "the margin of 5% (--memory-margin) could not be checked.")


def test_the_tuning_and_the_training_in_money_and_time() -> None:
    from optuna_ds.reporting import Budget

    lines = headline(_memory_result(None), Budget(cost_per_gpu_hour=2.5, train_samples=3_600_000, train_steps=None))
    assert lines[-3] == "Cost of the tuning: 5.00 at 2.50 per GPU-hour."
    # 3.6M samples at 50 and 200 samples/s, on the 2 GPUs of one experiment.
    assert lines[-2] == ("Training 3,600,000 samples on 2 GPU(s): your config 20:00:00 (40 GPU-hours, 100.00), "
                         "the optimum 5:00:00 (10 GPU-hours, 25.00).")
    assert lines[-1] == "Expected saving of the optimum over your config: 30 GPU-hours of the training, for 2 GPU-hours spent tuning."
    # The planner's expected regret of its choice, in the training's device-hours: 1% of 10.
    result = _memory_result(None)
    result = dataclasses.replace(result, best=dataclasses.replace(result.best, regret=0.01))
    assert headline(result, Budget(train_samples=3_600_000))[-1].endswith(
        "for 2 GPU-hours spent tuning; expected regret left 1.0% (0.099 GPU-hours).")
    steps = headline(_memory_result(None), Budget(train_samples=3_600_000, train_steps=900_000))
    assert steps[-2].startswith("Training 900,000 steps of your config (3,600,000 samples) on 2 GPU(s): your config 20:00:00 (40 GPU-hours),")
    latency = headline(_memory_result(None, budget_metric="latency"), Budget(train_samples=10))
    assert latency[-1] == "Training 10 samples: its time follows from the throughput metric only, not latency."


def test_a_run_above_the_memory_margin_counts_as_out_of_memory_for_the_planner() -> None:
    from optuna_ds.planner import Status
    from optuna_ds.studies import observation_of

    record = ExperimentRecord(config=Config(stage=1, micro_batch=8), exp_name="z1_gas1_tmbspg8",
                              peak_gpu_memory=78 * 2**30, duration=3.0)
    trial = optuna.trial.create_trial(value=200.0, user_attrs=record.attrs())
    metric = Metric.named("throughput")
    assert observation_of(trial, metric=metric, dead={}).status is Status.OK  # type: ignore[union-attr]
    assert observation_of(trial, metric=metric, dead={}, memory_limit=80 * 2**30 * 0.95).status is Status.OOM  # type: ignore[union-attr]
    assert observation_of(trial, metric=metric, dead={}, memory_limit=80 * 2**30 * 0.99).status is Status.OK  # type: ignore[union-attr]


@pytest.mark.parametrize("extra, words", [
    (["--memory-margin", "0.7"], "--memory-margin"),
    (["--cost-per-gpu-hour", "-1"], "--cost-per-gpu-hour"),
    (["--train-steps", "0"], "--train-steps"),
    (["--train-steps", "5", "--train-samples", "5"], "not both"),
])
def test_bad_budget_options_are_one_line(ws: Workspace, extra: list[str], words: str) -> None:
    ws.config(CONFIG)
    p = ws.tune("ds_config.json", *extra, surface=SURFACE)
    assert_one_line_error(p, words)
    assert not ws.launches()


def test_the_summary_gives_the_trainings_time_and_cost(ws: Workspace) -> None:
    ws.config(CONFIG)
    p = ws.tune("ds_config.json", "--cost-per-gpu-hour", "3", "--train-steps", "1000", surface=SURFACE)
    assert p.returncode == 0, p.stderr
    summary = (ws.results / "optuna_ds_summary.txt").read_text()
    assert "Cost of the tuning: " in summary and " at 3.00 per device-hour." in summary
    # 1000 steps of the user's global batch (micro-batch 2, one device).
    assert "Training 1,000 steps of your config (2,000 samples) on 1 CPU device(s): " in summary
    assert "Memory: the peak is not measured on this CPU device" in summary


def test_the_summary_says_why_the_optimum_and_which_configs_are_as_good() -> None:
    from optuna_ds.reporting._worth import choice_lines
    from optuna_ds.studies._results import Measured

    result = _memory_result(None)
    best = result.best
    assert best is not None
    measured = (Measured(name=best.name, config=best.config, runs=best.runs),
                Measured(name="z1_gas1_tmbspg10", config=Config(stage=1, micro_batch=10), runs=(203.0,)),
                Measured(name="z1_gas1_tmbspg6", config=Config(stage=1, micro_batch=6), runs=(198.0, 199.0)),
                Measured(name="z1_gas1_tmbspg2", config=Config(stage=1, micro_batch=2), runs=(50.0,)))
    # The planner's verdict, which the summary reads: 203 over one run and 198.5 over two it cannot tell from 200; 50 it can.
    result = dataclasses.replace(result, equivalent=(measured[1].config, measured[2].config))
    why, alike = choice_lines(dataclasses.replace(result, measured=measured))
    assert why == ("Why z1_gas1_tmbspg8: of the 4 configs that ran, it is the best by the planner's estimate, which weighs every "
                   "run of every size and stage (a curve per stage), not one run; z1_gas1_tmbspg10 measured a higher mean "
                   "(203 samples/s, 1 run) that its curve and the noise do not bear out.")
    assert alike == ("Equivalent within the noise (1.0% per run): z1_gas1_tmbspg10 (203 samples/s, 1 run), "
                     "z1_gas1_tmbspg6 (198.5 samples/s, 2 runs); any of them would do as well.")
    quiet = dataclasses.replace(result, measured=measured[::3], noise=Noise(0.001, 1, 2), equivalent=())
    assert choice_lines(quiet)[1] == ("Equivalent within the noise (0.1% per run): none; the next best, z1_gas1_tmbspg2, "
                                      "is 75.0% slower.")


def test_a_headline_on_runs_that_scatter_beyond_the_noise_gives_the_range_they_allow() -> None:
    # A loaded CPU (issue 35): your config's first run under load, then measured alike with the
    # optimum. The noise (stragglers left out) is 18%; the means divide to 1.9x; the pairs taken
    # alike say 12.8x and 0.77x. The range is the runs' own, and both scatters are said.
    from optuna_ds.studies import Optimum

    best = Optimum(name="z0_gas1_tmbspg64", config=Config(stage=0, micro_batch=64), trial_number=1, ds_config={}, result_dir="",
                   cmd=[], runs=(571.17, 259.77, 261.82), trials=(1, 3, 4), estimate=331.4, chosen=True,
                   run_starts=(10.0, 30.0, 50.0))
    base = Baseline(stage=0, micro_batch_size=4, name="z0_gas16_tmbspg4", value=190.36, status="complete", runs=2,
                    values=(44.76, 335.97), starts=(0.0, 40.0))
    result = TuningResult(metric=Metric.named("throughput"), stages=[StageResult(stage=0, status="tuned", best=best)], duration=1.0,
                          model_info={}, baseline=base, spend=Spend(experiments=6, gpu_seconds=80.0, profiled=True, device="CPU"),
                          noise=Noise(0.183, 2, 5), best=best)
    lines = headline(result)
    found = re.search(r"\), ([0-9.]+)-([0-9.]+)x as fast \(1.91x by the means of their runs, give or take twice their runs' scatter\)",
                      lines[1])
    assert found, lines[1]
    low, high = float(found[1]), float(found[2])
    assert low < 259.77 / 335.97 and high > 571.17 / 44.76  # wide enough for either pair taken alike
    assert lines[4] == ("Warning: the 2 runs of your config (z0_gas16_tmbspg4) scatter by 108.2%, more than 2x the 18.3% "
                        "run-to-run noise: the speed-up is uncertain.")
    # Runs within the noise keep the noise's range, and the word "faster" only where all of it is.
    quiet = dataclasses.replace(result, baseline=dataclasses.replace(base, values=(180.0, 200.0), value=190.0),
                                best=dataclasses.replace(best, runs=(360.0, 380.0, 370.0)), noise=Noise(0.08, 2, 5))
    assert "1.7-2.3x faster (1.95x by the means of their runs, give or take twice the noise)" in headline(quiet)[1]
    assert not any(line.startswith("Warning") for line in headline(quiet))


def test_without_a_batch_size_of_yours_no_learning_rate_is_scaled_from_a_guess(ws: Workspace) -> None:
    # "auto" mapped to a flag the command line does not pass: the summary said "the original 1:
    # ... lr 0.001 -> 0.008", a batch the user never trained at (issue 35, a newcomer's script).
    config = {**CONFIG, "train_micro_batch_size_per_gpu": "auto",
              "autotuning": {**CONFIG["autotuning"], "arg_mappings": {"train_micro_batch_size_per_gpu": "--batch_size"}}}
    ws.config(config)
    p = ws.tune("ds_config.json", "--scale-lr", surface=SURFACE)
    assert p.returncode == 0, p.stderr
    summary = (ws.results / "optuna_ds_summary.txt").read_text()
    batch = json.loads((ws.results / "ds_config_optimal.json").read_text())["train_batch_size"]
    assert (f"The best global batch size is {batch}; your config gives no batch size to compare it with, so no learning rate "
            f"is scaled: from the global batch size B you train at, scale it by sqrt({batch}/B) (an Adam-type optimizer).") in summary
    assert "the original" not in summary
    optimal = json.loads((ws.results / "ds_config_optimal.json").read_text())
    assert optimal["optimizer"]["params"]["lr"] == 0.001 and not (ws.results / "cmd_optimal.txt").read_text().startswith("#")


def test_the_partial_summary_gives_your_config_as_the_headline_does() -> None:
    from optuna_ds.reporting import partial_summary

    base = Baseline(stage=0, micro_batch_size=4, name="z0_gas16_tmbspg4", value=112.2, status="complete", runs=2, values=(132.6, 91.8))
    result = TuningResult(metric=Metric.named("throughput"), stages=[StageResult(stage=0, status="tuned")], duration=1.0,
                          model_info={}, baseline=base, spend=Spend(experiments=4, gpu_seconds=60.0, profiled=True, device="CPU"))
    head = partial_summary(result, finished=3, resume="rerun the same command to resume").head
    assert "Your config (z0_gas16_tmbspg4): 112.2 samples/s (mean of 2 runs)." in head  # it said "112.2 samples/s." of 2 runs


def _alike_result(base_starts: tuple[float, ...], best_starts: tuple[float, ...], *, chosen: bool = True) -> TuningResult:
    from optuna_ds.studies import Optimum

    runs = (200.0, 204.0, 198.0)[:len(best_starts)]
    best = Optimum(name="z1_gas1_tmbspg8", config=Config(stage=1, micro_batch=8), trial_number=1, ds_config={}, result_dir="",
                   cmd=[], runs=runs, trials=tuple(range(len(runs))), chosen=chosen, run_starts=best_starts)
    values = (100.0, 102.0, 101.0)[:len(base_starts)]
    base = Baseline(stage=1, micro_batch_size=2, name="z1_gas1_tmbspg2", value=sum(values) / len(values), status="complete",
                    runs=len(values), values=values, starts=base_starts)
    return TuningResult(metric=Metric.named("throughput"), stages=[StageResult(stage=1, status="tuned", best=best)], duration=1.0,
                        model_info={}, baseline=base, spend=Spend(experiments=5, gpu_seconds=60.0), noise=Noise(0.01, 2, 5),
                        best=best)


def test_a_speed_up_factor_needs_the_choice_and_your_config_measured_alike() -> None:
    """Issue 49: "2.35x faster" from one run of the user's config, taken first, where the user's
    own alternating re-measurement found 1.15x. A factor is printed only from the final choice
    and the user's config with at least two runs each, interleaved; otherwise the line says why."""
    alike = headline(_alike_result((0.0, 20.0), (10.0, 30.0)))[1]
    assert "2x faster; run-to-run noise" in alike and "no speed-up factor" not in alike
    once = headline(_alike_result((0.0,), (10.0, 30.0)))[1]
    assert ("; no speed-up factor: your config ran once and the optimum twice; a factor needs 2 runs of each at least, "
            "measured alike; run-to-run noise") in once and "faster" not in once and "as fast" not in once
    apart = headline(_alike_result((0.0, 5.0), (10.0, 30.0, 40.0)))[1]
    assert ("no speed-up factor: the runs of your config and of the optimum were not interleaved (all of one's came before "
            "the other's)") in apart and "faster" not in apart
    # Two training times side by side are a factor too: your config's is left out with it.
    from optuna_ds.reporting import Budget

    lines = headline(_alike_result((0.0,), (10.0, 30.0)), Budget(train_samples=3_600_000))
    training = next(line for line in lines if line.startswith("Training "))
    # A saving over your config is a factor too: only the tuning's cost is stated.
    assert not any("saving" in line for line in lines) and lines[-1].endswith("spent tuning.")
    assert training.startswith("Training 3,600,000 samples on 1 device(s): the optimum ") and "your config 5:" not in training
    assert training.endswith("; your config's is left out, as the speed-up factor is.")
    unknown = dataclasses.replace(_alike_result((0.0, 20.0), (10.0, 30.0)), baseline=dataclasses.replace(
        _alike_result((0.0, 20.0), (10.0, 30.0)).baseline, starts=()))  # no start recorded: not known alike
    assert "no speed-up factor" in headline(unknown)[1] and "faster" not in headline(unknown)[1]
    # Before the planner chose, the line says so already: no factor of the best so far.
    early = headline(_alike_result((0.0, 20.0), (10.0, 30.0), chosen=False))[1]
    assert early.startswith("Best so far (the planner has not chosen yet)") and "faster" not in early
