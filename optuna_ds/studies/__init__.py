"""Layer 3c: the studies of a tuning, one per ZeRO stage, and the workflow that drives them."""

from optuna_ds.studies._builder import ExperimentBuilder
from optuna_ds.studies._results import BestExperiment
from optuna_ds.studies._results import StageResult
from optuna_ds.studies._results import TuningResult
from optuna_ds.studies._stage import StageTuner
from optuna_ds.studies._tuning import ProfileError
from optuna_ds.studies._tuning import Tuning

__all__ = [
    "BestExperiment",
    "ExperimentBuilder",
    "ProfileError",
    "StageResult",
    "StageTuner",
    "Tuning",
    "TuningResult",
]
