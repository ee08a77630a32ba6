from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import optuna

from optuna_ds.samplers._xgboost import XGBoostSampler


def create_sampler(tuner_type: str, search_space: Mapping[str, Sequence[Any]], *, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The sampler of ``autotuning.tuner_type`` over a finite ``search_space``."""
    if tuner_type == "gridsearch":
        return optuna.samplers.GridSampler({k: list(v) for k, v in search_space.items()}, seed=seed)
    if tuner_type == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if tuner_type == "model_based":
        return XGBoostSampler(search_space, seed=seed)
    raise ValueError(f"unknown tuner_type {tuner_type!r}")
