"""optuna-ds: find the fastest DeepSpeed configuration of a training script, with Optuna.

Layers, by folder, each importing only those before it (``tests/test_layers.py`` checks):

0. ``domain``: a config, an experiment, the records a tuning stores;
1. side by side, none importing another: ``config``, ``space``, ``planner``, ``samplers``,
   ``pruners``, ``storage``;
2. ``launcher``;
3. ``studies``;
4. ``reporting``;
5. ``_tune``: :func:`tune`, the one call that runs a tuning;
6. ``cli``.

``_text`` (the cleaner of what a terminal or a shell reads), ``_errors``, ``_redact``, ``_files``
(the tuning's own files, never through a link) and ``_optuna_compat`` serve any layer and import
none but ``_text`` and ``_errors``. Every layer reaches Optuna beyond its public API through
``_optuna_compat`` only.
"""

from optuna_ds._errors import ConfigError
from optuna_ds._errors import OptunaDSError
from optuna_ds._tune import TuneOptions
from optuna_ds._tune import TuneOutcome
from optuna_ds._tune import run_training
from optuna_ds._tune import tune

__version__ = "0.1.0"

__all__ = ["ConfigError", "OptunaDSError", "TuneOptions", "TuneOutcome", "__version__", "run_training", "tune"]
