"""Layer 1: the budget that ends a stage study's knob search (``tuner_early_stopping``), checked before proposing."""

from optuna_ds.pruners._early_stopping import TunerEarlyStopping

__all__ = ["TunerEarlyStopping"]
