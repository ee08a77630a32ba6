"""The HTML report: one self-contained page, its template a package file."""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import os
import urllib.parse
from typing import Any

import jinja2
import markupsafe
import plotly.io

from optuna_ds._files import write_file
from optuna_ds.config import format_number
from optuna_ds.reporting._data import ReportData
from optuna_ds.reporting._figures import CHOSEN
from optuna_ds.reporting._rows import ExperimentRow
from optuna_ds.reporting._rows import format_value
from optuna_ds.reporting._tables import RUNS_HEAD


_PLOTLY_CONFIG = {"responsive": True, "displaylogo": False, "displayModeBar": "hover"}


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


@functools.cache
def _page() -> jinja2.Template:
    text = (importlib.resources.files("optuna_ds.reporting") / "templates" / "report.html").read_text(encoding="utf-8")
    return _ENV.from_string(text)


def render_report(data: ReportData, *, base_dir: str = "") -> str:
    """One self-contained HTML page (plotly.js inlined, nothing loaded from elsewhere): the
    headline, the figures (the optimum marked in each), the summary, and every experiment (the
    optimum's first), readable at 1280 px. jinja2 escapes every string; each experiment links
    to its folder and logs relative to ``base_dir``, where the page lies."""
    figures = [markupsafe.Markup(plotly.io.to_html(fig, full_html=False, include_plotlyjs=(i == 0), div_id=fig_id, default_width="100%",
                                                   config=_PLOTLY_CONFIG))
               for i, (fig_id, fig) in enumerate(data.figures.items())]
    heads, rows = _table(data, base_dir=base_dir)
    return _page().render(title=data.title or data.study_name, headline=data.headline, figures=figures, summary_head=RUNS_HEAD,
                        summary_rows=data.summary_rows, best=data.best, notes=data.notes, memory_note=data.memory_note,
                        heads=heads, rows=rows)


def write_report(data: ReportData, path: str) -> str:
    write_file(path, render_report(data, base_dir=os.path.dirname(os.path.abspath(path))))
    return path
