"""Experiments handed out through the storage: the tuning's decider queues each as a WAITING
trial of its stage study (Optuna's queued trials), and a free slot of any process pops one
(WAITING to RUNNING, which the storage grants to one caller only) and runs it on that trial."""
from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds._optuna_compat import storage_of
from optuna_ds._optuna_compat import take_waiting_trial
from optuna_ds._optuna_compat import trial_id
from optuna_ds.domain import Config
from optuna_ds.planner import Proposal

HANDED = "handed"  # the user attr of a queued trial: the proposal, the order and who decided it


def hand_out(study: optuna.Study, proposal: Proposal, *, order: int, by: dict[str, Any], to: str | None = None) -> None:
    """Queue ``proposal`` on ``study`` for a free slot of the process ``to`` (its
    :attr:`Peers.key`; ``None``: any process's); ``order``: slots take the lowest first."""
    handed = {"config": proposal.config.to_attrs(), "repeat": proposal.repeat, "why": proposal.why, "order": order, "by": by,
              "to": to}
    study.enqueue_trial({}, user_attrs={HANDED: handed})


def handed(trial: FrozenTrial) -> Proposal | None:
    """The proposal a queued trial carries; ``None`` for a trial nobody handed out."""
    value = trial.user_attrs.get(HANDED)
    if not isinstance(value, dict) or not isinstance(value.get("config"), dict):
        return None
    config = Config.from_attrs(value["config"])
    if config is None:
        return None
    return Proposal(config=config, repeat=int(value.get("repeat") or 0), why=str(value.get("why") or ""))


def addressee(trial: FrozenTrial) -> str | None:
    """The process a queued trial was handed to (``None``: any)."""
    value = trial.user_attrs.get(HANDED)
    to = value.get("to") if isinstance(value, dict) else None
    return to if isinstance(to, str) else None


def order_of(trial: FrozenTrial) -> tuple[int, int]:
    """A queued trial's place in the queue: its decider's order, then its number."""
    value = trial.user_attrs.get(HANDED)
    order = value.get("order") if isinstance(value, dict) else None
    return (order if isinstance(order, int) else 0, trial.number)


def waiting(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The queued trials among ``trials`` that carry a proposal, in queue order."""
    return sorted((t for t in trials if t.state == TrialState.WAITING and handed(t) is not None), key=order_of)


def pop(study: optuna.Study, trial: FrozenTrial, *, worker: dict[str, Any]) -> optuna.Trial | None:
    """Take the queued ``trial`` (now RUNNING, ``worker``'s: the taking process's identity, in
    the same write); ``None`` where another took it."""
    if not take_waiting_trial(storage_of(study), trial_id(trial), {"worker": worker}):
        return None
    study.get_trials(deepcopy=False)  # a cache of the storage reads it again: RUNNING, as ``tell`` expects
    return optuna.Trial(study, trial_id(trial))
