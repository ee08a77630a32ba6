"""The planner's model curve beside its choice, recorded for the report (docs/report.md)."""
from __future__ import annotations

from collections.abc import Sequence

import optuna

from optuna_ds.planner import ModelCurve
from optuna_ds.planner import Observation
from optuna_ds.planner import Problem
from optuna_ds.planner import model_curves
from optuna_ds.storage import model_curves_of
from optuna_ds.storage import set_model_curves


def record_model_curves(root: optuna.Study, problem: Problem, observations: Sequence[Observation]) -> None:
    """Fit the planner's model to ``observations`` as it decided (:func:`model_curves`) and
    record its curves on the root study."""
    set_model_curves(root, [c.to_dict() for c in model_curves(problem, observations)])


def recorded_model_curves(root: optuna.Study) -> tuple[ModelCurve, ...]:
    """The curves :func:`record_model_curves` recorded; none for a tuning that recorded none
    (interrupted before the choice, or stored by an earlier version)."""
    curves = []
    for data in model_curves_of(root):
        try:
            curves.append(ModelCurve.from_dict(data))
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(curves)
