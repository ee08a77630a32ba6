"""The planner prices AutoTP in physical terms (issue 37): a group of ranks splits each layer,
so a rank holds less of the model states and of a sample's activations, for per-layer
all-reduces; it pays only where memory bounds the micro-batch and the curve still rises beyond
that edge, a job where it cannot spends no launch on it, and a script that cannot run it is
found once, its size blamed on neither the stage nor the micro-batch."""
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
from optuna_ds.planner._autotp import autotp_effects
from optuna_ds.planner._autotp import hidden_size
from optuna_ds.planner._state import State

GB = 1e9
TP2 = Knobs({"tensor_parallel.autotp_size": 2})
TP4 = Knobs({"tensor_parallel.autotp_size": 4})


@dataclasses.dataclass(frozen=True)
class Job:
    """Eight GPUs of 80 GB at ZeRO-0: ``states`` GB of model states, which AutoTP of t splits t
    ways; a sample's activations of ``per_sample``, of which a rank of a group keeps ``kept``
    (t = 2) or ``kept`` / 1.6 (t = 4); per-GPU throughput ``factor`` per doubling of the group at a
    size both run; ``fails``: the script's data differ within a group."""

    states: float = 70.0
    per_sample: float = 2.0 * GB
    h: float = 32.0
    kept: float = 0.6
    factor: float = 0.93
    fails: bool = False
    cap: int = 256
    hidden: int = 0  # the model's hidden size, where known: its all-reduces' share of a step falls with it

    def problem(self, settings: tuple[Knobs, ...] = (TP2, TP4)) -> Problem:
        split = tuple((k.autotp, (80.0 - self.states / k.autotp) * GB, self.cap) for k in settings)
        arm = Arm(stage=0, free=(80.0 - self.states) * GB, cap=self.cap, autotp=split)
        return Problem(arms=(arm,), device_memory=80 * GB, per_sample=self.per_sample, gpus=8, params=7e9, hidden=self.hidden,
                       autotp=settings, autotp_batch=tuple((k.autotp, None, 1) for k in settings), max_experiments=40)

    def share(self, t: int) -> float:
        return 1.0 if t == 1 else self.kept if t == 2 else self.kept / 1.6

    def throughput(self, config: Config) -> float:
        m, t = config.micro_batch, config.knobs.autotp
        return 100.0 * m / (m + self.h) * self.factor ** math.log2(t)

    def fits(self, config: Config) -> bool:
        t = config.knobs.autotp
        return 1 * GB + self.states / t * GB + config.micro_batch * self.per_sample * self.share(t) <= 80 * GB

    def run(self, config: Config, repeat: int) -> Observation:
        if self.fails and config.knobs.autotp > 1:
            return Observation(config=config, status=Status.FAILED, seconds=10.0, repeat=repeat, reason=FailureReason.AUTOTP.value)
        if not self.fits(config):
            return Observation(config=config, status=Status.OOM, seconds=20.0, repeat=repeat)
        score = self.throughput(config) * (1.0 + 0.004 * (-1) ** repeat)
        return Observation(config=config, status=Status.OK, score=score, seconds=60.0, repeat=repeat)

    def best(self, problem: Problem) -> float:
        configs = [problem.config(a, m, k) for a in problem.arms for m in range(1, self.cap + 1) for k in (Knobs(), *problem.autotp)]
        return max(self.throughput(c) for c in configs if self.fits(c))


def _tune(job: Job, problem: Problem | None = None) -> tuple[list[Observation], Config]:
    return plan_one_at_a_time(problem or job.problem(), job.run)


def _split(observations: list[Observation]) -> list[Observation]:
    return [o for o in observations if o.knobs.autotp > 1]


def test_the_memory_model_knows_autotp_splits_the_states_and_the_activations() -> None:
    job = Job()
    problem = job.problem()
    runs = [job.run(problem.config(problem.arms[0], m), 0) for m in (1, 2, 4, 5)]
    assert [o.status for o in runs] == [Status.OK, Status.OK, Status.OK, Status.OOM]
    state = State(problem, runs, PlannerSettings())
    arm, split = problem.arms[0], state.arm(problem.arms[0].key, TP2)
    assert split.free == pytest.approx(45 * GB) and 0.5 < split.kept < 0.8
    sizes = np.array([4.0, 12.0, 20.0, 60.0])
    assert (state.memory.p_oom(arm, sizes) >= 0.99).tolist() == [False, True, True, True]
    p = state.memory.p_oom(split, sizes, TP2)
    assert p[1] < 0.05 and p[3] > 0.95  # 12 samples fit beside half the states; 60 do not
    assert (state.memory.share(split, sizes) < state.memory.share(arm, sizes)).all()
    # A run of the setting teaches its share: one that ran at 30 rules out keeping 80%.
    taught = State(problem, [*runs, job.run(problem.config(arm, 30, TP2), 0)], PlannerSettings())
    assert taught.memory.kept_share(TP2) < state.memory.kept_share(TP2)


def test_its_cost_is_the_all_reduces_share_which_falls_with_the_hidden_size_and_grows_with_the_group() -> None:
    problem = Job().problem()
    effects = autotp_effects(problem, Priors())
    two, four = effects[("tensor_parallel.autotp_size", 2)], effects[("tensor_parallel.autotp_size", 4)]
    assert hidden_size(problem) == pytest.approx(4200, rel=0.05)  # a 7B model's
    assert -0.08 < two[0] < -0.04 and four[0] < two[0] and four[1] > two[1] > 0
    wide = autotp_effects(dataclasses.replace(problem, hidden=16384), Priors())[("tensor_parallel.autotp_size", 2)]
    assert two[0] < wide[0] < 0


def test_the_accumulation_of_a_split_config_takes_the_global_batch_over_fewer_ranks() -> None:
    # 8 GPUs, a global batch of 64: 8 a rank without AutoTP, 16 a data-parallel rank of groups of 2.
    problem = dataclasses.replace(Job().problem(), max_batch=8, autotp_batch=((2, 16, 1), (4, 32, 1)))
    arm = problem.arms[0]
    assert problem.config(arm, 4).accumulation == 2
    assert problem.config(arm, 4, TP2).accumulation == 4 and problem.config(arm, 4, TP4).accumulation == 8


def test_where_the_model_states_bound_a_rising_curve_autotp_is_tried_and_wins() -> None:
    job = Job()
    problem = job.problem()
    observations, choice = _tune(job, problem)
    assert _split(observations)
    assert choice.knobs.autotp > 1 and choice.micro_batch > 4
    assert job.throughput(choice) >= 0.97 * job.best(problem)


@pytest.mark.parametrize("job", [Job(h=0.05, per_sample=0.25 * GB, hidden=1024), Job(states=10.0, cap=16)],
                         ids=["flat-curve", "memory-not-binding"])
def test_a_job_where_autotp_cannot_pay_spends_no_launch_on_it(job: Job) -> None:
    observations, choice = _tune(job)
    assert not _split(observations)
    assert choice.knobs.autotp == 1


def test_a_script_that_cannot_run_it_is_found_once_and_no_size_is_tried_again() -> None:
    job = Job(fails=True)
    observations, choice = _tune(job)
    assert len(_split(observations)) == 1
    assert choice.knobs.autotp == 1
    # The sizes the stage runs without it are explored as if it never ran.
    assert choice.micro_batch == max(o.mbs for o in observations if o.status is Status.OK)


def test_where_the_model_states_fit_only_split_the_first_launch_splits_them() -> None:
    # 90 GB of states: none fit an 80 GB device whole; split two ways they leave 35 GB.
    job = Job(states=90.0, h=4.0)
    observations, choice = _tune(job)
    assert observations[0].knobs.autotp > 1 and observations[0].status is Status.OK
    assert not [o for o in observations if o.knobs.autotp == 1]  # a whole copy of the states never fits: never launched
    assert choice.knobs.autotp > 1 and job.fits(choice)
