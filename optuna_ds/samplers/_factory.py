from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import optuna

from optuna_ds._errors import ConfigError
from optuna_ds.samplers._xgboost import XGBoostSampler


def create_sampler(tuner_type: str, search_space: Mapping[str, Sequence[Any]], *, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The sampler of ``autotuning.tuner_type`` over a finite ``search_space``: Optuna's grid or
    random sampler, or our xgboost one (DeepSpeed's ``model_based``)."""
    if tuner_type == "gridsearch":
        return optuna.samplers.GridSampler({k: list(v) for k, v in search_space.items()}, seed=seed)
    if tuner_type == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if tuner_type == "model_based":
        return XGBoostSampler(search_space, seed=seed)
    raise ValueError(f"unknown tuner_type {tuner_type!r}")


def check_tuner_type(tuner_type: str, *, fast: bool) -> None:
    """Refuse, before anything is launched, a knob search whose sampler cannot be built:
    ``model_based`` (DeepSpeed's default ``tuner_type``) needs xgboost, an extra, so that a CPU
    install does not pull xgboost's CUDA libraries in for a sampler only ``"fast": false`` uses."""
    import importlib.util

    if fast or tuner_type != "model_based":
        return
    try:
        found = importlib.util.find_spec("xgboost") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(
            'autotuning.tuner_type "model_based" (DeepSpeed\'s default for "fast": false) needs xgboost: '
            "pip install 'optuna-ds[xgboost]', or set tuner_type to \"gridsearch\" or \"random\""
        )
