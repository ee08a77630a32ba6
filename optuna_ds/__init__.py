"""optuna-ds: find the fastest DeepSpeed configuration of a training script, with Optuna.

Layers, by folder: ``config`` -> ``space`` -> ``studies``/``samplers``/``pruners`` ->
``launcher`` -> ``storage``/``reporting`` -> ``cli``. Every layer reaches Optuna beyond its
public API through ``_optuna_compat`` only.
"""

from optuna_ds._errors import ConfigError
from optuna_ds._errors import OptunaDSError
from optuna_ds._tune import TuneOptions
from optuna_ds._tune import TuneOutcome
from optuna_ds._tune import run_training
from optuna_ds._tune import tune

__version__ = "0.1.0"

__all__ = ["ConfigError", "OptunaDSError", "TuneOptions", "TuneOutcome", "__version__", "run_training", "tune"]
