"""Layer 5b: what a tuning leaves for the user: summary, optimal config and command."""

from optuna_ds.reporting._summary import learning_rate_advice
from optuna_ds.reporting._summary import optimal_command
from optuna_ds.reporting._summary import optimal_config
from optuna_ds.reporting._summary import summary_table
from optuna_ds.reporting._summary import write_optimal
from optuna_ds.reporting._summary import write_summary

__all__ = [
    "learning_rate_advice",
    "optimal_command",
    "optimal_config",
    "summary_table",
    "write_optimal",
    "write_summary",
]
