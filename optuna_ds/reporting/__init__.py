"""Layer 4: what a tuning leaves for the user: summary, report, optimal config and command."""

from optuna_ds.reporting._partial import PartialSummary
from optuna_ds.reporting._partial import partial_summary
from optuna_ds.reporting._progress import Progress
from optuna_ds.reporting._dashboard import best_stage_study
from optuna_ds.reporting._dashboard import opening_on
from optuna_ds.reporting._dashboard import register_with_dashboard
from optuna_ds.reporting._data import ReportData
from optuna_ds.reporting._data import load_report
from optuna_ds.reporting._page import render_report
from optuna_ds.reporting._page import write_report
from optuna_ds.reporting._headline import Budget
from optuna_ds.reporting._configs import LearningRateAdvice
from optuna_ds.reporting._configs import ScaledLearningRate
from optuna_ds.reporting._headline import headline
from optuna_ds.reporting._configs import learning_rate_advice
from optuna_ds.reporting._configs import optimal_config
from optuna_ds.reporting._configs import scale_learning_rate
from optuna_ds.reporting._speedup import speedup
from optuna_ds.reporting._summary import summary_markdown
from optuna_ds.reporting._tables import summary_table
from optuna_ds.reporting._summary import summary_text
from optuna_ds.reporting._write import write_optimal
from optuna_ds.reporting._write import write_summary
from optuna_ds.reporting._write import save_summary

__all__ = [
    "Budget",
    "LearningRateAdvice",
    "PartialSummary",
    "Progress",
    "ReportData",
    "ScaledLearningRate",
    "best_stage_study",
    "opening_on",
    "headline",
    "learning_rate_advice",
    "load_report",
    "optimal_config",
    "partial_summary",
    "register_with_dashboard",
    "render_report",
    "scale_learning_rate",
    "speedup",
    "summary_markdown",
    "summary_table",
    "summary_text",
    "write_optimal",
    "write_report",
    "save_summary",
    "write_summary",
]
