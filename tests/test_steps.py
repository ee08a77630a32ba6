"""What a run measured step by step, from the engine's timer lines (in-process)."""
from __future__ import annotations

import dataclasses

import pytest

from optuna_ds.config import Metric
from optuna_ds.launcher import measure_steps
from optuna_ds.launcher import profiled_steps
from optuna_ds.launcher import read_step_timers

import product

# Rank 0's output as DeepSpeed 0.19.8 prints it in autotuning mode (steps 1-6, then metrics.json
# from step 7), with the script's own lines, a micro-step line (wall_clock_breakdown) and a pdsh
# host prefix among them.
OUTPUT = """\
[2026-11-26 14:58:58,812] [INFO] [launch.py:245:main] process 7320 spawned
[Rank 0] time (ms) | fwd: 304.59 | bwd: 832.42 | bwd_inner: 471.86 | bwd_allreduce: 360.50 | step: 919.76
step 0 loss 2.2389
[Rank 0] time (ms) | fwd: 335.34 | bwd: 1002.06 | bwd_inner: 620.38 | bwd_allreduce: 381.64 | step: 439.95
[Rank 0] time (ms) | fwd_microstep: 300.00 | bwd_microstep: 500.00 | step_microstep: 400.00
[Rank 0] time (ms) | fwd: 300.00 | bwd: 600.00 | bwd_inner: 500.00 | bwd_allreduce: 100.00 | step: 100.00
node1: [Rank 0] time (ms) | fwd: 300.00 | bwd: 600.00 | bwd_inner: 450.00 | bwd_allreduce: 150.00 | step: 300.00
[Rank 0] time (ms) | fwd: 300.00 | bwd: 3000.00 | bwd_inner: 2900.00 | bwd_allreduce: 100.00 | step: 100.00
[Rank 0] time (ms) | fwd: 300.00 | bwd: 600.00 | bwd_inner: 500.00 | bwd_allreduce: 100.00 | step: 200.00
Autotuning: done with running current ds config.
"""
# Step 7 alone, as the engine writes it: microseconds under DeepSpeed's "ms" labels; one
# sample of 8 per step in 1.2 s.
METRICS = {"fwd": 300000.0, "bwd": 600000.0, "step": 300000.0, "latency": 1200000.0, "FLOPS_per_gpu": 5e9, "throughput": 8 / 1.2}


def test_the_global_step_lines_are_read_in_order_and_nothing_else() -> None:
    steps = read_step_timers(OUTPUT)
    assert [s["step"] for s in steps] == [919.76, 439.95, 100.0, 300.0, 100.0, 200.0]
    assert steps[3]["bwd_allreduce"] == 150.0


@pytest.mark.parametrize("name", ["throughput", "latency", "flops"])
def test_the_figure_is_the_engines_and_the_profiled_steps_are_kept_beside_it(name: str) -> None:
    # Steps 3-6 (1.0, 1.2, 3.4 and 1.1 s) and step 7 (1.2 s), whose timers metrics.json holds.
    metric = Metric.named(name)
    m = measure_steps(metric=metric, metrics=METRICS, logged=read_step_timers(OUTPUT), profiled=4)
    assert m.value == METRICS[metric.key]
    assert m.step_times_ms == pytest.approx((1000.0, 1200.0, 3400.0, 1100.0, 1200.0))
    assert m.timers_ms["bwd_allreduce"] == pytest.approx(100.0) and m.timers_ms["step"] == pytest.approx(150.0)
    assert m.to_attrs()["step_times_ms"] == [1000.0, 1200.0, 3400.0, 1100.0, 1200.0]


@pytest.mark.parametrize("case", ["no lines", "too few lines", "no latency", "other units"])
def test_no_steps_where_they_cannot_be_read(case: str) -> None:
    logged = read_step_timers(OUTPUT)
    metrics = dict(METRICS)
    if case == "no lines":
        logged = []
    elif case == "too few lines":
        logged = logged[-2:]
    elif case == "no latency":
        del metrics["latency"]
    else:
        metrics["latency"] = 1.2  # a DeepSpeed that wrote milliseconds: 1000x off the lines
    m = measure_steps(metric=Metric.named("throughput"), metrics=metrics, logged=logged, profiled=4)
    assert m.value == metrics["throughput"] and m.step_times_ms == () and m.to_attrs() == {}


def test_the_profiled_steps_are_those_the_config_names() -> None:
    assert profiled_steps({"autotuning": {"start_profile_step": 3, "end_profile_step": 6}}) == 4
    assert profiled_steps({}) == 3  # DeepSpeed's defaults, 3 to 5
    assert profiled_steps({"autotuning": {"start_profile_step": "3", "end_profile_step": 5}}) == 0


def test_the_summary_says_where_the_optimums_step_time_goes() -> None:
    from optuna_ds.domain import Config
    from optuna_ds.reporting._notes import step_line
    from optuna_ds.studies._results import Optimum
    from optuna_ds.studies._results import TuningResult

    best = Optimum(name="z1_gas1_tmbspg8", config=Config(stage=1, micro_batch=8), trial_number=0, ds_config={}, result_dir="",
                   cmd=[], runs=(10.0,), timers_ms={"fwd": 300.0, "bwd": 600.0, "bwd_inner": 450.0, "bwd_allreduce": 150.0, "step": 100.0})
    result = TuningResult(metric=Metric.named("throughput"), stages=[], duration=1.0, model_info={}, best=best)
    assert step_line(result) == ("Step time of z1_gas1_tmbspg8 by DeepSpeed's timers (median of its profiled steps): forward 300 ms (30%), "
                                 "backward 600 ms (60%, of which gradient all-reduce 150 ms), optimizer step 100 ms (10%).")
    import dataclasses
    assert step_line(dataclasses.replace(result, best=dataclasses.replace(best, timers_ms={}))) == ""


def test_steps_still_falling_across_the_window_mark_a_warm_up_and_noise_does_not() -> None:
    from optuna_ds.launcher import still_falling

    assert still_falling([2500.0, 2250.0, 2000.0, 1750.0]) == pytest.approx(750 / 2125)  # 3 steps of 250 ms over the median
    assert still_falling([2500.0, 2600.0, 2250.0, 2000.0, 1750.0]) is not None  # one slow step among five
    assert still_falling([2500.0, 2600.0, 2000.0, 1750.0]) is None  # among four: noise puts one in six so
    assert still_falling([1000.0, 1010.0, 990.0, 1005.0]) is None  # a settled run's scatter
    assert still_falling([1000.0, 980.0, 970.0, 960.0]) is None  # falling, by less than the steps' noise can matter
    assert still_falling([1750.0, 2000.0, 2250.0, 2500.0]) is None  # rising: no warm-up
    assert still_falling([2000.0, 1000.0]) is None  # too few steps to tell
    assert still_falling([3000.0, 2000.0, 1000.0]) is None  # three in order: by chance once in six


def test_a_run_still_warming_up_in_its_window_is_measured_later_in_the_run_and_the_summary_says_so(tmp_path) -> None:
    # Micro-batch 16 is the faster (1,329 against 864 samples/s), but its first 8 steps are slower
    # (step i by 1 + 2 (1 - (i-1)/8)): DeepSpeed's figure at step 6 reads 760, and 8 was chosen.
    import optuna

    job = product.FixedJob(name="warm", surface={"warmup": {"steps": 8, "slow": 2.0, "at": [16]}},
                           config={"train_micro_batch_size_per_gpu": [8, 16], "zero_optimization": {"stage": 1},
                                   "autotuning": {"enabled": True, "model_info": {"num_params": 1000}}})
    run = product.simulate(job, costs=product.Costs(decision_s=0.1, launch_s=0.2), keep=tmp_path)
    assert run.optimal is not None and run.optimal["train_micro_batch_size_per_gpu"] == 16
    storage = f"sqlite:///{tmp_path / job.name / 'autotuning_results' / 'optuna-ds.db'}"
    trials = optuna.load_study(study_name=f"{product.STUDY}-z1", storage=storage).get_trials()
    (warm,) = [t for t in trials if t.user_attrs.get("warmup")]
    assert warm.params["train_micro_batch_size_per_gpu"] == 16
    assert warm.user_attrs["warmup"]["settled"] and [w["steps"] for w in warm.user_attrs["warmup"]["windows"]] == [[3, 5], [9, 11]]
    assert warm.user_attrs["ds_config"]["autotuning"]["start_profile_step"] == 9
    assert warm.value == pytest.approx(120 * 16 / (1 + (16 / 24) ** 2))  # ZeRO-1 at its steady speed
    assert "Warm-up: 1 run(s) still got faster" in run.summary and "steps 9-11" in run.summary, run.summary
    # A script that trains 8 steps never reaches the later window (no metrics): that judges
    # nothing, and the first launch's figure stands, marked.
    short = dataclasses.replace(job, name="short", surface={**job.surface, "script_steps": 8})
    run = product.simulate(short, costs=product.Costs(decision_s=0.1, launch_s=0.2), keep=tmp_path)
    storage = f"sqlite:///{tmp_path / short.name / 'autotuning_results' / 'optuna-ds.db'}"
    (warm,) = [t for t in optuna.load_study(study_name=f"{product.STUDY}-z1", storage=storage).get_trials() if t.user_attrs.get("warmup")]
    assert warm.state.name == "COMPLETE" and warm.value == pytest.approx(120 * 16 / (1 + (16 / 24) ** 2) / 1.75)
    assert warm.user_attrs["warmup"] == {"windows": [{"steps": [3, 5], "fell": 0.353}, {"steps": [9, 11], "failed": "no-metrics"}],
                                         "settled": False}
    assert warm.user_attrs["ds_config"]["autotuning"]["start_profile_step"] == 3
    assert "their figures are below their speed: z1_gas1_tmbspg16" in run.summary, run.summary


def test_a_micro_batch_size_the_script_ignores_is_said_in_one_line(tmp_path) -> None:
    # The script trains 8 samples a step whatever the config says: DeepSpeed's engine counts the
    # config's, so 32 reads 4x the samples/s of 8 at the same step time, and was chosen.
    job = product.FixedJob(name="ignored", surface={"fixed_batch": 8},
                           config={"train_micro_batch_size_per_gpu": [8, 32], "zero_optimization": {"stage": 0},
                                   "autotuning": {"enabled": True, "model_info": {"num_params": 1000}}})
    run = product.simulate(job, costs=product.Costs(decision_s=0.1, launch_s=0.2))
    (line,) = [line for line in run.summary.splitlines() if "did not take effect" in line]
    assert "at micro-batch 8 (z0_gas1_tmbspg8)" in line and "at 32 (z0_gas1_tmbspg32)" in line, line
    assert "the script must train the train_micro_batch_size_per_gpu of the config it is given" in line
    # A size that took effect says nothing (the forward pass grew with it).
    normal = product.simulate(dataclasses.replace(job, surface={}), costs=product.Costs(decision_s=0.1, launch_s=0.2))
    assert "did not take effect" not in normal.summary
    # On a loaded machine most steps' forward timers also hold a wait for the CPU, far longer
    # than the forward itself (make example on 2 shared cores: 0.8 ms at 8 and 1.2 ms at 64 at
    # their fastest, medians 160 and 154 ms): the size took effect, and the figures stand.
    loaded = product.simulate(dataclasses.replace(job, name="loaded", surface={"fwd_stall": 1000.0}),
                              costs=product.Costs(decision_s=0.1, launch_s=0.2))
    assert "did not take effect" not in loaded.summary, loaded.summary
    ignored = product.simulate(dataclasses.replace(job, name="ignored-loaded", surface={"fixed_batch": 8, "fwd_stall": 1000.0}),
                               costs=product.Costs(decision_s=0.1, launch_s=0.2))
    assert "did not take effect" in ignored.summary, ignored.summary


def test_the_scripts_own_batch_flag_is_named_unless_arg_mappings_maps_it() -> None:
    from optuna_ds.studies._outcomes import _batch_flag

    args = ["--deepspeed_config", "ds.json", "--batch_size", "8", "--lr", "1e-3"]
    assert _batch_flag(args, mapped=[]) == "--batch_size 8"
    assert _batch_flag(["--per_device_train_batch_size=4"], mapped=[]) == "--per_device_train_batch_size 4"
    assert _batch_flag(args, mapped=["--batch_size"]) == ""


def test_an_exit_step_far_off_its_window_is_not_the_runs_figure(tmp_path) -> None:
    from optuna_ds.launcher import StepMeasurement

    throughput = Metric.named("throughput")
    blip = StepMeasurement(value=800.0, step_times_ms=(400.0, 380.0, 420.0, 60.0))  # the exit step 6.7x faster
    # The median of the four steps' figures, each the engine's scaled by its step's time.
    assert blip.exit_off and blip.figure(throughput) == pytest.approx((800 * 60 / 400 + 800 * 60 / 380) / 2)
    assert blip.figure(Metric.named("latency")) == pytest.approx((800 * 380 / 60 + 800 * 400 / 60) / 2)
    steady = StepMeasurement(value=120.0, step_times_ms=(400.0, 380.0, 420.0, 250.0))
    assert not steady.exit_off and steady.figure(throughput) == 120.0
    # Through the tuning: micro-batch 8's last step reads 6 times its steps (5,184 against 864
    # samples/s), above 16's 1,329: 8 was chosen on one step.
    job = product.FixedJob(name="blip", surface={"exit_step": {"factor": 6.0, "at": [8]}},
                           config={"train_micro_batch_size_per_gpu": [8, 16], "zero_optimization": {"stage": 1},
                                   "autotuning": {"enabled": True, "model_info": {"num_params": 1000}}})
    run = product.simulate(job, costs=product.Costs(decision_s=0.1, launch_s=0.2))
    assert run.optimal is not None and run.optimal["train_micro_batch_size_per_gpu"] == 16
    (line,) = [line for line in run.summary.splitlines() if line.startswith("One-step figures: 1 run(s)")]
    assert "(z1_gas1_tmbspg8: DeepSpeed's 5,184 samples/s, its steps' 86" in line, line  # 864, as its timer lines round it
