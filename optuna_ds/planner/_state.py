"""The observations arranged for one decision, and what they say about each arm: the sizes
worth trying, the chance of each to run out of memory or to crash, the knob settings worth
scoring. The planner's policy (:mod:`optuna_ds.planner._planner`) and the width of a batch
(:mod:`optuna_ds.planner._batch`) both read it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from optuna_ds.domain import Config
from optuna_ds.domain import KnobsLike
from optuna_ds.planner._autotp import autotp_effects
from optuna_ds.planner._autotp import usable as autotp_usable
from optuna_ds.planner._checkpointing import checkpointing_effects
from optuna_ds.planner._checkpointing import cost
from optuna_ds.planner._checkpointing import may_pay
from optuna_ds.planner._checkpointing import rise
from optuna_ds.planner._checkpointing import usable
from optuna_ds.planner._levers import lever_effects
from optuna_ds.planner._levers import lever_pays
from optuna_ds.planner._memory import FeasibilityModel
from optuna_ds.planner._problem import Arm
from optuna_ds.planner._problem import Knobs
from optuna_ds.planner._problem import KnobSetting
from optuna_ds.planner._problem import Observation
from optuna_ds.planner._problem import Problem
from optuna_ds.planner._problem import Status
from optuna_ds.planner._settings import PlannerSettings
from optuna_ds.planner._settings import Priors
from optuna_ds.planner._surrogate import ThroughputModel


def _known(problem: Problem, key: tuple[int, str]) -> Arm:
    """The problem's arm of ``key``: every observation and ranked config is of one of its arms."""
    arm = problem.arm(key)
    assert arm is not None, key
    return arm


def _candidate_sizes(problem: Problem, arm: Arm, growth: float) -> list[int]:
    if problem.sizes:
        return sorted({m for m in problem.sizes if problem.floor <= m <= arm.cap} or {min(problem.sizes)})
    low, cap = max(1, problem.floor), max(1, arm.cap)
    sizes = set(range(low, min(cap, 64) + 1))
    m = 64.0
    while m < cap:
        m *= growth
        sizes.add(min(cap, int(round(m))))
    sizes.add(cap)
    return sorted(s for s in sizes if s >= low) or [cap]


def _p_crash(arm: Arm, sizes: np.ndarray, finished: Sequence[Observation], priors: Priors) -> np.ndarray:
    """The probability that each size fails for a reason other than memory. A stage's failures
    are explained three ways: the stage is broken at every size (while nothing of it ran), the
    sizes from some threshold up fail (an index or a buffer that grows with the batch), or a size
    fails on its own; each weighed by how well it explains the stage's runs. A threshold lies
    between the largest size that ran and the smallest that failed above it, so the sizes
    between are bisected, not walked one by one, and the sizes above it are not tried again.
    A threshold may be the job's rather than the stage's (an int32 index over the logits fails
    at every stage): failures of other stages above every size that ran anywhere count too."""
    # Offload changes memory, not what crashes: every variant of a stage shares its failures.
    plain = [o for o in finished if not o.knobs and o.status in (Status.OK, Status.FAILED)]
    failed = [o.mbs for o in plain if o.stage == arm.stage and o.status is Status.FAILED]
    ran = [o.mbs for o in plain if o.stage == arm.stage and o.status is Status.OK]
    sizes = np.asarray(sizes, dtype=float)
    top = max((o.mbs for o in plain if o.status is Status.OK), default=0)
    elsewhere = {o.stage: o.mbs for o in sorted(plain, key=lambda o: -o.mbs)
                 if o.stage != arm.stage and o.status is Status.FAILED and o.mbs > top}
    shared = ((1.0 - priors.shared_threshold ** len(elsewhere)) * _below(sizes, top, min(elsewhere.values()))
              if elsewhere else np.zeros(len(sizes)))
    if not failed:
        return shared
    low = max(ran, default=0)
    above = [m for m in failed if m > low]
    weights = {
        "broken": 0.0 if ran else priors.broken,
        "threshold": (1.0 - priors.broken) / 2 if len(above) == len(failed) else 0.0,
        "alone": (1.0 - priors.broken) / 2 * priors.size_fails ** len(failed) * (1.0 - priors.size_fails) ** len(ran),
    }
    total = sum(weights.values())
    threshold = _below(sizes, low, min(above)) if above else np.zeros(len(sizes))
    own = (weights["broken"] + weights["threshold"] * threshold + weights["alone"] * priors.size_fails) / total
    return np.asarray(1.0 - (1.0 - own) * (1.0 - shared))


def _below(sizes: np.ndarray, ran: float, failed: float) -> np.ndarray:
    """The probability that a threshold somewhere above the size that ran, up to the one that
    failed (uniform in log size), lies at or below each size."""
    low = max(ran, 0.5)
    return np.asarray(np.clip(np.log(np.maximum(sizes, low) / low) / math.log(max(failed, low * 1.0001) / low), 0.0, 1.0))


def _median(values: list[float], default: float) -> float:
    return statistics.median(values) if values else default


class State:
    """The observations arranged for one decision."""

    def __init__(self, problem: Problem, observations: Sequence[Observation], settings: PlannerSettings,
                 knob_candidates: Mapping[tuple[int, str], Sequence[KnobSetting]] | None = None) -> None:
        self.problem = problem
        self.settings = settings
        self.knob_candidates = knob_candidates or {}
        self._buffers = {(key, c.knobs): c.buffers for key, cs in self.knob_candidates.items() for c in cs
                         if c.buffers is not None}
        self.finished = [o for o in observations if o.status is not Status.RUNNING and problem.arm(o.arm)]
        self.running = [o for o in observations if o.status is Status.RUNNING and problem.arm(o.arm)]
        self.memory = FeasibilityModel(problem, self.finished, priors=settings.priors)
        self.ok = [o for o in self.finished if o.status is Status.OK and o.score and o.score > 0]
        self.tried = {o.config for o in self.finished} | {o.config for o in self.running}
        ok_seconds = [o.seconds for o in self.ok if o.seconds]
        self.seconds_ok = _median(ok_seconds, 1.0)
        fail_seconds = [o.seconds for o in self.finished if o.status is not Status.OK and o.seconds]
        self.seconds_failed = _median(fail_seconds, 0.6 * self.seconds_ok)
        self._room_rows: dict[float, tuple[list[tuple[Arm, int, Knobs]], np.ndarray]] = {}

    def arm(self, key: tuple[int, str], knobs: KnobsLike = ()) -> Arm:
        """The arm of ``key`` as the models see a config of it with ``knobs``: a setting whose
        buffers are known moves the arm's memory by as much."""
        arm = _known(self.problem, key)
        buffers = self._buffers.get((key, Knobs(knobs))) if knobs else None
        if buffers is not None:
            arm = dataclasses.replace(arm, buffers=buffers)
        # A checkpointing or AutoTP setting keeps a share of each sample's activations; AutoTP's
        # model states are smaller.
        setting = Knobs(knobs).room
        return dataclasses.replace(arm.sharded(setting.autotp), kept=self.memory.kept_share(setting)) if setting else arm

    @functools.cached_property
    def levers(self) -> dict[tuple[str, Any], tuple[float, float]]:
        """The prior of each lever value in the stage-3 knob spaces (:mod:`optuna_ds.planner._levers`),
        of each checkpointing value (:mod:`optuna_ds.planner._checkpointing`) and of each AutoTP
        size (:mod:`optuna_ds.planner._autotp`)."""
        return {**lever_effects(self.problem, self.finished, self.settings.priors),
                **checkpointing_effects(self.problem, self.finished, self.settings.priors),
                **autotp_effects(self.problem, self.settings.priors)}

    def sizes(self, arm: Arm) -> list[int]:
        return _candidate_sizes(self.problem, arm, self.settings.growth)

    def points(self) -> list[tuple[Arm, int, Knobs, float]]:
        return [(self.arm(o.arm, o.knobs), o.mbs, o.knobs, float(o.score)) for o in self.ok if o.score is not None]

    @property
    def candidates(self) -> tuple[list[tuple[Arm, int, Knobs]], np.ndarray]:
        """Untried default-knob configs of every arm, with their probability to run: the same for
        every proposal of a batch."""
        rows, p_run, _ = self._candidates
        return rows, p_run

    @functools.cached_property
    def candidate_configs(self) -> list[Config]:
        """The config of each of :attr:`candidates`: what a batch's proposals are told apart by."""
        return [self.problem.config(a, m, k) for a, m, k in self._candidates[0]]

    @property
    def candidate_fits(self) -> np.ndarray:
        """The probability of each of :attr:`candidates` to fit in memory."""
        return self._candidates[2]

    @functools.cached_property
    def _candidates(self) -> tuple[list[tuple[Arm, int, Knobs]], np.ndarray, np.ndarray]:
        rows: list[tuple[Arm, int, Knobs]] = []
        p_run: list[np.ndarray] = []
        p_fit: list[np.ndarray] = []
        for arm in self.problem.arms:
            sizes = np.array([m for m in self.sizes(arm) if self.problem.config(arm, int(m)) not in self.tried])
            if not len(sizes):
                continue
            fits = 1.0 - self.memory.p_oom(arm, sizes)
            p = fits * (1.0 - _p_crash(arm, sizes, self.finished, self.settings.priors))
            # Sizes the user listed are each tried, as DeepSpeed does, unless they cannot fit:
            # a failure at one is no verdict on another (a table of sizes crashed at 2 and 4 and
            # ran at 6).
            keep = (fits if self.problem.sizes else p) > 1.0 - self.settings.hopeless_oom
            # The model is not the machine: an arm whose states fit is tried once; and while
            # nothing has run anywhere, each arm's smallest size is tried before the search gives up
            # (the profile's activation figure can be off by more than its belief allows). An arm
            # whose states fit only with AutoTP runs only with it.
            if not keep.any() and arm.free > 0 and (not any(o.arm == arm.key for o in self.finished)
                                                    or (not self.ok and sizes[0] == self.sizes(arm)[0])):
                keep[0] = True
            rows += [(arm, int(m), Knobs()) for m in sizes[keep]]
            p_run.append(p[keep])
            p_fit.append(fits[keep])
        return rows, (np.concatenate(p_run) if p_run else np.zeros(0)), (np.concatenate(p_fit) if p_fit else np.zeros(0))


    def knob_rows(self, model: ThroughputModel) -> tuple[list[tuple[Arm, int, Knobs]], np.ndarray]:
        """Untried knob settings of the candidates with their probability to run, each at its
        arm's best measured sizes (by the model, at the default knobs) and, for a setting that
        frees memory, at the largest size it is likely to fit where the default knobs likely do
        not: once an arm has run, its settings compete with every other experiment by expected
        gain per second."""
        rows: list[tuple[Arm, int, Knobs]] = []
        p_run: list[float] = []
        for key, candidates in self.knob_candidates.items():
            default = self.problem.arm(key)
            measured = sorted({o.mbs for o in self.ok if o.arm == key and not o.knobs})
            if default is None or not measured or not candidates:
                continue
            means = model.mean([(default, m, Knobs()) for m in measured])
            best = [measured[i] for i in np.argsort(-means)[: max(1, self.problem.knob_sizes)]]
            # Where the default knobs ran out of memory, sizes they likely run out at: room a
            # leaner setting may make.
            ran_out = any(o.arm == key and not o.knobs and o.status is Status.OOM for o in self.finished)
            larger = np.array([m for m in self.sizes(default) if m > max(measured)] if ran_out else [], dtype=float)
            larger = larger[self.memory.p_oom(default, larger) >= 0.5] if len(larger) else larger
            for candidate in candidates:
                if not lever_pays(candidate.knobs, self.levers, min_gain=self.settings.min_gain):
                    continue  # a lever that cannot pay here: no launch, whatever the model learns
                arm = self.arm(key, candidate.knobs)
                sizes = list(best)
                if arm.buffers < default.buffers and len(larger):
                    fit = larger[self.memory.p_oom(arm, larger, candidate.knobs) < 0.5]
                    if len(fit):
                        sizes.append(int(fit[-1]))
                p_knobs = 1.0 - _p_knob_crash(arm, candidate.knobs, self.finished, self.settings.priors)
                p_size = 1.0 - self.memory.p_oom(arm, np.array(sizes, dtype=float), candidate.knobs)
                for m, p in zip(sizes, p_size):
                    if self.problem.config(key, int(m), candidate.knobs) not in self.tried:
                        rows.append((arm, m, candidate.knobs))
                        p_run.append(float(p) * p_knobs)
        return rows, np.array(p_run)

    def room_rows(self, noise: float) -> tuple[list[tuple[Arm, int, Knobs]], np.ndarray]:
        """Untried settings that buy room (activation checkpointing, AutoTP) with their chance to
        run: at each arm explored, at the sizes its config without them likely runs out of
        memory at or is not allowed (what they buy is room, and they cost a forward, or
        AutoTP's all-reduces, at a size both run), where the setting may fit; none where it
        cannot pay (:func:`~optuna_ds.planner._checkpointing.may_pay`: the curve's rise beyond
        its best measured size, ``noise`` widening it, against the setting's cost), none of a
        setting the script ignored or that failed for a reason of its own, and AutoTP only at the
        arms that run it. The same for every slot of a decision."""
        cached = self._room_rows.get(noise)
        if cached is not None:
            return cached
        rows: list[tuple[Arm, int, Knobs]] = []
        p_run: list[np.ndarray] = []
        settings = (*usable(self.problem, self.finished, self.settings.priors), *autotp_usable(self.problem, self.finished))
        priors = self.settings.priors
        for arm in self.problem.arms if settings else ():
            runs: dict[int, list[float]] = {}
            for o in self.ok:
                if o.arm == arm.key and not o.knobs:
                    runs.setdefault(o.mbs, []).append(float(o.score))  # type: ignore[arg-type]
            climb = rise({m: statistics.fmean(v) for m, v in runs.items()}, noise)
            for setting in settings:
                if setting.autotp > 1 and setting.autotp not in arm.autotp_sizes:
                    continue
                at = self.arm(arm.key, setting)
                sizes = np.array(self.sizes(at), dtype=float)
                room = sizes[((self.memory.p_oom(arm, sizes) >= 0.5) | (sizes > arm.cap)) & (sizes > max(runs, default=0))]
                if not len(room):
                    continue  # activations and model states do not bound the micro-batch here
                fits = 1.0 - self.memory.p_oom(at, room, setting)
                reach = float(room[fits >= 0.5].max()) if (fits >= 0.5).any() else 0.0
                if not may_pay(climb, reach=reach, price=cost(setting, self.levers), min_gain=self.settings.min_gain):
                    continue
                crash = _p_crash(arm, room, self.finished, priors)
                p = fits * (1.0 - crash) * (1.0 - _p_knob_crash(at, setting, self.finished, priors))
                keep = np.array([q > 1.0 - self.settings.hopeless_oom and self.problem.config(arm, int(m), setting) not in self.tried
                                 for m, q in zip(room, p)], dtype=bool)
                rows += [(at, int(m), setting) for m in room[keep]]
                p_run.append(p[keep])
        cached = self._room_rows[noise] = (rows, np.concatenate(p_run) if p_run else np.zeros(0))
        return cached


def _departures(arm: Arm, knobs: Knobs) -> set[tuple[str, Any]]:
    return set(arm.departures(knobs))


def _p_knob_crash(arm: Arm, knobs: Knobs, finished: Sequence[Observation], priors: Priors) -> float:
    """The probability that a knob setting fails for a reason other than memory: a value it sets
    is taken to cause a stage's failures while no run of the stage that set it ran, each failure
    blamed on its unexplained values in equal shares."""
    mine = _departures(arm, knobs)
    if not mine:
        return 0.0
    at_stage = [o for o in finished if o.stage == arm.stage and o.knobs]
    cleared = set().union(*(_departures(arm, o.knobs) for o in at_stage if o.status is Status.OK))
    clear = {v: 1.0 - priors.knob_cause for v in sorted(mine - cleared, key=repr)}
    for o in at_stage:
        if o.status is Status.FAILED:
            suspects = _departures(arm, o.knobs) - cleared
            for v in suspects & clear.keys():
                clear[v] *= 1.0 - 1.0 / len(suspects)
    return 1.0 - math.prod(clear[v] for v in sorted(clear, key=repr))
