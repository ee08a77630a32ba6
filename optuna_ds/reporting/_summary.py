from __future__ import annotations

import datetime
import json
import math
import os
from typing import Any

from optuna_ds.config import UserConfig
from optuna_ds.config import with_integer_sizes
from optuna_ds.launcher import ResultsFiles
from optuna_ds.launcher import shell_line
from optuna_ds.studies import TuningResult


def _format_value(value: float) -> str:
    return f"{value:.6g}"


def summary_table(result: TuningResult) -> str:
    """DeepSpeed's summary table: one row per tuning space, then the global best."""
    rows = [("tuning_space", "num_experiments", "best_metric_val", "best_exp_name")]
    for stage in result.stages:
        if stage.status != "tuned":
            continue
        best = stage.best
        rows.append((stage.name, str(stage.num_experiments), _format_value(best.value) if best else "-", best.name if best else "-"))
    best = result.best
    rows.append(("global", str(result.num_experiments), _format_value(best.value) if best else "-", best.name if best else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    right = (False, True, True, False)

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)) + " |"

    sep = "| " + " | ".join((("-" * (w - 1) + ":") if r else (":" + "-" * (w - 1))) for w, r in zip(widths, right)) + " |"
    return "\n".join([line(rows[0]), sep, *(line(r) for r in rows[1:])])


def learning_rate_advice(result: TuningResult, user: UserConfig, *, data_parallel_size: int) -> str | None:
    """DeepSpeed's advice when the best global batch size B' differs from the user's B:
    scale the learning rate by sqrt(B'/B) for Adam-type optimizers, B'/B for SGD."""
    best = result.best
    if best is None or best.train_batch_size is None:
        return None
    original = user.train_batch_size or user.min_micro_batch_size * user.gradient_accumulation_steps * data_parallel_size
    new = best.train_batch_size
    if new == original:
        return None
    ratio = new / original
    if user.adam_type_optimizer:
        factor, rule = math.sqrt(ratio), f"sqrt({new}/{original})"
        kind = "an Adam-type optimizer"
    else:
        factor, rule = ratio, f"{new}/{original}"
        kind = f"{user.optimizer_type}"
    advice = (
        f"The best global batch size is {new}, the original {original}: scale the learning rate "
        f"by {rule} = {factor:.4g} ({kind}), keeping the other hyperparameters."
    )
    lr = (user.raw.get("optimizer") or {}).get("params", {}).get("lr") if isinstance(user.raw.get("optimizer"), dict) else None
    if isinstance(lr, (int, float)) and not isinstance(lr, bool):
        advice += f" Here: lr {lr:g} -> {lr * factor:.4g}."
    return advice


def summary_text(result: TuningResult, *, advice: str | None) -> str:
    """DeepSpeed's summary table, then the tuning time, the optimum, skipped stages, failures."""
    lines = [summary_table(result), ""]
    duration = datetime.timedelta(seconds=round(result.duration))
    lines.append(f"Tuning completed in {duration}. Total number of experiments: {result.num_experiments}.")
    best = result.best
    if best is not None:
        lines.append(f"Optimal: {best.name} (z{best.stage}, micro-batch {best.micro_batch_size}, "
                     f"gradient accumulation {best.gradient_accumulation_steps}), {result.metric} = {_format_value(best.value)}.")
    else:
        lines.append("No experiment ran successfully: see the stderr.log of each experiment under results_dir.")
    for stage in result.stages:
        if stage.status == "skipped":
            lines.append(f"{stage.name} skipped: {stage.reason}")
        elif stage.status == "pending":
            lines.append(f"{stage.name}: {stage.reason}")
        elif stage.num_failed:
            lines.append(f"{stage.name}: {stage.num_failed} of {stage.num_experiments} experiment(s) failed; last: {stage.last_failure}")
    if advice:
        lines.append(advice)
    return "\n".join(lines) + "\n"


def write_summary(result: TuningResult, *, results_dir: str, advice: str | None) -> str:
    """Write ``summary.txt`` and return its text."""
    text = summary_text(result, advice=advice)
    os.makedirs(results_dir, exist_ok=True)
    with open(ResultsFiles(results_dir).summary, "w", encoding="utf-8") as f:
        f.write(text)
    return text


def optimal_config(result: TuningResult) -> dict[str, Any] | None:
    best = result.best
    if best is None:
        return None
    config = json.loads(json.dumps(best.ds_config))
    config.pop("autotuning", None)
    return with_integer_sizes(config)


def write_optimal(result: TuningResult, *, results_dir: str, command: list[str]) -> tuple[str, str] | None:
    """Write ``ds_config_optimal.json`` (ready to train with: no ``autotuning`` section) and
    ``cmd_optimal.txt``; return their paths."""
    config = optimal_config(result)
    if config is None:
        return None
    files = ResultsFiles(results_dir)
    with open(files.optimal_config, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(files.optimal_cmd, "w", encoding="utf-8") as f:
        f.write(shell_line(command) + "\n")
    return files.optimal_config, files.optimal_cmd
