from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from optuna_ds.planner._autotp import kept_range as autotp_kept
from optuna_ds.planner._checkpointing import kept_range
from optuna_ds.planner._problem import Arm
from optuna_ds.planner._problem import Knobs
from optuna_ds.planner._problem import Observation
from optuna_ds.planner._problem import Problem
from optuna_ds.planner._problem import Status
from optuna_ds.planner._settings import Priors

_A_POINTS = 48
_C_POINTS = 61
# An arm's own offset beyond the shared one (its communication buckets), as a share of the device.
_DELTA = np.array([-0.06, -0.04, -0.02, -0.01, 0.0, 0.01, 0.02, 0.04, 0.06, 0.1, 0.15])
_DELTA_PRIOR = np.exp(-np.abs(_DELTA) / 0.02)
_KEPT_POINTS = 16  # the grid of a checkpointing setting's share of the activations kept


class FeasibilityModel:
    """The probability that a config runs out of memory, learned across all stages.

    Memory of one GPU is ``model states + offset + arm's own offset + mbs * per_sample``. The
    model states come from the analytic estimate (so ``Arm.free`` is known); ``per_sample`` and
    ``offset`` (CUDA context, allocator slack) are unknowns shared by every arm -- activations
    do not depend on the ZeRO stage -- and each arm adds a small offset of its own (its
    communication buckets). All are held as a posterior on a grid: every run and every OOM of
    every stage is a linear constraint, believed up to a small chance of a contradiction (a
    workspace that switches on at some size), and a run's peak memory, where the accelerator
    reports it, a measurement of the line itself: two runs of different sizes pin it, so the
    memory edge is known before any run has hit it. Runs with non-default knobs (other buckets)
    teach only their own config: within one arm and knob setting, memory grows with the size, so
    sizes above an OOM run out too and sizes below a run fit. An activation-checkpointing or
    AutoTP setting keeps a share of ``per_sample`` (:meth:`kept`): a grid over its prior range
    (:func:`~optuna_ds.planner._checkpointing.kept_range` times
    :func:`~optuna_ds.planner._autotp.kept_range`) weighed by the setting's own runs; AutoTP's
    smaller model states are its arm's (:meth:`~optuna_ds.planner._problem.Arm.sharded`).
    """

    def __init__(self, problem: Problem, observations: Sequence[Observation], *, priors: Priors = Priors()) -> None:
        self._problem = problem
        self._observations = observations
        self._priors = priors
        self._kept_cache: dict[Knobs, tuple[np.ndarray, np.ndarray]] = {}
        d = problem.device_memory
        widest = max((free for a in problem.arms for free in (a.free, *(f for _, f, _ in a.autotp))), default=d)
        wide = np.exp(np.linspace(np.log(max(widest, 1.0) / 16384), np.log(max(widest, 1.0)), _A_POINTS))
        if problem.per_sample:
            # The engine's figure is an estimate (real peaks seen from 0.6x to 2.5x of it), and
            # now and then far off: a fifth of the belief spreads over every plausible value.
            near = problem.per_sample * np.exp(np.linspace(np.log(0.6), np.log(2.5), _A_POINTS))
            self.a = np.concatenate([near, wide])
            prior_a = np.concatenate([np.full(_A_POINTS, 0.8 / _A_POINTS), np.full(_A_POINTS, 0.2 / _A_POINTS)])
        else:
            self.a, prior_a = wide, np.full(_A_POINTS, 1.0 / _A_POINTS)
        order = np.argsort(self.a)
        self.a, prior_a = self.a[order], prior_a[order]
        n_a = len(self.a)
        self.c = np.linspace(-0.03 * d, 0.5 * d, _C_POINTS)
        prior_c = np.exp(-np.maximum(self.c, 0.0) / (0.08 * d))  # small offsets are more common
        self._delta = _DELTA * d
        self._prior_delta = _DELTA_PRIOR / _DELTA_PRIOR.sum()
        self._ok: dict[tuple[Any, ...], int] = {}  # (arm, knobs) -> largest size that ran
        self._oom: dict[tuple[Any, ...], int] = {}  # (arm, knobs) -> smallest size that ran out
        self._lik: dict[tuple[int, str], np.ndarray] = {}  # arm -> (A, C, D) likelihood of its runs
        log_w = np.log(prior_a)[:, None] + np.log(prior_c / prior_c.sum())[None, :]
        for arm in problem.arms:
            lik = np.ones((n_a, _C_POINTS, len(_DELTA)))
            for o in observations:
                if o.arm != arm.key or o.status not in (Status.OK, Status.OOM):
                    continue
                key = (o.arm, o.knobs)
                if o.status is Status.OK:
                    self._ok[key] = max(self._ok.get(key, 0), o.mbs)
                else:
                    self._oom[key] = min(self._oom.get(key, 1 << 30), o.mbs)
                if o.knobs:
                    continue
                need = self._offsets(arm) + o.mbs * self.a[:, None, None]
                fits = need <= arm.free
                agrees = fits if o.status is Status.OK else ~fits
                lik *= np.where(agrees, 1.0 - priors.contradiction, priors.contradiction)
                if o.status is Status.OK and o.memory and o.memory < priors.saturated * d:
                    z = (d - arm.free + need - o.memory) / (priors.memory_sd * d)
                    lik *= np.maximum(np.exp(-0.5 * z * z), priors.contradiction)
            self._lik[arm.key] = lik
            log_w += np.log(np.maximum(lik @ self._prior_delta, 1e-300))
        w = np.exp(log_w - log_w.max())
        self._w = w / w.sum()  # (A, C)
        self._posterior_cache: dict[tuple[int, str], np.ndarray] = {}
        self._offset_cache: dict[tuple[tuple[int, str], float], float] = {}
        self._tails_cache: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}

    @functools.cached_property
    def per_sample(self) -> float:
        """The posterior mean of one sample's memory."""
        return float(self._w.sum(axis=1) @ self.a)

    def _offsets(self, arm: Arm) -> np.ndarray:
        """``(1, C, D)``: the arm's offset for each grid point: the shared one, the arm's
        expected buffers, and the arm's own deviation."""
        return self.c[None, :, None] + arm.buffers + self._delta[None, None, :]

    def _posterior(self, arm: Arm) -> np.ndarray:
        """``p(per_sample, offset, arm's offset)``, ``(A, C, D)``: computed once per arm (a
        decision asks every arm several times)."""
        cached = self._posterior_cache.get(arm.key)
        if cached is None:
            joint = self._lik[arm.key] * self._prior_delta[None, None, :]
            delta = joint / np.maximum(joint.sum(axis=2, keepdims=True), 1e-300)
            cached = self._posterior_cache[arm.key] = self._w[:, :, None] * delta
        return cached

    def p_oom(self, arm: Arm, sizes: np.ndarray, knobs: tuple[Any, ...] = ()) -> np.ndarray:
        """The probability that each size runs out of memory at ``arm`` with ``knobs``; an arm
        whose ``buffers`` differ from the problem's (a knob setting's) has its offsets moved
        by as much; a checkpointing or AutoTP setting keeps a share of each sample's activations
        (:meth:`kept`), over which the probability is averaged (``arm`` is then the arm as the
        setting sees it: AutoTP's room)."""
        sizes = np.asarray(sizes, dtype=float)
        setting = Knobs(knobs).room
        if setting:
            grid, weights = self.kept(setting)
            moved = self._moved(setting)
            p = np.asarray(sum((self._p_given(dataclasses.replace(arm, free=arm.free - moved[j]), sizes * r) * weights[i, j][None, :]).sum(axis=1)
                               for i, r in enumerate(grid) for j in range(len(moved))))
        else:
            p = self._p_line(arm, sizes)
        key = (arm.key, knobs)
        if key in self._ok:
            p = np.where(sizes <= self._ok[key], 0.0, p)
        if key in self._oom:
            p = np.where(sizes >= self._oom[key], 1.0, p)
        return np.asarray(np.clip(p, 0.0, 1.0))

    def _p_line(self, arm: Arm, sizes: np.ndarray) -> np.ndarray:
        """The probability that each size (of whole samples' activations: a fraction where a
        share is kept) runs out of memory by the linear model alone, no run of it consulted."""
        offsets, tails = self._tails(arm)
        # Size m runs out at (a, offset) where m * a + offset > free - buffers: for each a, the
        # weight of the offsets above that threshold.
        threshold = arm.free - arm.buffers - sizes[:, None] * self.a[None, :]  # (sizes, A)
        above = np.searchsorted(offsets, threshold, side="right")
        return np.asarray(tails[np.arange(len(self.a))[None, :], above].sum(axis=1))

    def _p_given(self, arm: Arm, sizes: np.ndarray) -> np.ndarray:
        """``(sizes, A)``: the probability that each size runs out of memory given each figure of
        a sample's memory (the offsets' posterior weight above its threshold, of theirs)."""
        offsets, tails = self._tails(arm)
        threshold = arm.free - arm.buffers - sizes[:, None] * self.a[None, :]
        above = np.searchsorted(offsets, threshold, side="right")
        return np.asarray(tails[np.arange(len(self.a))[None, :], above] / np.maximum(tails[:, 0], 1e-300)[None, :])

    def _moved(self, setting: Knobs) -> np.ndarray:
        """What a setting's model states may differ from the analytic estimate by: nothing for
        checkpointing (it splits no state); for AutoTP, whose arm may never have run whole to
        pin its offset, its own deviation on the arms' grid."""
        return self._delta if setting.autotp > 1 else np.zeros(1)

    def kept(self, setting: Knobs) -> tuple[np.ndarray, np.ndarray]:
        """The share of a sample's activations a checkpointing or AutoTP ``setting`` keeps: a
        grid over its prior range (log-uniform), and the joint weights ``(grid, moved, A)`` its
        runs give each share, each offset of its own (:meth:`_moved`) and each figure of a
        sample's memory (each run of any arm, or its out-of-memory, a constraint believed up to a
        contradiction, its peak memory where reported a measurement): where no run without the
        setting pinned a sample's memory or the arm's offset (its model states fit only split),
        the setting's own runs do."""
        cached = self._kept_cache.get(setting)
        if cached is not None:
            return cached
        low, high = kept_range(setting, self._priors)
        if setting.autotp > 1:
            tp_low, tp_high = autotp_kept(setting.autotp, self._priors)
            low, high = low * tp_low, high * tp_high
        grid = np.exp(np.linspace(math.log(low), math.log(high), _KEPT_POINTS)) if high > low else np.array([low])
        moved = self._moved(setting)
        prior_moved = self._prior_delta if len(moved) > 1 else np.ones(1)
        log_w = (np.log(np.maximum(self._w.sum(axis=1), 1e-300))[None, None, :] + np.log(prior_moved)[None, :, None]
                 + np.zeros((len(grid), len(moved), len(self.a))))
        d, floor = self._problem.device_memory, self._priors.contradiction
        for o in self._observations:
            arm = self._problem.arm(o.arm)
            if arm is None or o.knobs != setting or o.status not in (Status.OK, Status.OOM):
                continue
            arm = arm.sharded(setting.autotp)
            for j, shift in enumerate(moved):
                at = dataclasses.replace(arm, free=arm.free - shift)
                p = self._p_given(at, o.mbs * grid)  # (grid, A)
                log_w[:, j, :] += np.log(np.maximum(1.0 - p if o.status is Status.OK else p, floor))
                if o.status is Status.OK and o.memory and o.memory < self._priors.saturated * d:
                    need = d - at.free + self._offset(arm) + o.mbs * grid[:, None] * self.a[None, :]
                    z = (need - o.memory) / (self._priors.memory_sd * d)
                    log_w[:, j, :] += np.log(np.maximum(np.exp(-0.5 * z * z), floor))
        w = np.exp(log_w - log_w.max())
        cached = self._kept_cache[setting] = (grid, w / w.sum())
        return cached

    def kept_share(self, setting: Knobs) -> float:
        """The expected share of a sample's activations ``setting`` keeps (1 for none)."""
        if not setting:
            return 1.0
        grid, weights = self.kept(setting)
        return float(weights.sum(axis=(1, 2)) @ grid)

    def _tails(self, arm: Arm) -> tuple[np.ndarray, np.ndarray]:
        """The arm's offsets (shared plus its own, less its buffers) sorted, ``(K,)``, and for each
        per-sample figure the posterior weight of the offsets from each one up, ``(A, K + 1)``:
        computed once per arm, whatever buffers a knob setting gives it."""
        cached = self._tails_cache.get(arm.key)
        if cached is None:
            offsets = (self.c[:, None] + self._delta[None, :]).ravel()
            order = np.argsort(offsets)
            weights = self._posterior(arm).reshape(len(self.a), -1)[:, order]
            tails = np.concatenate([np.cumsum(weights[:, ::-1], axis=1)[:, ::-1], np.zeros((len(self.a), 1))], axis=1)
            cached = self._tails_cache[arm.key] = (offsets[order], tails)
        return cached

    def _offset(self, arm: Arm) -> float:
        cached = self._offset_cache.get((arm.key, arm.buffers))
        if cached is None:
            cached = self._offset_cache[(arm.key, arm.buffers)] = float(np.sum(self._posterior(arm) * self._offsets(arm)))
        return cached

    def share(self, arm: Arm, sizes: np.ndarray) -> np.ndarray:
        """The expected share of device memory in use at each size."""
        d = self._problem.device_memory
        return (d - arm.free + self._offset(arm) + np.asarray(sizes, dtype=float) * self.per_sample * arm.kept) / d

    def fill(self, arm: Arm, sizes: np.ndarray) -> np.ndarray:
        """The expected share of the arm's room (the device less the model states) in use: 1 at
        its memory edge."""
        return (self._offset(arm) + np.asarray(sizes, dtype=float) * self.per_sample * arm.kept) / max(arm.free, 1.0)
