from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from collections.abc import Sequence
from typing import Any

from optuna_ds._files import write_file
from optuna_ds._text import clean_text
from optuna_ds._text import one_line
from optuna_ds.config import UserConfig
from optuna_ds.config import find_arg
from optuna_ds.config import format_number
from optuna_ds.config import set_arg
from optuna_ds.config import with_integer_sizes
from optuna_ds.launcher import ResultsFiles
from optuna_ds.launcher import shell_line
from optuna_ds.studies import Optimum
from optuna_ds.studies import TuningResult

SUMMARY_HEAD = ("tuning_space", "num_experiments", "best_metric_val", "runs", "best_exp_name")


def summary_rows(result: TuningResult) -> list[tuple[str, ...]]:
    """DeepSpeed's summary table, without its header: one row per tuned space, each with its
    best (:func:`~optuna_ds.studies.leader`: the chosen stage's is the optimum), then the optimum."""
    rows: list[tuple[str, ...]] = []
    for stage in result.stages:
        if stage.status == "tuned":
            rows.append((stage.name, str(stage.num_experiments), *_best_cells(stage.best)))
    rows.append(("global", str(result.num_experiments), *_best_cells(result.best)))
    return rows


def _best_cells(best: Optimum | None) -> tuple[str, str, str]:
    return (format_number(best.value), str(len(best.runs)), best.name) if best is not None else ("-", "-", "-")


def summary_table(result: TuningResult) -> str:
    """:func:`summary_rows` as a Markdown table (the text summary and the dashboard's note)."""
    rows = [SUMMARY_HEAD, *summary_rows(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(SUMMARY_HEAD))]
    right = (False, True, True, True, False)

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)) + " |"

    sep = "| " + " | ".join((("-" * (w - 1) + ":") if r else (":" + "-" * (w - 1))) for w, r in zip(widths, right)) + " |"
    return "\n".join([line(rows[0]), sep, *(line(r) for r in rows[1:])])


def speedup(result: TuningResult) -> float | None:
    """How much faster the optimum is than the user's own config, both measured here (each the
    mean of its runs)."""
    base, best = result.baseline, result.best
    if base is None or base.value is None or best is None or not base.value or not best.value:
        return None
    return best.value / base.value if result.metric.maximize else base.value / best.value


def _mean_of(runs: int) -> str:
    return f" (mean of {runs} runs)" if runs > 1 else ""


def optimum_line(result: TuningResult) -> str:
    """The optimum as every view states it: the config, its figure (measured runs and the
    planner's estimate), how much faster than the user's config, and the noise."""
    best, metric = result.best, result.metric
    if best is None:
        return "Optimum: none, no experiment ran successfully."
    what = "Optimum" if best.chosen else "Best so far (the planner has not chosen yet)"
    line = (f"{what} ({best.name}: z{best.stage}, micro-batch {best.config.micro_batch}, gradient accumulation "
            f"{best.config.accumulation}): {best.figure(metric)}")
    factor = speedup(result)
    if factor is not None:
        base = result.baseline
        same = " (your config is the optimum)" if base is not None and base.name == best.name else ""
        line += f", {format_number(factor, 3)}x {'faster' if factor >= 1 else 'as fast'}{same}"
    return f"{line}; {result.noise.phrase}."


def headline(result: TuningResult) -> list[str]:
    """What the user came for: their config, the optimum and how much faster (with the
    run-to-run noise and what it was measured from), what finding it cost, and a warning where
    the optimum's own runs disagree more than the noise explains."""
    base, best, metric = result.baseline, result.best, result.metric
    lines = []
    if base is not None and base.stage is not None:
        label = f"z{base.stage}" + (f", micro-batch {base.micro_batch_size}" if base.micro_batch_size else "")
        if base.listed and len(base.listed) > 1:
            label += f", the first stage explored of {list(base.listed)}"
        if base.value is not None:
            mine = f"Your config ({label}): {metric.with_unit(base.value)}{_mean_of(base.runs)}"
        elif base.status:
            mine = f"Your config ({label}): failed ({base.status})"
        else:
            mine = f"Your config ({label}): not measured, {base.reason}"
    else:
        mine = "Your config: not measured"
    lines.append(mine + ".")
    lines.append(optimum_line(result))
    spend = result.spend
    lines.append(f"Spent: {spend.experiments} experiment(s)" + (" (the profile run included)" if spend.profiled else "")
                 + f", {spend.hours}.")
    warning = best.warning(metric, result.noise) if best is not None else ""
    if warning:
        lines.append(warning)
    return lines


@dataclasses.dataclass(frozen=True)
class LearningRateAdvice:
    """DeepSpeed's advice when the best global batch size B' differs from the user's B: scale
    the learning rate by sqrt(B'/B) for Adam-type optimizers, B'/B for SGD."""

    new: int
    original: int
    factor: float
    rule: str
    kind: str
    lr: float | None  # the config's own learning rate, when it is a number

    @property
    def text(self) -> str:
        advice = (f"The best global batch size is {self.new}, the original {self.original}: scale the learning rate "
                  f"by {self.rule} = {self.factor:.4g} ({self.kind}), keeping the other hyperparameters.")
        if self.lr is not None:
            advice += f" Here: lr {self.lr:g} -> {self.lr * self.factor:.4g}."
        return advice


def _config_lr(config: dict[str, Any]) -> Any:
    optimizer = config.get("optimizer")
    params = optimizer.get("params") if isinstance(optimizer, dict) else None
    return params.get("lr") if isinstance(params, dict) else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def learning_rate_advice(result: TuningResult, user: UserConfig, *, data_parallel_size: int) -> LearningRateAdvice | None:
    best = result.best
    if best is None or best.train_batch_size is None:
        return None
    original = user.train_batch_size or user.min_micro_batch_size * user.gradient_accumulation_steps * data_parallel_size
    new = best.train_batch_size
    if new == original:
        return None
    ratio = new / original
    if user.adam_type_optimizer:
        factor, rule, kind = math.sqrt(ratio), f"sqrt({new}/{original})", "an Adam-type optimizer"
    else:
        factor, rule, kind = ratio, f"{new}/{original}", f"{user.optimizer_type}"
    lr = _config_lr(user.raw)
    return LearningRateAdvice(new=new, original=original, factor=factor, rule=rule, kind=kind,
                              lr=float(lr) if _is_number(lr) else None)


@dataclasses.dataclass(frozen=True)
class ScaledLearningRate:
    """``--scale-lr`` applied: the optimal config and script arguments with the scaled learning
    rate, and the line that names the rule; ``note`` alone when it could not be applied."""

    config: dict[str, Any]
    script_args: list[str]
    note: str
    applied: bool


LR_FLAG = "--learning_rate"  # where a Hugging Face Trainer resolves an "auto" learning rate from


def scale_learning_rate(advice: LearningRateAdvice, *, config: dict[str, Any], script_args: Sequence[str],
                        user: UserConfig) -> ScaledLearningRate:
    """Scale the learning rate where it lives: ``optimizer.params.lr`` when it is a number, else
    the script flag it is resolved from (``arg_mappings``' ``lr``, or the Trainer's
    ``--learning_rate``) when the arguments pass it."""
    config = json.loads(json.dumps(config))
    rule = f"scaled by {advice.rule} = {advice.factor:.4g} ({advice.kind}; batch {advice.original} -> {advice.new})"
    lr = _config_lr(config)
    if _is_number(lr):
        config["optimizer"]["params"]["lr"] = new = lr * advice.factor
        return ScaledLearningRate(config, list(script_args), f"learning rate {rule}: optimizer.params.lr {lr:g} -> {new:.6g}", True)
    flag = user.arg_mappings.get("lr", LR_FLAG)
    found = find_arg(script_args, flag)
    if found is not None:
        try:
            value = float(found[1])
        except ValueError:
            value = None
        if value is not None:
            new = value * advice.factor
            return ScaledLearningRate(config, set_arg(script_args, flag, f"{new:.6g}"),
                                      f"learning rate {rule}: {flag} {value:g} -> {new:.6g}", True)
    where = "optimizer.params.lr is \"auto\"" if lr == "auto" else "the config sets no optimizer.params.lr"
    return ScaledLearningRate(config, list(script_args),
                              f"--scale-lr: not applied, {where} and the script arguments pass no {flag}: {advice.text}", False)


def summary_text(result: TuningResult, *, advice: LearningRateAdvice | str | None) -> str:
    """The headline, DeepSpeed's summary table, then the notes."""
    return "\n".join([*headline(result), "", summary_table(result), "", *summary_notes(result, advice)]) + "\n"


def summary_markdown(result: TuningResult, *, advice: LearningRateAdvice | str | None) -> str:
    """The summary as optuna-dashboard's note renders it: the headline, the table, the notes."""
    head = "\n\n".join(f"**{line}**" if i == 0 else line for i, line in enumerate(headline(result)))
    return "\n".join([head, "", summary_table(result), "", *(f"- {n}" for n in summary_notes(result, advice))]) + "\n"


def optuna_best_note(result: TuningResult) -> str:
    """Why Optuna's best trial (``optuna best-trial``, optuna-dashboard) is not the optimum,
    where it is not: Optuna ranks single runs; the planner ranks configs by all their runs."""
    other, best = result.optuna_best, result.best
    if other is None or best is None:
        return ""
    return (f"Optuna's best trial in the z{other.stage} study (what `optuna best-trial` and optuna-dashboard show) is trial "
            f"{other.number}, {other.name}: one run at {result.metric.with_unit(other.value)}. The optimum is {best.name} "
            f"(trial {best.trial_number}; the study's user attr `optimum`): Optuna ranks single runs, the planner ranks "
            f"configs by all their runs, its estimate and the measured noise.")


def stage_notes(result: TuningResult) -> list[str]:
    """A line for each stage left out (skipped, or pending where the search did not end) or
    with failures: the summary's and the partial summary's."""
    lines = []
    for stage in result.stages:
        if stage.status in ("skipped", "pending"):
            lines.append(f"{stage.name} {stage.status}: {stage.reason}")
        elif stage.num_failed:
            lines.append(f"{stage.name}: {stage.num_failed} of {stage.num_experiments} experiment(s) failed; last: {stage.last_failure}")
    return lines


def summary_notes(result: TuningResult, advice: LearningRateAdvice | str | None) -> list[str]:
    """What follows the table: the time, what its values are, Optuna's own best trial where it
    differs, skipped stages, failures, the learning-rate advice."""
    lines = []
    duration = datetime.timedelta(seconds=round(result.duration))
    lines.append(f"Tuning completed in {duration}. Total number of experiments: {result.num_experiments}. "
                 f"Each best_metric_val is the mean of its config's runs.")
    if result.best is None:
        lines.append("No experiment ran successfully: see the stderr.log of each experiment under results_dir.")
    if note := optuna_best_note(result):
        lines.append(note)
    lines += stage_notes(result)
    if advice:
        lines.append(advice if isinstance(advice, str) else advice.text)
    return lines


def write_summary(result: TuningResult, *, results_dir: str, advice: LearningRateAdvice | str | None) -> str:
    """Write ``summary.txt`` and return its text."""
    return save_summary(summary_text(result, advice=advice), results_dir=results_dir)


def save_summary(text: str, *, results_dir: str) -> str:
    """Write ``text`` as ``summary.txt``, cleaned (a terminal shows it), and return what was written."""
    text = clean_text(text)
    os.makedirs(results_dir, exist_ok=True)
    write_file(ResultsFiles(results_dir).summary, text)
    return text


def optimal_config(result: TuningResult) -> dict[str, Any] | None:
    best = result.best
    if best is None:
        return None
    config = json.loads(json.dumps(best.ds_config))
    config.pop("autotuning", None)
    return with_integer_sizes(config)


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
