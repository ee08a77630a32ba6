"""A run's steps reported to its trial as the engine logs them, and the study's pruner asked
whether to end it (docs/steps.md, "Pruned runs")."""
from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import optuna

from optuna_ds._optuna_compat import storage_of
from optuna_ds._optuna_compat import trial_id
from optuna_ds.config import Metric
from optuna_ds.domain import Experiment
from optuna_ds.launcher import Judge
from optuna_ds.launcher import profile_window
from optuna_ds.launcher import step_time_ms
from optuna_ds.studies._incumbent import IncumbentPruner
from optuna_ds.studies._incumbent import Verdict
from optuna_ds.space import autotp_size
from optuna_ds.storage import database_error


@dataclasses.dataclass
class LiveReport:
    """What one trial reported while its launches ran: each step's figure by global step, and
    the pruner's verdict where it ended a launch."""

    figures: dict[int, float] = dataclasses.field(default_factory=dict)
    verdict: Verdict | None = None
    left: int = 0  # where it pruned: the steps its window had left, its exit step counted
    step_s: float = 0.0  # ...and the median of its logged steps' seconds

    def pruned_attrs(self) -> dict[str, Any] | None:
        """The record's ``pruned``: the verdict, its figure the median of the steps logged, and
        the seconds its steps left would have taken at their pace (``saved_s``: what it saved,
        the time from the run's last logged step to its end aside)."""
        if self.verdict is None:
            return None
        return {**self.verdict.attrs(), "steps_left": self.left, "saved_s": round(self.left * self.step_s, 3)}

    def reason(self, metric: Metric) -> str:
        v = self.verdict
        assert v is not None
        return (f"pruned after {v.steps} profiled step(s): its fastest at {metric.with_unit(v.best)}, below "
                f"{metric.with_unit(v.bar)}, the incumbent's {metric.with_unit(v.incumbent)} less what a straggler "
                f"and the noise ({v.noise:.1%}) explain")


def live_judge(trial: optuna.Trial, experiment: Experiment, *, metric: Metric, report: LiveReport,
               protected: bool) -> Judge | None:
    """The runner's judge of a launch of ``experiment`` for ``trial``: each profiled step it
    logs is reported (``trial.report``, its figure from its time as the engine computes the
    throughput) and, unless ``protected`` (the user's config, a re-measurement), the study's
    pruner asked (``trial.should_prune``); a reason where it prunes. ``None`` for a metric other
    than the throughput, which a step's time alone gives. A database that fails meanwhile judges
    nothing: the run goes on (its steps are reported once it ended)."""
    if metric.key != "throughput":
        return None
    start, end = profile_window(experiment.ds_config)
    batch = experiment.ds_config.get("train_batch_size")
    if not isinstance(batch, int) or batch <= 0:
        return None
    size = autotp_size(experiment.ds_config)

    def judge(steps: Sequence[Mapping[str, float]]) -> str | None:
        try:
            return judged(steps)
        except Exception as e:  # noqa: BLE001 - a database's failure is not the run's: raised on otherwise
            if database_error(e) is None:
                raise
            return None

    def judged(steps: Sequence[Mapping[str, float]]) -> str | None:
        new = False
        for k, timers in enumerate(steps):
            step, ms = k + 1, step_time_ms(timers)  # the engine logs global step k + 1
            if start <= step <= end and step not in report.figures and ms > 0:
                figure = batch * 1000.0 / ms / size
                trial.report(figure, step)
                report.figures[step] = figure
                new = True
        if protected or not new or not trial.should_prune():
            return None
        pruner = trial.study.pruner
        if isinstance(pruner, IncumbentPruner):
            report.verdict = pruner.verdict(trial.study, storage_of(trial.study).get_trial(trial_id(trial)))
        if report.verdict is None:  # another pruner's, or no longer: the run goes on
            return None
        logged = [ms for k, timers in enumerate(steps) if start <= k + 1 <= end and (ms := step_time_ms(timers)) > 0]
        report.left, report.step_s = end + 1 - len(steps), statistics.median(logged) / 1000.0
        return report.reason(metric)

    return judge
