"""The width of a batch: what slots that would sit idle while others run are worth.

The sequential search launches an experiment while it is expected to gain ``min_gain``: at that
bar one run pays for its GPU-seconds by the training's. A slot free while others run is another
matter: an experiment started there costs GPU-seconds but no wall time, and if its result is one
the search would have waited for later, it saves a round of the tuning's wall time. So such a
slot takes the best candidate while its expected gain per second (per run of the usual length)
is at least ``batch_gain``, a bar below ``min_gain`` that is lower the more a wall-second is
worth in GPU-seconds -- but only while the tuning goes on anyway: when every experiment under
way is past half its run and the sequential search wants nothing more, their results end the
search, and a member started then would end a whole run after them.

With one slot nothing runs when the planner is asked, so none of this acts: the tuning is the
sequential search, decision by decision.
"""

from __future__ import annotations

import numpy as np

from optuna_ds.domain import Config
from optuna_ds.planner._problem import Arm
from optuna_ds.planner._problem import Knobs
from optuna_ds.planner._problem import Proposal
from optuna_ds.planner._state import State
from optuna_ds.planner._surrogate import ThroughputModel

Row = tuple[Arm, int, Knobs]  # a config as the model takes it
Point = tuple[Arm, int, Knobs, float]  # ...with its measured (or believed) score

_WHY = "a slot free while others run"


def remeasuring(state: State) -> bool:
    """Whether a config that ran is running again. The noise is measured on the best so far
    while other experiments run (every later decision weighs gains against it), once at a time."""
    finished = {o.config for o in state.finished}
    return any(o.config in finished for o in state.running)


def _seconds(state: State, model: ThroughputModel, rows: list[Row]) -> np.ndarray:
    """The expected seconds of a run of each row. DeepSpeed's autotuning runs a fixed number of
    steps, so a run takes a start-up plus the steps times the micro-batch over the throughput:
    fitted to the runs that finished where they tell both apart, else the usual run."""
    usual = np.full(len(rows), state.seconds_ok)
    runs = np.array([(o.mbs / o.score, o.seconds) for o in state.ok if o.seconds and o.score])
    if len(runs) < 3 or np.ptp(runs[:, 0]) <= 0 or not len(rows):
        return usual
    slope, start = np.polyfit(runs[:, 0], runs[:, 1], 1)
    if slope <= 0:
        return usual
    sizes = np.array([m for _, m, _ in rows], dtype=float)
    return np.asarray(np.maximum(start, 0.0) + slope * sizes / np.exp(model.mean(rows)))


def _left(state: State, model: ThroughputModel, proposals: list[Proposal]) -> float:
    """The expected seconds until the last experiment under way ends (one running of unknown
    age counts as just started; one proposed now, as starting)."""
    rows = [(state.arm(o.arm, o.knobs), o.mbs, o.knobs) for o in state.running] + [
        (state.arm((p.stage, p.offload), p.knobs), p.mbs, p.knobs) for p in proposals]
    ran = np.array([o.seconds or 0.0 for o in state.running] + [0.0] * len(proposals))
    return float(np.max(_seconds(state, model, rows) - ran, initial=0.0))


def widen(state: State, model: ThroughputModel, proposals: list[Proposal], *, slots: int) -> list[Proposal]:
    """Experiments for up to ``slots`` slots that would sit idle while others run (see the module).

    First every ZeRO stage likely to fit that no experiment measured or has under way, at the
    size expected to run fastest: the prior holds a stage's scale only within 6-15% of its
    neighbour's and one run settles it, which the expected improvement, measured against a best
    so far that counts what runs, undervalues. (An offload variant runs at 0.25-0.9x of its
    stage: the expected improvement sees where memory makes one pay.) Then the candidates of
    highest expected gain per second, with every experiment under way counted as measured at the
    model's mean, or at the best measured where that is lower: a speculative experiment (a far
    size, a stage not yet measured) does not raise the bar every other candidate must clear.

    Fantasies only lower a candidate's expected improvement (the best so far rises, the spread
    narrows), so a value computed earlier bounds it: after each addition only the candidates
    whose bound could still win are brought up to date (lazy greedy), about one model fit per
    member.
    """
    problem, settings = state.problem, state.settings
    # At most half the launches not yet finished under way at once: the rest is for what their
    # results call for.
    slots = min(slots, (problem.max_experiments - len(state.finished)) // 2 - len(state.running) - len(proposals))
    if slots <= 0:
        return []
    taken = {p.config for p in proposals}
    measured = [o.config for o in state.ok]

    def at(configs: list[Config]) -> list[Row]:
        return [(state.arm(c.arm, c.knobs), c.micro_batch, c.knobs) for c in configs]

    def incumbent(model: ThroughputModel) -> Row:
        rows = at(measured)
        return rows[int(np.argmax(model.mean(rows)))]

    def ready(rows: list[Row], p_run: np.ndarray) -> tuple[list[Row], np.ndarray, np.ndarray, np.ndarray]:
        """The rows not taken that may end in time, their chance to run, their gain and their
        rate (per second, in gain per run of the usual length: a run likely to fail ends sooner)."""
        keep = [i for i, (a, m, k) in enumerate(rows) if problem.config(a, m, k) not in taken]
        rows, p_run = [rows[i] for i in keep], p_run[keep]
        if not rows:
            return [], np.zeros(0), np.zeros(0), np.zeros(0)
        # A member may end at most ``priors.late`` of its run after the last experiment under way: later, it
        # would lengthen a tuning whose search those end.
        seconds = _seconds(state, model, rows)
        fits = seconds - _left(state, model, proposals) <= settings.priors.late * seconds
        rows, p_run, seconds = [r for r, f in zip(rows, fits) if f], p_run[fits], seconds[fits]
        if not rows:
            return [], np.zeros(0), np.zeros(0), np.zeros(0)
        gain = np.asarray(p_run * model.knowledge_gradient(rows, incumbent(model)))
        return rows, p_run, gain, state.seconds_ok / (p_run * seconds + (1.0 - p_run) * state.seconds_failed)

    rows, p_run, gain, rate = ready(*state.candidates)
    if not len(gain) or np.max(gain) < settings.min_gain:
        # The sizes are settled: the knob settings fill the slots, as the sequential search takes them.
        rows, p_run, gain, rate = ready(*state.knob_rows(model))
    if not len(gain) or np.max(gain) < settings.min_gain:
        return []  # nothing would be worth a launch even with nothing under way

    def gains(idx: np.ndarray) -> np.ndarray:
        return np.asarray(p_run[idx] * model.knowledge_gradient([rows[i] for i in idx], incumbent(model)))

    best = float(np.max(model.mean(at(measured))))

    def believed(points: list[Row]) -> list[Point]:
        return [(a, m, k, float(np.exp(min(mu, best)))) for (a, m, k), mu in zip(points, model.mean(points))] if points else []

    pending = list({o.config for o in state.running} | taken)
    measured += pending
    model = model.conditioned(believed(at(pending)))
    bound = gain * rate
    added: list[Proposal] = []

    def add(j: int, why: str) -> None:
        nonlocal model
        a, m, k = rows[j]
        added.append(Proposal(config=problem.config(a, m, k), why=f"{_WHY}: {why}"))
        bound[j] = -np.inf
        measured.append(problem.config(a, m, k))
        model = model.conditioned(believed([rows[j]]))

    explored = {o.arm for o in state.finished} | {o.arm for o in state.running} | {(p.stage, p.offload) for p in proposals}
    for arm in state.problem.arms:
        likely = np.array([i for i, (a, _, _) in enumerate(rows) if a.key == arm.key and p_run[i] >= 0.5], dtype=int)
        if len(added) < slots and not arm.offload and arm.key not in explored and len(likely):
            add(int(likely[np.argmax(p_run[likely] * np.exp(model.mean([rows[i] for i in likely])))]), "a stage not measured yet")
    chunk = settings.priors.chunk  # candidates whose value is brought up to date at once
    while len(added) < slots:
        order = np.argsort(-bound)
        top = order[:chunk][bound[order[:chunk]] >= settings.batch_gain]
        if not len(top):
            break
        gain[top] = gains(top)
        bound[top] = gain[top] * rate[top]
        j = int(top[np.argmax(bound[top])])
        rest = order[chunk:]
        if bound[j] >= settings.batch_gain and not (len(rest) and bound[j] < bound[rest[0]]):
            add(j, f"may raise the choice {gain[j]:.1%}")
    return added
