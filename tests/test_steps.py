"""A run's figure over its profiled steps, from the engine's timer lines (in-process)."""
from __future__ import annotations

import pytest

from optuna_ds.config import Metric
from optuna_ds.launcher import measure_steps
from optuna_ds.launcher import profiled_steps
from optuna_ds.launcher import read_step_timers

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
def test_the_figure_is_the_median_of_the_profiled_steps_and_the_exit_step(name: str) -> None:
    # Steps 3-6 (1.0, 1.2, 3.4 and 1.1 s) and step 7 (1.2 s): the median is 1.2 s, the straggler
    # step 5 moves it no more than one step does; the engine's one step is 1.2 s by chance here,
    # so a second case moves the exit step.
    metric = Metric.named(name)
    logged = read_step_timers(OUTPUT)
    m = measure_steps(metric=metric, metrics=METRICS, logged=logged, profiled=4)
    assert m.step_times_ms == pytest.approx((1000.0, 1200.0, 3400.0, 1100.0, 1200.0))
    assert m.value == pytest.approx(METRICS[metric.key])
    assert m.timers_ms["bwd_allreduce"] == pytest.approx(100.0) and m.timers_ms["step"] == pytest.approx(150.0)
    fast_exit = {**METRICS, "latency": 600000.0, "throughput": 8 / 0.6, "FLOPS_per_gpu": 1e10}
    m = measure_steps(metric=metric, metrics=fast_exit, logged=logged, profiled=4)
    assert m.step_times_ms[-1] == 600.0
    median = 1100.0  # of 1000, 1200, 3400, 1100, 600
    expected = {"throughput": 8 / 1.1, "latency": median * 1000, "flops": 1e10 * 600 / median}[name]
    assert m.value == pytest.approx(expected)


@pytest.mark.parametrize("case", ["no lines", "too few lines", "no latency", "other units", "too coarse"])
def test_the_engines_own_figure_where_the_steps_cannot_be_read(case: str) -> None:
    logged = read_step_timers(OUTPUT)
    metrics = dict(METRICS)
    if case == "no lines":
        logged = []
    elif case == "too few lines":
        logged = logged[-2:]
    elif case == "no latency":
        del metrics["latency"]
    elif case == "other units":
        metrics["latency"] = 1.2  # a DeepSpeed that wrote milliseconds: 1000x off the lines
    else:
        # A tiny model's 0.6 ms steps: the lines' 0.01 ms per timer is 2.5% of a step.
        logged = read_step_timers("\n".join("time (ms) | fwd: 0.12 | bwd: 0.24 | bwd_allreduce: 0.10 | step: 0.23" for _ in range(6)))
        metrics.update(latency=590.0, throughput=8 / 590e-6)
    m = measure_steps(metric=Metric.named("throughput"), metrics=metrics, logged=logged, profiled=4)
    assert m.value == metrics["throughput"] and m.step_times_ms == () and m.to_attrs() == {}


def test_the_profiled_steps_are_those_the_config_names() -> None:
    assert profiled_steps({"autotuning": {"start_profile_step": 3, "end_profile_step": 6}}) == 4
    assert profiled_steps({}) == 3  # DeepSpeed's defaults, 3 to 5
    assert profiled_steps({"autotuning": {"start_profile_step": "3", "end_profile_step": 5}}) == 0


def test_the_summary_says_where_the_optimums_step_time_goes() -> None:
    from optuna_ds.domain import Config
    from optuna_ds.reporting._summary import step_line
    from optuna_ds.studies._results import Optimum
    from optuna_ds.studies._results import TuningResult

    best = Optimum(name="z1_gas1_tmbspg8", config=Config(stage=1, micro_batch=8), trial_number=0, ds_config={}, result_dir="",
                   cmd=[], runs=(10.0,), timers_ms={"fwd": 300.0, "bwd": 600.0, "bwd_inner": 450.0, "bwd_allreduce": 150.0, "step": 100.0})
    result = TuningResult(metric=Metric.named("throughput"), stages=[], duration=1.0, model_info={}, best=best)
    assert step_line(result) == ("Step time of z1_gas1_tmbspg8 by DeepSpeed's timers (median of its profiled steps): forward 300 ms (30%), "
                                 "backward 600 ms (60%, of which gradient all-reduce 150 ms), optimizer step 100 ms (10%).")
    import dataclasses
    assert step_line(dataclasses.replace(result, best=dataclasses.replace(best, timers_ms={}))) == ""
