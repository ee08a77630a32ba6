"""The blind job generator (benchmarks/blind_jobs.py): deterministic, self-consistent, physical."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import blind_jobs

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"

SEEDS = range(40)


@pytest.fixture(scope="module")
def jobs() -> list[blind_jobs.BlindJob]:
    return [blind_jobs.blind_job(seed) for seed in SEEDS]


def _ok(outcome: blind_jobs.Outcome) -> bool:
    return outcome.kind == "ok" and outcome.throughput > 0


def test_a_job_is_a_function_of_its_seed() -> None:
    a, b = blind_jobs.blind_job(7), blind_jobs.by_name("blind-7")
    assert a.name == b.name == "blind-7"
    assert a.description == b.description and a.noise == b.noise and a.act_gb == b.act_gb
    config, _ = a.optimum(fast=True)
    assert config is not None
    for nonce in (0, 1, 5):
        assert a.measure(config, nonce) == b.measure(config, nonce)
        assert a.step_times(config, nonce) == b.step_times(config, nonce)
        assert a.peak_memory_gb(config, nonce) == b.peak_memory_gb(config, nonce)
        assert a.timers(config, nonce) == b.timers(config, nonce)
    assert a.evaluate(config) == b.evaluate(config)
    assert a.measure(config, 1) != a.measure(config, 2)
    assert blind_jobs.blind_job(8).description != a.description
    with pytest.raises(KeyError):
        blind_jobs.by_name("blind-x")


def test_every_job_has_an_optimum_that_evaluates_to_it(jobs: list[blind_jobs.BlindJob]) -> None:
    for job in jobs:
        config, throughput = job.optimum(fast=True)
        assert config is not None and throughput > 0, job.name
        outcome = job.evaluate(config)
        assert _ok(outcome) and outcome.throughput == pytest.approx(throughput, rel=1e-12)
        assert outcome.seconds > job.startup_s * 0.5
        for arm, (arm_config, arm_throughput) in job.arm_optima(fast=True).items():
            assert (arm_config.stage, arm_config.offload_optimizer, arm_config.offload_param) == arm
            assert arm_throughput <= throughput


def test_the_knob_search_never_loses_to_the_defaults(jobs: list[blind_jobs.BlindJob]) -> None:
    gained = 0
    for job in jobs[:15]:
        fast, full = job.arm_optima(fast=True), job.arm_optima(fast=False)
        for arm, (_, throughput) in fast.items():
            config, best = full[arm]
            assert best >= throughput * (1 - 1e-12)
            assert job.evaluate(config).throughput == pytest.approx(best, rel=1e-12)
            gained += best > throughput * 1.01
    assert gained > 0  # knobs matter somewhere


def test_a_knob_the_stage_ignores_changes_nothing() -> None:
    job = blind_jobs.blind_job(3)
    plain = blind_jobs.Config(stage=0, mbs=2)
    ignored = blind_jobs.Config(stage=0, mbs=2, knobs=(("reduce_bucket_size", 5e7), ("overlap_comm", True)))
    assert job.evaluate(plain) == job.evaluate(ignored)
    explicit = blind_jobs.Config(stage=2, mbs=2, knobs=tuple(blind_jobs.DEFAULTS.items()))
    assert job.evaluate(explicit) == job.evaluate(blind_jobs.Config(stage=2, mbs=2))


def test_configs_of_another_class_are_read_by_their_fields() -> None:
    @dataclass(frozen=True)
    class Other:
        stage: int
        mbs: int
        gas: int = 1
        knobs: tuple[tuple[str, object], ...] = ()
        offload_optimizer: bool = False
        offload_param: bool = False

    job = blind_jobs.blind_job(5)
    config, _ = job.optimum(fast=True)
    assert config is not None
    other = Other(config.stage, config.mbs, config.gas, config.knobs, config.offload_optimizer, config.offload_param)
    assert job.evaluate(other) == job.evaluate(config)
    assert job.measure(other, 3) == job.measure(config, 3)


def test_measurements_average_to_the_truth_with_the_stated_noise(jobs: list[blind_jobs.BlindJob]) -> None:
    noises = [job.noise for job in jobs]
    assert min(noises) >= 0.005 and max(noises) <= 0.15
    assert max(noises) / min(noises) > 3  # dedicated and shared machines both appear
    for job in jobs[:6]:
        config, throughput = job.optimum(fast=True)
        values = np.array([job.measure(config, nonce) for nonce in range(1500)])
        assert values.mean() == pytest.approx(throughput, rel=3 * job.noise / np.sqrt(1500) + 0.002), job.name
        assert values.std() / values.mean() == pytest.approx(job.noise, rel=0.2), job.name


def test_a_launch_reports_its_steps_timers_and_memory(jobs: list[blind_jobs.BlindJob]) -> None:
    for job in jobs[:10]:
        config, _ = job.optimum(fast=True)
        steps = job.step_times(config, 4)
        assert len(steps) == blind_jobs.PROFILED and min(steps) > 0
        samples = config.mbs * config.gas * job.num_gpus
        assert job.measure(config, 4) == pytest.approx(samples / np.mean(steps))
        timers = job.timers(config, 4)
        assert set(timers) == {"fwd", "bwd", "bwd_allreduce", "step"}
        assert 0.5 * np.mean(steps) * 1e3 < sum(timers.values()) <= np.mean(steps) * 1e3
        if job.num_gpus == 1:
            assert timers["bwd_allreduce"] == 0
        peak = job.peak_memory_gb(config, 4)
        assert job.memory_gb(config) <= peak <= job.device_gb


def test_beyond_memory_a_launch_runs_out_of_it(jobs: list[blind_jobs.BlindJob]) -> None:
    late = 0
    for job in jobs:
        for stage in range(4):
            largest, first_oom = job.oom_edge(stage)
            if first_oom > 1024:
                continue
            config = blind_jobs.Config(stage=stage, mbs=first_oom)
            outcome = job.evaluate(config)
            if outcome.kind == "crash":  # host RAM gone before the first step
                continue
            assert outcome.kind == "oom" and outcome.throughput == 0, (job.name, stage)
            assert job.memory_gb(config) > job.device_gb
            assert job.peak_memory_gb(config, 0) <= job.device_gb
            assert job.measure(config, 0) == 0 and job.step_times(config, 0) == [] and job.timers(config, 0) == {}
            fits = job.evaluate(blind_jobs.Config(stage=stage, mbs=max(1, largest)))
            if fits.kind == "ok":
                assert outcome.seconds < fits.seconds
            huge = blind_jobs.Config(stage=stage, mbs=first_oom * 4)
            assert job.evaluate(huge).kind != "ok"
            late += outcome.seconds > job._startup(stage, False, False) + 1e-9
    assert late > 0  # some out-of-memory launches fail after their first steps


def test_offload_rescues_a_model_that_fits_no_other_way(jobs: list[blind_jobs.BlindJob]) -> None:
    rescued = [job for job in jobs if all(arm[1] for arm in job.arm_optima(fast=True))]
    assert rescued
    for job in rescued:
        for stage in range(4):
            assert not _ok(job.evaluate(blind_jobs.Config(stage=stage, mbs=1)))


def test_summary_prints_a_table_and_refuses_bad_input() -> None:
    run = subprocess.run([sys.executable, str(BENCH / "blind_jobs.py"), "--summary", "2"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "blind-0:" in run.stdout and "blind-1:" in run.stdout and "optimum:" in run.stdout
    bad = subprocess.run([sys.executable, str(BENCH / "blind_jobs.py"), "--summary", "-1"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
