"""Our own summary as the terminal, ``optuna_ds_summary.txt`` and optuna-dashboard's note show it:
the headline, the table, the notes."""

from __future__ import annotations


from optuna_ds.studies import TuningResult
from optuna_ds.reporting._configs import LearningRateAdvice
from optuna_ds.reporting._headline import Budget
from optuna_ds.reporting._headline import headline
from optuna_ds.reporting._notes import optuna_best_note
from optuna_ds.reporting._notes import summary_notes
from optuna_ds.reporting._tables import runs_table


def summary_text(result: TuningResult, *, advice: LearningRateAdvice | str | None, budget: Budget | None = None) -> str:
    """Our own summary (``optuna_ds_summary.txt``, the terminal's): the headline, each space's
    best config with its mean and runs, then the notes."""
    notes = summary_notes(result, advice)
    return "\n".join([*headline(result, budget), "", runs_table(result), "", *notes]) + "\n"


def summary_markdown(result: TuningResult, *, advice: LearningRateAdvice | str | None, budget: Budget | None = None) -> str:
    """The summary as optuna-dashboard's note renders it: first what the dashboard's own figures
    get wrong (its "Best Trial" is one run, unformatted; a parameter that never changed gets an
    importance), then the headline, the table, the notes."""
    first = [f"**Read first:** {line}" for line in dashboard_caveats(result)]
    head = "\n\n".join(f"**{line}**" if i == 0 else line for i, line in enumerate(headline(result, budget)))
    notes = [n for n in summary_notes(result, advice) if n != optuna_best_note(result)]
    listed = [f"- {n}" for n in notes]
    lines = [*(f"{line}\n" for line in first), head, "", runs_table(result), "", *listed]
    return "\n".join(lines) + "\n"


def dashboard_caveats(result: TuningResult) -> list[str]:
    """What optuna-dashboard shows that is not this tuning's answer: its best trial, where it is
    not the optimum, the importance of an accumulation that never changed, and the trials it
    shows failed that were interrupted."""
    lines = [note] if (note := optuna_best_note(result)) else []
    if result.interrupted:
        cut = ", ".join(f"z{stage} trial {number} ({name})" for stage, number, name in result.interrupted)
        lines.append(f"{cut}: shown as Fail, but interrupted (a signal, or a worker lost), which is no failure: an "
                     "interrupted experiment runs again when the tuning resumes.")
    accumulations = {m.config.accumulation for m in result.measured}
    if len(accumulations) == 1 and len(result.measured) > 1:
        lines.append(f"gradient_accumulation_steps was {accumulations.pop()} in every experiment: its importance in the "
                     f"dashboard (0) says nothing of it.")
    return lines
