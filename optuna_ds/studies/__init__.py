"""Layer 3: the studies of a tuning, one per ZeRO stage, and the workflow that drives them."""

from optuna_ds.studies._builder import ExperimentBuilder
from optuna_ds.studies._builder import checkpointing_space
from optuna_ds.studies._builder import script_switches
from optuna_ds.studies._coordinator import observation_of
from optuna_ds.studies._observer import PrintObserver
from optuna_ds.studies._observer import TuningObserver
from optuna_ds.studies._observer import started_line
from optuna_ds.studies._owner import live_trials
from optuna_ds.studies._baseline import Baseline
from optuna_ds.studies._results import Measured
from optuna_ds.studies._results import Noise
from optuna_ds.studies._results import Optimum
from optuna_ds.studies._results import SCATTER_WARNING
from optuna_ds.studies._results import relative_spread
from optuna_ds.studies._results import scatters
from optuna_ds.studies._results import OptunaBest
from optuna_ds.studies._spend import Spend
from optuna_ds.studies._results import StageResult
from optuna_ds.studies._results import TuningResult
from optuna_ds.studies._results import departures
from optuna_ds.studies._runs import failure_text
from optuna_ds.studies._results import leader
from optuna_ds.studies._results import load_result
from optuna_ds.studies._tuning import Tuning

__all__ = [
    "Baseline",
    "ExperimentBuilder",
    "Measured",
    "Noise",
    "Optimum",
    "OptunaBest",
    "PrintObserver",
    "SCATTER_WARNING",
    "relative_spread",
    "scatters",
    "Spend",
    "StageResult",
    "Tuning",
    "TuningObserver",
    "TuningResult",
    "checkpointing_space",
    "departures",
    "failure_text",
    "leader",
    "live_trials",
    "load_result",
    "observation_of",
    "script_switches",
    "started_line",
]
