from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from optuna_ds.domain import Config
from optuna_ds.planner._batch import remeasuring
from optuna_ds.planner._batch import widen
from optuna_ds.planner._problem import Arm
from optuna_ds.planner._problem import Choice
from optuna_ds.planner._problem import Decision
from optuna_ds.planner._problem import Knobs
from optuna_ds.planner._problem import KnobSetting
from optuna_ds.planner._problem import Observation
from optuna_ds.planner._problem import Problem
from optuna_ds.planner._problem import Proposal
from optuna_ds.planner._problem import Status
from optuna_ds.planner._settings import PlannerSettings
from optuna_ds.planner._state import State
from optuna_ds.planner._surrogate import ThroughputModel
from optuna_ds.planner._noise import robust_level


class _Ranked(NamedTuple):
    """A measured config, ranked."""

    config: Config
    estimate: float  # the model's, of its log score
    mean: float  # of its measured scores
    runs: int


def _choose(model: ThroughputModel, state: State) -> tuple[Choice | None, list[_Ranked]]:
    """The best config that ran, by the model's estimate, among those not measured below
    another by more than the measured noise can explain; with every measured config ranked.

    Measured by each config's robust level (:func:`robust_level`: one-sided noise), the one
    figure the choice is both judged and shown by (``Choice.measured``)."""
    groups: dict[Config, list[float]] = {}
    for o in state.ok:
        groups.setdefault(o.config, []).append(float(o.score))  # type: ignore[arg-type]
    if not groups:
        return None, []
    configs = list(groups)
    rows = [(state.arm(c.arm, c.knobs), c.micro_batch, c.knobs) for c in configs]
    means = model.mean(rows)
    # Each config's runs by their robust level: noise is one-sided (a slow run, never a fast
    # one), so a slow run among several does not pull its config below a rival of one run.
    measured = np.array([robust_level(groups[c], model.noise, priors=state.settings.priors) for c in configs])
    counts = np.array([len(groups[c]) for c in configs])
    top = int(np.argmax(measured))
    # The model pools neighbouring runs, which beats one run's figure while the two agree within
    # the noise; a config measured below the best by more than that is not chosen, whatever the
    # model estimates for it: the model never overrules a measurement it cannot explain.
    spread = state.settings.plausible_z * model.noise * np.sqrt(1.0 / counts + 1.0 / counts[top])
    plausible = measured >= measured[top] - spread
    order = sorted(range(len(configs)), key=lambda i: (not plausible[i], -means[i]))
    ranked = [_Ranked(configs[i], float(means[i]), float(np.mean(groups[configs[i]])), int(counts[i])) for i in order]
    c, estimate, _, _ = ranked[0]
    return Choice(config=c, estimate=float(np.exp(estimate)), measured=float(np.exp(measured[order[0]]))), ranked


def _equivalent(model: ThroughputModel, ranked: list[_Ranked]) -> list[Config]:
    """The choice and every measured config whose mean lies within one noise deviation of the
    difference below (or above) the choice's."""
    if not ranked:
        return []
    _, _, mean_c, n_c = ranked[0]
    return [c for c, _, mean, n in ranked if math.log(mean / mean_c) >= -model.noise * math.sqrt(1.0 / n + 1.0 / n_c)]


def _repeat(state: State, config: Config, why: str) -> Proposal | None:
    if any(o.config == config for o in state.running):
        return None
    # Numbered after every run of the config, failed ones too: a name that ran is never asked for again.
    n = sum(1 for o in state.finished if o.config == config)
    return Proposal(config=config, repeat=n, why=why)


def fitted(problem: Problem, observations: Sequence[Observation], settings: PlannerSettings,
           knob_candidates: Mapping[tuple[int, str], Sequence[KnobSetting]] | None = None) -> tuple[State, ThroughputModel]:
    """What :func:`plan` decides from: the observations' state and the throughput model fitted
    to them (the report's model curve is drawn from the same, :func:`model_curves`)."""
    state = State(problem, observations, settings, knob_candidates)
    return state, ThroughputModel(problem, state.memory, state.points(), priors=settings.priors, levers=state.levers)


def plan(problem: Problem, observations: Sequence[Observation], *, free_slots: int = 1,
         settings: PlannerSettings = PlannerSettings(),
         knob_candidates: Mapping[tuple[int, str], Sequence[KnobSetting]] | None = None) -> Decision:
    """The next experiments of a tuning, as a pure function of everything observed so far.

    A launch is the currency. Candidates are the untried micro-batch sizes of every arm worth
    exploring, the knob settings once an arm's
    sizes are settled, and re-measurements of the choice and its closest rival. The first
    experiment is the run expected to measure fastest; from then on each is the one expected to
    raise the *final choice* most (its knowledge gradient against the best measured config,
    times the chance it runs: a launch that runs out of memory is a launch that raised nothing),
    while that is at least ``min_gain``. Nothing is launched by ritual -- no bracket, no
    confirmation -- save one re-measurement of the best so far that measures the noise every
    later launch is priced against. Experiments still running count as measured at the model's
    mean (so a batch for several slots spreads out), and a candidate is worth the lower of its
    values with and without them. The choice is the best measured config by the model's
    estimate, so one lucky measurement does not decide it, unless the measurements disagree with
    the model by more than the measured noise; ``Decision.equivalent`` names the configs a run
    cannot tell from it.

    ``knob_candidates`` are the knob settings worth scoring at each arm (a sampler's proposals,
    each a whole setting of the arm's tuned knobs): from an arm's first run on, each competes
    at the arm's best sizes like any other experiment, its value from knob effects the model
    learns across stages.
    """
    settings = priced(problem, observations, settings)
    state, model = fitted(problem, observations, settings, knob_candidates)
    choice, ranked = _choose(model, state)
    noise = model.noise if state.ok else None
    launched = len(state.finished) + len(state.running)

    equivalent = tuple(_equivalent(model, ranked))

    def decision(proposals: Sequence[Proposal], done: bool, reason: str) -> Decision:
        left = regret(model, state, choice) if done and choice is not None else None
        return Decision(tuple(proposals), done, choice, noise, reason, noise_runs=model.noise_dof, equivalent=equivalent,
                        regret=left)

    if free_slots <= 0:
        return decision((), False, "no free slot")
    if launched >= problem.max_experiments:
        return decision((), not state.running, f"{problem.max_experiments} experiments")
    proposals = [p for step in OPENING if (p := step.propose(state, model, choice)) is not None]
    step_model = model.conditioned(_fantasies(model, [(state.arm(o.arm, o.knobs), o.mbs, o.knobs) for o in state.running]))
    while len(proposals) < free_slots and launched + len(proposals) < problem.max_experiments:
        if proposals:
            step_model = step_model.conditioned(_fantasies(model, [(state.arm((proposals[-1].stage, proposals[-1].offload), proposals[-1].knobs),
                                                                    proposals[-1].mbs, proposals[-1].knobs)]))
        taken = {p.config for p in proposals}
        nxt = _next(state, step_model, taken, ranked, model)
        if nxt is None:
            break
        proposals.append(nxt)
    if state.ok and (state.running or proposals) and len(proposals) < free_slots:
        proposals += widen(state, model, proposals, slots=min(free_slots, problem.max_experiments - launched) - len(proposals))
    done = not proposals and not state.running
    return decision(proposals, done, "no experiment left is expected to pay" if done else "")


def regret(model: ThroughputModel, state: State, choice: Choice) -> float:
    """What ``choice`` is still expected to lose, as a share of throughput: the largest
    expected loss (:meth:`ThroughputModel.expected_loss`) against a measured config, or an
    untried candidate times its chance to run. A lower bound of the loss to the best of them
    all, which the summary states beside the training's time."""
    c = choice.config
    chosen = (state.arm(c.arm, c.knobs), c.micro_batch, c.knobs)
    measured = [(state.arm(o.arm, o.knobs), o.mbs, o.knobs) for o in {o.config: o for o in state.ok if o.config != c}.values()]
    rows, p_run = state.candidates
    losses = [0.0]
    if measured:
        losses.append(float(np.max(model.expected_loss(measured, chosen))))
    if rows:
        losses.append(float(np.max(p_run * model.expected_loss(rows, chosen))))
    return float(np.expm1(max(losses)))


def launch_price(problem: Problem, observations: Sequence[Observation], settings: PlannerSettings) -> float:
    """What a launch must be expected to raise the final choice by (a share of throughput) to
    be bought: its own device-time over the training's at the best throughput measured so far
    (``Problem.train_samples`` samples; the same devices run both, so their count cancels),
    the usual run's seconds for a launch's. Without a training length, or before a run
    succeeded, ``settings.min_gain``."""
    ok = [o for o in observations if o.status is Status.OK and o.score and o.score > 0 and o.seconds]
    if problem.train_samples is None or not ok:
        return settings.min_gain
    seconds = float(np.median([o.seconds for o in ok]))
    return seconds * max(float(o.score) for o in ok) / problem.train_samples  # type: ignore[arg-type]


def priced(problem: Problem, observations: Sequence[Observation], settings: PlannerSettings) -> PlannerSettings:
    """``settings`` with the launch's price (:func:`launch_price`) for ``min_gain``, and the
    batch's bar (``batch_gain``) moved in proportion."""
    price = launch_price(problem, observations, settings)
    if price == settings.min_gain:
        return settings
    return dataclasses.replace(settings, min_gain=price, batch_gain=settings.batch_gain * price / settings.min_gain)


def _fantasies(model: ThroughputModel, rows: list[tuple[Arm, int, Knobs]]) -> list[tuple[Arm, int, Knobs, float]]:
    """Experiments not measured yet (running, or proposed in this batch), as measured at the
    model's mean: the next proposal of a batch goes elsewhere."""
    if not rows:
        return []
    return [(a, m, k, float(np.exp(mu))) for (a, m, k), mu in zip(rows, model.mean(rows))]


class YourSize:
    """Is the user's micro-batch size untried? It runs first, at the first arm."""

    def propose(self, state: State, model: ThroughputModel, choice: Choice | None) -> Proposal | None:
        problem = state.problem
        if problem.baseline is None or not problem.arms:
            return None
        config = problem.config(problem.arms[0], problem.baseline)
        return None if config in state.tried else Proposal(config=config, why="your micro-batch size")


class NoiseReplicate:
    """Did enough runs succeed, no config twice? The best so far runs again: the noise prices
    every later launch (a gain within it is none a run can show) and the summary reports it,
    measured once, not assumed. Once only: where its pair is judged a straggler the noise stays
    assumed, and a further run of it is a re-measurement like any other, bought by its value."""

    def propose(self, state: State, model: ThroughputModel, choice: Choice | None) -> Proposal | None:
        twice = len({o.config for o in state.ok}) < len(state.ok)
        if twice or model.noise_dof != 0 or len(state.ok) < state.settings.noise_after or choice is None or remeasuring(state):
            return None
        return _repeat(state, choice.config, "measure again: the run-to-run noise")


OPENING = (YourSize(), NoiseReplicate())
"""The proposals of a decision before its slots are filled: each that proposes something does."""


@dataclasses.dataclass(frozen=True)
class FreeSlot:
    """A free slot as the policy's steps see it. ``model`` counts the experiments
    under way at its mean (so a batch spreads out), ``measured_only`` the runs alone: a launch is
    worth the lower of its two values, as results not in yet cannot make one worth more."""

    state: State
    model: ThroughputModel
    measured_only: ThroughputModel
    taken: set[Config]  # proposed earlier in this batch
    ranked: list[_Ranked]
    rows: list[tuple[Arm, int, Knobs]]  # the untried default-knob candidates not taken
    p_run: np.ndarray  # the chance of each row to run
    fits: np.ndarray  # the chance of each row to fit in memory
    explored: set[tuple[int, str]]  # the arms run, running or taken

    @property
    def problem(self) -> Problem:
        return self.state.problem


class ListedStages:
    """Is a stage the user listed not measured yet? Each is measured once, at the size expected
    to run fastest."""

    def propose(self, slot: FreeSlot) -> Proposal | None:
        if not slot.problem.explicit:
            return None
        fresh = [i for i, (a, _, _) in enumerate(slot.rows) if a.key not in slot.explored and a.offload == ""]
        if not fresh:
            return None
        return _best_run(slot.problem, [slot.rows[i] for i in fresh], slot.p_run[fresh], slot.model, "a stage you listed",
                         slot.problem.sizes, fits=slot.fits[fresh])


class ListedSizes:
    """Is a size the user listed not measured yet at a stage explored? Each is, at every stage
    explored, as DeepSpeed does."""

    def propose(self, slot: FreeSlot) -> Proposal | None:
        if not (user_sizes := slot.problem.sizes):
            return None
        rows = slot.rows
        listed = [i for i, (a, _, _) in enumerate(rows) if a.key in slot.explored and not a.offload]
        if not listed:
            return None
        i = min(listed, key=lambda i: (rows[i][0].stage, user_sizes.index(rows[i][1]) if rows[i][1] in user_sizes else 0))
        a, m, k = rows[i]
        return Proposal(config=slot.problem.config(a, m, k), why="a size you listed")


class FirstLaunch:
    """Is nothing measured, running or proposed yet? The lowest stage likely to run, at the size
    expected to run fastest of those likely to fit: DeepSpeed's order, the lowest stage that runs
    communicates least."""

    def propose(self, slot: FreeSlot) -> Proposal | None:
        state, rows, p_run, fits = slot.state, slot.rows, slot.p_run, slot.fits
        if state.ok or state.running or slot.taken or not rows:
            return None
        if not (p_run >= 0.5).any():
            # No size is likely to fit without checkpointing or AutoTP: a setting that likely fits
            # with one is as much a first launch (a sample's activations beyond the device, model
            # states that fit only split); its chance to run is its chance to fit.
            more, p_more = _room(slot, slot.model.noise)
            likely = [i for i, p in enumerate(p_more) if p >= 0.5]
            rows, p_run = rows + [more[i] for i in likely], np.concatenate([p_run, p_more[likely]])
            fits = np.concatenate([fits, p_more[likely]])
        lowest = min((a.key for (a, _, _), p in zip(rows, p_run) if p >= 0.5), default=None)
        first = [i for i, (a, _, _) in enumerate(rows) if a.key == lowest] or list(range(len(rows)))
        return _best_run(slot.problem, [rows[i] for i in first], p_run[first], slot.model, "the size expected to run fastest",
                         slot.problem.sizes, fits=fits[first])


class WhilePending:
    """Are the first results still pending? The best guess of an arm not tried yet, else a
    smaller size."""

    def propose(self, slot: FreeSlot) -> Proposal | None:
        state, rows = slot.state, slot.rows
        if state.ok:
            return None
        busy = {(o.stage, o.offload) for o in state.running} | {p.arm for p in slot.taken}
        sizes = [o.mbs for o in state.running] + [p.micro_batch for p in slot.taken]
        other = [i for i, (a, _, _) in enumerate(rows) if a.key not in busy]
        if not other:
            other = [i for i, (_, m, _) in enumerate(rows) if m <= 0.7 * min(sizes)] if sizes else []
        if not other:
            return None
        return _best_run(slot.problem, [rows[i] for i in other], slot.p_run[other], slot.model, "while the first results are pending",
                         fits=slot.fits[other])


class MostValue:
    """Is a launch expected to raise the final choice by ``min_gain``? The one expected to raise
    it most: a size, else (the sizes settled) a knob setting, against a re-measurement."""

    def propose(self, slot: FreeSlot) -> Proposal | None:
        state, model, measured_only, taken = slot.state, slot.model, slot.measured_only, slot.taken
        if not state.ok:
            return None
        # The best so far counts the experiments under way (running, or proposed in this batch) at
        # the model's mean, as the model does: else every proposal of a batch would be measured
        # against the first results alone, and a batch for many slots would crowd one curve.
        # A set, not sorted: one knob's values may mix types (5e8, "auto"), and a max needs no order.
        measured = [(state.arm(c.arm, c.knobs), c.micro_batch, c.knobs)
                    for c in {o.config for o in state.ok} | {o.config for o in state.running} | taken]
        incumbent = measured[int(np.argmax(model.mean(measured)))]
        best = _best_value((model, measured_only), state, slot.rows, slot.p_run, incumbent)
        if best is None:
            # Knob, checkpointing and AutoTP settings once the sizes are settled: a knob setting is
            # tried at an arm's best sizes, checkpointing and AutoTP beyond its memory edge, which
            # the size search finds first (and the curve's rise there, which they must beat);
            # their gain is measured against the best config there is.
            knob_rows, knob_p = state.knob_rows(model)
            fresh = [i for i, (a, m, k) in enumerate(knob_rows) if slot.problem.config(a, m, k) not in taken]
            rows, p_run = _room(slot, model.noise)
            best = _best_value((model, measured_only), state, [knob_rows[i] for i in fresh] + rows,
                               np.concatenate([knob_p[fresh], p_run]), incumbent)
        again = _replicate(model, state, slot.ranked) if not taken and not state.running else None
        if not taken and not state.running and (check := _check(slot, incumbent)) is not None:
            again = check if again is None or check[1] > again[1] else again
        if again is not None and (best is None or again[1] > best[1]):
            return again[0]
        if best is None:
            return None
        (a, m, k), value = best
        return Proposal(config=slot.problem.config(a, m, k), why=f"may raise the choice {value:.1%}")


def _check(slot: FreeSlot, incumbent: tuple[Arm, int, Knobs]) -> tuple[Proposal, float] | None:
    """Is a config's only run, not yet taken for a straggler, likely one by what the other runs
    predict for it (:attr:`ThroughputModel.slow` at least ``Priors.surprise``)? Two
    explanations hold: a slow run, or the curve bending there. Its second run tells them apart;
    it is worth the launch it unlocks: the best knowledge gradient among the run's config and
    the untried sizes of its arm about it with the run taken for a straggler, net of that
    launch's price and of what the region's best launch pays with the run believed, times the
    straggler's posterior probability; with that value, ``None`` where it is below ``min_gain``."""
    state, model = slot.state, slot.measured_only
    priors = state.settings.priors
    runs: dict[Config, int] = {}
    for o in state.ok:
        runs[o.config] = runs.get(o.config, 0) + 1
    alone = [i for i, o in enumerate(state.ok) if runs[o.config] == 1 and model.slow[i] >= priors.surprise]
    if not alone:
        return None
    i = max(alone, key=lambda i: model.slow[i])
    p_slow = float(model.slow[i])
    o = state.ok[i]
    arm = state.arm(o.arm, o.knobs)
    near = [j for j, (a, m, k) in enumerate(slot.rows)
            if a.key == arm.key and k == o.knobs and abs(math.log(m / o.mbs)) <= 2.0 * priors.residual_length]
    region = [(arm, o.mbs, o.knobs)] + [slot.rows[j] for j in near]
    p_run = np.concatenate([[1.0], slot.p_run[near]])
    # What the second run unlocks: were the run a straggler, the region's best launch (the run's
    # config again or an untried size about it) would be worth its knowledge gradient under that
    # explanation, less the launch's own price; believed, whatever the region's best launch pays
    # already (it is bought without the check).
    price = state.settings.min_gain
    unlocked = float(np.max(p_run * model.as_straggler(i).knowledge_gradient(region, incumbent))) - price
    already = float(np.max(p_run * model.knowledge_gradient(region, incumbent))) - price
    value = p_slow * max(unlocked - max(already, 0.0), 0.0)
    if value < price:
        return None
    again = _repeat(state, o.config, f"measure again: a run {p_slow:.0%} likely slowed may change the choice {value:.1%}")
    return (again, value) if again is not None else None


class OnlyWithRoom:
    """Did nothing run, nothing is running and no size is left to try? A checkpointing or AutoTP
    setting, at the lowest stage and the size likeliest to run fast: where one sample's
    activations fit nowhere, or the model states fit only split, it is what may make any size fit."""

    def propose(self, slot: FreeSlot) -> Proposal | None:
        if slot.state.ok or slot.state.running or slot.taken or slot.rows:
            return None
        rows, p_run = _room(slot, slot.model.noise)
        likely = [i for i, p in enumerate(p_run) if p >= 0.5] or list(range(len(rows)))
        if not likely:
            return None
        lowest = min(rows[i][0].key for i in likely)
        first = [i for i in likely if rows[i][0].key == lowest]
        proposal = _best_run(slot.problem, [rows[i] for i in first], p_run[first], slot.model, "",
                             fits=p_run[first])
        without = "AutoTP" if proposal.knobs.autotp > 1 else "checkpointing"
        return dataclasses.replace(proposal, why=f"nothing fits without {without}")


def _room(slot: FreeSlot, noise: float) -> tuple[list[tuple[Arm, int, Knobs]], np.ndarray]:
    """The state's settings that buy room (:meth:`State.room_rows`) not taken in this batch."""
    rows, p_run = slot.state.room_rows(noise)
    keep = [i for i, (a, m, k) in enumerate(rows) if slot.problem.config(a, m, k) not in slot.taken]
    return [rows[i] for i in keep], (p_run[keep] if keep else np.zeros(0))


POLICY = (ListedStages(), ListedSizes(), FirstLaunch(), WhilePending(), OnlyWithRoom(), MostValue())
"""The planner's policy for one slot, in order: the first step that proposes something fills it;
where none does, the slot and the rest of the batch stay empty."""


def _next(state: State, model: ThroughputModel, taken: set[Config], ranked: list[_Ranked],
          measured_only: ThroughputModel) -> Proposal | None:
    """The next experiment of one slot, by the first step of the policy that proposes one."""
    rows, p_run = state.candidates
    fits = state.candidate_fits
    keep = [i for i, c in enumerate(state.candidate_configs) if c not in taken]
    explored = {o.arm for o in state.finished} | {o.arm for o in state.running} | {p.arm for p in taken}
    slot = FreeSlot(state=state, model=model, measured_only=measured_only, taken=taken, ranked=ranked,
                rows=[rows[i] for i in keep], p_run=p_run[keep] if len(keep) else np.zeros(0),
                fits=fits[keep] if len(keep) else np.zeros(0), explored=explored)
    for step in POLICY:
        if (proposal := step.propose(slot)) is not None:
            return proposal
    return None


def _best_value(models: tuple[ThroughputModel, ThroughputModel], state: State, rows: list[tuple[Arm, int, Knobs]],
                p_run: np.ndarray, incumbent: tuple[Arm, int, Knobs]) -> tuple[tuple[Arm, int, Knobs], float] | None:
    """Of ``rows``, the one whose launch is expected to raise the final choice most (its
    knowledge gradient times the chance it runs: a launch that runs out of memory costs a launch
    and raises nothing), with that value; ``None`` where none is worth ``min_gain``."""
    if not rows:
        return None
    value = p_run * models[0].knowledge_gradient(rows, incumbent)
    if models[1] is not models[0]:
        value = np.minimum(value, p_run * models[1].knowledge_gradient(rows, incumbent))
    i = int(np.argmax(value))
    return (rows[i], float(value[i])) if value[i] >= state.settings.min_gain else None


def _replicate(model: ThroughputModel, state: State, ranked: list[_Ranked]) -> tuple[Proposal, float] | None:
    """The measured config whose next run is expected to raise the final choice most: the
    chosen one or a rival it may lose to (a knowledge gradient over the pair), with that value;
    ``None`` where none is worth ``min_gain`` or the re-measurements are spent. A replicate is a
    launch like any other: one that cannot change the choice is not made."""
    repeats = len(state.finished) - len({o.config for o in state.finished})
    if len(ranked) < 2 or repeats >= state.settings.max_remeasures:
        return None
    rows = [(state.arm(c.arm, c.knobs), c.micro_batch, c.knobs) for c, _, _, _ in ranked]
    losses = model.expected_loss(rows[1:], rows[0])
    rivals = np.argsort(-losses)[:state.settings.priors.rivals] + 1
    of_rival, of_chosen = model.remeasure_value([rows[i] for i in rivals], rows[0])
    j = int(np.argmax(np.maximum(of_rival, of_chosen)))
    value = float(max(of_rival[j], of_chosen[j]))
    if value < state.settings.min_gain:
        return None
    config = ranked[int(rivals[j])][0] if of_rival[j] > of_chosen[j] else ranked[0][0]
    again = _repeat(state, config, f"measure again: may change the choice {value:.1%}")
    return (again, value) if again is not None else None


def _best_run(problem: Problem, rows: list[tuple[Arm, int, Knobs]], p_run: np.ndarray, model: ThroughputModel, why: str,
              sizes: tuple[int, ...] | None = None, *, fits: np.ndarray) -> Proposal:
    """The run expected to measure fastest among the sizes likely to fit in memory (``fits``,
    each row's chance to), or the likeliest to fit where none is; with the user's list of
    ``sizes``, the first listed that is likely to run, in the user's order as DeepSpeed does."""
    likely = [i for i, (_, m, _) in enumerate(rows) if p_run[i] >= 0.5]
    if sizes and likely:
        i = min(likely, key=lambda i: sizes.index(rows[i][1]) if rows[i][1] in sizes else len(sizes))
    else:
        # A launch that runs out of memory measures nothing, its peak memory included: the sizes
        # likely to fit, where any is; where none is, the likeliest.
        fit = [i for i in range(len(rows)) if fits[i] >= 0.5] or [int(np.argmax(fits))]
        i = fit[int(np.argmax(p_run[fit] * np.exp(model.mean([rows[i] for i in fit]))))]
    a, m, k = rows[i]
    return Proposal(config=problem.config(a, m, k), why=why)
