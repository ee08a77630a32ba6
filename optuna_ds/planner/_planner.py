from __future__ import annotations

import functools
import statistics
from collections.abc import Sequence

import numpy as np

from optuna_ds.planner._memory import FeasibilityModel
from optuna_ds.planner._problem import Arm
from optuna_ds.planner._problem import Choice
from optuna_ds.planner._problem import Decision
from optuna_ds.planner._problem import Knobs
from optuna_ds.planner._problem import Observation
from optuna_ds.planner._problem import Problem
from optuna_ds.planner._problem import Proposal
from optuna_ds.planner._problem import Status
from optuna_ds.planner._surrogate import ThroughputModel

# An experiment is worth its launch while it is expected to beat the best by this share.
MIN_GAIN = 0.002
# ...counting only gains beyond this share: smaller ones are within what one measurement can tell.
MARGIN = 0.005
HOPELESS_OOM = 0.98  # sizes this likely to run out are not candidates
# The chosen size is bracketed from below by a size this much smaller (or one ran within the
# second factor) before the search ends.
BRACKET = 1.6
BRACKET_SEEN = 1.3
# A finalist is measured again while that is expected to improve the choice by MIN_GAIN,
MAX_REMEASURES = 3  # and at most this many times in a tuning.
PLAUSIBLE_Z = 3.0  # a config measured this many noise deviations below the best is not chosen
_BROKEN_PRIOR = 0.2  # a stage that fails for reasons other than memory may fail at every size
_SIZE_FAILS = 0.3  # else, once one size failed, another may
_GROWTH = 1.04  # candidate sizes above 64 step by 4%


def _candidate_sizes(problem: Problem, arm: Arm) -> list[int]:
    if problem.sizes:
        return sorted({m for m in problem.sizes if problem.floor <= m <= arm.cap} or {min(problem.sizes)})
    low, cap = max(1, problem.floor), max(1, arm.cap)
    sizes = set(range(low, min(cap, 64) + 1))
    m = 64.0
    while m < cap:
        m *= _GROWTH
        sizes.add(min(cap, int(round(m))))
    sizes.add(cap)
    return sorted(s for s in sizes if s >= low) or [cap]


def _p_crash(arm: Arm, sizes: np.ndarray, finished: Sequence[Observation]) -> np.ndarray:
    """The probability that each size fails for a reason other than memory: the stage is broken
    at every size (likelier with each failure while nothing ran), or a size fails on its own."""
    # Offload changes memory, not what crashes: every variant of a stage shares its failures.
    failed = [o.mbs for o in finished if o.stage == arm.stage and o.status is Status.FAILED and not o.knobs]
    ran = any(o.stage == arm.stage and o.status is Status.OK and not o.knobs for o in finished)
    if not failed:
        return np.zeros(len(sizes))
    broken = 0.0 if ran else _BROKEN_PRIOR / (_BROKEN_PRIOR + (1 - _BROKEN_PRIOR) * _SIZE_FAILS ** len(failed))
    return np.full(len(sizes), broken + (1.0 - broken) * _SIZE_FAILS)


def _median(values: list[float], default: float) -> float:
    return statistics.median(values) if values else default


class _State:
    """The observations arranged for one decision."""

    def __init__(self, problem: Problem, observations: Sequence[Observation]) -> None:
        self.problem = problem
        self.finished = [o for o in observations if o.status is not Status.RUNNING and problem.arm(o.arm)]
        self.running = [o for o in observations if o.status is Status.RUNNING and problem.arm(o.arm)]
        self.memory = FeasibilityModel(problem, self.finished)
        self.ok = [o for o in self.finished if o.status is Status.OK and o.score and o.score > 0]
        self.tried = {o.config for o in self.finished} | {o.config for o in self.running}
        ok_seconds = [o.seconds for o in self.ok if o.seconds]
        self.seconds_ok = _median(ok_seconds, 1.0)
        fail_seconds = [o.seconds for o in self.finished if o.status is not Status.OK and o.seconds]
        self.seconds_failed = _median(fail_seconds, 0.6 * self.seconds_ok)

    def points(self) -> list[tuple[Arm, int, Knobs, float]]:
        return [(self.problem.arm(o.arm), o.mbs, o.knobs, float(o.score)) for o in self.ok]  # type: ignore[misc]

    @functools.cached_property
    def candidates(self) -> tuple[list[tuple[Arm, int, Knobs]], np.ndarray]:
        """Untried default-knob configs of every arm, with their probability to run: the same for
        every proposal of a batch."""
        rows: list[tuple[Arm, int, Knobs]] = []
        p_run: list[np.ndarray] = []
        for arm in self.problem.arms:
            sizes = np.array([m for m in _candidate_sizes(self.problem, arm) if (arm.stage, arm.offload, m, ()) not in self.tried])
            if not len(sizes):
                continue
            p = (1.0 - self.memory.p_oom(arm, sizes)) * (1.0 - _p_crash(arm, sizes, self.finished))
            keep = p > 1.0 - HOPELESS_OOM
            if not keep.any() and not any(o.arm == arm.key for o in self.finished):
                keep[0] = True  # the model is not the machine: an arm whose states fit is tried once
            rows += [(arm, int(m), ()) for m in sizes[keep]]
            p_run.append(p[keep])
        return rows, (np.concatenate(p_run) if p_run else np.zeros(0))


def _choose(model: ThroughputModel, state: _State) -> tuple[Choice | None, list[tuple[tuple, float, float, int]]]:
    """The best config that ran, by the model's estimate, among those not measured below
    another by more than the noise can explain; with every measured config ranked."""
    groups: dict[tuple, list[float]] = {}
    for o in state.ok:
        groups.setdefault(o.config, []).append(float(o.score))  # type: ignore[arg-type]
    if not groups:
        return None, []
    configs = list(groups)
    rows = [(state.problem.arm((c[0], c[1])), c[2], c[3]) for c in configs]
    means = model.mean(rows)  # type: ignore[arg-type]
    measured = np.array([np.mean(np.log(groups[c])) for c in configs])
    counts = np.array([len(groups[c]) for c in configs])
    top = int(np.argmax(measured))
    # Where the data contradict the model's shape (a size the kernels dislike, a broken
    # measurement), the measurements decide: a config measured below the best by more than
    # PLAUSIBLE_Z noise deviations is not chosen, whatever the model estimates for it.
    spread = PLAUSIBLE_Z * model.noise * np.sqrt(1.0 / counts + 1.0 / counts[top])
    plausible = measured >= measured[top] - spread
    order = sorted(range(len(configs)), key=lambda i: (not plausible[i], -means[i]))
    ranked = [(configs[i], float(means[i]), float(np.mean(groups[configs[i]])), int(counts[i])) for i in order]
    best = ranked[0]
    c = best[0]
    return Choice(stage=c[0], offload=c[1], mbs=c[2], knobs=c[3], estimate=float(np.exp(best[1])), measured=best[2]), ranked


def _remeasure(model: ThroughputModel, state: _State, ranked: list[tuple[tuple, float, float, int]],
               repeats_so_far: int) -> Proposal | None:
    """A finalist to measure again while that is expected to improve the choice by ``MIN_GAIN``:
    the chosen config, or the measured config it is most likely to lose to, whichever
    measurement is worth more."""
    if len(ranked) < 2 or repeats_so_far >= MAX_REMEASURES:
        return None
    rows = [(state.problem.arm((c[0], c[1])), c[2], c[3]) for c, _, _, _ in ranked]
    i = int(np.argmax(model.expected_loss(rows[1:], rows[0])))  # type: ignore[arg-type]
    of_rival, of_chosen = (float(v[0]) for v in model.remeasure_value([rows[i + 1]], rows[0]))  # type: ignore[arg-type]
    if max(of_rival, of_chosen) < MIN_GAIN:
        return None
    c = (ranked[i + 1] if of_rival > of_chosen else ranked[0])[0]
    if any(o.config == c for o in state.running):
        return None
    # Numbered after every run of the config, failed ones too: a name that ran is never asked for again.
    n = sum(1 for o in state.finished if o.config == c)
    return Proposal(stage=c[0], offload=c[1], mbs=c[2], knobs=c[3], repeat=n, why="re-measure a finalist")


def plan(problem: Problem, observations: Sequence[Observation], *, free_slots: int = 1) -> Decision:
    """The next experiments of a tuning, as a pure function of everything observed so far.

    Candidates are the untried micro-batch sizes of every arm. The first experiment maximises the
    expected throughput of the run itself (the model's prior shape times the chance it fits); from
    then on each maximises the expected improvement on the best estimate, times the chance it
    runs, per expected second. Experiments still running count as measured at the model's mean
    (so a batch for several slots spreads out). The search is done when no candidate is expected
    to gain ``MIN_GAIN`` and no finalist needs re-measuring; the choice is the best measured config
    by the model's estimate, so one lucky measurement does not decide it.
    """
    state = _State(problem, observations)
    model = ThroughputModel(problem, state.memory, state.points())
    choice, ranked = _choose(model, state)
    noise = model.noise if len(state.ok) >= 2 else None
    launched = len(state.finished) + len(state.running)
    if free_slots <= 0:
        return Decision((), False, choice, noise, "no free slot")
    if launched >= problem.max_experiments:
        return Decision((), not state.running, choice, noise, f"{problem.max_experiments} experiments")
    proposals: list[Proposal] = []
    baseline = problem.baseline
    first = problem.arms[0] if problem.arms else None
    if baseline is not None and first is not None and (first.stage, first.offload, baseline, ()) not in state.tried:
        proposals.append(Proposal(stage=first.stage, offload=first.offload, mbs=baseline, why="your micro-batch size"))
    fantasy = list(state.points()) + _fantasies(model, [(problem.arm(o.arm), o.mbs, o.knobs) for o in state.running])
    while len(proposals) < free_slots and launched + len(proposals) < problem.max_experiments:
        if proposals:
            fantasy += _fantasies(model, [(problem.arm((proposals[-1].stage, proposals[-1].offload)), proposals[-1].mbs,
                                           proposals[-1].knobs)])
        step_model = ThroughputModel(problem, state.memory, fantasy) if len(fantasy) > len(state.ok) else model
        taken = {p.config for p in proposals}
        nxt = _next(problem, state, step_model, taken)
        if nxt is None:
            break
        proposals.append(nxt)
    if not proposals and not state.running and choice is not None:
        bracket = _bracket(problem, state, choice)
        if bracket is not None:
            proposals.append(bracket)
    if not proposals and not state.running:
        repeats = len(state.finished) - len({o.config for o in state.finished})
        again = _remeasure(model, state, ranked, repeats)
        if again is not None:
            proposals.append(again)
    done = not proposals and not state.running
    return Decision(tuple(proposals), done, choice, noise, "no experiment left is expected to pay" if done else "")


def _bracket(problem: Problem, state: _State, choice: Choice) -> Proposal | None:
    """A size well below the chosen one, when none ran: until the optimum is bracketed, the
    curve's fall on that side is the model's extrapolation, not a measurement."""
    arm = problem.arm((choice.stage, choice.offload))
    assert arm is not None
    target = int(choice.mbs / BRACKET)
    if target < max(1, problem.floor) or choice.knobs:
        return None
    sizes = _candidate_sizes(problem, arm)
    below = [o.mbs for o in state.finished if o.arm == arm.key and not o.knobs and o.mbs <= choice.mbs / BRACKET_SEEN]
    if below or problem.sizes:
        return None
    mbs = min(sizes, key=lambda m: abs(m - target))
    if (arm.stage, arm.offload, mbs, ()) in state.tried:
        return None
    return Proposal(stage=arm.stage, offload=arm.offload, mbs=mbs, why="a smaller size, to bracket the optimum")


def _fantasies(model: ThroughputModel, rows: list) -> list[tuple[Arm, int, Knobs, float]]:
    """Experiments not measured yet (running, or proposed in this batch), as measured at the
    model's mean: the next proposal of a batch goes elsewhere."""
    if not rows:
        return []
    return [(a, m, k, float(np.exp(mu))) for (a, m, k), mu in zip(rows, model.mean(rows))]


def _next(problem: Problem, state: _State, model: ThroughputModel, taken: set) -> Proposal | None:
    rows, p_run = state.candidates
    keep = [i for i, (a, m, k) in enumerate(rows) if (a.stage, a.offload, m, k) not in taken]
    rows = [rows[i] for i in keep]
    p_run = p_run[keep] if len(keep) else np.zeros(0)
    if not rows:
        return None
    explored = {o.arm for o in state.finished} | {o.arm for o in state.running} | {(p[0], p[1]) for p in taken}
    if problem.explicit:
        # The stages the user listed are each measured once: at the size expected to run fastest.
        fresh = [i for i, (a, _, _) in enumerate(rows) if a.key not in explored and a.offload == ""]
        if fresh:
            return _best_run([rows[i] for i in fresh], p_run[fresh], model, "a stage you listed", problem.sizes)
    if problem.sizes:
        # Sizes the user listed are each measured at every stage explored, as DeepSpeed does.
        listed = [i for i, (a, _, _) in enumerate(rows) if a.key in explored and not a.offload]
        if listed:
            i = min(listed, key=lambda i: (rows[i][0].stage, problem.sizes.index(rows[i][1]) if rows[i][1] in problem.sizes else 0))
            a, m, k = rows[i]
            return Proposal(stage=a.stage, offload=a.offload, mbs=m, knobs=k, why="a size you listed")
    if not state.ok and not state.running and not taken:
        # DeepSpeed's order: the lowest stage that runs communicates least.
        lowest = min((a.key for (a, _, _), p in zip(rows, p_run) if p >= 0.5), default=None)
        first = [i for i, (a, _, _) in enumerate(rows) if a.key == lowest] or list(range(len(rows)))
        return _best_run([rows[i] for i in first], p_run[first], model, "the size expected to run fastest", problem.sizes)
    if not state.ok:
        # Waiting for the first result: the best guess of an arm not tried yet, else a smaller size.
        busy = {(o.stage, o.offload) for o in state.running} | {(p[0], p[1]) for p in taken}
        sizes = [o.mbs for o in state.running] + [p[2] for p in taken]
        other = [i for i, (a, _, _) in enumerate(rows) if a.key not in busy]
        if not other:
            other = [i for i, (_, m, _) in enumerate(rows) if m <= 0.7 * min(sizes)] if sizes else []
        if not other:
            return None
        return _best_run([rows[i] for i in other], p_run[other], model, "while the first results are pending")
    # The best so far counts the experiments under way (running, or proposed in this batch) at
    # the model's mean, as the model does: else every proposal of a batch would be measured
    # against the first results alone, and a batch for many slots would crowd one curve.
    # A set, not sorted: one knob's values may mix types (5e8, "auto"), and a max needs no order.
    measured = list({o.config for o in state.ok} | {o.config for o in state.running} | taken)
    incumbent = float(np.max(model.mean([(problem.arm((c[0], c[1])), c[2], c[3]) for c in measured])))  # type: ignore[misc]
    gain = p_run * model.expected_improvement(rows, incumbent + MARGIN)
    cost = p_run * state.seconds_ok + (1.0 - p_run) * state.seconds_failed
    i = int(np.argmax(gain / cost))
    if gain[i] < MIN_GAIN:
        return None
    a, m, k = rows[i]
    return Proposal(stage=a.stage, offload=a.offload, mbs=m, knobs=k, why=f"expected gain {gain[i]:.1%}")


def _best_run(rows: list[tuple[Arm, int, Knobs]], p_run: np.ndarray, model: ThroughputModel, why: str,
              sizes: tuple[int, ...] | None = None) -> Proposal:
    """The run expected to measure fastest; with the user's list of ``sizes``, the first listed
    that is likely to run, in the user's order as DeepSpeed does."""
    likely = [i for i, (_, m, _) in enumerate(rows) if p_run[i] >= 0.5]
    if sizes and likely:
        i = min(likely, key=lambda i: sizes.index(rows[i][1]) if rows[i][1] in sizes else len(sizes))
    else:
        i = int(np.argmax(p_run * np.exp(model.mean(rows))))
    a, m, k = rows[i]
    return Proposal(stage=a.stage, offload=a.offload, mbs=m, knobs=k, why=why)
