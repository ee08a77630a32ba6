"""The report's figures (plotly), which optuna-dashboard shows too: one colour and marker per
ZeRO stage throughout, each run a point, the optimum a red ring in each."""

from __future__ import annotations

import dataclasses
import datetime
import math
import warnings
from typing import Any

import markupsafe
import optuna
import plotly.graph_objects as go
from optuna.trial import TrialState

from optuna_ds.config import Metric
from optuna_ds.config import format_number
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import GAS_KEY
from optuna_ds.domain import Knobs
from optuna_ds.domain import MBS_KEY
from optuna_ds.domain import Phase
from optuna_ds.domain import RootRecord
from optuna_ds.domain import ZERO_KEY
from optuna_ds.domain import is_checkpointing
from optuna_ds.planner import ModelCurve
from optuna_ds.reporting._model_curve import model_traces
from optuna_ds.reporting._rows import ExperimentRow
from optuna_ds.reporting._rows import format_value
from optuna_ds.reporting._worth import judged_noise
from optuna_ds.studies import Optimum
from optuna_ds.studies import TuningResult


_MIN_TRIALS_FOR_IMPORTANCE = 4
# One colour and marker per ZeRO stage, shared by its runs, its knob experiments, its failures
# and its timeline bars.
_STAGE_COLORS = {0: "#1f77b4", 1: "#e8710a", 2: "#2ca02c", 3: "#9467bd"}
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


def _title(text: str) -> dict[str, Any]:
    return {"text": text, "x": 0.01, "xanchor": "left", "yref": "container", "y": 1.0, "yanchor": "top", "pad": {"t": 36}}


def _safe(text: object) -> str:
    """Figures embed their text in a <script> block and plotly renders some HTML in it: every
    string that comes from the user or an experiment's output is escaped."""
    return str(markupsafe.escape(str(text)))


def _stage_name(stage: int) -> str:
    return f"z{stage}"


def _chosen_label(best: Optimum, metric: Metric) -> str:
    """The optimum as a figure's hover and legend say it: the same figure as the headline."""
    return _safe(f"{CHOSEN}: {best.name}") + "<br>" + _safe(best.figure(metric))


def _noise_bars(configs: list[Optimum], noise: float | None,
                **style: Any) -> dict[str, Any] | None:
    """One noise deviation of each config's mean about it, in log (``noise`` a run over its
    runs), the planner's measure: a config it did not judge equivalent to the choice lies beyond
    the choice's bar (and the choice beyond its), so no bar spans a figure the text sets apart.
    ``None`` where the noise is unknown."""
    if noise is None:
        return None
    spreads = [noise / math.sqrt(len(c.runs)) for c in configs]
    pairs = list(zip(configs, spreads))
    return {"type": "data", "symmetric": False, "array": [c.value * math.expm1(d) for c, d in pairs],
            "arrayminus": [-c.value * math.expm1(-d) for c, d in pairs], **style}


@dataclasses.dataclass(frozen=True)
class _Context:
    """What every figure is drawn against: the metric, the user's config, the optimum, and the
    name of the devices."""

    metric: Metric
    baseline: ExperimentRow | None  # its first run
    best: Optimum | None
    device: str  # "GPU", "CPU device"...
    mine: float | None = None  # the mean of its runs: the figure of the headline
    mine_runs: int = 1
    noise: float | None = None  # of one run, as the planner judged the configs by it
    curves: tuple[ModelCurve, ...] = ()  # the planner's model over sizes, where it recorded one

    def is_mine(self, row: ExperimentRow) -> bool:
        """Whether ``row`` is a run of the user's config (its first or a re-run)."""
        base = self.baseline
        return base is not None and row.stage == base.stage and row.record.config is not None and row.record.config == base.record.config

    @property
    def mine_label(self) -> str:
        runs = f" (mean of {self.mine_runs} runs)" if self.mine_runs > 1 else ""
        return f"your config {format_number(self.mine)}{runs}" if self.mine is not None else "your config"


def _beside(x: float, xs: list[float], side: str) -> str:
    """A text position ``side`` of a marker at ``x``, to its left where it is the rightmost
    (the plot's right margin is narrow: a label there is cut off)."""
    return f"{side} left" if xs and x >= max(xs) else f"{side} right"


def _metric_vs_mbs(rows: list[ExperimentRow], ctx: _Context) -> go.Figure:
    fig = go.Figure()
    metric, baseline = ctx.metric, ctx.baseline
    label = metric.label
    hover = "%{text}<br>mbs %{x}<br>" + _safe(metric.name) + " %{y:,.4r}<extra></extra>"
    floor = min((r.value for r in rows if r.value is not None), default=0.0)
    for stage in sorted({r.stage for r in rows}):
        color = _STAGE_COLORS.get(stage, "#333")
        ok = sorted((r for r in rows if r.stage == stage and r.status == "complete" and r.mbs), key=lambda r: r.mbs)  # type: ignore[arg-type,return-value]
        # Activation checkpointing and each AutoTP size run a curve of their own, beyond the
        # stage's memory edge.
        checkpointed = [r for r in ok if r.phase != "knobs" and any(is_checkpointing(k) for k in r.knobs)]
        split = {t: [r for r in ok if r.phase != "knobs" and Knobs(r.knobs).autotp == t]
                 for t in sorted({Knobs(r.knobs).autotp for r in ok} - {1})}
        curve = [r for r in ok if r.phase != "knobs" and r not in checkpointed and Knobs(r.knobs).autotp == 1]
        knobs = [r for r in ok if r.phase == "knobs"]
        group = _stage_name(stage)
        # Each run a point: a line through them would draw sizes that never ran.
        fig.add_trace(go.Scatter(
            x=[r.mbs for r in curve], y=[r.value for r in curve], mode="markers", name=group, legendgroup=group,
            marker={"symbol": _STAGE_SYMBOL.get(stage, "circle"), "size": 8, "color": color},
            text=[_safe(r.name) for r in curve], hovertemplate=hover))
        if checkpointed:
            fig.add_trace(go.Scatter(
                x=[r.mbs for r in checkpointed], y=[r.value for r in checkpointed], mode="markers", name=f"{group} checkpointing",
                legendgroup=group,
                marker={"symbol": f"{_STAGE_SYMBOL.get(stage, 'circle')}-open", "size": 9, "color": color, "line": {"width": 2}},
                text=[_safe(r.name) for r in checkpointed], hovertemplate=hover))
        for t, runs in split.items():
            fig.add_trace(go.Scatter(
                x=[r.mbs for r in runs], y=[r.value for r in runs], mode="markers", name=f"{group} AutoTP {t}",
                legendgroup=group,
                marker={"symbol": "triangle-up-open", "size": 9, "color": color, "line": {"width": 2}},
                text=[_safe(r.name) for r in runs], hovertemplate=hover))
        if knobs:
            fig.add_trace(go.Scatter(
                x=[r.mbs for r in knobs], y=[r.value for r in knobs], mode="markers", name=f"{group} knobs", legendgroup=group,
                marker={"symbol": "diamond-open", "size": 11, "color": color, "line": {"width": 2}},
                text=[_safe(r.name) for r in knobs], hovertemplate=hover))
        pruned = [r for r in rows if r.stage == stage and r.status == "pruned" and r.mbs and r.record.pruned]
        if pruned:  # at the figure of the steps it ran (docs/steps.md)
            fig.add_trace(go.Scatter(
                x=[r.mbs for r in pruned], y=[float(r.record.pruned["figure"]) for r in pruned], mode="markers",  # type: ignore[index]
                name=f"{group} pruned", legendgroup=group,
                marker={"symbol": f"{_STAGE_SYMBOL.get(stage, 'circle')}-open", "size": 9, "color": color, "line": {"width": 1}},
                text=[_safe(f"{r.name}: {r.detail}") for r in pruned], hovertemplate=hover))
        failed = [r for r in rows if r.stage == stage and r.status not in ("complete", "duplicate", "not launched", "running", "pruned")
                  and r.mbs]
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
    for trace in model_traces(ctx.curves, metric, colors=_STAGE_COLORS):  # the model: lines, the runs: points
        fig.add_trace(trace)
    sizes = [float(r.mbs) for r in rows if r.mbs]
    if baseline is not None and baseline.mbs and ctx.mine is not None:
        # At the mean of its runs, as the headline gives it, not at its first run.
        fig.add_trace(go.Scatter(x=[baseline.mbs], y=[ctx.mine], mode="markers+text", name="your config",
                                 marker=_BASELINE_MARKER, text=["your config"], textposition=_beside(baseline.mbs, sizes, "top"),
                                 cliponaxis=False, hovertemplate=_safe(f"{baseline.name}<br>{ctx.mine_label}") + "<extra></extra>"))
    if ctx.best is not None:
        best = ctx.best
        bars = _noise_bars([best], ctx.noise, color=_CHOSEN_COLOR, thickness=2, width=8)
        fig.add_trace(go.Scatter(x=[best.config.micro_batch], y=[best.value], mode="markers+text", name=CHOSEN, marker=_CHOSEN_MARKER,
                                 error_y=bars, text=[CHOSEN], textposition=_beside(best.config.micro_batch, sizes, "bottom"),
                                 cliponaxis=False, hovertemplate=_chosen_label(best, metric) + "<extra></extra>"))
    fig.update_layout(title=_title(f"{_safe(label)} against micro-batch size per {ctx.device}"),
                      xaxis_title=f"micro-batch size per {ctx.device}", yaxis_title=_safe(label), **_FIGURE_LAYOUT)
    return fig


def _best_per_stage(leaders: dict[int, Optimum], ctx: _Context) -> go.Figure:
    """Each stage's best config (the chosen stage's is the optimum) by the mean of its runs,
    with one noise deviation of it (:func:`_noise_bars`)."""
    metric, baseline = ctx.metric, ctx.baseline
    stages = sorted(leaders)
    label = metric.label
    chosen = ctx.best.stage if ctx.best is not None else None
    fig = go.Figure(go.Bar(
        x=[_stage_name(s) for s in stages], y=[leaders[s].value for s in stages], name="best",
        marker_color=[_STAGE_COLORS.get(s, "#333") for s in stages],
        error_y=_noise_bars([leaders[s] for s in stages], ctx.noise),
        text=[("<b>chosen</b><br>" if s == chosen else "") + f"{format_number(leaders[s].value)}<br>mbs {leaders[s].config.micro_batch}"
              for s in stages],
        textposition="outside", cliponaxis=False, showlegend=False,
        customdata=[_safe(leaders[s].name) + "<br>" + _safe(leaders[s].figure(metric)) for s in stages],
        hovertemplate="%{customdata}<extra></extra>"))
    if ctx.best is not None:
        best = ctx.best
        fig.add_trace(go.Bar(x=[_stage_name(best.stage)], y=[best.value], name=CHOSEN, hovertemplate=_chosen_label(best, metric) + "<extra></extra>",
                             marker={"color": "rgba(0,0,0,0)", "line": {"color": _CHOSEN_COLOR, "width": 4}}, showlegend=False))
    if baseline is not None and ctx.mine is not None:
        # Named in the legend: a label on the line lies over a bar.
        line = {"color": "#000", "dash": "dash"}
        fig.add_hline(y=ctx.mine, line=line)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=line, name=_safe(ctx.mine_label), hoverinfo="skip"))
    top = max((max(b.runs) for b in leaders.values()), default=1.0)
    bar = ", ± one noise deviation of it" if ctx.noise is not None else ""
    title = _title(f"Best {_safe(metric.name)} per ZeRO stage (mean of each config's runs{bar})")
    fig.update_layout(title=title, xaxis_title="ZeRO stage",
                      yaxis_title=_safe(label), showlegend=True, yaxis_range=[0, top * 1.3], barmode="overlay", **_FIGURE_LAYOUT)
    return fig


def _history(rows: list[ExperimentRow], ctx: _Context) -> go.Figure:
    metric, best = ctx.metric, ctx.best
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
        # Its mean named in the legend: a label on the line lay over the runs near it.
        line = {"color": _CHOSEN_COLOR, "dash": "dot"}
        fig.add_hline(y=best.value, line=line)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=line, hoverinfo="skip",
                                 name=_safe(f"{CHOSEN}: mean {metric.with_unit(best.value)}")))
    mine = [(i, r) for i, r in enumerate(ordered) if ctx.is_mine(r) and r.value is not None]
    if mine:
        # Each of its runs, as the optimum's are ringed.
        fig.add_trace(go.Scatter(x=[i for i, _ in mine], y=[r.value for _, r in mine], mode="markers+text", name="your config",
                                 marker=_BASELINE_MARKER, text=["your config"] + [""] * (len(mine) - 1),
                                 textposition=_beside(mine[0][0], [float(len(ordered) - 1)], "top"), cliponaxis=False,
                                 customdata=[_safe(r.name) for _, r in mine],
                                 hovertemplate="%{customdata}<br>your config<br>%{y:,.4r}<extra></extra>"))
    fig.update_layout(title=_title("Optimization history"), xaxis={"title": "experiment (in order of completion)", "tickformat": "d"},
                      yaxis_title=_safe(metric.label), **_FIGURE_LAYOUT)
    return fig


@dataclasses.dataclass(frozen=True)
class _Profile:
    start: datetime.datetime
    seconds: float
    slot: str


def busy_steps(spans: list[tuple[datetime.datetime, datetime.datetime]]) -> list[tuple[datetime.datetime, int]]:
    """The slots busy over time with runs ``spans`` (start, end): a step at each start and end,
    the count from then on."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda ev: (ev[0], ev[1]))
    steps: list[tuple[datetime.datetime, int]] = []
    busy = 0
    for when, change in events:
        busy += change
        if steps and steps[-1][0] == when:
            steps[-1] = (when, busy)
        else:
            steps.append((when, busy))
    return steps


def _timeline(rows: list[ExperimentRow], ctx: _Context, profile: _Profile | None, spend: str,
              cut: list[ExperimentRow] | None = None) -> go.Figure:
    """Every run in time on its slot; ``cut``: the runs an interrupt cut short, the table's
    hidden ones included (their device time is in the title's), drawn apart from failures."""
    fig = go.Figure()
    timed = [r for r in rows if r.start and r.end and r.status != "interrupted"]
    cut = [r for r in (cut or []) if r.start and r.end]
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
                    "line": {"color": ["#000" if ctx.is_mine(r) else "#fff" for r in group],
                             "width": [3 if ctx.is_mine(r) else 0.5 for r in group]}},
            text=[_safe(r.name + (" (your config)" if ctx.is_mine(r) else "")) for r in group],
            textposition="none", hovertemplate="%{text}<br>%{x:,.0f} ms<extra></extra>",
        ))
    if cut:
        fig.add_trace(go.Bar(
            base=[r.start.isoformat() for r in cut],  # type: ignore[union-attr]
            x=[r.duration * 1000 for r in cut],  # type: ignore[operator]
            y=[_safe(r.slot or "?") for r in cut], orientation="h", name="interrupted",
            marker={"color": "#ced4da", "pattern": {"shape": "/"}, "line": {"color": "#fff", "width": 0.5}},
            text=[_safe(f"{r.name}: interrupted, no failure") for r in cut], textposition="none",
            hovertemplate="%{text}<br>%{x:,.0f} ms<extra></extra>"))
    chosen = [r for r in timed if r.chosen]
    if ctx.best is not None and chosen:
        fig.add_trace(go.Bar(
            base=[r.start.isoformat() for r in chosen],  # type: ignore[union-attr]
            x=[r.duration * 1000 for r in chosen],  # type: ignore[operator]
            y=[_safe(r.slot or "?") for r in chosen], orientation="h", name=CHOSEN,
            marker={"color": "rgba(0,0,0,0)", "line": {"color": _CHOSEN_COLOR, "width": 3}},
            text=[_safe(r.name) for r in chosen], textposition="none",
            hovertemplate=_chosen_label(ctx.best, ctx.metric) + "<br>this run: %{text}<extra></extra>"))
    # Width at a glance: how many slots ran at once, over time, on the right-hand axis.
    steps = busy_steps([(r.start, r.end) for r in timed + cut if r.start and r.end])
    if steps:
        fig.add_trace(go.Scatter(x=[t.isoformat() for t, _ in steps], y=[n for _, n in steps], mode="lines", line_shape="hv",
                                 name="busy slots", yaxis="y2", line={"color": "#495057", "width": 1.5},
                                 hovertemplate="%{y} busy<extra></extra>"))
    # One day: its date in the axis title, not as a second line of tick labels over the legend.
    days = {t.date() for t in [*(r.start for r in timed), *(r.end for r in timed), *([profile.start] if profile else [])] if t}
    xaxis: dict[str, Any] = {"type": "date", "title": "time"}
    if len(days) == 1:
        xaxis.update(title=f"time on {next(iter(days)):%b %d, %Y}", tickformat="%H:%M:%S")
    fig.update_layout(title=_title(f"{ctx.device} slots: {_safe(spend)}"), xaxis=xaxis,
                      yaxis_title=f"{ctx.device} slot", barmode="overlay", **_FIGURE_LAYOUT,
                      yaxis2={"title": "busy slots", "overlaying": "y", "side": "right", "rangemode": "tozero", "showgrid": False,
                              "dtick": 1})
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


def _profile(root: RootRecord, rows: list[ExperimentRow]) -> _Profile | None:
    end, seconds = root.profile_end, root.profile_duration
    if not end or seconds is None:
        return None
    slots = sorted({r.slot for r in rows if r.slot})
    start = datetime.datetime.fromisoformat(end) - datetime.timedelta(seconds=float(seconds))
    return _Profile(start=start, seconds=float(seconds), slot=slots[0] if slots else "?")


def figures(result: TuningResult, *, studies: dict[int, optuna.Study], rows: list[ExperimentRow], baseline: ExperimentRow | None,
            cut: list[ExperimentRow] | None = None,
            root: RootRecord) -> dict[str, go.Figure]:
    """The report's figures, by id, the optimum marked in each; a stage's knob importances where
    enough of its knob experiments ran."""
    spend = result.spend
    base = result.baseline
    mine = base.value if base is not None and baseline is not None and base.name == baseline.name else None
    ctx = _Context(metric=result.metric, baseline=baseline, best=result.best, device=spend.noun, mine=mine,
                   mine_runs=base.runs if base is not None else 1, noise=judged_noise(result), curves=result.model_curves)
    out = {
        "metric_vs_mbs": _metric_vs_mbs(rows, ctx),
        "best_per_stage": _best_per_stage({s.stage: s.best for s in result.stages if s.best is not None}, ctx),
        "history": _history(rows, ctx),
        "timeline": _timeline(rows, ctx, _profile(root, rows), f"{spend.hours}, {spend.experiments} runs", cut),
    }
    for stage, study in studies.items():
        fig = _importances(study, stage, ctx)
        if fig is not None:
            out[f"importance_z{stage}"] = fig
    return out
