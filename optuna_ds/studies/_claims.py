"""The claims on a stage study's experiments: which of the trials that ask for one runs it, and
the trials of dead workers failed so that their experiments run again."""
from __future__ import annotations

import time

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.config import Metric
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import Phase
from optuna_ds.domain import given_up
from optuna_ds.domain import is_finished_experiment
from optuna_ds.studies._observer import TuningObserver
from optuna_ds.studies._owner import fail_orphaned_trials

CLAIM_WAIT_SECONDS = 10.0  # a claimant waits this long for an earlier one's fate; a trial unclaimed longer lost its process
_REAP_SECONDS = 2.0


def running(trials: list[FrozenTrial], phase: Phase) -> list[FrozenTrial]:
    """The running trials of ``phase`` that claimed their experiment."""
    # A claimed record has all its claim's attrs (ExperimentRecord writes exp_name last).
    return [t for t in trials if t.state == TrialState.RUNNING
            and (r := ExperimentRecord.from_trial(t)).phase is phase and r.claimed]


def competitor(study: optuna.Study, trial: optuna.Trial, name: str, *, timeout: float | None = None) -> FrozenTrial | None:
    """Another trial of ``study`` that has experiment ``name``, so ``trial`` must stand down;
    ``None`` if ``trial`` may run it. A run of it that timed out under a shorter trial timeout
    than ``timeout`` is no result (:func:`is_finished_experiment`): it may run again.

    Called after ``trial`` published its claim (``exp_name``), so of two simultaneous claimants
    at least one sees the other. A claimant yields to a finished or launched competitor and to a
    later-numbered one; it waits for the fate of an earlier-numbered one still claiming. So never
    two run one experiment, and never both stand down.
    """
    deadline = time.monotonic() + CLAIM_WAIT_SECONDS
    while True:
        trials = study.get_trials(deepcopy=False)
        dead = given_up(trials)
        if name in dead:
            return dead[name]
        undecided = None
        for t in trials:
            record = ExperimentRecord.from_trial(t)
            if t.number == trial.number or record.exp_name != name:
                continue
            if is_finished_experiment(t, timeout=timeout):
                return t
            if t.state == TrialState.RUNNING:
                if t.number > trial.number or record.launched:
                    return t
                undecided = t
        if undecided is None:
            return None
        if time.monotonic() > deadline:
            return undecided
        time.sleep(0.05)


class Reaper:
    """Fails the trials of a stage study's dead workers, at most every ``_REAP_SECONDS``."""

    def __init__(self, study: optuna.Study, *, stage: int, metric: Metric, observer: TuningObserver) -> None:
        self._study = study
        self._stage = stage
        self._metric = metric
        self._observer = observer
        self._reaped = 0.0

    def reap(self, *, force: bool = False) -> None:
        """Fail the trials of dead workers, their experiments not run (the planner decides whether
        they run again): at once for a process of this host, after the heartbeat's grace period
        for one elsewhere."""
        now = time.monotonic()
        if not force and now - self._reaped < _REAP_SECONDS:
            return
        self._reaped = now
        completed, failed, unclaimed = fail_orphaned_trials(self._study, metric=self._metric)
        for number in completed:
            self._observer.log(f"[z{self._stage}] trial {number}: its process died, but its experiment finished: result kept")
        for number in failed:
            self._observer.log(f"[z{self._stage}] trial {number}: its process died; its experiment counts as not run")
        for number in unclaimed:
            self._observer.log(f"[z{self._stage}] trial {number}: its process died before it claimed an experiment; it launched nothing")
        optuna.storages.fail_stale_trials(self._study)
