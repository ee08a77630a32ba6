from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from optuna_ds.planner._problem import Observation
from optuna_ds.planner._problem import Proposal
from optuna_ds.planner._problem import Status
from optuna_ds.planner._surrogate import ThroughputModel

if TYPE_CHECKING:
    from optuna_ds.planner._planner import _State

_CHUNK = 16  # candidates whose value is brought up to date at once


def under_way(proposals: list[Proposal]) -> list[Observation]:
    """Proposals as running experiments, just started."""
    return [Observation(stage=p.stage, mbs=p.mbs, offload=p.offload, knobs=p.knobs, status=Status.RUNNING, repeat=p.repeat,
                        seconds=0.0) for p in proposals]


def remeasuring(state: _State) -> bool:
    """Whether a config that ran is running again. The noise is measured on the best so far
    while other experiments run (a slot would sit idle, and every later decision weighs gains
    against it), but once at a time."""
    finished = {o.config for o in state.finished}
    return any(o.config in finished for o in state.running)


_LATE = 0.5  # of the usual run: an experiment running this long is in its round's second half


def _late(state: _State, proposals: list[Proposal]) -> bool:
    """Whether every experiment under way has run half the usual run or more: a member started
    now ends that long after them, and if their results end the search (the sequential search
    wants nothing more now), it only lengthens the tuning. Running experiments of unknown age
    count as just started."""
    return not proposals and all(o.seconds is not None and o.seconds >= _LATE * state.seconds_ok for o in state.running)


def widen(state: _State, model: ThroughputModel, proposals: list[Proposal], *, slots: int) -> list[Proposal]:
    """Experiments for up to ``slots`` slots that would sit idle while others run: the sequential
    search stopped (nothing is expected to gain ``min_gain``), yet an experiment started now
    costs no wall time, and one whose result the search would have waited for later saves a
    round of it. Each is the untried config of highest expected gain per second, as the
    sequential search ranks them, with every experiment under way (running, or proposed in this
    batch) counted as measured at the model's mean; added while that is at least
    :attr:`~optuna_ds.planner.PlannerSettings.batch_gain`.

    Fantasies only lower a candidate's expected improvement (the best so far rises, the spread
    narrows), so a value computed earlier bounds it: only the candidates whose bound could still
    win are brought up to date after each addition (lazy greedy), and a batch for many slots
    costs about one model fit per member.
    """
    problem, settings = state.problem, state.settings
    rows, p_run = state.candidates
    taken = {p.config for p in proposals}
    keep = [i for i, (a, m, k) in enumerate(rows) if (a.stage, a.offload, m, k) not in taken]
    if not keep or slots <= 0:
        return []
    rows = [rows[i] for i in keep]
    p_run = p_run[keep]
    # Per second, in gain per run of the usual length: a run likely to fail ends sooner.
    rate = state.seconds_ok / (p_run * state.seconds_ok + (1.0 - p_run) * state.seconds_failed)
    measured = [o.config for o in state.ok]

    def gains(idx: np.ndarray) -> np.ndarray:
        incumbent = float(np.max(model.mean([(problem.arm((c[0], c[1])), c[2], c[3]) for c in measured])))  # type: ignore[misc]
        return p_run[idx] * model.expected_improvement([rows[i] for i in idx], incumbent + settings.margin)

    gain = gains(np.arange(len(rows)))
    if np.max(gain) < settings.min_gain or _late(state, proposals):
        return []
    # What is under way counts as measured at the model's mean, or at the best measured where
    # that is lower: a speculative experiment (a far size, a stage not measured) does not raise
    # the bar every other candidate must clear before it has run.
    best = float(np.max(model.mean([(problem.arm((c[0], c[1])), c[2], c[3]) for c in measured])))  # type: ignore[misc]
    measured = list(set(measured) | {o.config for o in state.running} | taken)
    pending = [(problem.arm((c[0], c[1])), c[2], c[3]) for c in {o.config for o in state.running} | taken]

    def believed(rows_: list) -> list:
        return [(a, m, k, float(np.exp(min(mu, best)))) for (a, m, k), mu in zip(rows_, model.mean(rows_))] if rows_ else []

    fantasy = state.points() + believed(pending)
    model = ThroughputModel(problem, state.memory, fantasy)
    bound = gain * rate
    added: list[Proposal] = []

    def add(j: int, why: str) -> None:
        nonlocal model
        a, m, k = rows[j]
        added.append(Proposal(stage=a.stage, offload=a.offload, mbs=m, knobs=k, why=why))
        bound[j] = -np.inf
        measured.append((a.stage, a.offload, m, k))
        fantasy.extend(believed([rows[j]]))
        model = ThroughputModel(problem, state.memory, fantasy)

    # Every ZeRO stage likely to fit, once, at the size expected to run fastest: the prior holds
    # a stage's scale only within 6-15% of its neighbour's, and one run settles it, which the
    # expected improvement, measured against a best so far that counts what runs, undervalues.
    # (An offload variant runs at 0.25-0.9x of its stage: the expected improvement sees where
    # memory makes one pay.)
    explored = {o.arm for o in state.finished} | {o.arm for o in state.running} | {(p.stage, p.offload) for p in proposals}
    for arm in problem.arms:
        likely = np.array([i for i, (a, _, _) in enumerate(rows) if a.key == arm.key and p_run[i] >= 0.5], dtype=int)
        if len(added) >= slots or arm.offload or arm.key in explored or not len(likely):
            continue
        add(int(likely[np.argmax(p_run[likely] * np.exp(model.mean([rows[i] for i in likely])))]),
            "a slot free while others run: a stage not measured yet")
    while len(added) < slots:
        order = np.argsort(-bound)
        top = order[:_CHUNK]
        top = top[bound[top] >= settings.batch_gain]
        if not len(top):
            break
        gain[top] = gains(top)
        bound[top] = gain[top] * rate[top]
        j = int(top[np.argmax(bound[top])])
        rest = order[_CHUNK:]
        if bound[j] < settings.batch_gain or (len(rest) and bound[j] < bound[rest[0]]):
            continue  # a candidate not brought up to date may be worth more
        add(j, f"a slot free while others run: expected gain {gain[j]:.2%}")
    return added
