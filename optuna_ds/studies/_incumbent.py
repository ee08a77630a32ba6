"""The pruner of a stage study: a run clearly below the incumbent ends while it runs (docs/steps.md)."""
from __future__ import annotations

import dataclasses
import math
import statistics

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds._optuna_compat import storage_of
from optuna_ds._optuna_compat import trial_id
from optuna_ds.domain import Config
from optuna_ds.domain import ExperimentRecord
from optuna_ds.launcher import profile_window
from optuna_ds.planner import Priors
from optuna_ds.planner import measured_noise

# A run is judged once this many steps of its profiled window are logged (docs/steps.md).
_MIN_STEPS = 2
# The rise of a window's step figures, first to last, that marks it still warming up: the
# still-falling rule's share (launcher/_steps.py), seen from the figures.
_RISING = 0.10


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Why a run is below the incumbent beyond the noise: its fastest logged step's figure
    (``best``) below ``bar``, the incumbent's mean shrunk by a straggler's range and
    ``straggler_z`` noise deviations; ``figure`` the median of its logged steps, ``steps`` how many."""

    figure: float
    best: float
    steps: int
    incumbent: float
    bar: float
    noise: float

    def attrs(self) -> dict[str, float]:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}


class IncumbentPruner(optuna.pruners.BasePruner):
    """Prunes a run of a stage study whose profiled steps so far are clearly below the study's
    incumbent: even its fastest step is below the incumbent's mean by more than one-sided,
    heavy-tailed noise explains (a straggler's range, ``Priors.straggler_range``, and
    ``Priors.straggler_z`` deviations of the study's measured run-to-run noise, the planner's
    own figure). Only steps of the trial's profiled window count, once at least two are logged
    and their figures are not still rising (a run still warming up is never judged); a
    re-measurement (``repeat``) is never pruned. The incumbent is the best mean of the study's
    completed configs; without one nothing is pruned. Rationale: docs/steps.md.

    The intermediate values are the figures of the run's steps (``trial.report`` at each global
    step, in the study's direction).
    """

    def __init__(self, *, priors: Priors = Priors()) -> None:
        self._priors = priors

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        return self.verdict(study, trial) is not None

    def verdict(self, study: optuna.Study, trial: FrozenTrial) -> Verdict | None:
        """Why ``trial`` is to be pruned, or ``None`` where it runs on. Its record is read from
        the storage: ``Trial.should_prune`` passes the trial as its ``Trial`` object last saw it,
        without the attrs written to the storage directly (the claim, in one transaction)."""
        trial = storage_of(study).get_trial(trial_id(trial))
        record = ExperimentRecord.from_trial(trial)
        if record.repeat or record.ds_config is None:
            return None
        start, end = profile_window(record.ds_config)
        window = [v for step, v in sorted(trial.intermediate_values.items()) if start <= step <= end and v > 0]
        if len(window) < _MIN_STEPS:
            return None
        maximize = study.direction == StudyDirection.MAXIMIZE
        rates = [v if maximize else 1.0 / v for v in window]
        if rates[-1] > rates[0] * (1.0 + _RISING):
            return None  # still warming up: its later steps may be its speed
        runs: dict[Config, list[float]] = {}
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            config = ExperimentRecord.from_trial(t).config
            if config is not None and t.value is not None and math.isfinite(t.value) and t.value > 0 and t.number != trial.number:
                runs.setdefault(config, []).append(t.value if maximize else 1.0 / t.value)
        if not runs:
            return None
        incumbent = max(statistics.fmean(v) for v in runs.values())
        noise = measured_noise(runs.values(), priors=self._priors)[0]
        bar = incumbent * math.exp(-(self._priors.straggler_range + self._priors.straggler_z * noise))
        best = max(rates)
        if best >= bar:
            return None

        def back(rate: float) -> float:
            return rate if maximize else 1.0 / rate

        return Verdict(figure=back(statistics.median(rates)), best=back(best), steps=len(window), incumbent=back(incumbent),
                       bar=back(bar), noise=noise)
