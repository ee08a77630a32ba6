from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from optuna_ds.planner._planner import fitted
from optuna_ds.planner._planner import priced
from optuna_ds.planner._problem import Knobs
from optuna_ds.planner._problem import Observation
from optuna_ds.planner._problem import Problem
from optuna_ds.planner._settings import PlannerSettings

# Sizes the memory model expects to fit at least this likely are drawn; beyond, the curve stops.
_FITS = 0.5


@dataclasses.dataclass(frozen=True)
class ModelCurve:
    """The planner's model of one arm's throughput (a rate, higher is better) at its default
    knobs over micro-batch sizes: its posterior mean and one posterior deviation either side
    (``low``, ``high``), at ``sizes``."""

    stage: int
    offload: str
    sizes: tuple[int, ...]
    mean: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelCurve:
        return cls(stage=int(data["stage"]), offload=str(data.get("offload", "")),
                   **{k: tuple(data[k]) for k in ("sizes", "mean", "low", "high")})


def model_curves(problem: Problem, observations: Sequence[Observation], *,
                 settings: PlannerSettings = PlannerSettings()) -> list[ModelCurve]:
    """The model :func:`plan` fits to ``observations`` (:func:`fitted`, the same code), at the
    planner's candidate sizes of each arm that ran (and the sizes it ran at) the memory model
    expects to fit: what the report draws as the model's curve beside the measured points."""
    state, model = fitted(problem, observations, priced(problem, observations, settings))
    curves = []
    for arm in state.problem.arms:
        ran = sorted({o.mbs for o in state.ok if o.arm == arm.key and not o.knobs})
        if not ran:
            continue
        grid = np.array(sorted(set(state.sizes(arm)) | set(ran)), dtype=float)
        fits = 1.0 - state.memory.p_oom(arm, grid)
        sizes = [int(m) for m, p in zip(grid, fits) if p >= _FITS or int(m) in ran]
        w, means, sds = model.predict([(arm, m, Knobs()) for m in sizes])
        mean = w @ means
        sd = np.sqrt(np.maximum(w @ (sds**2 + means**2) - mean**2, 0.0))  # the mixture's
        curves.append(ModelCurve(stage=arm.stage, offload=arm.offload, sizes=tuple(sizes),
                                 mean=tuple(float(v) for v in np.exp(mean)), low=tuple(float(v) for v in np.exp(mean - sd)),
                                 high=tuple(float(v) for v in np.exp(mean + sd))))
    return curves


