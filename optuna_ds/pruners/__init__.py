"""Layer 1: the pruner that ends a stage study's search (``tuner_early_stopping``)."""

from optuna_ds.pruners._early_stopping import TunerEarlyStoppingPruner

__all__ = ["TunerEarlyStoppingPruner"]
