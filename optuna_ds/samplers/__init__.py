"""Layer 1: samplers that choose the next knob configuration of a stage study."""

from optuna_ds.samplers._factory import check_tuner_type
from optuna_ds.samplers._factory import create_sampler
from optuna_ds.samplers._factory import with_fixed_params
from optuna_ds.samplers._xgboost import XGBoostSampler

__all__ = ["XGBoostSampler", "check_tuner_type", "create_sampler", "with_fixed_params"]
