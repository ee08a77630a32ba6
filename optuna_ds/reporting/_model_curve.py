"""The planner's model curve on the report's throughput-against-size figure: a dashed line
and a band, marks of their own, so no size that never ran reads as measured (docs/report.md)."""
from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from optuna_ds.config import Metric
from optuna_ds.planner import ModelCurve

MODEL_ESTIMATE = "model estimate"  # the legend of the model's mean, after the arm's name


def model_traces(curves: Sequence[ModelCurve], metric: Metric, *, colors: dict[int, str]) -> list[go.Scatter]:
    """For each curve, its band (one posterior deviation either side, shaded) and its mean (a
    dashed line named "z<stage> model estimate"), in the metric's units and the stage's colour."""
    traces = []
    for c in curves:
        color = colors.get(c.stage, "#333")
        arm = f"z{c.stage}" + (f" {c.offload}" if c.offload else "")
        mean = [metric.rate(v) for v in c.mean]  # a rate back to the metric: its own inverse
        low, high = ([metric.rate(v) for v in c.low], [metric.rate(v) for v in c.high])
        if not metric.maximize:
            low, high = high, low
        sizes = list(c.sizes)
        traces.append(go.Scatter(
            x=sizes + sizes[::-1], y=high + low[::-1], mode="lines", fill="toself", fillcolor=color, opacity=0.12,
            line={"width": 0, "color": color}, name=f"{arm} model band", legendgroup=arm, showlegend=False, hoverinfo="skip"))
        traces.append(go.Scatter(
            x=sizes, y=mean, mode="lines", name=f"{arm} {MODEL_ESTIMATE}", legendgroup=arm,
            line={"dash": "dash", "width": 1.5, "color": color},
            hovertemplate=f"{arm} {MODEL_ESTIMATE}<br>mbs %{{x}}<br>{metric.name} %{{y:,.4r}}<extra></extra>"))
    return traces
