"""What optuna-dashboard shows of a tuning: its notes, where the optimum is, the report's figures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from optuna_ds.config import Metric
from optuna_ds.config import parse_user_config
from optuna_ds.reporting._data import ReportData
from optuna_ds.storage import load_plan
from optuna_ds.storage import stage_study_name
from optuna_ds.storage import tuning_names
from optuna_ds.studies import Optimum
from optuna_ds.studies import load_result


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


def optimum_note(data: ReportData) -> str:
    """The first line of the root study's note: where the optimum is (the study a person opens
    first has no trials of its own)."""
    best = data.best
    if best is None:
        return ""
    chosen = "Optimum" if best.chosen else "Best so far"
    study = stage_study_name(data.study_name, best.stage)
    return (f"**{chosen}: {best.name}** ({best.figure(data.metric)}), trial {best.trial_number} "
            f"of study `{study}`.\n\n")


def opening_on(app: Callable[..., Any], path: str) -> Callable[..., Any]:
    """The WSGI application ``app`` with its root address sending the browser to ``path`` (the
    optimum's stage study), so the first page a person lands on names the optimum; every other
    address is ``app``'s."""

    def landing(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO", "/") in ("", "/"):
            start_response("302 Found", [("Location", path), ("Content-Length", "0")])
            return [b""]
        return app(environ, start_response)

    return landing


def register_with_dashboard(data: ReportData, storage: optuna.storages.BaseStorage, *, note: str) -> None:
    """Give optuna-dashboard what it can show: the summary (a Markdown note with the headline)
    on each study, where the optimum is (a user attr, and a line saying why Optuna's best trial
    is another), the root study described, and the report's figures as custom plots."""
    import optuna_dashboard

    root = optuna.load_study(study_name=data.study_name, storage=storage)
    stages = ", ".join(f"`{s.study_name}`" for s in data.studies.values()) or "none yet"
    root_note = ROOT_NOTE.format(stages=stages) + "\n" + note
    optuna_dashboard.save_note(root, optimum_note(data) + root_note)
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
