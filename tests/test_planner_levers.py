"""The planner prices ZeRO++ like any other knob, from priors in physical terms (issue 37): a job
where it cannot pay spends no launch on it; one where it can tries it, its memory counted."""
from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

from optuna_ds.planner import Arm
from optuna_ds.planner import KnobSetting
from optuna_ds.planner import Observation
from optuna_ds.planner import PlannerSettings
from optuna_ds.planner import Priors
from optuna_ds.planner import Problem
from optuna_ds.planner import Status
from optuna_ds.planner import communication_share
from optuna_ds.planner import lever_effect
from optuna_ds.planner import plan
from optuna_ds.planner._levers import expected_gain
from optuna_ds.planner._state import State
from optuna_ds.space import estimate_memory

GB = 1e9
QWZ, QGZ, HPZ = "zero_quantized_weights", "zero_quantized_gradients", "zero_hpz_partition_size"
Knobs = tuple[tuple[str, object], ...]


def _job(*, nodes: int, params: float, space: tuple, gpus_per_node: int = 8) -> tuple[Problem, dict]:
    """A ZeRO-3 job whose knob settings' buffers are optuna-ds's estimate (hpZ's secondary copy in them)."""
    gpus = nodes * gpus_per_node
    defaults = tuple((k, values[0]) for k, values in space)

    def buffers(knobs: Knobs) -> float:
        return estimate_memory(stage=3, num_params=int(params), trainable_params=None, activation_per_sample=1 * GB,
                               device_memory=80 * GB, num_gpus=gpus, precision="fp16", zero=dict(knobs)).buffers

    e = estimate_memory(stage=3, num_params=int(params), trainable_params=None, activation_per_sample=1 * GB,
                        device_memory=80 * GB, num_gpus=gpus, precision="fp16")
    arm = Arm(stage=3, free=80 * GB - e.instantiation, cap=256, buffers=e.buffers, knobs=space, knob_defaults=defaults)
    problem = Problem(arms=(arm,), device_memory=80 * GB, gpus=gpus, nodes=nodes, params=params, per_sample=1 * GB,
                      max_experiments=60)
    names = [k for k, _ in space]
    settings = [KnobSetting(knobs, buffers(knobs)) for values in itertools.product(*(v for _, v in space))
                if (knobs := tuple(zip(names, values))) != defaults]
    return problem, {arm.key: settings}


def _tune(problem: Problem, candidates: dict, throughput: Callable[[int, Knobs], float], *, share: float | None
          ) -> tuple[list[Observation], Observation | None]:
    observations: list[Observation] = []
    decision = None
    for _ in range(problem.max_experiments):
        decision = plan(problem, observations, knob_candidates=candidates)
        if not decision.proposals:
            break
        p = decision.proposals[0]
        score = throughput(p.mbs, p.knobs) * (1.0 + 0.004 * (-1) ** p.repeat)
        timers = _timers(p.mbs, share) if share is not None else {}
        observations.append(Observation(config=p.config, status=Status.OK, score=score, seconds=60.0, repeat=p.repeat,
                                        timers=tuple(timers.items())))
    assert decision is not None and decision.done
    return observations, decision.choice


def _timers(mbs: int, share: float) -> dict[str, float]:
    """DeepSpeed's timers of a step whose collectives take ``share`` of it at 40 samples: 10 ms of
    compute per sample (a third forward), the gathers (two thirds of the collectives) waited for
    in forward and backward alike, the reduction's tail in ``bwd_allreduce``."""
    comm = share / (1.0 - share) * 10.0 * 40
    fwd, inner, reduce = 10.0 * mbs / 3 + comm / 3, 20.0 * mbs / 3 + comm / 3, comm / 3
    return {"fwd": fwd, "bwd": inner + reduce, "bwd_inner": inner, "bwd_allreduce": reduce, "step": 0.0}


def _throughput(gains: dict[tuple[str, object], float]) -> Callable[[int, Knobs], float]:
    def f(mbs: int, knobs: Knobs) -> float:
        value = 100.0 * mbs / (mbs + 6.0) * (1.0 - 0.3 * max(0.0, mbs - 40) / 40)
        for pair in knobs:
            value *= gains.get(pair, 1.0)
        return value
    return f


def _levers_run(observations: list[Observation]) -> list[Observation]:
    return [o for o in observations if any(k in (QWZ, QGZ, HPZ) and (v is True or (type(v) is int and v > 1)) for k, v in o.knobs)]


def test_the_hpz_secondary_partition_is_in_the_memory_estimate() -> None:
    kw = dict(stage=3, num_params=8_000_000_000, trainable_params=None, activation_per_sample=1e9, device_memory=80e9,
              num_gpus=16, precision="bf16")
    plain = estimate_memory(**kw)
    hpz = estimate_memory(**kw, zero={HPZ: 8})
    # A second copy of the parameters partitioned over the 8 ranks of its group, in bf16.
    assert hpz.buffers - plain.buffers == pytest.approx(8e9 * 2 / 8)
    assert hpz.params == plain.params  # the primary partition is unchanged
    assert estimate_memory(**kw, zero={HPZ: 1}).buffers == plain.buffers
    # With the parameters offloaded DeepSpeed keeps the secondary partition off the GPU too.
    offloaded = {"offload_param": {"device": "cpu"}}
    assert estimate_memory(**kw, zero={**offloaded, HPZ: 8}).buffers == estimate_memory(**kw, zero=offloaded).buffers


def test_the_communication_share_comes_from_deepspeeds_timers() -> None:
    # The collectives' bytes do not grow with the micro-batch, the compute does: over two sizes
    # or more, the intercept of the forward and backward time holds the gathers' wait.
    runs = [(m, 1, _timers(m, 0.4)) for m in (10, 20, 40)]
    assert communication_share(runs) == pytest.approx(0.4)
    # Per micro-batch: an accumulation of 4 times the step's timers, not the line's.
    assert communication_share([(m, 4, {k: 4 * v for k, v in t.items()}) for m, _, t in runs]) == pytest.approx(0.4)
    assert communication_share([(m, 1, _timers(m, 0.0)) for m in (10, 40)]) == pytest.approx(0.0, abs=1e-9)
    # One size, or no timers, says nothing.
    assert communication_share(runs[:1]) is None and communication_share([(10, 1, {}), (20, 1, {"fwd": 1.0})]) is None


def test_a_lever_is_bounded_by_what_it_can_save_less_what_it_costs() -> None:
    priors = Priors()
    big = lever_effect(QWZ, True, share=0.6, nodes=4, priors=priors)
    small = lever_effect(QWZ, True, share=0.03, nodes=4, priors=priors)
    assert big is not None and small is not None and big[0] > 0.0 > small[0]
    # qgZ and hpZ save nothing within a node: they only cost.
    one_node = lever_effect(QGZ, True, share=0.6, nodes=1, priors=priors)
    assert one_node is not None and one_node[0] == pytest.approx(-dict(priors.lever_costs)[QGZ])
    assert expected_gain(small) < PlannerSettings().min_gain < expected_gain(big)
    assert lever_effect(QWZ, False, share=0.6, nodes=4, priors=priors) is None  # the default has no effect
    assert lever_effect("overlap_comm", True, share=0.6, nodes=4, priors=priors) is None


def test_a_one_node_job_spends_no_launch_on_zeropp() -> None:
    # The user listed qwZ on one node, where it costs its kernels and saves little NVLink time.
    problem, candidates = _job(nodes=1, params=7e9, space=(("overlap_comm", (True, False)), (QWZ, (False, True))))
    observations, choice = _tune(problem, candidates, _throughput({(QWZ, True): 0.97, ("overlap_comm", False): 1.04}),
                                 share=0.08)
    assert not _levers_run(observations)
    assert choice is not None and dict(choice.knobs).get(QWZ) in (None, False)


def test_a_multi_node_job_that_communicates_little_spends_no_launch_on_zeropp() -> None:
    space = ((HPZ, (1, 8)), (QGZ, (False, True)), (QWZ, (False, True)))
    problem, candidates = _job(nodes=4, params=13e9, space=space)
    observations, _ = _tune(problem, candidates, _throughput({(QWZ, True): 0.98, (QGZ, True): 0.98, (HPZ, 8): 0.995}), share=0.03)
    assert not _levers_run(observations)


def test_a_low_bandwidth_multi_node_large_model_tries_zeropp_and_counts_hpzs_memory() -> None:
    space = ((HPZ, (1, 8)), (QGZ, (False, True)), (QWZ, (False, True)))
    problem, candidates = _job(nodes=4, params=13e9, space=space)
    gains = {(QWZ, True): 1.2, (QGZ, True): 1.1, (HPZ, 8): 1.15}
    observations, choice = _tune(problem, candidates, _throughput(gains), share=0.55)
    assert _levers_run(observations)
    assert choice is not None and dict(choice.knobs).get(QWZ) is True
    # hpZ's secondary copy (13e9 parameters in fp16 over 8 ranks) is in its setting's memory, so
    # a size the default knobs run at is likelier to run out with it.
    state = State(problem, observations, PlannerSettings(), candidates)
    key = problem.arms[0].key
    with_hpz = state.arm(key, ((HPZ, 8), (QGZ, False), (QWZ, False)))
    assert with_hpz.buffers - problem.arms[0].buffers == pytest.approx(13e9 * 2 / 8)
    sizes = np.arange(1, 90)
    p_hpz, p_default = state.memory.p_oom(with_hpz, sizes), state.memory.p_oom(problem.arms[0], sizes)
    assert (p_hpz >= p_default).all() and (p_hpz > p_default + 0.03).any()


def test_without_timers_the_prior_comes_from_the_nodes_and_the_models_size() -> None:
    space = ((QWZ, (False, True)),)
    problem, candidates = _job(nodes=4, params=13e9, space=space)
    small, _ = _job(nodes=4, params=0.1e9, space=space)
    one, _ = _job(nodes=1, params=13e9, space=space)
    priors = Priors()
    effects = {name: State(p, [], PlannerSettings(), candidates).levers[(QWZ, True)] for name, p in
               (("multi", problem), ("small", small), ("one", one))}
    assert effects["multi"][0] > effects["one"][0] and effects["multi"][0] > effects["small"][0]
    assert expected_gain(effects["one"]) < PlannerSettings().min_gain
    assert priors.internode_share > priors.intranode_share


def test_a_runs_timers_reach_the_planner() -> None:
    import optuna

    from optuna_ds.config import Metric
    from optuna_ds.domain import Config
    from optuna_ds.domain import ExperimentRecord
    from optuna_ds.studies import observation_of

    timers = {"fwd": 140.0, "bwd": 270.0, "bwd_allreduce": 30.0, "step": 20.0}
    record = ExperimentRecord(config=Config(stage=3, micro_batch=8), exp_name="z3_gas1_tmbspg8", duration=3.0, timers_ms=timers)
    trial = optuna.trial.create_trial(value=200.0, user_attrs=record.attrs())
    observation = observation_of(trial, metric=Metric.named("throughput"), dead={})
    assert observation is not None and dict(observation.timers) == timers
