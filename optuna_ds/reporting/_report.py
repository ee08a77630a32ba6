from __future__ import annotations

import dataclasses
import datetime
import os
import urllib.parse
import warnings
from typing import Any

import jinja2
import markupsafe
import optuna
import plotly.graph_objects as go
import plotly.io
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds._files import write_file
from optuna_ds.config import Metric
from optuna_ds.config import format_number
from optuna_ds.config import parse_user_config
from optuna_ds.domain import GAS_KEY
from optuna_ds.domain import MBS_KEY
from optuna_ds.domain import ZERO_KEY
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import Phase
from optuna_ds.domain import RootRecord
from optuna_ds.reporting._summary import Budget
from optuna_ds.domain import superseded
from optuna_ds.reporting._summary import SUMMARY_HEAD
from optuna_ds.reporting._summary import LearningRateAdvice
from optuna_ds.reporting._summary import headline
from optuna_ds.reporting._summary import summary_notes
from optuna_ds.reporting._summary import summary_rows
from optuna_ds.storage import load_plan
from optuna_ds.storage import stage_of
from optuna_ds.storage import stage_study_name
from optuna_ds.storage import tuning_names
from optuna_ds.storage import tuning_study_names
from optuna_ds.studies import Optimum
from optuna_ds.studies import TuningResult
from optuna_ds.studies import failure_text
from optuna_ds.studies import load_result

_MIN_TRIALS_FOR_IMPORTANCE = 4
# One colour, line dash and marker per ZeRO stage, shared by its line, its knob experiments,
# its failures and its timeline bars.
_STAGE_COLORS = {0: "#1f77b4", 1: "#e8710a", 2: "#2ca02c", 3: "#9467bd"}
_STAGE_DASH = {0: "solid", 1: "dash", 2: "dot", 3: "dashdot"}
_STAGE_SYMBOL = {0: "circle", 1: "square", 2: "triangle-up", 3: "pentagon"}
_FAILURE_SYMBOL = {"oom": "x", "timeout": "hourglass", "no-metrics": "circle-open", "interrupted": "asterisk-open"}
_BASELINE_MARKER = {"symbol": "star", "size": 18, "color": "#ffd60a", "line": {"color": "#000", "width": 1.5}}
# The optimum, in every figure: a trace of this name, drawn as a red ring.
CHOSEN = "chosen"
_CHOSEN_COLOR = "#d62728"
_CHOSEN_MARKER = {"symbol": "circle-open", "size": 22, "color": _CHOSEN_COLOR, "line": {"width": 3, "color": _CHOSEN_COLOR}}
_PROFILE_COLOR = "#6c757d"
# The title sits below plotly's modebar (shown on hover only), not under it.
_FIGURE_LAYOUT = {"height": 430, "margin": {"l": 60, "r": 20, "t": 80, "b": 50}, "legend": {"orientation": "h", "y": -0.18}}
_PLOTLY_CONFIG = {"responsive": True, "displaylogo": False, "displayModeBar": "hover"}


def _title(text: str) -> dict[str, Any]:
    return {"text": text, "x": 0.01, "xanchor": "left", "yref": "container", "y": 1.0, "yanchor": "top", "pad": {"t": 36}}


@dataclasses.dataclass(frozen=True)
class ExperimentRow:
    """One experiment as the report shows it: a view of its trial and the trial's record."""

    stage: int  # its study's
    trial: FrozenTrial
    record: ExperimentRecord
    chosen: bool = False  # a run of the optimum

    @property
    def number(self) -> int:
        return self.trial.number

    @property
    def name(self) -> str:
        return self.record.exp_name or ""

    @property
    def phase(self) -> str:
        return self.record.phase.value if self.record.phase else ""

    @property
    def status(self) -> str:
        t = self.trial
        if t.state == TrialState.COMPLETE:
            return "complete"
        if self.record.duplicate_of is not None:
            return "duplicate"
        if t.state == TrialState.PRUNED:
            return "not launched"  # an earlier version's pruned ask of a knob search that was over
        if t.state == TrialState.RUNNING:
            return "running"
        return self.record.reason.value if self.record.reason else "failed"

    @property
    def value(self) -> float | None:
        return self.trial.value

    @property
    def mbs(self) -> int | None:
        return self.record.config.micro_batch if self.record.config else None

    @property
    def gas(self) -> int | None:
        return self.record.config.accumulation if self.record.config else None

    @property
    def knobs(self) -> dict[str, Any]:
        return self.record.config.knob_dict if self.record.config else {}

    @property
    def slot(self) -> str:
        return self.record.slot or ""

    @property
    def start(self) -> datetime.datetime | None:
        return self.trial.datetime_start

    @property
    def end(self) -> datetime.datetime | None:
        return self.trial.datetime_complete

    @property
    def detail(self) -> str:
        if self.record.duplicate_of is not None:
            return f"same as trial {self.record.duplicate_of}"
        return failure_text(self.record)

    @property
    def result_dir(self) -> str:
        return self.record.result_dir or ""

    @property
    def peak_memory(self) -> float | None:
        """Bytes, where the accelerator reports it."""
        return self.record.peak_gpu_memory

    @property
    def duration(self) -> float | None:
        if self.start and self.end:
            return (self.end - self.start).total_seconds()
        return None


def _safe(text: object) -> str:
    """Figures embed their text in a <script> block and plotly renders some HTML in it: every
    string that comes from the user or an experiment's output is escaped."""
    return str(markupsafe.escape(str(text)))


def stage_studies(storage: optuna.storages.BaseStorage, study_name: str) -> dict[int, optuna.Study]:
    out = {}
    for name in tuning_study_names(storage, study_name):
        stage = stage_of(study_name, name)
        if stage is not None:
            out[stage] = optuna.load_study(study_name=name, storage=storage)
    return dict(sorted(out.items()))


def experiment_rows(studies: dict[int, optuna.Study], best: Optimum | None = None) -> list[ExperimentRow]:
    """Every claimed experiment, the optimum's runs first (its named run leading), then by
    stage and trial."""
    rows = []
    for stage, study in studies.items():
        trials = study.get_trials(deepcopy=False)
        gone = superseded(trials)
        for t in trials:
            record = ExperimentRecord.from_trial(t)
            if record.exp_name is None or t.state == TrialState.WAITING or t.number in gone:
                continue
            rows.append(ExperimentRow(stage=stage, trial=t, record=record,
                                      chosen=best is not None and stage == best.stage and t.number in best.trials))
    return sorted(rows, key=lambda r: (not r.chosen, r.number != (best.trial_number if best else -1), r.stage, r.number))


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
    """What the user paid for: internal duplicates (a claim that stood down) and an earlier
    version's pruned asks launched nothing, and an experiment cut short that ran again since is
    that run's, not a failure."""
    hidden = ("duplicate", "not launched")
    again = {(r.stage, r.name) for r in rows if r.status not in (*hidden, "interrupted")}
    return [r for r in rows if r.status not in hidden and not (r.status == "interrupted" and (r.stage, r.name) in again)]


def _stage_name(stage: int) -> str:
    return f"z{stage}"


def _chosen_label(best: Optimum, metric: Metric) -> str:
    """The optimum as a figure's hover and legend say it: the same figure as the headline."""
    return _safe(f"{CHOSEN}: {best.name}") + "<br>" + _safe(best.figure(metric))


def _error_bars(best: Optimum) -> dict[str, Any]:
    """Its runs' range about their mean."""
    return {"type": "data", "symmetric": False, "array": [max(best.runs) - best.value], "arrayminus": [best.value - min(best.runs)],
            "color": _CHOSEN_COLOR, "thickness": 2, "width": 8}


@dataclasses.dataclass(frozen=True)
class _Context:
    """What every figure is drawn against: the metric, the user's config, the optimum, and the
    name of the devices."""

    metric: Metric
    baseline: ExperimentRow | None
    best: Optimum | None
    device: str  # "GPU", "CPU device"...


def _metric_vs_mbs(rows: list[ExperimentRow], ctx: _Context) -> go.Figure:
    fig = go.Figure()
    metric, baseline = ctx.metric, ctx.baseline
    label = metric.label
    hover = "%{text}<br>mbs %{x}<br>" + _safe(metric.name) + " %{y:,.4r}<extra></extra>"
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
        failed = [r for r in rows if r.stage == stage and r.status not in ("complete", "duplicate", "not launched", "running") and r.mbs]
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
                                 hovertemplate=_safe(baseline.name) + "<br>your config<br>%{y:,.4r}<extra></extra>"))
    if ctx.best is not None:
        best = ctx.best
        fig.add_trace(go.Scatter(x=[best.config.micro_batch], y=[best.value], mode="markers+text", name=CHOSEN, marker=_CHOSEN_MARKER,
                                 error_y=_error_bars(best), text=[CHOSEN], textposition="bottom right",
                                 hovertemplate=_chosen_label(best, metric) + "<extra></extra>"))
    fig.update_layout(title=_title(f"{_safe(label)} against micro-batch size per {ctx.device}"),
                      xaxis_title=f"micro-batch size per {ctx.device}", yaxis_title=_safe(label), **_FIGURE_LAYOUT)
    return fig


def _best_per_stage(leaders: dict[int, Optimum], ctx: _Context) -> go.Figure:
    """Each stage's best config (the chosen stage's is the optimum) by the mean of its runs,
    with their range."""
    metric, baseline = ctx.metric, ctx.baseline
    stages = sorted(leaders)
    label = metric.label
    chosen = ctx.best.stage if ctx.best is not None else None
    fig = go.Figure(go.Bar(
        x=[_stage_name(s) for s in stages], y=[leaders[s].value for s in stages], name="best",
        marker_color=[_STAGE_COLORS.get(s, "#333") for s in stages],
        error_y={"type": "data", "symmetric": False, "array": [max(leaders[s].runs) - leaders[s].value for s in stages],
                 "arrayminus": [leaders[s].value - min(leaders[s].runs) for s in stages]},
        text=[("<b>chosen</b><br>" if s == chosen else "") + f"{format_number(leaders[s].value)}<br>mbs {leaders[s].config.micro_batch}"
              for s in stages],
        textposition="outside", cliponaxis=False,
        customdata=[_safe(leaders[s].name) + "<br>" + _safe(leaders[s].figure(metric)) for s in stages],
        hovertemplate="%{customdata}<extra></extra>"))
    if ctx.best is not None:
        best = ctx.best
        fig.add_trace(go.Bar(x=[_stage_name(best.stage)], y=[best.value], name=CHOSEN, hovertemplate=_chosen_label(best, metric) + "<extra></extra>",
                             marker={"color": "rgba(0,0,0,0)", "line": {"color": _CHOSEN_COLOR, "width": 4}}))
    if baseline is not None and baseline.value is not None:
        fig.add_hline(y=baseline.value, line={"color": "#000", "dash": "dash"},
                      annotation_text=f"your config {format_number(baseline.value)}", annotation_position="top left")
    top = max((max(b.runs) for b in leaders.values()), default=1.0)
    fig.update_layout(title=_title(f"Best {_safe(metric.name)} per ZeRO stage (mean of each config's runs)"), xaxis_title="ZeRO stage",
                      yaxis_title=_safe(label), showlegend=False, yaxis_range=[0, top * 1.3], barmode="overlay", **_FIGURE_LAYOUT)
    return fig


def _history(rows: list[ExperimentRow], ctx: _Context) -> go.Figure:
    metric, baseline, best = ctx.metric, ctx.baseline, ctx.best
    ordered = sorted((r for r in rows if r.end), key=lambda r: r.end)  # type: ignore[arg-type,return-value]
    fig = go.Figure()
    for stage in sorted({r.stage for r in ordered}):
        pts = [(i, r) for i, r in enumerate(ordered) if r.stage == stage and r.value is not None]
        fig.add_trace(go.Scatter(x=[i for i, _ in pts], y=[r.value for _, r in pts], mode="markers", name=_stage_name(stage),
                                 marker={"symbol": _STAGE_SYMBOL.get(stage, "circle"), "size": 9, "color": _STAGE_COLORS.get(stage, "#333")},
                                 text=[_safe(r.name) for _, r in pts], hovertemplate="%{text}<br>%{y:,.4r}<extra></extra>"))
    if best is not None:
        runs = [(i, r) for i, r in enumerate(ordered) if r.chosen and r.value is not None]
        fig.add_trace(go.Scatter(x=[i for i, _ in runs], y=[r.value for _, r in runs], mode="markers", name=CHOSEN, marker=_CHOSEN_MARKER,
                                 hovertemplate=_chosen_label(best, metric) + "<extra></extra>"))
        fig.add_hline(y=best.value, line={"color": _CHOSEN_COLOR, "dash": "dot"},
                      annotation_text=_safe(f"{CHOSEN}: {metric.with_unit(best.value)}"), annotation_position="bottom right")
    mine = [i for i, r in enumerate(ordered) if baseline is not None and r.name == baseline.name and r.stage == baseline.stage]
    if mine and baseline is not None and baseline.value is not None:
        fig.add_trace(go.Scatter(x=mine[:1], y=[baseline.value], mode="markers+text", name="your config", marker=_BASELINE_MARKER,
                                 text=["your config"], textposition="top right", hovertemplate="your config<br>%{y:,.4r}<extra></extra>"))
    fig.update_layout(title=_title("Optimization history"), xaxis={"title": "experiment (in order of completion)", "tickformat": "d"},
                      yaxis_title=_safe(metric.label), **_FIGURE_LAYOUT)
    return fig


@dataclasses.dataclass(frozen=True)
class _Profile:
    start: datetime.datetime
    seconds: float
    slot: str


def _timeline(rows: list[ExperimentRow], ctx: _Context, profile: _Profile | None, spend: str) -> go.Figure:
    baseline = ctx.baseline
    fig = go.Figure()
    timed = [r for r in rows if r.start and r.end]
    if profile is not None:
        fig.add_trace(go.Bar(base=[profile.start.isoformat()], x=[profile.seconds * 1000], y=[_safe(profile.slot)], orientation="h",
                             name="profile run", marker_color=_PROFILE_COLOR, text=["profile"], textposition="inside",
                             hovertemplate="profile run<br>%{x:,.0f} ms<extra></extra>"))
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
            textposition="none", hovertemplate="%{text}<br>%{x:,.0f} ms<extra></extra>",
        ))
    chosen = [r for r in timed if r.chosen]
    if ctx.best is not None and chosen:
        fig.add_trace(go.Bar(
            base=[r.start.isoformat() for r in chosen],  # type: ignore[union-attr]
            x=[r.duration * 1000 for r in chosen],  # type: ignore[operator]
            y=[_safe(r.slot or "?") for r in chosen], orientation="h", name=CHOSEN,
            marker={"color": "rgba(0,0,0,0)", "line": {"color": _CHOSEN_COLOR, "width": 3}},
            text=[_safe(r.name) for r in chosen], textposition="none",
            hovertemplate=_chosen_label(ctx.best, ctx.metric) + "<br>this run: %{text}<extra></extra>"))
    fig.update_layout(title=_title(f"{ctx.device} slots: {_safe(spend)}"), xaxis={"type": "date", "title": "time"},
                      yaxis_title=f"{ctx.device} slot", barmode="overlay", **_FIGURE_LAYOUT)
    return fig


def _importances(study: optuna.Study, stage: int, ctx: _Context) -> go.Figure | None:
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
    best = ctx.best
    # Each knob's setting in the optimum, beside its bar; another stage's optimum is named.
    setting = {}
    if best is not None and best.stage == stage:
        setting = {**(best.ds_config.get(ZERO_KEY) or {}), MBS_KEY: best.config.micro_batch}
    chosen = {n: f"{CHOSEN}: {format_value(setting[n])}" for n in names if n in setting}
    fig = go.Figure(go.Bar(x=[scores[n] for n in names], y=[_safe(n) for n in names], orientation="h", name="importance",
                           text=[_safe(chosen.get(n, "")) for n in names], textposition="outside", cliponaxis=False))
    if best is not None:
        where = f"{CHOSEN}: {best.name}" + ("" if best.stage == stage else f" (z{best.stage})")
        fig.add_annotation(text=_safe(where), xref="paper", yref="paper", x=1, y=1.02, xanchor="right", yanchor="bottom",
                           showarrow=False, font={"color": _CHOSEN_COLOR})
    fig.update_layout(title=_title(f"Knob importances, z{stage} (PED-ANOVA over {len(knob_trials)} experiments)"),
                      xaxis={"title": "importance", "range": [0, max(scores.values(), default=1.0) * 1.35]}, height=430,
                      margin=_FIGURE_LAYOUT["margin"])
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
    best: Optimum | None = None
    summary_rows: tuple[tuple[str, ...], ...] = ()
    notes: tuple[str, ...] = ()


def _profile(root: RootRecord, rows: list[ExperimentRow]) -> _Profile | None:
    end, seconds = root.profile_end, root.profile_duration
    if not end or seconds is None:
        return None
    slots = sorted({r.slot for r in rows if r.slot})
    start = datetime.datetime.fromisoformat(end) - datetime.timedelta(seconds=float(seconds))
    return _Profile(start=start, seconds=float(seconds), slot=slots[0] if slots else "?")


def load_report(storage: optuna.storages.BaseStorage, study_name: str, *, result: TuningResult,
                advice: LearningRateAdvice | str | None = None, budget: Budget | None = None) -> ReportData:
    metric, best, spend = result.metric, result.best, result.spend
    studies = stage_studies(storage, study_name)
    rows = _hide(experiment_rows(studies, best))
    root = RootRecord.from_attrs(optuna.load_study(study_name=study_name, storage=storage).user_attrs)
    base = result.baseline
    baseline = next((r for r in sorted(rows, key=lambda r: r.status != "complete")
                     if base is not None and base.name and r.name == base.name and r.stage == base.stage), None)
    ctx = _Context(metric=metric, baseline=baseline, best=best, device=spend.noun)
    figures = {
        "metric_vs_mbs": _metric_vs_mbs(rows, ctx),
        "best_per_stage": _best_per_stage({s.stage: s.best for s in result.stages if s.best is not None}, ctx),
        "history": _history(rows, ctx),
        "timeline": _timeline(rows, ctx, _profile(root, rows), f"{spend.hours}, {spend.experiments} runs"),
    }
    for stage, study in studies.items():
        fig = _importances(study, stage, ctx)
        if fig is not None:
            figures[f"importance_z{stage}"] = fig
    plan = load_plan(storage, study_name)
    script = os.path.basename(plan.script) if plan is not None else ""
    title = f"{script}: the fastest DeepSpeed config" + ("" if study_name == "optuna-ds" else f" (tuning {study_name})")
    memory_note = ""
    if not any(r.peak_memory for r in rows):
        memory_note = (f"Peak GPU memory per experiment: {(root.resources.gpu_memory if root.resources else '') or 'not reported'}."
                       if spend.device == "GPU" else f"Peak memory per experiment: not measured on this accelerator ({spend.noun}).")
    return ReportData(study_name=study_name, metric=metric, studies=studies, rows=rows, figures=figures, title=title,
                      headline=tuple(headline(result, budget)), memory_note=memory_note, baseline=baseline.name if baseline else "",
                      best=best, summary_rows=tuple(summary_rows(result)), notes=tuple(summary_notes(result, advice)))


def _gib(n: float | None) -> str:
    return "" if not n else f"{n / 2**30:.2f} GiB"


def _href(path: str, base_dir: str) -> str:
    return urllib.parse.quote(os.path.relpath(path, base_dir) if base_dir else path)


@dataclasses.dataclass(frozen=True)
class _Cell:
    text: str = ""
    sort: str | None = None  # what the column sorts by, where the text is not it
    href: str = ""


def _table(data: ReportData, *, base_dir: str) -> tuple[list[str], list[tuple[ExperimentRow, dict[str, Any]]]]:
    """The experiments table's columns and, per row, its cells by column."""
    metric, best = data.metric, data.best
    memory = any(r.peak_memory for r in data.rows)
    heads = ["stage", "trial", "experiment", "status", metric.label, "mbs", "gas", "knobs", "slot", "seconds",
             *(["peak GPU memory"] if memory else []), "reason", "logs"]
    out = []
    for r in data.rows:
        badge = ""
        if best is not None and r.chosen and r.number == best.trial_number:
            badge = f"{CHOSEN}: {best.figure(metric)}"
        cells = {
            "stage": _Cell(f"z{r.stage}"),
            "trial": _Cell(str(r.number)),
            "experiment": _Cell(r.name, href=_href(r.result_dir, base_dir) if r.result_dir else ""),
            "badge": badge,
            "mine": r.name == data.baseline,
            "status": _Cell(r.status),
            "value": _Cell("" if r.value is None else format_number(r.value), sort="" if r.value is None else repr(r.value)),
            "mbs": _Cell(str(r.mbs or "")),
            "gas": _Cell(str(r.gas or "")),
            "knobs": [f"{k}={format_value(v)}" for k, v in sorted(r.knobs.items())],
            "slot": _Cell(r.slot),
            "seconds": _Cell("" if r.duration is None else f"{r.duration:,.1f}", sort="" if r.duration is None else repr(r.duration)),
            "memory": _Cell(_gib(r.peak_memory), sort=repr(r.peak_memory or 0)) if memory else None,
            "reason": _Cell(r.detail),
            "logs": [(f.split(".")[0], _href(os.path.join(r.result_dir, f), base_dir)) for f in ("stdout.log", "stderr.log")]
                    if r.result_dir else [],
        }
        out.append((r, cells))
    return heads, out


_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_PAGE = _ENV.from_string("""<!DOCTYPE html>
<html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>{{ title }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.6em; margin: 0 0 .5em; }
.headline { background: #eef6ee; border-left: 6px solid #2a9d8f; padding: .6em 1em; font-size: 1.1em; }
.headline p { margin: .3em 0; }
.headline p.warning { color: #9a3412; }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 1em; }
.figures > div { min-width: 0; }
table { border-collapse: collapse; font-size: 13px; }
table.experiments { width: 100%; }
td, th { border: 1px solid #ccc; padding: 3px 6px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.sortable th { cursor: pointer; user-select: none; background: #f3f3f3; }
table.sortable th[aria-sort=ascending]::after { content: " \\25B2"; }
table.sortable th[aria-sort=descending]::after { content: " \\25BC"; }
td.experiment { min-width: 15em; overflow-wrap: anywhere; }
td.knobs span { white-space: nowrap; }
td.reason { min-width: 16em; overflow-wrap: anywhere; }
tr.oom td, tr.error td, tr.timeout td, tr.no-metrics td { background: #fdecea; }
tr.chosen td { background: #fff1f0; }
tr.chosen td:first-child { border-left: 4px solid #d62728; }
.mine { background: #ffd60a; border-radius: 3px; padding: 0 4px; font-size: 11px; white-space: nowrap; }
.chosen-badge { display: block; color: #fff; background: #d62728; border-radius: 3px; padding: 0 4px; font-size: 11px; margin-top: 2px; }
.note { color: #555; }
</style></head><body>
<h1>{{ title }}</h1>
<div class="headline">{% for line in headline %}<p{% if line.startswith("Warning:") %} class="warning"{% endif %}>{{ line }}</p>{% endfor %}</div>
<div class="figures">{% for figure in figures %}{{ figure }}{% endfor %}</div>
<h2>Summary</h2>
<table class="summary sortable"><thead><tr>{% for h in summary_head %}<th>{{ h }}</th>{% endfor %}</tr></thead><tbody>
{% for row in summary_rows %}<tr{% if row[0] == "global" or (best and row[-1] == best.name) %} class="chosen"{% endif %}>{% for cell in row %}<td{% if loop.index in (2, 3, 4) %} class="num"{% endif %}>{{ cell }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>
<ul class="notes">{% for note in notes %}<li>{{ note }}</li>{% endfor %}</ul>
<h2>Experiments</h2>
{% if memory_note %}<p class="note">{{ memory_note }}</p>{% endif %}
<p class="note">The optimum's runs come first{% if best %} (highlighted){% endif %}; click a column's header to sort by it.</p>
<table class="experiments sortable"><thead><tr>{% for h in heads %}<th class="{{ h.split()[0] }}">{{ h }}</th>{% endfor %}</tr></thead><tbody>
{% for row, c in rows %}<tr class="{{ row.status }}{% if row.chosen %} chosen{% endif %}">
<td class="stage">{{ c.stage.text }}</td><td class="trial num">{{ c.trial.text }}</td>
<td class="experiment">{% if c.experiment.href %}<a href="{{ c.experiment.href }}">{{ c.experiment.text }}</a>{% else %}{{ c.experiment.text }}{% endif %}{% if c.mine %} <span class="mine">your config</span>{% endif %}{% if c.badge %}<span class="chosen-badge">{{ c.badge }}</span>{% endif %}</td>
<td class="status">{{ c.status.text }}</td><td class="{{ heads[4].split()[0] }} num" data-sort="{{ c.value.sort }}">{{ c.value.text }}</td>
<td class="mbs num">{{ c.mbs.text }}</td><td class="gas num">{{ c.gas.text }}</td>
<td class="knobs">{% for k in c.knobs %}{% if not loop.first %}, {% endif %}<span>{{ k }}</span>{% endfor %}</td>
<td class="slot">{{ c.slot.text }}</td><td class="seconds num" data-sort="{{ c.seconds.sort }}">{{ c.seconds.text }}</td>
{% if c.memory %}<td class="peak num" data-sort="{{ c.memory.sort }}">{{ c.memory.text }}</td>{% endif %}
<td class="reason">{{ c.reason.text }}</td>
<td class="logs">{% for text, href in c.logs %}{% if not loop.first %} {% endif %}<a href="{{ href }}">{{ text }}</a>{% endfor %}</td></tr>
{% endfor %}</tbody></table>
<script>
document.querySelectorAll("table.sortable").forEach(table => table.querySelectorAll("th").forEach((th, column) => {
  th.addEventListener("click", () => {
    const up = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("th").forEach(h => h.removeAttribute("aria-sort"));
    th.setAttribute("aria-sort", up ? "ascending" : "descending");
    const key = tr => { const td = tr.children[column]; const v = td ? (td.dataset.sort ?? td.textContent.trim()) : "";
                        const n = Number(v.replace(/^z/, "")); return v === "" ? null : isNaN(n) ? v : n; };
    const body = table.tBodies[0];
    [...body.rows].sort((a, b) => { const x = key(a), y = key(b);
      if (x === null || y === null) return (x === null) - (y === null);
      return (typeof x === typeof y ? (x > y) - (x < y) : typeof x === "number" ? -1 : 1) * (up ? 1 : -1); })
      .forEach(tr => body.appendChild(tr));
  });
}));
</script>
</body></html>
""")


def render_report(data: ReportData, *, base_dir: str = "") -> str:
    """One self-contained HTML page (plotly.js inlined, nothing loaded from elsewhere): the
    headline, the figures (the optimum marked in each), the summary, and every experiment (the
    optimum's first), readable at 1280 px. jinja2 escapes every string; each experiment links
    to its folder and logs relative to ``base_dir``, where the page lies."""
    figures = [markupsafe.Markup(plotly.io.to_html(fig, full_html=False, include_plotlyjs=(i == 0), div_id=fig_id, default_width="100%",
                                                   config=_PLOTLY_CONFIG))
               for i, (fig_id, fig) in enumerate(data.figures.items())]
    heads, rows = _table(data, base_dir=base_dir)
    return _PAGE.render(title=data.title or data.study_name, headline=data.headline, figures=figures, summary_head=SUMMARY_HEAD,
                        summary_rows=data.summary_rows, best=data.best, notes=data.notes, memory_note=data.memory_note,
                        heads=heads, rows=rows)


def write_report(data: ReportData, path: str) -> str:
    write_file(path, render_report(data, base_dir=os.path.dirname(os.path.abspath(path))))
    return path


ROOT_NOTE = """This study holds the tuning's plan (script, arguments, config), the model info and the
memory estimates; it has no experiments. Each experiment is a trial of a stage study:
{stages}.
"""
OPTIMUM_ATTR = "optimum"  # on each stage study: where the tuning's optimum is, for optuna-dashboard


def optimum_attr(best: Optimum, *, tuning: str, metric: Metric) -> dict[str, Any]:
    """The optimum as a stage study's user attr: Optuna's own best trial is its single highest
    run, so the dashboard shows, beside it, which trial the tuning chose and why."""
    return {"study": stage_study_name(tuning, best.stage), "trial": best.trial_number, "exp_name": best.name,
            "runs": list(best.trials), "figure": best.figure(metric), "final": best.chosen}


def register_with_dashboard(data: ReportData, storage: optuna.storages.BaseStorage, *, note: str) -> None:
    """Give optuna-dashboard what it can show: the summary (a Markdown note with the headline)
    on each study, where the optimum is (a user attr, and a line saying why Optuna's best trial
    is another), the root study described, and the report's figures as custom plots."""
    import optuna_dashboard

    root = optuna.load_study(study_name=data.study_name, storage=storage)
    stages = ", ".join(f"`{s.study_name}`" for s in data.studies.values()) or "none yet"
    optuna_dashboard.save_note(root, ROOT_NOTE.format(stages=stages) + "\n" + note)
    for fig_id, fig in data.figures.items():
        optuna_dashboard.save_plotly_graph_object(root, fig, graph_object_id=fig_id)
    for stage, study in data.studies.items():
        if data.best is not None:
            study.set_user_attr(OPTIMUM_ATTR, optimum_attr(data.best, tuning=data.study_name, metric=data.metric))
        optuna_dashboard.save_note(study, note)
        for fig_id in ("metric_vs_mbs", f"importance_z{stage}"):
            if fig_id in data.figures:
                optuna_dashboard.save_plotly_graph_object(study, data.figures[fig_id], graph_object_id=fig_id)


def best_stage_study(storage: optuna.storages.BaseStorage) -> tuple[int, str] | None:
    """The stage study holding the optimum of the storage's first tuning that has one,
    ``(id, name)``: where the dashboard should open, rather than a root study that has no trials."""
    for tuning in tuning_names(storage):
        plan = load_plan(storage, tuning)
        if plan is None:
            continue
        user = parse_user_config(plan.user_config, path=plan.config_path, script_args=plan.script_args)
        best = load_result(storage, plan, user).best
        if best is not None:
            name = stage_study_name(tuning, best.stage)
            return storage.get_study_id_from_name(name), name
    return None
