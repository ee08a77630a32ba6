"""Layer 1: the budget that ends a stage study's knob search (``tuner_early_stopping``), checked
before proposing; and the pruner that ends a run clearly below the incumbent while it runs."""

from optuna_ds.pruners._early_stopping import TunerEarlyStopping
from optuna_ds.pruners._incumbent import IncumbentPruner
from optuna_ds.pruners._incumbent import Verdict

__all__ = ["IncumbentPruner", "TunerEarlyStopping", "Verdict"]
