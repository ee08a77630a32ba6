from __future__ import annotations

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import Phase
from optuna_ds.domain import was_pruned


class TunerEarlyStopping:
    """``tuner_early_stopping`` and ``tuner_num_trials``: the knob search's budget, which the
    planner's knob candidates check before any setting is proposed, so no trial is created for
    an experiment that will not run (a pruner, asked by a trial once created, left a pruned
    trial each time the planner asked again, and the planner asked again for ever).

    The search of a study is over once ``patience`` trials of the counted phase have finished
    without improving on the study's best, or once ``max_trials`` of them were started.
    Everything is read from the storage, so the rule holds across workers.

    Args:
        patience: finished trials without improvement that end the search.
        max_trials: trials of the counted phase that may be started in all.
        phase: the phase of the trials that count (as their records say); ``None`` counts all.
        min_improvement: the share by which a trial must beat the best for an improvement (the
            measurement noise): a gain within what one run can tell does not prolong the search.
    """

    def __init__(self, patience: int, *, max_trials: int | None = None, phase: Phase | None = None,
                 min_improvement: float = 0.0) -> None:
        self._patience = patience
        self._max_trials = max_trials
        self._min_improvement = min_improvement
        self._phase = phase

    def _counts(self, trial: FrozenTrial) -> bool:
        # A re-measurement (the planner's, of a setting that ran) is not a trial of the search,
        # nor is an interrupted one (Ctrl-C, a dead worker, a script failing whatever the config):
        # its experiment runs again.
        record = ExperimentRecord.from_trial(trial)
        interrupted = trial.state == TrialState.FAIL and (record.reason is None or not record.reason.judges_config)
        return (self._phase is None or record.phase is self._phase) and not record.repeat and not interrupted

    def exhausted(self, study: optuna.Study, *, pending: int = 0) -> bool:
        """Whether the search is over; ``pending`` trials of the counted phase are about to be
        started (handed to slots, not yet in the storage): they count against ``max_trials``."""
        trials = study.get_trials(deepcopy=False)
        # A run the pruner ended ran (and did not improve); a claim that stood down ran nothing.
        counted = [t for t in trials if self._counts(t) and (t.state != TrialState.PRUNED or was_pruned(t))]
        if self._max_trials is not None and len(counted) + pending >= self._max_trials:
            return True
        maximize = study.direction == StudyDirection.MAXIMIZE
        best: float | None = None
        since = 0
        finished = sorted(
            (t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL) or was_pruned(t)),
            key=lambda t: (t.datetime_complete or t.datetime_start, t.number),
        )
        # The bar is the best value seen, lucky runs included: a bar held at the last counted
        # improvement is beaten by noise alone (one run in six by one standard deviation), and
        # each such run would prolong the search.
        step = 1.0 + self._min_improvement
        for t in finished:
            value = t.value if t.state == TrialState.COMPLETE else None
            improved = value is not None and (best is None or (value > best * step if maximize else value * step < best))
            if value is not None and (best is None or (value > best if maximize else value < best)):
                best = value
            if improved:
                since = 0
            elif self._counts(t):
                since += 1
        return since >= self._patience
