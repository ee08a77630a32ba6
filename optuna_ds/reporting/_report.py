from __future__ import annotations

import dataclasses
import datetime
import html
import os
import urllib.parse
import warnings
from typing import Any

import optuna
import plotly.graph_objects as go
import plotly.io
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.config import GAS_KEY
from optuna_ds.config import MBS_KEY
from optuna_ds.config import Metric
from optuna_ds.launcher import Phase
from optuna_ds.reporting._summary import headline
from optuna_ds.storage import ExperimentRecord
from optuna_ds.storage import load_plan
from optuna_ds.storage import stage_of
from optuna_ds.storage import tuning_study_names
from optuna_ds.studies import TuningResult

_MIN_TRIALS_FOR_IMPORTANCE = 4
# One colour, line dash and marker per ZeRO stage, shared by its line, its knob experiments,
# its failures and its timeline bars.
_STAGE_COLORS = {0: "#1f77b4", 1: "#e8710a", 2: "#2ca02c", 3: "#9467bd"}
_STAGE_DASH = {0: "solid", 1: "dash", 2: "dot", 3: "dashdot"}
_STAGE_SYMBOL = {0: "circle", 1: "square", 2: "triangle-up", 3: "pentagon"}
_FAILURE_SYMBOL = {"oom": "x", "timeout": "hourglass", "no-metrics": "circle-open", "interrupted": "asterisk-open"}
_BASELINE_MARKER = {"symbol": "star", "size": 18, "color": "#ffd60a", "line": {"color": "#000", "width": 1.5}}
_PROFILE_COLOR = "#6c757d"
_FIGURE_LAYOUT = {"height": 430, "margin": {"l": 60, "r": 20, "t": 60, "b": 50}, "legend": {"orientation": "h", "y": -0.18}}


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
    result_dir: str = ""
    peak_memory: float | None = None  # bytes, where the accelerator reports it

    @property
    def duration(self) -> float | None:
        if self.start and self.end:
            return (self.end - self.start).total_seconds()
        return None


def _safe(text: object) -> str:
    """Figures embed their text in a <script> block and plotly renders some HTML in it: every
    string that comes from the user or an experiment's output is escaped."""
    return html.escape(str(text))


def _status(t: FrozenTrial, record: ExperimentRecord) -> str:
    if t.state == TrialState.COMPLETE:
        return "complete"
    if t.state == TrialState.PRUNED:
        return "duplicate"
    if t.state == TrialState.RUNNING:
        return "running"
    return record.reason.value if record.reason else "failed"


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
            record = ExperimentRecord.from_trial(t)
            if record.exp_name is None or t.state == TrialState.WAITING:
                continue
            knobs = {k: v for k, v in t.params.items() if k not in (MBS_KEY, GAS_KEY)}
            detail = record.detail or ""
            tail = (record.stderr_tail or "").strip().splitlines()
            if tail:
                detail = f"{detail}: {tail[-1]}" if detail else tail[-1]
            if t.state == TrialState.PRUNED and record.duplicate_of is not None:
                detail = f"same as trial {record.duplicate_of}"
            rows.append(ExperimentRow(
                stage=stage, number=t.number, name=record.exp_name, phase=record.phase.value if record.phase else "",
                status=_status(t, record), value=t.value,
                mbs=record.micro_batch_size, gas=record.gradient_accumulation_steps, knobs=knobs,
                slot=record.slot or "", start=t.datetime_start, end=t.datetime_complete, detail=detail,
                result_dir=record.result_dir or "", peak_memory=record.peak_gpu_memory,
            ))
    return rows


def format_value(value: Any) -> str:
    """Knob values as people write them: integers as integers, round powers of ten as 5e8."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        mantissa, exponent = f"{value:e}".split("e")
        if float(mantissa).is_integer():
            return f"{int(float(mantissa))}e{int(exponent)}"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _hide(rows: list[ExperimentRow]) -> list[ExperimentRow]:
    """What the user paid for: internal duplicates (a claim that stood down) launched nothing."""
    return [r for r in rows if r.status != "duplicate"]


def _stage_name(stage: int) -> str:
    return f"z{stage}"


def _metric_vs_mbs(rows: list[ExperimentRow], metric: Metric, baseline: ExperimentRow | None) -> go.Figure:
    fig = go.Figure()
    label = metric.label
    hover = "%{text}<br>mbs %{x}<br>" + _safe(metric.name) + " %{y:.4g}<extra></extra>"
    floor = min((r.value for r in rows if r.value is not None), default=0.0)
    for stage in sorted({r.stage for r in rows}):
        color = _STAGE_COLORS.get(stage, "#333")
        ok = sorted((r for r in rows if r.stage == stage and r.status == "complete" and r.mbs), key=lambda r: r.mbs)  # type: ignore[arg-type,return-value]
        curve = [r for r in ok if r.phase != "knobs"]
        knobs = [r for r in ok if r.phase == "knobs"]
        group = _stage_name(stage)
        fig.add_trace(go.Scatter(
            x=[r.mbs for r in curve], y=[r.value for r in curve], mode="lines+markers", name=group, legendgroup=group,
            line={"color": color, "dash": _STAGE_DASH.get(stage, "solid"), "width": 2},
            marker={"symbol": _STAGE_SYMBOL.get(stage, "circle"), "size": 8, "color": color},
            text=[_safe(r.name) for r in curve], hovertemplate=hover))
        if knobs:
            fig.add_trace(go.Scatter(
                x=[r.mbs for r in knobs], y=[r.value for r in knobs], mode="markers", name=f"{group} knobs", legendgroup=group,
                marker={"symbol": "diamond-open", "size": 11, "color": color, "line": {"width": 2}},
                text=[_safe(r.name) for r in knobs], hovertemplate=hover))
        failed = [r for r in rows if r.stage == stage and r.status not in ("complete", "duplicate", "running") and r.mbs]
        if failed:
            # At its stage and size, on the level of the stage's nearest size that ran.
            def level(r: ExperimentRow) -> float:
                near = min(curve or ok, key=lambda o: abs((o.mbs or 0) - (r.mbs or 0)), default=None)
                return near.value if near is not None and near.value is not None else floor

            fig.add_trace(go.Scatter(
                x=[r.mbs for r in failed], y=[level(r) for r in failed], mode="markers", name=f"{group} failed", legendgroup=group,
                marker={"symbol": [_FAILURE_SYMBOL.get(r.status, "x-thin-open") for r in failed], "size": 13, "color": color,
                        "line": {"width": 2, "color": color}},
                text=[_safe(f"{r.name}: {r.status}" + (f" ({r.detail})" if r.detail else "")) for r in failed],
                hovertemplate="%{text}<br>mbs %{x}: no measurement<extra></extra>"))
    if baseline is not None and baseline.value is not None:
        fig.add_trace(go.Scatter(x=[baseline.mbs], y=[baseline.value], mode="markers+text", name="your config",
                                 marker=_BASELINE_MARKER, text=["your config"], textposition="top right",
                                 hovertemplate=_safe(baseline.name) + "<br>your config<br>%{y:.4g}<extra></extra>"))
    fig.update_layout(title=f"{_safe(label)} against micro-batch size per GPU", xaxis_title="micro-batch size per GPU",
                      yaxis_title=_safe(label), **_FIGURE_LAYOUT)
    return fig


def _best_per_stage(rows: list[ExperimentRow], metric: Metric, baseline: ExperimentRow | None) -> go.Figure:
    best: dict[int, ExperimentRow] = {}
    for r in rows:
        if r.status == "complete" and r.value is not None:
            cur = best.get(r.stage)
            if cur is None or metric.better(r.value, cur.value):  # type: ignore[arg-type]
                best[r.stage] = r
    stages = sorted(best)
    label = metric.label
    fig = go.Figure(go.Bar(
        x=[_stage_name(s) for s in stages], y=[best[s].value for s in stages], name="best",
        marker_color=[_STAGE_COLORS.get(s, "#333") for s in stages],
        text=[f"{best[s].value:.4g}<br>mbs {best[s].mbs}" for s in stages], textposition="outside", cliponaxis=False,
        customdata=[_safe(best[s].name) for s in stages], hovertemplate="%{customdata}<br>%{y:.4g}<extra></extra>"))
    if baseline is not None and baseline.value is not None:
        fig.add_hline(y=baseline.value, line={"color": "#000", "dash": "dash"},
                      annotation_text=f"your config {baseline.value:.4g}", annotation_position="top left")
    top = max((r.value for r in best.values() if r.value is not None), default=1.0)
    fig.update_layout(title=f"Best {_safe(metric.name)} per ZeRO stage", xaxis_title="ZeRO stage", yaxis_title=_safe(label),
                      showlegend=False, yaxis_range=[0, top * 1.2], **_FIGURE_LAYOUT)
    return fig


def _history(rows: list[ExperimentRow], metric: Metric, baseline: ExperimentRow | None) -> go.Figure:
    ordered = sorted((r for r in rows if r.end), key=lambda r: r.end)  # type: ignore[arg-type,return-value]
    fig = go.Figure()
    for stage in sorted({r.stage for r in ordered}):
        pts = [(i, r) for i, r in enumerate(ordered) if r.stage == stage and r.value is not None]
        fig.add_trace(go.Scatter(x=[i for i, _ in pts], y=[r.value for _, r in pts], mode="markers", name=_stage_name(stage),
                                 marker={"symbol": _STAGE_SYMBOL.get(stage, "circle"), "size": 9, "color": _STAGE_COLORS.get(stage, "#333")},
                                 text=[_safe(r.name) for _, r in pts], hovertemplate="%{text}<br>%{y:.4g}<extra></extra>"))
    best, xs, ys = None, [], []
    for i, r in enumerate(ordered):
        if r.value is not None and (best is None or metric.better(r.value, best)):
            best = r.value
        if best is not None:
            xs.append(i)
            ys.append(best)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="best so far", line={"shape": "hv", "color": "#444"}))
    mine = [i for i, r in enumerate(ordered) if baseline is not None and r.name == baseline.name and r.stage == baseline.stage]
    if mine and baseline is not None and baseline.value is not None:
        fig.add_trace(go.Scatter(x=mine[:1], y=[baseline.value], mode="markers+text", name="your config", marker=_BASELINE_MARKER,
                                 text=["your config"], textposition="top right", hovertemplate="your config<br>%{y:.4g}<extra></extra>"))
    fig.update_layout(title="Optimization history", xaxis={"title": "experiment (in order of completion)", "tickformat": "d"},
                      yaxis_title=_safe(metric.label), **_FIGURE_LAYOUT)
    return fig


@dataclasses.dataclass(frozen=True)
class _Profile:
    start: datetime.datetime
    seconds: float
    slot: str


def _timeline(rows: list[ExperimentRow], baseline: ExperimentRow | None, profile: _Profile | None, spend: str) -> go.Figure:
    fig = go.Figure()
    timed = [r for r in rows if r.start and r.end]
    if profile is not None:
        fig.add_trace(go.Bar(base=[profile.start.isoformat()], x=[profile.seconds * 1000], y=[_safe(profile.slot)], orientation="h",
                             name="profile run", marker_color=_PROFILE_COLOR, text=["profile"], textposition="inside",
                             hovertemplate="profile run<br>%{x:.0f} ms<extra></extra>"))
    for stage in sorted({r.stage for r in timed}):
        group = [r for r in timed if r.stage == stage]
        fig.add_trace(go.Bar(
            base=[r.start.isoformat() for r in group],  # type: ignore[union-attr]
            x=[r.duration * 1000 for r in group],  # type: ignore[operator]
            y=[_safe(r.slot or "?") for r in group], orientation="h", name=_stage_name(stage),
            marker={"color": _STAGE_COLORS.get(stage, "#333"),
                    "pattern": {"shape": ["x" if r.status not in ("complete", "running") else "" for r in group]},
                    "line": {"color": ["#000" if baseline is not None and r.name == baseline.name else "#fff" for r in group],
                             "width": [3 if baseline is not None and r.name == baseline.name else 0.5 for r in group]}},
            text=[_safe(r.name + (" (your config)" if baseline is not None and r.name == baseline.name else "")) for r in group],
            textposition="none", hovertemplate="%{text}<br>%{x:.0f} ms<extra></extra>",
        ))
    fig.update_layout(title=f"GPU slots: {_safe(spend)}", xaxis={"type": "date", "title": "time"},
                      yaxis_title="GPU slot", barmode="overlay", **_FIGURE_LAYOUT)
    return fig


def _importances(study: optuna.Study, stage: int) -> go.Figure | None:
    knob_trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                   if ExperimentRecord.from_trial(t).phase is Phase.KNOBS]
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
    metric: Metric
    studies: dict[int, optuna.Study]
    rows: list[ExperimentRow]
    figures: dict[str, go.Figure]
    title: str = ""
    headline: tuple[str, ...] = ()
    memory_note: str = ""
    baseline: str = ""  # the experiment that ran the user's own config


def _profile(root: optuna.Study, rows: list[ExperimentRow]) -> _Profile | None:
    end, seconds = root.user_attrs.get("profile_end"), root.user_attrs.get("profile_duration")
    if not end or seconds is None:
        return None
    slots = sorted({r.slot for r in rows if r.slot})
    start = datetime.datetime.fromisoformat(end) - datetime.timedelta(seconds=float(seconds))
    return _Profile(start=start, seconds=float(seconds), slot=slots[0] if slots else "?")


def load_report(storage: optuna.storages.BaseStorage, study_name: str, *, result: TuningResult) -> ReportData:
    metric = result.metric
    studies = stage_studies(storage, study_name)
    rows = _hide(experiment_rows(studies))
    root = optuna.load_study(study_name=study_name, storage=storage)
    base = result.baseline
    baseline = next((r for r in rows if base is not None and base.name and r.name == base.name and r.stage == base.stage), None)
    spend = result.spend
    spent = f"{spend.gpu_hours:.3g} GPU-hours, {spend.experiments} runs"
    figures = {
        "metric_vs_mbs": _metric_vs_mbs(rows, metric, baseline),
        "best_per_stage": _best_per_stage(rows, metric, baseline),
        "history": _history(rows, metric, baseline),
        "timeline": _timeline(rows, baseline, _profile(root, rows), spent),
    }
    for stage, study in studies.items():
        fig = _importances(study, stage)
        if fig is not None:
            figures[f"importance_z{stage}"] = fig
    plan = load_plan(storage, study_name)
    script = os.path.basename(plan.script) if plan is not None else ""
    title = f"{script}: the fastest DeepSpeed config" + ("" if study_name == "optuna-ds" else f" (tuning {study_name})")
    memory_note = "" if any(r.peak_memory for r in rows) else (
        "Peak GPU memory per experiment: " + str((root.user_attrs.get("resources") or {}).get("gpu_memory") or "not reported") + ".")
    return ReportData(study_name=study_name, metric=metric, studies=studies, rows=rows, figures=figures, title=title,
                      headline=tuple(headline(result)), memory_note=memory_note, baseline=baseline.name if baseline else "")


def _gib(n: float | None) -> str:
    return "" if not n else f"{n / 2**30:.2f} GiB"


def _link(path: str, base_dir: str, text: str) -> str:
    if not path:
        return html.escape(text)
    href = urllib.parse.quote(os.path.relpath(path, base_dir) if base_dir else path)
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


def _table(rows: list[ExperimentRow], metric: Metric, *, base_dir: str, baseline: str) -> str:
    e = html.escape
    memory = any(r.peak_memory for r in rows)
    heads = ["stage", "trial", "experiment", "status", metric.label, "mbs", "gas", "knobs", "slot", "seconds",
             *(["peak GPU memory"] if memory else []), "reason", "logs"]
    head = "".join(f'<th class="{e(h.split()[0])}">{e(h)}</th>' for h in heads)
    body = []
    for r in sorted(rows, key=lambda r: (r.stage, r.number)):
        knobs = ", ".join(f"<span>{e(k)}={e(format_value(v))}</span>" for k, v in sorted(r.knobs.items()))
        name = _link(r.result_dir, base_dir, r.name) + (' <span class="mine">your config</span>' if r.name == baseline else "")
        logs = " ".join(_link(os.path.join(r.result_dir, f), base_dir, f.split(".")[0]) for f in ("stdout.log", "stderr.log")) if r.result_dir else ""
        cells = [e(f"z{r.stage}"), e(str(r.number)), name, e(r.status), "" if r.value is None else e(f"{r.value:.6g}"),
                 e(str(r.mbs or "")), e(str(r.gas or "")), knobs, e(r.slot), "" if r.duration is None else e(f"{r.duration:.1f}"),
                 *([e(_gib(r.peak_memory))] if memory else []), e(r.detail), logs]
        body.append(f'<tr class="{e(r.status)}">' + "".join(f'<td class="{e(h.split()[0])}">{c}</td>' for h, c in zip(heads, cells)) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_report(data: ReportData, *, summary: str, base_dir: str = "") -> str:
    """One self-contained HTML page (plotly.js inlined): the headline, figures, summary and
    every experiment, readable at 1280 px. Every user-provided string is escaped; each
    experiment links to its folder and logs relative to ``base_dir``, where the page lies."""
    study_name, metric = data.study_name, data.metric
    parts = []
    for i, (fig_id, fig) in enumerate(data.figures.items()):
        parts.append(plotly.io.to_html(fig, full_html=False, include_plotlyjs=(i == 0), div_id=fig_id,
                                       default_width="100%", config={"responsive": True, "displaylogo": False}))
    e = html.escape
    rest = summary.split("\n\n", 1)[1] if data.headline and "\n\n" in summary else summary
    headline = "".join(f"<p>{e(line)}</p>" for line in data.headline)
    memory = f'<p class="note">{e(data.memory_note)}</p>' if data.memory_note else ""
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>{e(data.title or study_name)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
h1 {{ font-size: 1.6em; margin: 0 0 .5em; }}
.headline {{ background: #eef6ee; border-left: 6px solid #2a9d8f; padding: .6em 1em; font-size: 1.1em; }}
.headline p {{ margin: .3em 0; }}
.figures {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 1em; }}
.figures > div {{ min-width: 0; }}
table {{ border-collapse: collapse; font-size: 13px; width: 100%; }}
td, th {{ border: 1px solid #ccc; padding: 3px 6px; text-align: left; vertical-align: top; }}
td.experiment {{ min-width: 15em; overflow-wrap: anywhere; }}
td.knobs span {{ white-space: nowrap; }}
td.reason {{ min-width: 16em; overflow-wrap: anywhere; }}
tr.oom td, tr.error td, tr.timeout td, tr.no-metrics td {{ background: #fdecea; }}
.mine {{ background: #ffd60a; border-radius: 3px; padding: 0 4px; font-size: 11px; white-space: nowrap; }}
pre {{ background: #f6f6f6; padding: 1em; white-space: pre-wrap; overflow-wrap: anywhere; }}
.note {{ color: #555; }}
</style></head><body>
<h1>{e(data.title or study_name)}</h1>
<div class="headline">{headline}</div>
<div class="figures">{''.join(parts)}</div>
<h2>Summary</h2>
<pre>{e(rest)}</pre>
<h2>Experiments</h2>
{memory}
{_table(data.rows, metric, base_dir=base_dir, baseline=data.baseline)}
</body></html>
"""


def write_report(data: ReportData, path: str, *, summary: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_report(data, summary=summary, base_dir=os.path.dirname(os.path.abspath(path))))
    return path


ROOT_NOTE = """This study holds the tuning's plan (script, arguments, config), the model info and the
memory estimates; it has no experiments. Each experiment is a trial of a stage study:
{stages}.
"""


def register_with_dashboard(data: ReportData, storage: optuna.storages.BaseStorage, *, note: str) -> None:
    """Give optuna-dashboard what it can show: the summary (a Markdown note with the headline)
    on each study, the root study described, and the report's figures as custom plots."""
    import optuna_dashboard

    root = optuna.load_study(study_name=data.study_name, storage=storage)
    stages = ", ".join(f"`{s.study_name}`" for s in data.studies.values()) or "none yet"
    optuna_dashboard.save_note(root, ROOT_NOTE.format(stages=stages) + "\n" + note)
    for fig_id, fig in data.figures.items():
        optuna_dashboard.save_plotly_graph_object(root, fig, graph_object_id=fig_id)
    for stage, study in data.studies.items():
        optuna_dashboard.save_note(study, note)
        for fig_id in ("metric_vs_mbs", f"importance_z{stage}"):
            if fig_id in data.figures:
                optuna_dashboard.save_plotly_graph_object(study, data.figures[fig_id], graph_object_id=fig_id)


def best_stage_study(storage: optuna.storages.BaseStorage) -> tuple[int, str] | None:
    """The stage study holding the best experiment of the storage's tunings, ``(id, name)``:
    where the dashboard should open, rather than a root study that has no trials."""
    best: tuple[float, str] | None = None
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=True):
        trial = summary.best_trial
        if trial is None or trial.value is None or not ExperimentRecord.from_trial(trial).claimed:
            continue
        score = trial.value if summary.direction == optuna.study.StudyDirection.MAXIMIZE else -trial.value
        if best is None or score > best[0]:
            best = (score, summary.study_name)
    return (storage.get_study_id_from_name(best[1]), best[1]) if best else None
