"""One read of a tuning from the storage: its experiments, its figures and the summary's lines,
which the HTML page and optuna-dashboard both show."""

from __future__ import annotations

import dataclasses
import os

import optuna
import plotly.graph_objects as go

from optuna_ds.config import Metric
from optuna_ds.domain import RootRecord
from optuna_ds.reporting._figures import figures
from optuna_ds.reporting._rows import ExperimentRow
from optuna_ds.reporting._rows import experiment_rows
from optuna_ds.reporting._rows import stage_studies
from optuna_ds.reporting._rows import visible_rows
from optuna_ds.reporting._headline import Budget
from optuna_ds.reporting._configs import LearningRateAdvice
from optuna_ds.reporting._headline import headline
from optuna_ds.reporting._notes import summary_notes
from optuna_ds.reporting._tables import runs_rows
from optuna_ds.storage import load_plan
from optuna_ds.studies import Optimum
from optuna_ds.studies import TuningResult


@dataclasses.dataclass(frozen=True)
class ReportData:
    """One read of a tuning's stage studies, and the figures made from it: the HTML report and
    optuna-dashboard show the same ones."""

    study_name: str
    metric: Metric
    studies: dict[int, optuna.Study]
    rows: list[ExperimentRow]
    figures: dict[str, go.Figure]
    title: str = ""
    headline: tuple[str, ...] = ()
    memory_note: str = ""
    baseline: str = ""  # the experiment that ran the user's own config
    best: Optimum | None = None
    summary_rows: tuple[tuple[str, ...], ...] = ()
    notes: tuple[str, ...] = ()


def load_report(storage: optuna.storages.BaseStorage, study_name: str, *, result: TuningResult,
                advice: LearningRateAdvice | str | None = None, budget: Budget | None = None) -> ReportData:
    metric, best, spend = result.metric, result.best, result.spend
    studies = stage_studies(storage, study_name)
    every = experiment_rows(studies, best)
    rows = visible_rows(every)
    root = RootRecord.from_attrs(optuna.load_study(study_name=study_name, storage=storage).user_attrs)
    base = result.baseline
    baseline = next((r for r in sorted(rows, key=lambda r: r.status != "complete")
                     if base is not None and base.name and r.name == base.name and r.stage == base.stage), None)
    drawn = figures(result, studies=studies, rows=rows, baseline=baseline, root=root,
                    cut=[r for r in every if r.status == "interrupted" and r.record.claimed])
    plan = load_plan(storage, study_name)
    script = os.path.basename(plan.script) if plan is not None else ""
    title = f"{script}: the fastest DeepSpeed config" + ("" if study_name == "optuna-ds" else f" (tuning {study_name})")
    memory_note = ""
    if not any(r.peak_memory for r in rows):
        memory_note = (f"Peak GPU memory per experiment: {(root.resources.gpu_memory if root.resources else '') or 'not reported'}."
                       if spend.device == "GPU" else f"Peak memory per experiment: not measured on this accelerator ({spend.noun}).")
    return ReportData(study_name=study_name, metric=metric, studies=studies, rows=rows, figures=drawn, title=title,
                      headline=tuple(headline(result, budget)), memory_note=memory_note, baseline=baseline.name if baseline else "",
                      best=best, summary_rows=tuple(runs_rows(result)), notes=tuple(summary_notes(result, advice)))
