"""What a lever can be worth before it runs, in physical terms (issue 37).

ZeRO++ saves communication and costs compute: qwZ quantizes the parameter all-gathers (fp16 to
int8: half their bytes), qgZ the gradient reduce-scatter (to int4, hierarchically: a quarter of
its bytes across nodes), hpZ keeps a secondary copy of the parameters within a node so the
backward all-gather never leaves it. At ZeRO-3 the two all-gathers and the reduce-scatter move a
third of the step's volume each, so no lever saves more than a share of the step's communication
(:attr:`Priors.lever_savings`), and what a job communicates bounds what any lever can give it.
That share comes from the job's own timers where runs of ZeRO-3 have them
(:func:`communication_share`), else from the node count and the model's size. Every function here
is pure: the planner prices a lever from its prior, and a setting whose lever cannot pay
``min_gain`` (:func:`lever_pays`) spends no launch.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from optuna_ds.planner._problem import Observation
from optuna_ds.planner._problem import Problem
from optuna_ds.planner._problem import Status
from optuna_ds.planner._settings import Priors

# An effect's prior: (mean, sd) of its log throughput.
Effect = tuple[float, float]


def communication_share(runs: Sequence[tuple[int, int, Mapping[str, float]]]) -> float | None:
    """The share of a ZeRO-3 step spent waiting on collectives at the fastest of ``runs`` (each its
    micro-batch size, accumulation and DeepSpeed's step timers in ms: ``fwd``, ``bwd``,
    ``bwd_inner``, ``bwd_allreduce``, ``step``), one arm's at its default knobs; ``None`` where
    they do not say (no timers, or one size only).

    The gradient reduction DeepSpeed times itself (``bwd_allreduce``). The parameter all-gathers
    it does not: they wait inside ``fwd`` and ``bwd_inner``. But their bytes do not depend on the
    micro-batch size and the compute grows with it, so over two sizes or more the forward and
    backward time per micro-batch is a line ``a + b m`` whose intercept ``a`` holds the gathers'
    exposed wait (with the hooks' and a small batch's kernel inefficiency: a bound, as a lever's
    worth is bounded). Activation checkpointing moves compute between the timers, not off the
    line.
    """
    rows = []
    for m, accumulation, timers in runs:
        try:
            fwd, bwd, step = (float(timers[k]) for k in ("fwd", "bwd", "step"))
            reduce = float(timers.get("bwd_allreduce", 0.0) or 0.0)
            inner = float(timers.get("bwd_inner", bwd - reduce))
        except (KeyError, TypeError, ValueError):
            continue
        total = fwd + bwd + step
        if m >= 1 and all(math.isfinite(v) and v >= 0 for v in (fwd, bwd, step, reduce, inner)) and total > 0:
            rows.append((m, max(accumulation, 1), (fwd + inner) / max(accumulation, 1), reduce, total))
    if len({m for m, *_ in rows}) < 2:
        return None
    sizes = [float(m) for m, *_ in rows]
    times = [t for _, _, t, _, _ in rows]
    mean_m, mean_t = statistics.fmean(sizes), statistics.fmean(times)
    slope = sum((m - mean_m) * (t - mean_t) for m, t in zip(sizes, times)) / sum((m - mean_m) ** 2 for m in sizes)
    intercept = min(max(mean_t - max(slope, 0.0) * mean_m, 0.0), min(times))
    m, accumulation, _, reduce, total = min(rows, key=lambda r: r[4] / (r[0] * r[1]))  # the fastest per sample
    return min((accumulation * intercept + reduce) / total, 0.95)


def prior_share(problem: Problem, priors: Priors) -> float:
    """The communication share of a ZeRO-3 step before a run measured it: across nodes the
    slowest link is the inter-node one (:attr:`Priors.internode_share`), within a node NVLink or
    PCIe (:attr:`Priors.intranode_share`); a model below :attr:`Priors.lever_model` parameters
    gathers little beside the compute of the larger micro-batches it leaves room for."""
    share = priors.internode_share if problem.nodes > 1 else priors.intranode_share if problem.gpus > 1 else 0.0
    if problem.params > 0:
        share *= min(1.0, problem.params / priors.lever_model)
    return share


def measured_share(observations: Sequence[Observation]) -> float | None:
    """The communication share (:func:`communication_share`) of the default-knob ZeRO-3 runs
    with timers of the arm whose best run is fastest (the arm a lever would join); ``None``
    where they do not say."""
    best: dict[tuple[int, str], float] = {}
    runs: dict[tuple[int, str], list[tuple[int, int, Mapping[str, float]]]] = {}
    for o in observations:
        if o.stage != 3 or o.status is not Status.OK or o.knobs or not o.timers or not o.score:
            continue
        best[o.arm] = max(best.get(o.arm, 0.0), o.score)
        runs.setdefault(o.arm, []).append((o.mbs, o.config.accumulation, dict(o.timers)))
    if not best:
        return None
    return communication_share(runs[max(best, key=lambda k: best[k])])


def lever_effect(knob: str, value: Any, *, share: float, nodes: int, priors: Priors) -> Effect | None:
    """The prior of setting ``knob`` to ``value`` at ZeRO-3 (``None``: no lever, or the value a
    default config runs with): its saving is uniform between nothing (the communication hidden
    behind compute anyway) and its bound, ``share`` times the lever's reduction, less its
    cost. qgZ and hpZ save nothing within one node (DeepSpeed reduces unquantized there, and
    the secondary group is the primary one), so they only cost."""
    saving = dict(priors.lever_savings).get(knob)
    cost = dict(priors.lever_costs).get(knob, 0.0)
    if saving is None or not _sets(value):
        return None
    if nodes <= 1 and knob != "zero_quantized_weights":
        saving = 0.0
    bound = -math.log(1.0 - min(share * saving, 0.9))
    return bound / 2.0 - cost, math.sqrt(bound**2 / 12.0 + (priors.lever_cost_sd * cost) ** 2)


def _sets(value: Any) -> bool:
    """Whether a lever's value turns it on: ``True``, or a partition of more than one rank."""
    if isinstance(value, bool):
        return value
    return isinstance(value, (int, float)) and value > 1


def lever_effects(problem: Problem, observations: Sequence[Observation], priors: Priors) -> dict[tuple[str, Any], Effect]:
    """The prior of every lever value in the stage-3 arms' knob spaces: from the measured
    communication share where a ZeRO-3 run has timers, else from :func:`prior_share`."""
    share = measured_share(observations)
    share = prior_share(problem, priors) if share is None else share
    out: dict[tuple[str, Any], Effect] = {}
    for arm in problem.arms:
        if arm.stage != 3:
            continue
        listed = [(knob, value) for knob, values in arm.knobs for value in values]
        for knob, value in arm.departures(listed):
            if (effect := lever_effect(knob, value, share=share, nodes=problem.nodes, priors=priors)) is not None:
                out[(knob, value)] = effect
    return out


def expected_gain(effect: Effect) -> float:
    """``E[max(0, x)]`` for the effect ``x ~ N(mean, sd^2)``: what knowing it could raise the
    choice by, the most any launch of it can be worth (its knowledge gradient is less)."""
    mean, sd = effect
    if sd <= 0:
        return max(mean, 0.0)
    z = mean / sd
    return mean * 0.5 * math.erfc(-z / math.sqrt(2.0)) + sd * math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def lever_pays(knobs: Sequence[tuple[str, Any]], effects: Mapping[tuple[str, Any], Effect], *, min_gain: float) -> bool:
    """Whether every lever a setting sets may pay ``min_gain``: a setting with one that cannot
    is not worth its launch (the same setting without it is a candidate of its own)."""
    return all(expected_gain(effects[kv]) >= min_gain for kv in knobs if kv in effects)
