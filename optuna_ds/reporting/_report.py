from __future__ import annotations

import dataclasses
import datetime
import html
import warnings
from typing import Any

import optuna
import plotly.graph_objects as go
import plotly.io
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.config import GAS_KEY
from optuna_ds.config import MBS_KEY
from optuna_ds.storage import stage_of
from optuna_ds.storage import tuning_study_names

_MIN_TRIALS_FOR_IMPORTANCE = 4
_STATUS_COLORS = {"complete": "#2a9d8f", "oom": "#e76f51", "error": "#9b2226", "timeout": "#ee9b00", "no-metrics": "#6c757d",
                  "interrupted": "#adb5bd", "failed": "#9b2226", "running": "#457b9d", "duplicate": "#dee2e6"}


@dataclasses.dataclass(frozen=True)
class ExperimentRow:
    """One experiment as the report shows it."""

    stage: int
    number: int
    name: str
    phase: str
    status: str
    value: float | None
    mbs: int | None
    gas: int | None
    knobs: dict[str, Any]
    slot: str
    start: datetime.datetime | None
    end: datetime.datetime | None
    detail: str

    @property
    def duration(self) -> float | None:
        if self.start and self.end:
            return (self.end - self.start).total_seconds()
        return None


def _safe(text: object) -> str:
    """Figures embed their text in a <script> block and plotly renders some HTML in it: every
    string that comes from the user or an experiment's output is escaped."""
    return html.escape(str(text))


def _status(t: FrozenTrial) -> str:
    if t.state == TrialState.COMPLETE:
        return "complete"
    if t.state == TrialState.PRUNED:
        return "duplicate"
    if t.state == TrialState.RUNNING:
        return "running"
    return str(t.user_attrs.get("reason", "failed"))


def stage_studies(storage: optuna.storages.BaseStorage, study_name: str) -> dict[int, optuna.Study]:
    out = {}
    for name in tuning_study_names(storage, study_name):
        stage = stage_of(study_name, name)
        if stage is not None:
            out[stage] = optuna.load_study(study_name=name, storage=storage)
    return dict(sorted(out.items()))


def experiment_rows(studies: dict[int, optuna.Study]) -> list[ExperimentRow]:
    rows = []
    for stage, study in studies.items():
        for t in study.get_trials(deepcopy=False):
            if "exp_name" not in t.user_attrs or t.state == TrialState.WAITING:
                continue
            knobs = {k: v for k, v in t.params.items() if k not in (MBS_KEY, GAS_KEY)}
            detail = t.user_attrs.get("detail", "")
            tail = (t.user_attrs.get("stderr_tail") or "").strip().splitlines()
            if tail:
                detail = f"{detail}: {tail[-1]}" if detail else tail[-1]
            if t.state == TrialState.PRUNED and "duplicate_of" in t.user_attrs:
                detail = f"same as trial {t.user_attrs['duplicate_of']}"
            rows.append(ExperimentRow(
                stage=stage, number=t.number, name=t.user_attrs["exp_name"], phase=str(t.user_attrs.get("phase", "")),
                status=_status(t), value=t.value,
                mbs=t.user_attrs.get("micro_batch_size"), gas=t.user_attrs.get("gradient_accumulation_steps"), knobs=knobs,
                slot=str(t.user_attrs.get("slot", "")), start=t.datetime_start, end=t.datetime_complete, detail=detail,
            ))
    return rows


def _metric_vs_mbs(rows: list[ExperimentRow], metric: str) -> go.Figure:
    fig = go.Figure()
    stages = sorted({r.stage for r in rows})
    hover = "%{text}<br>mbs %{x}<br>" + metric + " %{y:.4g}<extra></extra>"
    for stage in stages:
        ok = sorted((r for r in rows if r.stage == stage and r.status == "complete" and r.mbs), key=lambda r: r.mbs)
        curve = [r for r in ok if r.phase != "knobs"]
        knobs = [r for r in ok if r.phase == "knobs"]
        fig.add_trace(go.Scatter(x=[r.mbs for r in curve], y=[r.value for r in curve], mode="lines+markers", name=f"z{stage}",
                                 text=[_safe(r.name) for r in curve], hovertemplate=hover))
        if knobs:
            fig.add_trace(go.Scatter(x=[r.mbs for r in knobs], y=[r.value for r in knobs], mode="markers", name=f"z{stage} knobs",
                                     marker={"symbol": "diamond", "size": 9}, text=[_safe(r.name) for r in knobs], hovertemplate=hover))
    failed = [r for r in rows if r.status not in ("complete", "duplicate", "running") and r.mbs]
    floor = min((r.value for r in rows if r.value is not None), default=0.0)
    for status in sorted({r.status for r in failed}):
        group = [r for r in failed if r.status == status]
        fig.add_trace(go.Scatter(
            x=[r.mbs for r in group], y=[floor * 0.95 for _ in group], mode="markers", name=_safe(status),
            marker={"symbol": "x", "size": 11, "color": _STATUS_COLORS.get(status, "#000")},
            text=[_safe(f"z{r.stage} {r.name}: {r.detail}") for r in group], hovertemplate="%{text}<extra></extra>",
        ))
    fig.update_layout(title=f"{metric} against micro-batch size per GPU", xaxis_title="micro-batch size per GPU", yaxis_title=metric)
    return fig


def _best_per_stage(rows: list[ExperimentRow], metric: str, maximize: bool) -> go.Figure:
    best: dict[int, ExperimentRow] = {}
    for r in rows:
        if r.status == "complete" and r.value is not None:
            cur = best.get(r.stage)
            if cur is None or (r.value > cur.value if maximize else r.value < cur.value):  # type: ignore[operator]
                best[r.stage] = r
    stages = sorted(best)
    fig = go.Figure(go.Bar(x=[f"z{s}" for s in stages], y=[best[s].value for s in stages], text=[_safe(best[s].name) for s in stages],
                           hovertemplate="%{text}<br>%{y:.4g}<extra></extra>"))
    fig.update_layout(title=f"Best {metric} per ZeRO stage", xaxis_title="ZeRO stage", yaxis_title=metric)
    return fig


def _history(rows: list[ExperimentRow], metric: str, maximize: bool) -> go.Figure:
    ordered = sorted((r for r in rows if r.end), key=lambda r: r.end)  # type: ignore[arg-type,return-value]
    fig = go.Figure()
    for stage in sorted({r.stage for r in ordered}):
        pts = [(i, r) for i, r in enumerate(ordered) if r.stage == stage and r.value is not None]
        fig.add_trace(go.Scatter(x=[i for i, _ in pts], y=[r.value for _, r in pts], mode="markers", name=f"z{stage}",
                                 text=[_safe(r.name) for _, r in pts], hovertemplate="%{text}<br>%{y:.4g}<extra></extra>"))
    best, xs, ys = None, [], []
    for i, r in enumerate(ordered):
        if r.value is not None and (best is None or (r.value > best if maximize else r.value < best)):
            best = r.value
        if best is not None:
            xs.append(i)
            ys.append(best)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="best so far", line={"shape": "hv"}))
    fig.update_layout(title="Optimization history", xaxis_title="experiment (in order of completion)", yaxis_title=metric)
    return fig


def _timeline(rows: list[ExperimentRow]) -> go.Figure:
    fig = go.Figure()
    timed = [r for r in rows if r.start and r.end]
    for status in sorted({r.status for r in timed}):
        group = [r for r in timed if r.status == status]
        fig.add_trace(go.Bar(
            base=[r.start.isoformat() for r in group],  # type: ignore[union-attr]
            x=[r.duration * 1000 for r in group],  # type: ignore[operator]
            y=[_safe(r.slot or "?") for r in group], orientation="h", name=_safe(status),
            marker_color=_STATUS_COLORS.get(status, "#000"), text=[_safe(r.name) for r in group],
            hovertemplate="%{text}<br>%{x:.0f} ms<extra></extra>",
        ))
    fig.update_layout(title="Experiments on GPU slots", xaxis={"type": "date", "title": "time"}, yaxis_title="GPU slot", barmode="overlay")
    return fig


def _importances(study: optuna.Study, stage: int) -> go.Figure | None:
    knob_trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.user_attrs.get("phase") == "knobs"]
    if len(knob_trials) < _MIN_TRIALS_FOR_IMPORTANCE:
        return None
    params = sorted({k for t in knob_trials for k in t.params if k != GAS_KEY and len({str(u.params.get(k)) for u in knob_trials}) > 1})
    if not params:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            # PED-ANOVA: needs no scikit-learn, unlike fANOVA.
            scores = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.PedAnovaImportanceEvaluator(), params=params
            )
        except (RuntimeError, ValueError, ImportError):
            return None
    names = list(scores)[::-1]
    fig = go.Figure(go.Bar(x=[scores[n] for n in names], y=[_safe(n) for n in names], orientation="h"))
    fig.update_layout(title=f"Knob importances, z{stage} (PED-ANOVA over {len(knob_trials)} experiments)", xaxis_title="importance")
    return fig


@dataclasses.dataclass(frozen=True)
class ReportData:
    """One read of a tuning's stage studies, and the figures made from it: the HTML report and
    optuna-dashboard show the same ones."""

    study_name: str
    metric: str
    studies: dict[int, optuna.Study]
    rows: list[ExperimentRow]
    figures: dict[str, go.Figure]


def load_report(storage: optuna.storages.BaseStorage, study_name: str, *, metric: str, maximize: bool) -> ReportData:
    studies = stage_studies(storage, study_name)
    rows = experiment_rows(studies)
    figures = {
        "metric_vs_mbs": _metric_vs_mbs(rows, metric),
        "best_per_stage": _best_per_stage(rows, metric, maximize),
        "history": _history(rows, metric, maximize),
        "timeline": _timeline(rows),
    }
    for stage, study in studies.items():
        fig = _importances(study, stage)
        if fig is not None:
            figures[f"importance_z{stage}"] = fig
    return ReportData(study_name=study_name, metric=metric, studies=studies, rows=rows, figures=figures)


def _table(rows: list[ExperimentRow], metric: str) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in ("stage", "trial", "experiment", "status", metric, "mbs", "gas", "knobs", "slot", "seconds", "reason"))
    body = []
    for r in sorted(rows, key=lambda r: (r.stage, r.number)):
        knobs = ", ".join(f"{k}={v}" for k, v in sorted(r.knobs.items()))
        cells = [f"z{r.stage}", str(r.number), r.name, r.status, "" if r.value is None else f"{r.value:.6g}", str(r.mbs or ""),
                 str(r.gas or ""), knobs, r.slot, "" if r.duration is None else f"{r.duration:.1f}", r.detail]
        body.append(f'<tr class="{e(r.status)}">' + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_report(data: ReportData, *, summary: str) -> str:
    """One self-contained HTML page (plotly.js inlined): figures, summary and every experiment.
    Every user-provided string is escaped."""
    study_name, metric = data.study_name, data.metric
    parts = []
    for i, (fig_id, fig) in enumerate(data.figures.items()):
        parts.append(plotly.io.to_html(fig, full_html=False, include_plotlyjs=(i == 0), div_id=fig_id))
    e = html.escape
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>optuna-ds report: {e(study_name)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 6px; text-align: left; }}
tr.oom td, tr.error td, tr.timeout td, tr.no-metrics td {{ background: #fdecea; }}
pre {{ background: #f6f6f6; padding: 1em; white-space: pre-wrap; }}
.figures > div {{ max-width: 1000px; }}
</style></head><body>
<h1>optuna-ds: {e(study_name)}</h1>
<pre>{e(summary)}</pre>
<div class="figures">{''.join(parts)}</div>
<h2>Experiments</h2>
{_table(data.rows, metric)}
</body></html>
"""


def write_report(data: ReportData, path: str, *, summary: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_report(data, summary=summary))
    return path


def register_with_dashboard(data: ReportData, storage: optuna.storages.BaseStorage, *, summary: str) -> None:
    """Give optuna-dashboard what it can show: the summary as each study's note and the
    report's figures as its custom plots."""
    import optuna_dashboard

    note = "```\n" + summary.rstrip() + "\n```\n"
    root = optuna.load_study(study_name=data.study_name, storage=storage)
    optuna_dashboard.save_note(root, note)
    for fig_id, fig in data.figures.items():
        optuna_dashboard.save_plotly_graph_object(root, fig, graph_object_id=fig_id)
    for stage, study in data.studies.items():
        optuna_dashboard.save_note(study, note)
        for fig_id in ("metric_vs_mbs", f"importance_z{stage}"):
            if fig_id in data.figures:
                optuna_dashboard.save_plotly_graph_object(study, data.figures[fig_id], graph_object_id=fig_id)
