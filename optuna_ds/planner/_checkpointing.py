"""What activation checkpointing is worth before it runs, in physical terms (issue 37).

A checkpointed step keeps only part of a sample's activations (each layer's input) and
recomputes the forward in the backward: at a size both run, it is slower by the recomputed
forward (:func:`checkpointing_effects`, from the job's own timers once a run logged them);
what it buys is room, the sizes the config without it runs out of memory at (the memory model
holds the share of a sample's activations it keeps, :func:`kept_range`). So it pays only where
activations bound the micro-batch and the throughput curve still rises beyond that edge by more
than the recompute costs (:func:`may_pay`): a job where it cannot spends no launch on it.
Whether a setting took effect is read from what its runs measured and logged
(:func:`ignored`), and a setting that failed for a reason of its own is not tried again
(:func:`broken`). Every function here is pure.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from optuna_ds.domain import CHECKPOINTING_SECTION
from optuna_ds.domain import CHECKPOINTING_SWITCH
from optuna_ds.domain import FailureReason
from optuna_ds.planner._problem import Knobs
from optuna_ds.planner._problem import Observation
from optuna_ds.planner._problem import Problem
from optuna_ds.planner._problem import Status
from optuna_ds.planner._settings import Priors

Effect = tuple[float, float]  # (mean, sd) of a log throughput effect
SWITCH_ON = (CHECKPOINTING_SWITCH, True)
# The section's settings that free memory: the checkpoints in host memory, or partitioned over
# the model-parallel ranks. contiguous_memory_optimization moves them into one buffer against
# fragmentation, which the linear memory model does not see: it only costs there.
_FREEING = frozenset({f"{CHECKPOINTING_SECTION}.cpu_checkpointing", f"{CHECKPOINTING_SECTION}.partition_activations"})


def recomputes(knobs: Iterable[tuple[str, Any]]) -> bool:
    """Whether a config with ``knobs`` turns the script's checkpointing switch on."""
    return SWITCH_ON in tuple(knobs)


def kept_range(knobs: Iterable[tuple[str, Any]], priors: Priors) -> tuple[float, float]:
    """The range of the share of a sample's activation memory a config with these
    checkpointing ``knobs`` holds against the same config without them: the switch's
    (:attr:`Priors.checkpoint_kept`) times each freeing section setting's
    (:attr:`Priors.section_kept`)."""
    low = high = 1.0
    for knob, value in knobs:
        if (knob, value) == SWITCH_ON:
            low, high = low * priors.checkpoint_kept[0], high * priors.checkpoint_kept[1]
        elif knob in _FREEING and value is True:
            low, high = low * priors.section_kept[0], high * priors.section_kept[1]
    return low, high


def _timers(o: Observation) -> tuple[float, float, float] | None:
    """``(fwd, backward compute, step)`` of a run's timers (ms): the backward less its gradient
    all-reduce, which no recompute repeats."""
    timers = dict(o.timers)
    try:
        fwd, bwd, step = (float(timers[k]) for k in ("fwd", "bwd", "step"))
        inner = float(timers.get("bwd_inner", bwd - float(timers.get("bwd_allreduce", 0.0) or 0.0)))
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(v) and v >= 0 for v in (fwd, inner, step)) or fwd <= 0 or fwd + bwd + step <= 0:
        return None
    return fwd, inner, fwd + bwd + step


def recompute_share(observations: Sequence[Observation]) -> float | None:
    """The share of a step a recomputed forward adds, from the runs without checkpointing that
    logged DeepSpeed's timers (the median of ``fwd / (fwd + bwd + step)``); ``None`` without."""
    shares = [t[0] / t[2] for o in observations
              if o.status is Status.OK and not o.knobs.checkpointing and (t := _timers(o)) is not None]
    return statistics.median(shares) if shares else None


def checkpointing_effects(problem: Problem, observations: Sequence[Observation], priors: Priors) -> dict[tuple[str, Any], Effect]:
    """The prior of each checkpointing value of the problem's settings on log throughput at a
    size both run: the switch costs the recomputed forward (the job's measured share, else
    :attr:`Priors.recompute`), a section setting :attr:`Priors.section_cost`."""
    share = recompute_share(observations)
    switch = (-math.log1p(share), priors.recompute_sd_measured) if share is not None else (-math.log1p(priors.recompute), priors.recompute_sd)
    out: dict[tuple[str, Any], Effect] = {}
    for setting in problem.checkpointing:
        for kv in setting:
            out[kv] = switch if kv == SWITCH_ON else (-priors.section_cost, priors.section_cost_sd)
    return out


def cost(setting: Iterable[tuple[str, Any]], effects: Mapping[tuple[str, Any], Effect]) -> float:
    """What a setting costs at a size both run, in log throughput (its effects' means, negated)."""
    return -sum(effects[kv][0] for kv in setting if kv in effects)


def backward_ratio(o: Observation) -> float | None:
    """A run's backward compute over its forward, from DeepSpeed's timers: about 2 without
    checkpointing (the gradients of the activations and of the weights), about 3 with it."""
    t = _timers(o)
    return t[1] / t[0] if t is not None else None


def ignored(observations: Sequence[Observation], priors: Priors) -> dict[tuple[str, Any], str]:
    """The checkpointing values this job's runs show the script ignored, each with what shows it.

    The switch: its runs' backward, against the runs of the same arm without it, grew by
    credibly less than :attr:`Priors.recompute_growth` of a forward (the recompute never ran);
    judged on every arm where both have timers, ignored where all agree; or one of its runs ran
    out of memory at a size whose activations, at the most checkpointing keeps, are fewer than
    those of a size that ran without it. A section setting: a run that set it, whose ranks log
    at INFO, logged no configuration of DeepSpeed's checkpointing (the script never calls
    ``deepspeed.checkpointing.configure``), or logged another value (it configures it without
    the config)."""
    ok = [o for o in observations if o.status is Status.OK]
    plain: dict[tuple[int, str], list[float]] = {}
    switched: dict[tuple[int, str], list[float]] = {}
    for o in ok:
        ratio = backward_ratio(o)
        if ratio is None or o.knobs.zero:
            continue
        if not o.knobs.checkpointing:
            plain.setdefault(o.arm, []).append(ratio)
        elif recomputes(o.knobs):
            switched.setdefault(o.arm, []).append(ratio)
    verdicts = []
    for arm, ratios in switched.items():
        if arm not in plain:
            continue
        base, mine = statistics.median(plain[arm]), statistics.median(ratios)
        spread = statistics.stdev(plain[arm]) if len(plain[arm]) > 1 else 0.0
        verdicts.append((mine - base + 2.0 * spread < priors.recompute_growth, base, mine))
    out: dict[tuple[str, Any], str] = {}
    if verdicts and all(v for v, _, _ in verdicts):
        _, base, mine = verdicts[0]
        out[SWITCH_ON] = (f"its runs' backward did not grow by the forward checkpointing recomputes (DeepSpeed's bwd/fwd "
                          f"{base:.2f} without it, {mine:.2f} with it): the script never checkpoints")
    # Or its run ran out of memory at a size whose activations, at the most checkpointing keeps,
    # are fewer than those of a size that ran without it: it freed nothing.
    largest: dict[tuple[int, str], int] = {}
    for o in ok:
        if not o.knobs:
            largest[o.arm] = max(largest.get(o.arm, 0), o.mbs)
    for o in observations:
        most = kept_range(o.knobs.checkpointing, priors)[1]
        if (o.status is Status.OOM and recomputes(o.knobs) and SWITCH_ON not in out and not o.knobs.zero
                and o.mbs * most <= largest.get(o.arm, 0)):
            out[SWITCH_ON] = (f"{o.config.name} ran out of memory where {largest[o.arm]} samples ran without it, though "
                              f"checkpointing keeps at most {most:.0%} of a sample's activations: the script never checkpoints")
    for o in ok:
        if o.checkpointing is None:
            continue  # its ranks logged no INFO line: the output cannot tell
        logged = dict(o.checkpointing)
        for knob, value in o.knobs.checkpointing:
            if not knob.startswith(CHECKPOINTING_SECTION + ".") or (knob, value) in out:
                continue
            key = knob.split(".", 1)[1]
            if not logged:
                out[(knob, value)] = ("its run logged no configuration of DeepSpeed's checkpointing: the script never calls "
                                      "deepspeed.checkpointing.configure")
            elif key in logged and logged[key] != value:
                out[(knob, value)] = (f"DeepSpeed's checkpointing logged {key} {logged[key]} where the config set {value}: the "
                                      "script configures it without the config")
    return out


def broken(observations: Sequence[Observation]) -> set[Knobs]:
    """The checkpointing settings that failed for a reason of their own (the model or
    DeepSpeed's checkpointing refusing them, the script refusing the switch), and every value
    such a failure is blamed on: those of its setting no run that ran cleared."""
    cleared = {kv for o in observations if o.status is Status.OK for kv in o.knobs.checkpointing}
    out: set[Knobs] = set()
    for o in observations:
        if o.status is Status.FAILED and o.reason == FailureReason.CHECKPOINTING.value and o.knobs.checkpointing:
            out.add(o.knobs.checkpointing)
            out.update(Knobs([kv]) for kv in o.knobs.checkpointing if kv not in cleared)
    return out


def usable(problem: Problem, observations: Sequence[Observation], priors: Priors) -> tuple[Knobs, ...]:
    """The problem's checkpointing settings still worth a launch: none the script ignored, none
    that failed for a reason of its own."""
    away = ignored(observations, priors)
    gone = broken(observations)
    return tuple(s for s in problem.checkpointing
                 if s not in gone and not any(Knobs([kv]) in gone or kv in away for kv in s))


def rise(means: Mapping[int, float], noise: float) -> tuple[int, float] | None:
    """The steepest the throughput curve can climb beyond its best measured size, in log
    throughput per log size: ``(that size, slope)``. The curve amortises a per-step cost over
    the batch (``m / (m + h)``: concave in log size), so its chord from a smaller measured size
    up to the best bounds its slope beyond; the noise of the two means widens it. ``None`` below
    two sizes: nothing bounds it."""
    if len(means) < 2:
        return None
    top = max(means, key=lambda m: means[m])
    below = [m for m in means if m < top]
    if not below:
        return top, 0.0
    low = max([m for m in below if m <= top / 1.5] or [min(below)])
    span = math.log(top / low)
    slope = (math.log(means[top]) - math.log(means[low]) + 2.0 * math.sqrt(2.0) * noise) / span
    return top, max(slope, 0.0)


def may_pay(climb: tuple[int, float] | None, *, reach: float, price: float, min_gain: float) -> bool:
    """Whether a setting that fits up to size ``reach`` where the config without it runs out
    of memory may pay ``min_gain`` against its cost ``price`` (log throughput at a size both
    run): the curve's rise from its best measured size to ``reach`` (:func:`rise`) must exceed
    the cost. Where nothing bounds the rise (under two sizes ran), the model decides."""
    if climb is None:
        return True
    top, slope = climb
    return reach > top and slope * math.log(reach / top) - price >= min_gain
