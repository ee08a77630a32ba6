from __future__ import annotations

import dataclasses

from optuna_ds.reporting._headline import Budget
from optuna_ds.reporting._headline import budget_lines
from optuna_ds.reporting._headline import mean_of
from optuna_ds.reporting._notes import stage_notes
from optuna_ds.reporting._tables import runs_table
from optuna_ds.studies import TuningResult


@dataclasses.dataclass(frozen=True)
class PartialSummary:
    """An interrupted tuning's summary: ``head`` (what the report's headline shows), ``text``
    (summary.txt) and ``markdown`` (optuna-dashboard's note)."""

    head: tuple[str, ...]
    body: tuple[str, ...]
    notes: tuple[str, ...] = ()  # the body's notes, the report's list under its table

    @property
    def text(self) -> str:
        return "\n".join([*self.head, "", *self.body]) + "\n"

    @property
    def markdown(self) -> str:
        return "\n\n".join(self.head) + "\n\n" + "\n".join(self.body) + "\n"


def partial_summary(result: TuningResult, *, finished: int, resume: str, budget: Budget | None = None) -> PartialSummary:
    """What an interrupted tuning leaves, marked partial at the top: the best measured so far,
    DeepSpeed's table, the stages' notes.

    The planner's verdicts (the optimum, a stage skipped for no expected gain) are made when its
    search ends: an interrupted tuning claims none of them, and writes no optimal config.
    """
    metric, best, base, spend = result.metric, result.best, result.baseline, result.spend
    cut = result.num_experiments - finished
    done = f"{finished} experiment(s)" + (f" finished and {cut} cut short, which run again" if cut > 0 else "")
    head = [f"PARTIAL: interrupted after {done}; {resume}.",
            "No optimal config yet: the planner chooses it when its search ends."]
    head.append(f"Best so far ({best.name}): {best.figure(metric)}." if best is not None
                else "Best so far: none, no experiment finished successfully.")
    if base is not None and base.value is not None:
        head.append(f"Your config ({base.name}): {metric.with_unit(base.value)}{mean_of(base.runs)}.")
    head.append(f"Spent so far: {spend.hours}.")
    head += budget_lines(result, budget)
    notes = stage_notes(result)
    return PartialSummary(head=tuple(head), body=(runs_table(result), *(("", *notes) if notes else ())), notes=tuple(notes))
