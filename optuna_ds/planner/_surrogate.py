"""The planner's Bayesian surrogate of log throughput over (arm, micro-batch size, knobs)."""

from __future__ import annotations

import copy
import functools
import math
from typing import Any
from collections.abc import Mapping
from collections.abc import Sequence

import numpy as np

from optuna_ds.domain import Offload
from optuna_ds.planner._autotp import EXCHANGE
from optuna_ds.planner._autotp import autotp_shares
from optuna_ds.planner._memory import FeasibilityModel
from optuna_ds.planner._problem import Arm
from optuna_ds.planner._problem import Knobs
from optuna_ds.planner._problem import Problem
from optuna_ds.planner._settings import Priors
from optuna_ds.planner._gaussian import NODE_WEIGHTS
from optuna_ds.planner._gaussian import NODES
from optuna_ds.planner._gaussian import gain
from optuna_ds.planner._gaussian import heaviest
from optuna_ds.planner._gaussian import logsumexp
from optuna_ds.planner._gaussian import norm_cdf
from optuna_ds.planner._noise import measured_noise
from optuna_ds.planner._shape import grid_of
from optuna_ds.planner._shape import shape

# The knob effects' scale (sd of log throughput, a share of the step: docs/planner.md, The
# surrogate's priors), learned from the runs on this grid, and its prior.
_KNOB_SDS = np.array([0.005, 0.02, 0.05])
_KNOB_SD_PRIOR = {False: np.array([0.5, 0.35, 0.15]), True: np.array([0.25, 0.45, 0.3])}  # by: more than one GPU
# The residual's amplitude (what the saturating shape misses, ``Priors.residual_*``), learned
# from the runs, from 0.5% (the shape holds) to 10% (it barely does): misfit goes into the model,
# never into the noise.
_AMPLITUDE = np.array([0.005, 0.015, 0.04, 0.1])
_AMPLITUDE_PRIOR = np.array([0.3, 0.35, 0.25, 0.1])
_OFFLOADS = tuple(o for o in Offload if o)


def _arm_code(arm: Arm) -> int:
    return arm.stage * 4 + (1 + _OFFLOADS.index(arm.offload) if arm.offload in _OFFLOADS else 0)


def _kernel(log_a: np.ndarray, arms_a: np.ndarray, log_b: np.ndarray, arms_b: np.ndarray, priors: Priors) -> np.ndarray:
    """The residual's correlation between two sets of (log size, arm) points (unit amplitude)."""
    same = arms_a[:, None] == arms_b[None, :]
    shared, length = priors.residual_shared, priors.residual_length
    return np.asarray((shared + (1.0 - shared) * same) * np.exp(-0.5 * ((log_a[:, None] - log_b[None, :]) / length) ** 2))


_STAGES = 4


def _scale_prior(base: float, priors: Priors) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of the stages' log scales (a random walk along the stages) and of
    the two offload effects."""
    means, variances = [base], [priors.first_arm_sd**2]
    for stage in range(1, _STAGES):
        mu, sd = priors.stage_steps[stage - 1]
        means.append(means[-1] + mu)
        variances.append(variances[-1] + sd**2)
    n = _STAGES + len(_OFFLOADS)
    cov = np.zeros((n, n))
    for i in range(_STAGES):
        for j in range(_STAGES):
            cov[i, j] = variances[min(i, j)]
    for k in range(len(_OFFLOADS)):
        cov[_STAGES + k, _STAGES + k] = priors.offload_step[1] ** 2
    return np.array(means + [priors.offload_step[0], 0.5 * priors.offload_step[0]]), cov


def _knob_features(problem: Problem, points: Sequence[tuple[Arm, int, Knobs, float]], shares: Mapping[tuple[str, Any], float]
                   ) -> tuple[list[tuple[str, Any]], list[tuple[int, str, Any]]]:
    """The knob values that differ from what a default config runs with, in the arms' knob
    spaces and in the runs: each value's effect shared by the stages (``(knob, value)``), and
    each stage's own deviation (``(stage, knob, value)``); a value of ``shares`` (an AutoTP size)
    is a multiple of one effect, :data:`~optuna_ds.planner._autotp.EXCHANGE`. Ordered by
    ``repr``: one knob's values may mix types (``5e8``, ``"auto"``)."""
    shared: set[tuple[str, Any]] = set()
    own: set[tuple[int, str, Any]] = set()

    settings = [(arm, tuple((knob, value) for value in values)) for arm in problem.arms for knob, values in arm.knobs]
    settings += [(arm, setting) for arm in problem.arms for setting in problem.checkpointing]
    settings += [(arm, setting) for arm in problem.arms for setting in problem.autotp if setting.autotp in arm.autotp_sizes]
    for arm, knobs in settings + [(arm, knobs) for arm, _, knobs, _ in points]:
        for knob, value in arm.departures(knobs):
            feature = EXCHANGE if (knob, value) in shares else (knob, value)
            shared.add(feature)
            own.add((arm.stage, *feature))
    return sorted(shared, key=repr), sorted(own, key=repr)


def _runs(points: Sequence[tuple[Arm, int, Knobs, float]]) -> dict[tuple[Any, ...], list[float]]:
    """The points' values by config, in the order each config first appears."""
    runs: dict[tuple[Any, ...], list[float]] = {}
    for arm, m, knobs, value in points:
        runs.setdefault((arm.key, m, knobs), []).append(value)
    return runs


class ThroughputModel:
    """A Bayesian surrogate of log throughput over (arm, micro-batch size, knobs).

    ``log y = scale[arm] + knob effects + shape(m, memory share) + residual(arm, log m) + noise``:
    Gaussian in the scales, knob effects and the residual given the shape's parameters and the
    residual's amplitude, which are a grid whose posterior weights are the marginal
    likelihoods. The shape is physics (a fixed cost per step amortised over the micro-batch, a
    loss as memory fills); the residual is a Gaussian process over log size that bends the
    curve wherever the runs say so. The noise is not a free parameter of the fit: it is
    measured from repeated configs (:func:`measured_noise`), so a curve the shape cannot follow
    raises the residual's amplitude, not the noise, and the model never explains a measurement
    away as noise it has not seen.
    """

    def __init__(self, problem: Problem, memory: FeasibilityModel,
                 points: Sequence[tuple[Arm, int, Knobs, float]], *, priors: Priors = Priors(),
                 levers: Mapping[tuple[str, Any], tuple[float, float]] | None = None) -> None:
        self._memory = memory
        self._priors = priors
        self._grid = grid_of(priors)
        self._shares = autotp_shares(problem, priors)
        self._shared, self._own = _knob_features(problem, points, self._shares)
        self._feature_index = {f: i for i, f in enumerate(self._shared)}
        self._own_index = {f: i for i, f in enumerate(self._own)}
        self.n = len(points)
        self.noise, self.noise_dof = measured_noise(_runs(points).values(), priors=priors)
        y = np.log(np.array([p[3] for p in points], dtype=float)) if points else np.zeros(0)
        base = float(y.mean()) if len(y) else 0.0
        mu_scales, cov_scales = _scale_prior(base, priors)
        n0, k_shared, k_own = len(mu_scales), len(self._shared), len(self._own)
        self._n0 = n0
        # A lever's effect has a prior of its own, in physical terms (``levers``,
        # :func:`~optuna_ds.planner._levers.lever_effects`): its mean and sd, whatever the scale of
        # the bucket knobs' effects; it acts at one stage, so it has no stage's own deviation.
        levers = levers or {}
        lever = np.array([f in levers for f in self._shared], dtype=bool)
        lever_own = np.array([(k, v) in levers for _, k, v in self._own], dtype=bool)
        lever_mean = np.array([levers[f][0] if f in levers else 0.0 for f in self._shared])
        lever_sd = np.array([levers[f][1] if f in levers else 0.0 for f in self._shared])
        self._mu0 = np.concatenate([mu_scales, lever_mean, np.zeros(k_own)])
        # One prior covariance per scale of the knob effects (one, where no knob is tuned).
        knob_sds, knob_prior = ((_KNOB_SDS, _KNOB_SD_PRIOR[problem.gpus > 1]) if k_shared and not lever.all()
                                else (np.zeros(1), np.ones(1)))
        self._knob_covariances = []
        for sd, prior in zip(knob_sds, knob_prior / knob_prior.sum()):
            s0 = np.zeros((n0 + k_shared + k_own, n0 + k_shared + k_own))
            s0[:n0, :n0] = cov_scales
            s0[n0:n0 + k_shared, n0:n0 + k_shared] = np.diag(np.where(lever, lever_sd, sd) ** 2)
            s0[n0 + k_shared:, n0 + k_shared:] = np.diag(np.where(lever_own, 0.0, priors.knob_own * sd) ** 2)
            self._knob_covariances.append((float(sd), float(prior), s0))
        x = self._design([(a, kn) for a, _, kn, _ in points])
        f = self._shape([(a, m) for a, m, _, _ in points])  # (G, n)
        self._x = x
        self._log_m = np.log(np.array([m for _, m, _, _ in points], dtype=float))
        self._arms = np.array([_arm_code(a) for a, _, _, _ in points], dtype=int)
        self._unit = _kernel(self._log_m, self._arms, self._log_m, self._arms, priors)
        self._r = (y[None, :] - f - (x @ self._mu0)[None, :]) if self.n else np.zeros((len(self._grid.h), 0))
        self._problem, self._levers, self._points, self._y_sum = problem, levers, list(points), float(y.sum())
        self._fit_runs()

    def conditioned(self, points: Sequence[tuple[Arm, int, Knobs, float]]) -> ThroughputModel:
        """The model of this one's runs and ``points``, as ``ThroughputModel`` fits them: a batch
        conditions on each experiment it holds before it takes the next. The features of this
        model's runs (their shapes under every component, design, residual correlation) are
        kept, as are the knob features where ``points`` set no knob value no arm or run set
        (where they do, the model is fitted from scratch); the noise is measured again, from
        the repeats among them all (a re-measurement under way, believed at the model's mean)."""
        points = list(points)
        if not points:
            return self
        every = self._points + points
        if _knob_features(self._problem, every, self._shares) != (self._shared, self._own):
            return ThroughputModel(self._problem, self._memory, every, priors=self._priors, levers=self._levers)
        model = copy.copy(self)
        model.__dict__.pop("slow", None)  # of this model's runs, not the new ones'
        y = np.log(np.array([p[3] for p in points], dtype=float))
        model._points, model._y_sum, model.n = every, self._y_sum + float(y.sum()), len(every)
        model.noise, model.noise_dof = measured_noise(_runs(every).values(), priors=self._priors)  # a repeat among them moves it
        # The stages' prior mean is the mean of the runs: every earlier residual moves with it.
        shift = model._y_sum / model.n - (self._y_sum / self.n if self.n else 0.0)
        model._mu0 = self._mu0.copy()
        model._mu0[:_STAGES] += shift
        z = self._design([(a, kn) for a, _, kn, _ in points])
        log_m = np.log(np.array([m for _, m, _, _ in points], dtype=float))
        arms = np.array([_arm_code(a) for a, _, _, _ in points], dtype=int)
        cross = _kernel(self._log_m, self._arms, log_m, arms, self._priors)
        model._unit = np.block([[self._unit, cross], [cross.T, _kernel(log_m, arms, log_m, arms, self._priors)]])
        r_new = y[None, :] - self._shape([(a, m) for a, m, _, _ in points]) - (z @ model._mu0)[None, :]
        model._r = np.concatenate([self._r - shift, r_new], axis=1)
        model._x, model._log_m, model._arms = np.concatenate([self._x, z]), np.concatenate([self._log_m, log_m]), np.concatenate([self._arms, arms])
        model._fit_runs()
        return model

    def _fit_runs(self) -> None:
        """The fit to the runs, stragglers apart."""
        self.straggler = np.zeros(self.n, dtype=bool)
        self._fit()
        if self.n > 2:
            # Leave-one-out under the heaviest component: a run far below what every other run
            # predicts for it is a straggler (runs are slowed, never sped up).
            s, g = np.unravel_index(int(np.argmax(self._w)), self._w.shape)
            _, _, alpha, kinv = self._fits[s]
            diagonal = np.diag(kinv)
            z = alpha[:, g] / np.sqrt(diagonal)
            self.straggler = z < -self._priors.straggler_z
            if self.straggler.any():
                self._fit()

    @functools.cached_property
    def slow(self) -> np.ndarray:
        """Each run's posterior probability of being a straggler rather than a plain draw, from
        what the other runs predict for it: leave-one-out over the whole mixture, each
        component reweighed as if the run had not been seen (``w / p(run | others)``), so a
        component whose curve bends to meet the run weighs no more than the others make it.
        Plain, the run lies about that prediction; a straggler (probability ``straggler_p``),
        anywhere within ``straggler_range`` below it, never above. 0 for a run taken for a
        straggler already, and where fewer than three runs are."""
        p, width = self._priors.straggler_p, self._priors.straggler_range
        out = np.zeros(self.n)
        if self.n <= 2:
            return out
        log_plain, log_slow, deficits = [], [], []
        for (_, _, alpha, kinv), log_w in zip(self._fits, self._log_w):
            diagonal = np.diag(kinv)
            sd = (1.0 / np.sqrt(diagonal))[:, None]
            d = alpha / diagonal[:, None]  # each run less its leave-one-out mean, (n, G)
            plain = -0.5 * (d / sd) ** 2 - np.log(sd) - 0.5 * math.log(2.0 * math.pi)
            slow = np.log(np.maximum(norm_cdf((d + width) / sd) - norm_cdf(d / sd), 1e-300) / width)
            # p(component | others) is proportional to w / p(run | component, others); the
            # weights before pruning, as components the run alone ruled out count without it.
            log_loo = log_w[None, :] - plain
            log_plain.append((log_loo + plain, log_loo))
            log_slow.append(log_loo + slow)
            deficits.append(d)
        loo = np.concatenate([b for _, b in log_plain], axis=1)
        norm = logsumexp(loo)
        plain_lik = logsumexp(np.concatenate([a for a, _ in log_plain], axis=1)) - norm
        slow_lik = logsumexp(np.concatenate(log_slow, axis=1)) - norm
        odds = math.log(p / (1.0 - p)) + slow_lik - plain_lik
        out = 1.0 / (1.0 + np.exp(-np.clip(odds, -50.0, 50.0)))
        # A run further below what the others predict than a straggler slows one is no straggler
        # (both explanations fail there, and the Gaussian's tail falls faster than the range's).
        deficit = np.sum(np.exp(loo - norm[:, None]) * np.concatenate(deficits, axis=1), axis=1)
        return np.where(self.straggler | (deficit < -width), 0.0, out)

    def as_straggler(self, index: int) -> ThroughputModel:
        """This model with its run ``index`` taken for a straggler: its noise widened by
        ``Priors.straggler_range``, so it neither drags its curve down nor bends it."""
        other = copy.copy(self)
        other.__dict__.pop("slow", None)
        other.straggler = self.straggler.copy()
        other.straggler[index] = True
        other._fit()
        return other

    def _fit(self) -> None:
        """The posterior of every (amplitude, knob scale, shape) component given the runs: its
        weight, and what its predictions need."""
        r = self._r
        noise = self.noise**2 + np.where(self.straggler, self._priors.straggler_range**2, 0.0)
        # Per (amplitude, knob scale): (amplitude, prior covariance, alpha (n, G), inverse of the covariance (n, n)).
        self._fits = []
        logs = []
        # Until a run sets a knob, the knob scales fit the runs alike: one solve serves them all.
        knobs_ran = bool(self._x[:, self._n0:].any())
        solved: dict[float, tuple[np.ndarray, np.ndarray, np.ndarray, float]] = {}
        for _, knob_prior, s0 in self._knob_covariances:
            structural = self._x @ s0 @ self._x.T
            for amplitude, prior in zip(_AMPLITUDE, _AMPLITUDE_PRIOR):
                if knobs_ran or amplitude not in solved:
                    kmat = structural + amplitude**2 * self._unit + np.diag(noise)
                    if self.n:
                        chol = np.linalg.cholesky(kmat)
                        kinv = np.linalg.inv(kmat)
                        alpha = kinv @ r.T  # (n, G)
                        quad = np.einsum("ng,gn->g", alpha, r)
                        logdet = 2.0 * np.log(np.diag(chol)).sum()
                    else:
                        kinv, alpha, quad, logdet = np.zeros((0, 0)), np.zeros((0, len(self._grid.h))), np.zeros(len(self._grid.h)), 0.0
                    solved[amplitude] = (kinv, alpha, quad, logdet)
                kinv, alpha, quad, logdet = solved[amplitude]
                logs.append(-0.5 * quad - 0.5 * logdet + self._grid.logp + math.log(prior * knob_prior))
                self._fits.append((float(amplitude), s0, alpha, kinv))
        log_w = np.stack(logs)  # (S, G)
        self._log_w = log_w  # unnormalised and unpruned: what a run's leave-one-out reweighs
        w = np.exp(log_w - log_w.max())
        w /= w.sum()
        w = np.where(w >= self._priors.keep, w, 0.0)
        self._w = w / w.sum()
        self._active = [np.flatnonzero(row) for row in self._w]

    # -- features -----------------------------------------------------------------------------

    def _design(self, rows: Sequence[tuple[Arm, Knobs]]) -> np.ndarray:
        x = np.zeros((len(rows), len(self._mu0)))
        shared = self._n0 + len(self._shared)
        for i, (arm, knobs) in enumerate(rows):
            x[i, arm.stage] = 1.0
            if arm.offload:
                x[i, _STAGES] = 1.0  # the optimizer is offloaded in both variants
            if arm.offload == _OFFLOADS[1]:
                x[i, _STAGES + 1] = 1.0
            for k, v in arm.departures(knobs):  # a value a default config runs with has no effect
                weight = self._shares.get((k, v), 1.0)
                feature = EXCHANGE if (k, v) in self._shares else (k, v)
                j = self._feature_index.get(feature)
                if j is not None:
                    x[i, self._n0 + j] = weight
                j = self._own_index.get((arm.stage, *feature))
                if j is not None:
                    x[i, shared + j] = weight
        return x

    def _shape(self, rows: Sequence[tuple[Arm, int]]) -> np.ndarray:
        if not rows:
            return np.zeros((len(self._grid.h), 0))
        sizes = np.array([m for _, m in rows], dtype=float)
        return shape(sizes, *self._pressure(rows, sizes), self._grid)

    def _pressure(self, rows: Sequence[tuple[Any, ...]], sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        shares, fills = np.empty(len(rows)), np.empty(len(rows))
        # By key, buffers, activations kept and room: arms compare by key alone, and a knob
        # setting's has buffers of its own, a checkpointing setting its share of the activations,
        # an AutoTP one both and the room of its smaller model states.
        groups: dict[tuple[tuple[int, str], float, float, float], list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault((r[0].key, r[0].buffers, r[0].kept, r[0].free), []).append(i)
        for idx in groups.values():
            arm = rows[idx[0]][0]
            shares[idx], fills[idx] = self._memory.share(arm, sizes[idx]), self._memory.fill(arm, sizes[idx])
        return shares, fills

    # -- predictions --------------------------------------------------------------------------

    @property
    def amplitude(self) -> float:
        """The posterior mean of the residual's amplitude: how far the curves depart from the
        shape."""
        return float(self._w.sum(axis=1) @ np.array([f[0] for f in self._fits]))

    def _cross(self, rows: Sequence[tuple[Arm, int, Knobs]]) -> tuple[np.ndarray, np.ndarray]:
        """The rows' unit residual correlation with the points ``(rows, n)`` and with the last
        row ``(rows,)``; the structural part depends on the knob scale (``z @ s0 @ x.T``)."""
        log_m = np.log(np.array([m for _, m, _ in rows], dtype=float))
        arms = np.array([_arm_code(a) for a, _, _ in rows], dtype=int)
        return (_kernel(log_m, arms, self._log_m, self._arms, self._priors),
                _kernel(log_m, arms, log_m[-1:], arms[-1:], self._priors)[:, 0])

    def _structural(self, z: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per fit, the rows' structural prior covariance with the points ``(rows, n)``, their
        prior variances ``(rows,)`` and their covariance with the last row ``(rows,)``:
        computed once per knob scale."""
        by_prior: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        out = []
        for _, s0, _, _ in self._fits:
            if id(s0) not in by_prior:
                zs = z @ s0
                by_prior[id(s0)] = (zs @ self._x.T, np.einsum("rp,rp->r", zs, z), zs @ z[-1])
            out.append(by_prior[id(s0)])
        return out

    def predict(self, rows: Sequence[tuple[Arm, int, Knobs]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The mixture of the rows' latent log throughput: the weights ``(K,)`` of its
        components with any weight, their means ``(K, rows)`` and standard deviations
        ``(K, rows)``."""
        z = self._design([(a, kn) for a, _, kn in rows])
        sizes = np.array([m for _, m, _ in rows], dtype=float)
        shares, fills = self._pressure(rows, sizes)
        unit, _ = self._cross(rows)
        weights, means, sds = [], [], []
        for (amplitude, _, alpha, kinv), (structural, prior_var, _), w, active in zip(self._fits, self._structural(z), self._w,
                                                                                      self._active):
            if not len(active):
                continue
            f = shape(sizes, shares, fills, self._grid, active)
            base = f + (z @ self._mu0)[None, :]
            var = prior_var + amplitude**2
            if self.n:
                cross = structural + amplitude**2 * unit
                base = base + (cross @ alpha[:, active]).T
                var = var - np.einsum("rn,nm,rm->r", cross, kinv, cross)
            weights.append(w[active])
            means.append(base)
            sds.append(np.broadcast_to(np.sqrt(np.maximum(var, 1e-12)), base.shape))
        return np.concatenate(weights), np.concatenate(means), np.concatenate(sds)

    def _versus(self, rows: Sequence[tuple[Arm, int, Knobs]], chosen: tuple[Arm, int, Knobs]) -> tuple[np.ndarray, ...]:
        """The joint posterior of each row with ``chosen``, per mixture component: weights
        ``(K,)``, the means of ``log y_row`` and of ``log y_chosen`` ``(K, rows)``, the variances
        of the row, of ``chosen`` and their covariance ``(K, rows)``, and the noise ``(K,)``."""
        every = list(rows) + [chosen]
        z = self._design([(a, kn) for a, _, kn in every])
        unit, last = self._cross(every)
        w, means, _ = self.predict(every)
        var_r: list[np.ndarray] = []
        var_c: list[np.ndarray] = []
        cov: list[np.ndarray] = []
        for (amplitude, _, _, kinv), (structural, prior_var, with_last), active in zip(self._fits, self._structural(z),
                                                                                       self._active):
            if not len(active):
                continue
            var, covariance = prior_var + amplitude**2, with_last[:-1] + amplitude**2 * last[:-1]
            if self.n:
                cross = structural + amplitude**2 * unit
                explained = cross @ kinv  # (rows + 1, n)
                var = var - np.einsum("rn,rn->r", explained, cross)
                covariance = covariance - explained[:-1] @ cross[-1]
            # Rounding leaves a variance at a measured point a little below zero: clamped as
            # predict() clamps it, lest a value be NaN.
            var = np.maximum(var, 1e-12)
            for out, value in ((var_r, var[:-1]), (var_c, np.full(len(rows), var[-1])), (cov, covariance)):
                out.append(np.broadcast_to(value, (len(active), len(rows))))
        mean_c = np.broadcast_to(means[:, -1:], means[:, :-1].shape)
        return (w, means[:, :-1], mean_c, np.concatenate(var_r), np.concatenate(var_c), np.concatenate(cov),
                np.full(len(w), self.noise))

    def expected_loss(self, rows: Sequence[tuple[Arm, int, Knobs]], chosen: tuple[Arm, int, Knobs]) -> np.ndarray:
        """``E[max(0, log y_row - log y_chosen)]`` for each row: what choosing ``chosen`` over
        the row is expected to lose, from their joint posterior (sizes of one arm share its
        scale, so their difference is surer than either)."""
        w, mean_r, mean_c, var_r, var_c, cov, _ = self._versus(rows, chosen)
        return np.asarray(w @ gain(mean_r - mean_c, np.sqrt(np.maximum(var_r + var_c - 2.0 * cov, 1e-12))))

    def remeasure_value(self, rows: Sequence[tuple[Arm, int, Knobs]], chosen: tuple[Arm, int, Knobs]) -> tuple[np.ndarray, np.ndarray]:
        """What one more measurement of each row, or of ``chosen``, is expected to gain by the
        choice between the two made after it (a knowledge gradient): ``E_y[max(0, E[d | y])] -
        max(0, E[d])`` for the difference ``d = log y_row - log y_chosen``. The measurement ``y``
        moves each component's estimate of ``d`` and reweighs the components, so a config seen
        once, whose value the shapes disagree on, is worth measuring again, and one pinned by
        several runs is not. ``(of the row, of chosen)``."""
        w, mean_r, mean_c, var_r, var_c, cov, noise = self._versus(rows, chosen)
        keep = heaviest(w, self._priors.max_components)
        w, noise = w[keep] / w[keep].sum(), noise[keep]
        mean_r, mean_c, var_r, var_c, cov = (a[keep] for a in (mean_r, mean_c, var_r, var_c, cov))
        diff = mean_r - mean_c  # (K, R)
        now = np.maximum(0.0, w @ diff)
        values = []
        for at, var, moves in ((mean_r, var_r, var_r - cov), (mean_c, var_c, cov - var_c)):
            s2 = var + noise[:, None] ** 2  # the predictive variance of the measurement, (K, R)
            y = at[:, None, :] + np.sqrt(s2)[:, None, :] * NODES[None, :, None]  # (K, J, R)
            # Each component l's likelihood of each possible measurement: (L, K, J, R).
            dev = y[None] - at[:, None, None, :]
            log_lik = np.log(w)[:, None, None, None] - 0.5 * dev**2 / s2[:, None, None, :] - 0.5 * np.log(s2)[:, None, None, :]
            post = np.exp(log_lik - log_lik.max(axis=0, keepdims=True))
            post /= post.sum(axis=0, keepdims=True)
            after = np.einsum("lkjr,lkjr->kjr", post, diff[:, None, None, :] + (moves / s2)[:, None, None, :] * dev)
            expected = np.einsum("k,j,kjr->r", w, NODE_WEIGHTS, np.maximum(after, 0.0))
            values.append(np.maximum(expected - now, 0.0))
        return values[0], values[1]

    def mean(self, rows: Sequence[tuple[Arm, int, Knobs]]) -> np.ndarray:
        w, means, _ = self.predict(rows)
        return np.asarray(w @ means)

    def knowledge_gradient(self, rows: Sequence[tuple[Arm, int, Knobs]], incumbent: tuple[Arm, int, Knobs]) -> np.ndarray:
        """What one run of each row is expected to raise the final choice by, in log throughput:
        ``E[max(0, E[log y_row - log y_incumbent | the run])]``, the knowledge gradient of the
        pair. The run moves the difference by ``(var_row - cov) / sqrt(var_row + sigma^2)``: a
        size whose curve moves with the incumbent's (a plateau the runs pin together) is worth
        little however uncertain the curve's level, and a gain within one run's noise is not one
        the run can show."""
        w, mean_r, mean_c, var_r, _, cov, noise = self._versus(rows, incumbent)
        moved = np.maximum(var_r - cov, 0.0) / np.sqrt(var_r + noise[:, None] ** 2)
        return np.asarray(w @ gain(mean_r - mean_c, np.maximum(moved, 1e-9)))
