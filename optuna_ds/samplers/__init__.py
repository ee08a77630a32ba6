"""Layer 1: the samplers that propose knob settings of a stage for the planner to score."""

from optuna_ds.samplers._candidates import knob_candidates
from optuna_ds.samplers._factory import check_tuner_type
from optuna_ds.samplers._factory import create_sampler
from optuna_ds.samplers._xgboost import XGBoostSampler

__all__ = ["XGBoostSampler", "check_tuner_type", "create_sampler", "knob_candidates"]
