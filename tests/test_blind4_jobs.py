"""The fourth, blind job generator (benchmarks/blind4_jobs.py): deterministic and self-consistent."""
from __future__ import annotations


import numpy as np
import pytest

import blind4_jobs


SEEDS = (0, 3, 12, 22, 26)  # one node and many, 24 GB desktops to H200s, ViT, GPT-2, Mixtral


@pytest.fixture(scope="module")
def jobs() -> dict[int, blind4_jobs.Blind4Job]:
    return {seed: blind4_jobs.blind4_job(seed) for seed in SEEDS}


def _random_configs(job: blind4_jobs.Blind4Job, rng: np.random.Generator, count: int) -> list[blind4_jobs.Config]:
    arms = job._arms((0, 1, 2, 3), True)
    out = []
    for _ in range(count):
        stage, oo, op = arms[int(rng.integers(len(arms)))]
        knobs = tuple((k, v[int(rng.integers(len(v)))]) for k, v in blind4_jobs.SPACES[stage].items())
        out.append(blind4_jobs.Config(stage, int(rng.integers(1, 300)), 1, knobs, oo, op))
    return out


def test_a_seed_always_draws_the_same_job() -> None:
    a, b = blind4_jobs.blind4_job(7), blind4_jobs.by_name("blind4-7")
    assert (a.name, a.description, a.num_gpus, a.device_gb, a.params_b, a.act_gb, a.noise, a.startup_s) == \
           (b.name, b.description, b.num_gpus, b.device_gb, b.params_b, b.act_gb, b.noise, b.startup_s)
    config = a.reference
    assert a.evaluate(config) == b.evaluate(config)
    assert a.step_times(config, 11) == b.step_times(config, 11)
    assert a.timers(config, 11) == b.timers(config, 11)
    assert a.measure(config, 11) != a.measure(config, 12)
    assert blind4_jobs.blind4_job(8).description != a.description
    for bad in ("blind-7", "blind4-x", "blind4-"):
        with pytest.raises(KeyError):
            blind4_jobs.by_name(bad)


def test_measurements_average_to_the_truth(jobs: dict[int, blind4_jobs.Blind4Job]) -> None:
    for job in jobs.values():
        config = job.reference
        truth = job.evaluate(config).throughput
        nonces = range(20_000, 20_500)  # launches outside the set the noise is normalised over
        samples = np.asarray([job.measure(config, k) for k in nonces]) / truth
        assert abs(samples.mean() - 1.0) < 4 * job.noise / np.sqrt(len(samples)) + 0.003, job.name
        assert 0.5 * job.noise < samples.std() < 1.5 * job.noise + 0.002, job.name
        steps = job.step_times(config, 5)
        assert len(steps) == blind4_jobs.PROFILED
        assert job.measure(config, 5) == pytest.approx(config.mbs * config.gas * job.num_gpus / np.mean(steps))
        assert set(job.timers(config, 5)) == {"fwd", "bwd", "bwd_allreduce", "step"}


def test_the_optimum_beats_random_configs_and_evaluates_to_itself(jobs: dict[int, blind4_jobs.Blind4Job]) -> None:
    rng = np.random.default_rng(0)
    for job in jobs.values():
        arms = job.arm_optima(fast=False, max_mbs=300)
        best_config, best = max(arms.values(), key=lambda ct: ct[1])
        assert job.evaluate(best_config).throughput == pytest.approx(best)
        fast_best = job.optimum(fast=True, max_mbs=300)[1]
        assert best >= fast_best * (1 - 1e-12)
        for config in _random_configs(job, rng, 25):
            outcome = job.evaluate(config)
            assert outcome.kind in ("ok", "oom", "crash") and outcome.seconds > 0
            arm = (config.stage, config.offload_optimizer, config.offload_param)
            assert outcome.throughput <= arms.get(arm, (None, 0.0))[1] * (1 + 1e-9), (job.name, config)
            assert (job.measure(config, 1) > 0) == (outcome.kind == "ok")


def test_the_oom_edge_agrees_with_evaluate(jobs: dict[int, blind4_jobs.Blind4Job]) -> None:
    for job in jobs.values():
        for stage in range(4):
            for oo, op in ((False, False), (True, False), (True, True)):
                if (oo and stage == 0) or (op and stage < 3):
                    continue
                largest, first = job.oom_edge(stage, offload_optimizer=oo, offload_param=op, max_mbs=400)
                if largest:
                    fits = job.evaluate(blind4_jobs.Config(stage, largest, offload_optimizer=oo, offload_param=op))
                    assert fits.kind != "oom", (job.name, stage, oo, op)
                    assert job.peak_memory_gb(blind4_jobs.Config(stage, largest, offload_optimizer=oo, offload_param=op), 0) <= job.device_gb
                if first <= 400:
                    fails = blind4_jobs.Config(stage, first, offload_optimizer=oo, offload_param=op)
                    assert job.evaluate(fails).kind in ("oom", "crash"), (job.name, stage, oo, op)
                    if job.evaluate(fails).kind == "oom":
                        assert job.memory_gb(fails) > job.device_gb - 1.0
                        assert job.peak_memory_gb(fails, 3) > 0.95 * job.device_gb


def test_knobs_a_stage_does_not_read_change_nothing(jobs: dict[int, blind4_jobs.Blind4Job]) -> None:
    job = jobs[12]
    plain = blind4_jobs.Config(1, 8)
    foreign = blind4_jobs.Config(1, 8, knobs=(("overlap_comm", True), ("stage3_max_live_parameters", 1e8)))
    assert job.evaluate(plain) == job.evaluate(foreign)
    assert job.measure(plain, 4) == job.measure(foreign, 4)
    z0 = blind4_jobs.Config(0, 8, knobs=(("reduce_bucket_size", 5e7),))
    assert job.evaluate(z0) == job.evaluate(blind4_jobs.Config(0, 8))
