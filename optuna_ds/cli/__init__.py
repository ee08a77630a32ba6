"""Layer 6: the ``optuna-ds`` command line, a thin shell over :func:`optuna_ds.tune` and the layers below."""

from optuna_ds.cli._main import cli
from optuna_ds.cli._main import main

__all__ = ["cli", "main"]
