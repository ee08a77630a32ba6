"""The planner prices activation checkpointing in physical terms (issue 37): it frees most of a
sample's activations for one more forward, so it pays only where activations bound the
micro-batch and the throughput curve still rises beyond that edge; a job where it cannot spends
no launch on it, a script that ignores it is found once, and a setting that fails for a reason of
its own blames neither the stage nor the size."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from conftest import plan_one_at_a_time
from optuna_ds.domain import Config
from optuna_ds.domain import FailureReason
from optuna_ds.domain import Knobs
from optuna_ds.planner import Arm
from optuna_ds.planner import Observation
from optuna_ds.planner import PlannerSettings
from optuna_ds.planner import Priors
from optuna_ds.planner import Problem
from optuna_ds.planner import Status
from optuna_ds.planner._checkpointing import checkpointing_effects
from optuna_ds.planner._checkpointing import ignored
from optuna_ds.planner._checkpointing import may_pay
from optuna_ds.planner._checkpointing import rise
from optuna_ds.planner._state import State

GB = 1e9
SWITCH = Knobs({"gradient_checkpointing": True})
CPU = Knobs({"activation_checkpointing.cpu_checkpointing": True})


@dataclasses.dataclass(frozen=True)
class Job:
    """One GPU of 80 GB, 20 GB of model states: the truth the simulated runs answer from.
    Checkpointing keeps ``kept`` of a sample's activations and adds the forward (a third of the
    compute) to the backward, as DeepSpeed's timers show it; ``ignored``: the script takes the
    switch and never checkpoints."""

    per_sample: float = 7.5 * GB
    h: float = 32.0  # the size at half the curve's height: large, a curve still rising at the edge
    kept: float = 0.15
    ignored: bool = False
    unsupported: bool = False
    stages: tuple[int, ...] = (0,)
    cap: int = 256
    profile: float | None = None  # the profile's per-sample figure, where it is off

    def problem(self, settings: tuple[Knobs, ...] = (SWITCH,)) -> Problem:
        arms = tuple(Arm(stage=s, free=60 * GB, cap=self.cap) for s in self.stages)
        return Problem(arms=arms, device_memory=80 * GB, per_sample=self.profile or self.per_sample, checkpointing=settings,
                       max_experiments=40, explicit=len(self.stages) > 1)

    def on(self, config: Config) -> bool:
        return dict(config.knobs).get("gradient_checkpointing") is True and not self.ignored

    def throughput(self, config: Config) -> float:
        m = config.micro_batch
        return 100.0 * m / (m + self.h) / (4 / 3 if self.on(config) else 1.0) * (1.0 - 0.1 * config.stage)

    def fits(self, config: Config) -> bool:
        share = self.kept if self.on(config) else 1.0
        return 2 * GB + config.micro_batch * self.per_sample * share <= 60 * GB

    def run(self, config: Config, repeat: int) -> Observation:
        if self.unsupported and config.knobs.checkpointing:
            return Observation(config=config, status=Status.FAILED, seconds=10.0, repeat=repeat, reason=FailureReason.CHECKPOINTING.value)
        if not self.fits(config):
            return Observation(config=config, status=Status.OOM, seconds=20.0, repeat=repeat)
        m = config.micro_batch
        fwd = 10.0 * m / 3
        timers = {"fwd": fwd, "bwd": 2 * fwd + (fwd if self.on(config) else 0.0), "step": 2.0}
        score = self.throughput(config) * (1.0 + 0.004 * (-1) ** repeat)
        return Observation(config=config, status=Status.OK, score=score, seconds=60.0, repeat=repeat, timers=tuple(timers.items()))

    def best(self, problem: Problem) -> float:
        """The best true throughput of any config the problem allows."""
        configs = [problem.config(a, m, k) for a in problem.arms for m in range(1, self.cap + 1)
                   for k in (Knobs(), *problem.checkpointing)]
        return max(self.throughput(c) for c in configs if self.fits(c))


def _tune(job: Job, problem: Problem | None = None) -> tuple[list[Observation], Config]:
    return plan_one_at_a_time(problem or job.problem(), job.run)


def _checkpointed(observations: list[Observation]) -> list[Observation]:
    return [o for o in observations if o.knobs.checkpointing]


def test_the_memory_model_knows_checkpointing_frees_activations() -> None:
    job = Job()
    problem = job.problem()
    runs = [job.run(problem.config(problem.arms[0], m), 0) for m in (2, 4, 7, 8)]
    assert [o.status for o in runs] == [Status.OK, Status.OK, Status.OK, Status.OOM]
    state = State(problem, runs, PlannerSettings())
    arm, ckpt = problem.arms[0], state.arm(problem.arms[0].key, SWITCH)
    sizes = np.array([7.0, 12.0, 20.0, 30.0])
    assert (state.memory.p_oom(arm, sizes) >= 0.99).tolist() == [False, True, True, True]
    # Kept between a twentieth and half of a sample's activations: twice the edge fits.
    p = state.memory.p_oom(ckpt, sizes, SWITCH)
    assert p[1] < 0.05 and p[2] < 0.5
    assert 0.05 < ckpt.kept < 0.5
    assert (state.memory.share(ckpt, sizes) < state.memory.share(arm, sizes)).all()
    # A run of the setting teaches its share: one that ran at 30 rules out keeping a half.
    taught = State(problem, [*runs, job.run(problem.config(arm, 30, SWITCH), 0)], PlannerSettings())
    assert taught.memory.kept_share(SWITCH) < state.memory.kept_share(SWITCH)


def test_the_recompute_costs_a_forward_read_from_the_timers() -> None:
    job = Job()
    problem = job.problem()
    priors = Priors()
    before = checkpointing_effects(problem, [], priors)[("gradient_checkpointing", True)]
    assert before[0] == pytest.approx(-math.log1p(1 / 3))
    # A step whose forward is a fifth of it (the optimizer step and communication are not recomputed).
    config = problem.config(problem.arms[0], 4)
    timed = Observation(config=config, status=Status.OK, score=10.0, timers=(("fwd", 20.0), ("bwd", 60.0), ("step", 20.0)))
    after = checkpointing_effects(problem, [timed], priors)[("gradient_checkpointing", True)]
    assert after[0] == pytest.approx(-math.log1p(0.2)) and after[1] < before[1]


def test_the_gate_weighs_the_curves_rise_against_the_recompute() -> None:
    cost = math.log1p(1 / 3)
    steep = rise({1: 11.0, 2: 20.0, 4: 33.0}, 0.01)
    flat = rise({2: 80.0, 4: 89.0, 8: 94.0}, 0.01)
    assert steep is not None and flat is not None
    assert may_pay(steep, reach=16, price=cost, min_gain=0.002)
    assert not may_pay(flat, reach=32, price=cost, min_gain=0.002)
    assert not may_pay(steep, reach=4, price=cost, min_gain=0.002)  # no room beyond the best size
    assert may_pay(rise({4: 33.0}, 0.01), reach=16, price=cost, min_gain=0.002)  # one size: the model decides


def test_where_activations_bound_a_rising_curve_checkpointing_is_tried_and_wins() -> None:
    job = Job(h=32.0)
    problem = job.problem()
    observations, choice = _tune(job, problem)
    assert _checkpointed(observations)
    assert choice.knobs == SWITCH and choice.micro_batch > 8
    assert job.throughput(choice) >= 0.97 * job.best(problem)
    assert not ignored(observations, Priors())


@pytest.mark.parametrize("job", [Job(h=0.5), Job(per_sample=0.5 * GB, cap=32)], ids=["flat-curve", "memory-not-binding"])
def test_a_job_where_checkpointing_cannot_pay_spends_no_launch_on_it(job: Job) -> None:
    observations, choice = _tune(job)
    assert not _checkpointed(observations)
    assert not choice.knobs


def test_a_script_that_ignores_the_switch_is_found_once_and_explored_no_further() -> None:
    # The script takes --gradient_checkpointing and never checkpoints: its run at a size that
    # cannot fit without it runs out of memory, which no checkpointing could.
    job = Job(h=32.0, ignored=True)
    observations, choice = _tune(job)
    assert 1 <= len(_checkpointed(observations)) <= 3  # each out of memory halves the room it may still make
    assert ("gradient_checkpointing", True) in ignored(observations, Priors())
    assert not choice.knobs


def test_a_run_whose_backward_did_not_grow_by_a_forward_never_checkpointed() -> None:
    # A run that fitted (a size the model believed too large without it): DeepSpeed's timers
    # say whether the backward recomputed the forward, against the runs of its arm without it.
    problem = Job().problem()

    def run(m: int, knobs: Knobs, ratio: float) -> Observation:
        fwd = 10.0 * m / 3
        timers = (("fwd", fwd), ("bwd", ratio * fwd), ("step", 2.0))
        return Observation(config=problem.config(problem.arms[0], m, knobs), status=Status.OK, score=10.0, timers=timers)

    plain = [run(4, Knobs(), 2.0), run(6, Knobs(), 2.1)]
    why = ignored([*plain, run(12, SWITCH, 2.05)], Priors())
    assert "did not grow" in why[("gradient_checkpointing", True)]
    assert not ignored([*plain, run(12, SWITCH, 3.0)], Priors())
    # Ratios that scatter as much as the growth sought say nothing.
    assert not ignored([run(4, Knobs(), 2.0), run(6, Knobs(), 2.6), run(12, SWITCH, 2.3)], Priors())


def test_a_setting_that_fails_for_its_own_reason_blames_neither_stage_nor_size() -> None:
    job = Job(h=32.0, unsupported=True)
    observations, choice = _tune(job)
    assert len(_checkpointed(observations)) == 1
    assert not choice.knobs
    # The sizes the stage runs without it are all explored as if it never ran.
    plain = Job(h=32.0)
    reference, _ = _tune(dataclasses.replace(plain, kept=1.0))
    assert choice.micro_batch == max(o.mbs for o in reference if o.status is Status.OK and not o.knobs)


def test_where_no_sample_fits_without_it_checkpointing_makes_one_fit() -> None:
    # The profile says one sample's activations (70 GB) exceed the 60 GB the states leave: the
    # first launch is one likely to run, with checkpointing.
    job = Job(per_sample=70 * GB, h=2.0)
    observations, choice = _tune(job)
    assert observations[0].knobs == SWITCH and observations[0].status is Status.OK
    assert choice.knobs == SWITCH and job.fits(choice)


def test_a_section_setting_the_script_never_configures_is_found_from_its_log() -> None:
    job = Job(h=32.0)
    problem = job.problem((CPU,))
    config = problem.config(problem.arms[0], 12, CPU)
    # Its ranks logged at INFO, and nothing of DeepSpeed's checkpointing.
    silent = Observation(config=config, status=Status.OK, score=10.0, checkpointing=())
    assert "never calls deepspeed.checkpointing.configure" in ignored([silent], Priors())[tuple(CPU)[0]]
    # Its ranks logged at DeepSpeed's default, WARNING: the output cannot tell.
    assert not ignored([dataclasses.replace(silent, checkpointing=None)], Priors())
    logged = dataclasses.replace(silent, checkpointing=(("cpu_checkpointing", True), ("partition_activations", False)))
    assert not ignored([logged], Priors())
    other = dataclasses.replace(silent, checkpointing=(("cpu_checkpointing", False),))
    assert "without the config" in ignored([other], Priors())[tuple(CPU)[0]]
