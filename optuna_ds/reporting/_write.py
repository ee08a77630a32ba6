"""What a tuning writes for the user: both summaries, the optimal config and its command."""

from __future__ import annotations

import json
import os
from typing import Any

from optuna_ds._files import write_file
from optuna_ds._text import clean_text
from optuna_ds._text import one_line
from optuna_ds.launcher import ResultsFiles
from optuna_ds.launcher import shell_line
from optuna_ds.studies import TuningResult
from optuna_ds.reporting._configs import LearningRateAdvice
from optuna_ds.reporting._configs import optimal_config
from optuna_ds.reporting._headline import Budget
from optuna_ds.reporting._summary import summary_text
from optuna_ds.reporting._tables import deepspeed_summary


def write_summary(result: TuningResult, *, results_dir: str, advice: LearningRateAdvice | str | None,
                  budget: Budget | None = None) -> str:
    """Write ``summary.txt`` in DeepSpeed's form (:func:`deepspeed_summary`) and our own summary
    (:func:`summary_text`) beside it; return our own, which the terminal shows."""
    text = summary_text(result, advice=advice, budget=budget)
    text = save_summary(text, results_dir=results_dir)
    write_file(ResultsFiles(results_dir).summary, clean_text(deepspeed_summary(result)))
    return text


def save_summary(text: str, *, results_dir: str) -> str:
    """Write ``text`` as our own summary (``ResultsFiles.own_summary``), cleaned (a terminal
    shows it), and return what was written."""
    text = clean_text(text)
    os.makedirs(results_dir, exist_ok=True)
    write_file(ResultsFiles(results_dir).own_summary, text)
    return text


def write_optimal(result: TuningResult, *, results_dir: str, command: list[str], config: dict[str, Any] | None = None,
                  comment: str | None = None) -> tuple[str, str] | None:
    """Write ``ds_config_optimal.json`` (ready to train with: no ``autotuning`` section; ``config``
    when given, e.g. with a scaled learning rate) and ``cmd_optimal.txt`` (after a ``comment``
    line when given); return their paths."""
    config = config or optimal_config(result)
    if config is None:
        return None
    files = ResultsFiles(results_dir)
    write_file(files.optimal_config, json.dumps(config, indent=2) + "\n")
    # The comment quotes the config (its optimizer's type): one line, or its next line would be a command.
    write_file(files.optimal_cmd, (f"# {one_line(comment)}\n" if comment else "") + shell_line(command) + "\n")
    return files.optimal_config, files.optimal_cmd
