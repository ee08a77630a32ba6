from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import statistics
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
from optuna_ds.domain import MBS_KEY
from optuna_ds.launcher import ResultsFiles
from optuna_ds.launcher import shell_line
from optuna_ds.studies import Measured
from optuna_ds.studies import SCATTER_WARNING
from optuna_ds.studies import Baseline
from optuna_ds.studies import Optimum
from optuna_ds.studies import TuningResult
from optuna_ds.studies import departures
from optuna_ds.studies import relative_spread
from optuna_ds.studies import scatters

# DeepSpeed's summary table: its columns, in its order (its autotuner's print_tuning_results).
SUMMARY_HEAD = ("tuning_space", "num_experiments", "best_metric_val", "best_exp_name")
# Ours, in our own summary: each row's best config by the mean of its runs.
RUNS_HEAD = ("tuning_space", "num_experiments", "best_config_mean", "runs", "best_exp_name")


def _spaces(result: TuningResult) -> list[tuple[str, int, Optimum | None]]:
    """Each tuned space with its experiments and its best (:func:`~optuna_ds.studies.leader`:
    the chosen stage's is the optimum), then ``global``."""
    rows = [(s.name, s.num_experiments, s.best) for s in result.stages if s.status == "tuned"]
    return [*rows, ("global", result.num_experiments, result.best)]


def summary_rows(result: TuningResult) -> list[tuple[str, ...]]:
    """DeepSpeed's summary table, without its header: a row per space with a best, as DeepSpeed
    writes one, ``best_metric_val`` the best single run of the config the row names and
    ``best_exp_name`` that run's experiment; ``global`` the optimum's."""
    rows: list[tuple[str, ...]] = []
    for space, experiments, best in _spaces(result):
        if best is not None:
            name, value = best.best_run(result.metric)
            rows.append((space, str(experiments), format(value, "g"), name))
    return rows


def runs_rows(result: TuningResult) -> list[tuple[str, ...]]:
    """Our table's rows: each space's best config by the mean of its runs, and how many."""
    return [
        (
            space,
            str(experiments),
            *((format_number(b.mean), str(len(b.runs)), b.name) if b else ("-", "-", "-")),
        )
        for space, experiments, b in _spaces(result)
    ]


def _after_point(cell: str) -> int:
    """The characters after a number's point (its exponent's where it has none), -1 for an
    integer: how tabulate aligns a column of numbers on their points."""
    if cell.lstrip("-").isdigit():
        return -1
    point = cell.rfind(".") if "." in cell else cell.lower().rfind("e")
    return len(cell) - point - 1


def pipe_table(
    head: Sequence[str], rows: Sequence[Sequence[str]], *, numeric: Sequence[bool]
) -> str:
    """``rows`` under ``head`` as tabulate's ``pipe`` format writes them, which DeepSpeed's
    summary uses: a ``numeric`` column aligned right (on the numbers' points where every cell
    is a number), the others left."""
    columns = []
    for i, (title, right) in enumerate(zip(head, numeric)):
        cells = [r[i] for r in rows]
        if right and all(_is_numeral(c) for c in cells):
            points = [_after_point(c) for c in cells]
            cells = [c + " " * (max(points, default=0) - p) for c, p in zip(cells, points)]
        width = max([len(title) + 2, *(len(c) for c in cells)])
        pad = str.rjust if right else str.ljust
        rule = ("-" * (width + 1) + ":") if right else (":" + "-" * (width + 1))
        columns.append([pad(title, width), rule, *(pad(c, width) for c in cells)])
    lines = [
        "|" + "|".join(line) + "|" if j == 1 else "| " + " | ".join(line) + " |"
        for j, line in enumerate(zip(*columns))
    ]
    return "\n".join(lines)


def _is_numeral(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def summary_table(result: TuningResult) -> str:
    """DeepSpeed's summary table (:func:`summary_rows`) as DeepSpeed writes it; ``""`` where no
    space has a best (DeepSpeed then writes none)."""
    rows = summary_rows(result)
    return pipe_table(SUMMARY_HEAD, rows, numeric=(False, True, True, False)) if rows else ""


def deepspeed_summary(result: TuningResult) -> str:
    """``summary.txt`` as DeepSpeed's autotuner writes it: its table, then the time and the count
    of experiments; nothing of ours (that is :func:`summary_text`'s)."""
    duration = datetime.timedelta(seconds=result.duration)
    return (
        summary_table(result)
        + f"\n\nTuning completed in {duration}. "
        + f"Total number of experiments: {result.num_experiments}."
    )


def runs_table(result: TuningResult) -> str:
    """Our table (:func:`runs_rows`), in the same form: the text summary and the dashboard's
    note."""
    return pipe_table(RUNS_HEAD, runs_rows(result), numeric=(False, True, True, True, False))


def speedup(result: TuningResult) -> float | None:
    """How much faster the optimum is than the user's own config, each the mean of its runs,
    where :func:`no_speedup` finds nothing against it; else ``None``."""
    base, best = result.baseline, result.best
    if no_speedup(result) or base is None or base.value is None or best is None:
        return None
    return best.mean / base.value if result.metric.maximize else base.value / best.mean


ALIKE_RUNS = 2  # runs of each config a speed-up factor rests on, at least


def no_speedup(result: TuningResult) -> str:
    """Why no speed-up factor is given, or ``""``: a factor compares the final choice with the
    user's config measured alike, at least :data:`ALIKE_RUNS` runs of each, interleaved in time
    (so that a change in the machine between them does not read as a speed-up)."""
    base, best = result.baseline, result.best
    if best is None:
        return "no experiment ran successfully"
    if base is None or base.value is None or not best.value or not base.value:
        return "your config was not measured"
    if not best.chosen:
        return "the planner has not chosen yet"
    if base.name == best.name:
        return ""
    mine, its = len(base.values), len(best.runs)
    if min(mine, its) < ALIKE_RUNS:
        return (
            f"your config ran {_times(mine)} and the optimum {_times(its)}; "
            f"a factor needs {ALIKE_RUNS} runs of each at least, measured alike"
        )
    if not _interleaved(base.starts, best.run_starts):
        return (
            "the runs of your config and of the optimum were not interleaved (all of one's came "
            "before the other's), so a change in the machine between them would read as a speed-up"
        )
    return ""


def _times(n: int) -> str:
    return {0: "no time", 1: "once", 2: "twice"}.get(n, f"{n} times")


def _interleaved(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two configs' runs (their start times) interleave: neither's all before the
    other's."""
    return bool(a) and bool(b) and min(a) < max(b) and min(b) < max(a)


def mean_of(runs: int) -> str:
    """How many runs a figure is the mean of, as every view says it (nothing for one)."""
    return f" (mean of {runs} runs)" if runs > 1 else ""


def optimum_line(result: TuningResult) -> str:
    """The optimum as every view states it: the config, its figure (measured runs and the
    planner's estimate), how much faster than the user's config, and the noise."""
    best, metric = result.best, result.metric
    if best is None:
        return "Optimum: none, no experiment ran successfully."
    what = "Optimum" if best.chosen else "Best so far (the planner has not chosen yet)"
    setting = best.config.knobs.checkpointing
    checkpointing = f", {result.checkpointing.named(setting)}" if setting and result.checkpointing is not None else ""
    autotp = f", AutoTP {best.config.knobs.autotp}" if best.config.knobs.autotp > 1 else ""
    line = (f"{what} ({best.name}: z{best.stage}, micro-batch {best.config.micro_batch}, gradient accumulation "
            f"{best.config.accumulation}{checkpointing}{autotp}): {best.figure(metric)}")
    factor = speedup(result)
    base = result.baseline
    if best.chosen and (why := no_speedup(result)) and base is not None and base.value is not None:
        line += f"; no speed-up factor: {why}"
    if factor is not None:
        same = " (your config is the optimum)" if base is not None and base.name == best.name else ""
        spread = speedup_uncertainty(result)
        if spread is not None and spread.deviation >= _RANGE_FROM and not same:
            low, high = factor * math.exp(-spread.deviation), factor * math.exp(spread.deviation)
            source = "their runs' scatter" if spread.scattered else "the noise"
            line += (f", {format_number(low, 2)}-{format_number(high, 2)}x {'faster' if low >= 1 else 'as fast'} "
                     f"({format_number(factor, 3)}x by the means of their runs, give or take twice {source})")
        else:
            line += f", {format_number(factor, 3)}x {'faster' if factor >= 1 else 'as fast'}{same}"
    return f"{line}; {result.noise.phrase}."


# The speed-up is given as a range once twice its deviation reaches this share of it.
_RANGE_FROM = 0.1


@dataclasses.dataclass(frozen=True)
class SpeedupUncertainty:
    """Twice the deviation of the speed-up's log, and whether a config's own runs, scattering
    more than the noise explains, set it in place of the noise."""

    deviation: float
    scattered: bool


def _run_deviation(runs: Sequence[float], noise: float) -> tuple[float, bool]:
    """The deviation of one run's log: the measured noise, or the runs' own where they scatter
    beyond :data:`~optuna_ds.studies.SCATTER_WARNING` times it (a run taken under load, or a
    straggler the noise leaves out, is still in the mean the headline divides)."""
    if all(r > 0 for r in runs) and scatters(runs, noise):
        return max(noise, statistics.stdev(math.log(r) for r in runs)), True
    return noise, False


def speedup_uncertainty(result: TuningResult) -> SpeedupUncertainty | None:
    """Twice the deviation of :func:`speedup` (of its log), from the runs each mean rests on and
    the measured run-to-run noise, or a config's own scatter where the noise does not explain
    it; ``None`` where the noise was not measured."""
    base, best, noise = result.baseline, result.best, result.noise.value
    if noise is None or base is None or best is None:
        return None
    mine, mine_scattered = _run_deviation(base.values, noise)
    its, its_scattered = _run_deviation(best.runs, noise)
    deviation = 2 * (mine**2 / max(1, base.runs) + its**2 / len(best.runs)) ** 0.5
    return SpeedupUncertainty(deviation=deviation, scattered=mine_scattered or its_scattered)


@dataclasses.dataclass(frozen=True)
class Budget:
    """What a user budgets in: the price of a device-hour (``--cost-per-gpu-hour``) and the real
    training's length in samples (``--train-samples``, or ``--train-steps`` at the user's own
    global batch size)."""

    cost_per_gpu_hour: float | None = None
    train_samples: int | None = None
    train_steps: int | None = None  # what the user gave, where the samples come from steps


def _money(amount: float) -> str:
    return f"{amount:,.2f}"


def _duration(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


def _gib(size: float) -> str:
    return f"{size / 2**30:,.1f} GiB"


def memory_line(result: TuningResult) -> str:
    """The optimum's measured peak memory against the device's, and the margin kept free;
    where the accelerator reports no peak, that the margin held the estimate only."""
    best, spend = result.best, result.spend
    if best is None or not result.device_memory:
        return ""
    margin = (f"the margin keeps {result.memory_margin:.0%} free (--memory-margin): a run above "
              f"{_gib(result.device_memory * (1 - result.memory_margin))} counts as out of memory")
    if best.peak_memory:
        return (f"Memory: {best.name} peaks at {_gib(best.peak_memory)} of {_gib(result.device_memory)} per {spend.noun} "
                f"({best.peak_memory / result.device_memory:.0%}); {margin}.")
    why = " (NVML reports NVIDIA GPUs only)" if spend.device == "GPU" else ""
    return (f"Memory: the peak is not measured on this {spend.noun}{why}; "
            f"the margin of {result.memory_margin:.0%} (--memory-margin) could not be checked.")


def budget_lines(result: TuningResult, budget: Budget | None) -> list[str]:
    """The tuning's cost in money, and the real training's time and cost with the user's config
    and with the optimum, each at its measured mean (on the GPUs of one experiment)."""
    if budget is None:
        return []
    lines = []
    spend, price = result.spend, budget.cost_per_gpu_hour
    noun = "GPU-hour" if spend.device == "GPU" else "device-hour"
    if price is not None:
        lines.append(f"Cost of the tuning: {_money(spend.gpu_hours * price)} at {_money(price)} per {noun}.")
    if budget.train_samples is None:
        return lines
    base, best = result.baseline, result.best
    what = (f"{budget.train_steps:,} steps of your config ({budget.train_samples:,} samples)" if budget.train_steps
            else f"{budget.train_samples:,} samples")
    if result.metric.name != "throughput":
        return [*lines, f"Training {what}: its time follows from the throughput metric only, not {result.metric.name}."]
    gpus = spend.gpus_per_experiment

    def cost(rate: float) -> str:
        seconds = budget.train_samples / rate  # type: ignore[operator]
        hours = seconds * gpus / 3600
        money = f", {_money(hours * price)}" if price is not None else ""
        return f"{_duration(seconds)} ({format_number(hours, 3)} {noun}s{money})"

    parts = []
    # Two times side by side are a speed-up factor: given under the factor's rule alone.
    alike = not no_speedup(result)
    if base is not None and base.value and alike:
        parts.append(f"your config {cost(base.value)}")
    if best is not None and best.value:
        parts.append(f"the optimum {cost(best.value)}")
    if parts:
        lines.append(f"Training {what} on {gpus} {spend.noun}(s): " + ", ".join(parts)
                     + ("" if alike or base is None or not base.value
                        else "; your config's is left out, as the speed-up factor is")
                     + ".")
    if best is not None and best.value:
        # What the tuning was for: the planner bought a launch only where it was expected to
        # save the training more device-time than it took. A saving over the user's config is
        # a speed-up factor: stated under the factor's rule alone.
        spent = f"{format_number(spend.gpu_hours, 3)} {noun}s spent tuning"
        left = ""
        if best.regret is not None:
            lost = budget.train_samples / best.value * best.regret / (1 + best.regret) * gpus / 3600
            left = f"; expected regret left {best.regret:.1%} ({format_number(lost, 3)} {noun}s)"
        if alike and base is not None and base.value:
            saved = budget.train_samples * (1 / base.value - 1 / best.value) * gpus / 3600
            lines.append(f"Expected saving of the optimum over your config: {format_number(saved, 3)} "
                         f"{noun}s of the training, for {spent}{left}.")
        else:
            lines.append(f"{spent[0].upper()}{spent[1:]}{left}.")
    return lines


def headline(result: TuningResult, budget: Budget | None = None) -> list[str]:
    """What the user came for: their config, the optimum and how much faster (with the
    run-to-run noise and what it was measured from), what finding it cost, and a warning where
    the optimum's own runs disagree more than the noise explains; then its memory against the
    device's, and, given a price and the training's length, what the training costs."""
    base, best, metric = result.baseline, result.best, result.metric
    lines = []
    if base is not None and base.stage is not None:
        label = f"z{base.stage}" + (f", micro-batch {base.micro_batch_size}" if base.micro_batch_size else "")
        if base.listed and len(base.listed) > 1:
            label += f", the first stage explored of {list(base.listed)}"
        if base.value is not None:
            mine = f"Your config ({label}): {metric.with_unit(base.value)}{mean_of(base.runs)}"
        elif base.status:
            mine = f"Your config ({label}): failed ({base.status})"
        else:
            mine = f"Your config ({label}): not measured, {base.reason}"
    else:
        mine = "Your config: not measured"
    lines.append(mine + ".")
    lines.append(optimum_line(result))
    spend = result.spend
    cut = len(result.interrupted)
    included = [what for what, on in (("the profile run", spend.profiled), (f"{cut} cut short by an interrupt", cut)) if on]
    lines.append(f"Spent: {spend.experiments} experiment(s)" + (f" ({' and '.join(included)} included)" if included else "")
                 + f", {spend.hours}.")
    warning = best.warning(metric, result.noise) if best is not None else ""
    if warning:
        lines.append(warning)
    if base is not None and (mine := _baseline_warning(base, result.noise.value)):
        lines.append(mine)
    if memory := memory_line(result):
        lines.append(memory)
    return lines + budget_lines(result, budget)


def _baseline_warning(base: Baseline, noise: float | None) -> str:
    """The line that says the user's own runs disagree beyond the noise (the speed-up divides
    their mean), or ``""``."""
    if not scatters(base.values, noise) or (spread := relative_spread(base.values)) is None:
        return ""
    return (f"Warning: the {len(base.values)} runs of your config ({base.name}) scatter by {spread:.1%}, more than "
            f"{SCATTER_WARNING:g}x the {noise:.1%} run-to-run noise: the speed-up is uncertain.")


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


def learning_rate_advice(result: TuningResult, user: UserConfig, *,
                         data_parallel_size: int) -> LearningRateAdvice | str | None:
    """DeepSpeed's advice against the user's global batch size; where the config gives none (a
    micro-batch ``"auto"`` no script flag resolves), the rule alone, as a line: a factor from
    the smallest size tried would scale the learning rate by a batch the user never trained at."""
    best = result.best
    if best is None or best.train_batch_size is None:
        return None
    new = best.train_batch_size
    if not (user.own_train_batch_size or user.baseline_micro_batch_size or user.micro_batch_sizes):
        rule = f"sqrt({new}/B) (an Adam-type optimizer)" if user.adam_type_optimizer else f"{new}/B ({user.optimizer_type})"
        return (f"The best global batch size is {new}; your config gives no batch size to compare it with, so no learning "
                f"rate is scaled: from the global batch size B you train at, scale it by {rule}.")
    original = user.own_train_batch_size or user.min_micro_batch_size * user.gradient_accumulation_steps * data_parallel_size
    if new == original:
        return None
    ratio = new / original
    if user.adam_type_optimizer:
        factor, rule, kind = math.sqrt(ratio), f"sqrt({new}/{original})", "an Adam-type optimizer"
    else:
        # The config's text inside a sentence of the summary and the terminal: one line of it.
        factor, rule, kind = ratio, f"{new}/{original}", one_line(f"{user.optimizer_type}")
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


def summary_text(result: TuningResult, *, advice: LearningRateAdvice | str | None, budget: Budget | None = None) -> str:
    """Our own summary (``optuna_ds_summary.txt``, the terminal's): the headline, each space's
    best config with its mean and runs, then the notes."""
    notes = summary_notes(result, advice)
    return "\n".join([*headline(result, budget), "", runs_table(result), "", *notes]) + "\n"


def summary_markdown(result: TuningResult, *, advice: LearningRateAdvice | str | None, budget: Budget | None = None) -> str:
    """The summary as optuna-dashboard's note renders it: first what the dashboard's own figures
    get wrong (its "Best Trial" is one run, unformatted; a parameter that never changed gets an
    importance), then the headline, the table, the notes."""
    first = [f"**Read first:** {line}" for line in dashboard_caveats(result)]
    head = "\n\n".join(f"**{line}**" if i == 0 else line for i, line in enumerate(headline(result, budget)))
    notes = [n for n in summary_notes(result, advice) if n != optuna_best_note(result)]
    listed = [f"- {n}" for n in notes]
    lines = [*(f"{line}\n" for line in first), head, "", runs_table(result), "", *listed]
    return "\n".join(lines) + "\n"


def dashboard_caveats(result: TuningResult) -> list[str]:
    """What optuna-dashboard shows that is not this tuning's answer: its best trial, where it is
    not the optimum, the importance of an accumulation that never changed, and the trials it
    shows failed that were interrupted."""
    lines = [note] if (note := optuna_best_note(result)) else []
    if result.interrupted:
        cut = ", ".join(f"z{stage} trial {number} ({name})" for stage, number, name in result.interrupted)
        lines.append(f"{cut}: shown as Fail, but interrupted (a signal, or a worker lost), which is no failure: an "
                     "interrupted experiment runs again when the tuning resumes.")
    accumulations = {m.config.accumulation for m in result.measured}
    if len(accumulations) == 1 and len(result.measured) > 1:
        lines.append(f"gradient_accumulation_steps was {accumulations.pop()} in every experiment: its importance in the "
                     f"dashboard (0) says nothing of it.")
    return lines


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


_NAMED = 4  # equivalent configs named, at most


def _equivalent(result: TuningResult, other: Measured | Optimum) -> bool | None:
    """Whether the planner judged ``other`` a config a run cannot tell from the optimum (its one
    rule, ``Decision.equivalent``); ``None`` where it gave no verdict (it has not chosen)."""
    return None if result.equivalent is None else other.config in result.equivalent


def judged_noise(result: TuningResult) -> float | None:
    """The relative noise of one run the planner judged the configs by (else the measured one)."""
    return result.judged_noise if result.judged_noise is not None else result.noise.value


def _per_run(result: TuningResult) -> str:
    noise = judged_noise(result)
    assumed = "" if result.noise.value is not None else ", assumed: not measured"
    return f"{noise:.1%} per run{assumed}" if noise is not None else "the noise unknown"


def choice_lines(result: TuningResult) -> list[str]:
    """Why the optimum is the optimum, and which configs are as good within the noise: what a
    DeepSpeed user, who can predict DeepSpeed's own search, asks of this one."""
    best, metric = result.best, result.metric
    if best is None or not best.chosen:
        return []
    others = [m for m in result.measured if m.config != best.config]
    why = (f"Why {best.name}: of the {len(others) + 1} configs that ran, it is the best by the planner's estimate, which weighs "
           f"every run of every size and stage (a curve per stage), not one run")
    higher = metric.best([m for m in others if metric.better(m.value, best.value)], key=lambda m: m.value)
    if higher is not None:
        why += (f"; {higher.name} measured a higher mean ({metric.with_unit(higher.value)}, {_runs(len(higher.runs))}) "
                f"that its curve and the noise do not bear out")
    if result.equivalent is None:
        unknown = "Equivalent configs: none can be named, the planner recorded no verdict on them."
        return [why + ".", unknown]
    ranked = sorted(others, key=lambda m: metric.oriented(m.value), reverse=True)
    alike = [m for m in ranked if _equivalent(result, m)]
    if alike:
        named = ", ".join(f"{m.name} ({metric.with_unit(m.value)}, {_runs(len(m.runs))})" for m in alike[:_NAMED])
        more = f" and {len(alike) - _NAMED} more" if len(alike) > _NAMED else ""
        equal = (f"Equivalent within the noise ({_per_run(result)}): {named}{more}; any of them "
                 "would do as well.")
    elif ranked:
        gap = abs(ranked[0].value - best.value) / best.value
        equal = (f"Equivalent within the noise ({_per_run(result)}): none; the next best, "
                 f"{ranked[0].name}, is "
                 f"{gap:.1%} {'slower' if metric.better(best.value, ranked[0].value) else 'apart'}.")
    else:
        equal = "Equivalent configs: none, no other config ran."
    return [why + ".", equal]


def knob_line(result: TuningResult) -> str:
    """What the optimum's knob settings were worth: its mean against the best config of its
    stage and offload that ran at the defaults (at its own micro-batch size where one ran), by
    the same noise rule as the equivalent configs; "" where it sets none or no such config ran."""
    best, metric = result.best, result.metric
    if best is None or not (settings := departures(best.config).zero):
        return ""
    # Checkpointing and AutoTP have their own lines: the configs compared share the optimum's.
    plain = [m for m in result.measured if m.config.arm == best.config.arm and not departures(m.config).zero
             and m.config.knobs.room == best.config.knobs.room]
    mbs = best.config.micro_batch
    same = [m for m in plain if m.config.micro_batch == mbs]
    other = metric.best(same or plain, key=lambda m: m.value)
    if other is None or not other.value:
        return ""
    named = ", ".join(f"{k}={json.dumps(v)}" for k, v in settings)
    who = "the optimum's" if best.chosen else "the best so far's"
    gap = best.value / other.value - 1
    where = ("at the same micro-batch size" if same
             else f"at micro-batch {other.config.micro_batch} (none was measured at {mbs} without them)")
    equivalent = _equivalent(result, other)
    if equivalent is None:
        verdict = ("the planner has judged no config beside it yet, so whether they matter is "
                   "unknown")
    elif equivalent:
        verdict = f"within the noise ({_per_run(result)})"
    else:
        verdict = f"more than the noise explains ({_per_run(result)})"
    return (f"Knobs: {who} settings ({named}) measured {abs(gap):.1%} {'above' if gap >= 0 else 'below'} the best config "
            f"without them {where} ({other.name}: {metric.with_unit(other.value)}, {_runs(len(other.runs))}), {verdict}.")


def _with_it(result: TuningResult, best: Optimum, other: Measured) -> str:
    """The best config with a setting the optimum goes without, against the optimum."""
    metric = result.metric
    return (f"the best config with it, {other.name} ({metric.with_unit(other.value)}, {_runs(len(other.runs))}), "
            f"is {format_number(other.value / best.value, 3)}x the optimum without it.")


def _without_it(result: TuningResult, best: Optimum, other: Measured) -> str:
    """The optimum, which uses a setting, against the best config without it: by how much, and
    whether within the noise."""
    metric = result.metric
    factor = best.value / other.value if metric.maximize else other.value / best.value
    verdict = f", within the noise ({_per_run(result)})" if _equivalent(result, other) else ""
    return (f"{format_number(factor, 3)}x the best config without it, {other.name} ({metric.with_unit(other.value)}, "
            f"{_runs(len(other.runs))}){verdict}.")


def checkpointing_line(result: TuningResult) -> str:
    """What activation checkpointing came to, where it was a dimension: the setting the optimum
    uses and its worth against the best config without it (any stage: what it buys may be a
    lower stage), or why the optimum goes without: the script ignored it (said once, with what
    shows it), it failed for a reason of its own, it ran and lost, or it could not pay."""
    outcome, best, metric = result.checkpointing, result.best, result.metric
    if outcome is None or best is None:
        return ""
    if outcome.ignored:
        named, why = outcome.ignored[0]
        return f"Checkpointing: {named}: {why}; explored no further ({_runs(outcome.runs)} with it)."
    if outcome.failed and not best.config.knobs.checkpointing:
        name, why = outcome.failed[-1]
        return f"Checkpointing: {name} failed for a reason of the setting ({why}); not tried again."
    setting = best.config.knobs.checkpointing
    others = [m for m in result.measured if bool(m.config.knobs.checkpointing) != bool(setting)]
    other = metric.best(others, key=lambda m: m.value)
    if not setting:
        if other is None:
            return ("Checkpointing: not launched: it pays only where activations bound the micro-batch and the throughput "
                    "curve still rises beyond that size by more than the forward it recomputes, which the runs did not show here.")
        return f"Checkpointing: {_with_it(result, best, other)}"
    if other is None:
        return f"Checkpointing: the optimum uses {outcome.named(setting)}; no config ran without it."
    return (f"Checkpointing: the optimum uses {outcome.named(setting)} (micro-batch {best.config.micro_batch}): "
            f"{_without_it(result, best, other)}")


def autotp_line(result: TuningResult) -> str:
    """What AutoTP came to, where it was a dimension: the size the optimum splits its layers over
    and its worth against the best config without it (any stage: what it buys may be a lower
    stage or a larger micro-batch), or why the optimum goes without: it failed for the script's
    reason (said once), it ran and lost, or it could not pay."""
    outcome, best, metric = result.autotp, result.best, result.metric
    if outcome is None or best is None:
        return ""
    size = best.config.knobs.autotp
    if outcome.failed and size == 1:
        name, why = outcome.failed[0]
        return f"AutoTP: {name} failed for a reason of the script ({why}); no size tried again."
    others = [m for m in result.measured if (m.config.knobs.autotp > 1) != (size > 1)]
    other = metric.best(others, key=lambda m: m.value)
    if size == 1:
        if other is None and result.measured and all(m.config.stage == 3 for m in result.measured):
            return ("AutoTP: not launched: it applies at ZeRO stages 0 to 2 only (DeepSpeed's AutoTP training documents no "
                    "ZeRO-3), and the tuning ran ZeRO-3 only.")
        if other is None:
            return ("AutoTP: not launched: it pays only where the model states or activations bound the micro-batch and the "
                    "throughput curve still rises beyond that size by more than its per-layer all-reduces cost, which the "
                    "runs did not show here.")
        return f"AutoTP: {_with_it(result, best, other)}"
    split = (f"AutoTP: the optimum splits each layer over {size} GPUs (tensor_parallel.autotp_size {size}; "
             f"micro-batch {best.config.micro_batch} for each group of {size})")
    if other is None:
        return f"{split}; no config ran without it."
    return f"{split}: {_without_it(result, best, other)}"


# DeepSpeed's global timers, as a user reads them: backward includes its gradient all-reduce.
_TIMERS = (("fwd", "forward"), ("bwd", "backward"), ("step", "optimizer step"))


def step_line(result: TuningResult) -> str:
    """Where the optimum's step time goes, by the engine's own timers over its profiled steps:
    a large all-reduce share says communication bounds it (a faster interconnect, larger
    buckets or ZeRO++ may pay), a large optimizer share says the optimizer does (offload costs
    most there)."""
    best = result.best
    timers = best.timers_ms if best is not None else {}
    if best is None or not all(k in timers for k, _ in _TIMERS):
        return ""
    total = sum(timers[k] for k, _ in _TIMERS)
    if total <= 0:
        return ""
    parts = []
    for key, label in _TIMERS:
        part = f"{label} {timers[key]:,.4g} ms ({timers[key] / total:.0%}"
        if key == "bwd" and "bwd_allreduce" in timers:
            part += f", of which gradient all-reduce {timers['bwd_allreduce']:,.4g} ms"
        parts.append(part + ")")
    return f"Step time of {best.name} by DeepSpeed's timers (median of its profiled steps): " + ", ".join(parts) + "."


def ignored_batch_line(result: TuningResult) -> str:
    """Where the micro-batch size did not take effect (the forward pass did not grow with it):
    every figure counted samples the script did not train, so neither the optimum nor its size
    holds; the line says so, and names the script's own batch flag where it has one."""
    ignored = result.ignored_batch
    if ignored is None:
        return ""
    if ignored.flag:
        fix = (f"the script's {ignored.flag} is not in autotuning.arg_mappings: map it "
               f"(\"{MBS_KEY}\": \"{ignored.flag.split()[0]}\")")
    else:
        fix = f"the script must train the {MBS_KEY} of the config it is given"
    return (f"The micro-batch size did not take effect: the fastest forward pass took "
            f"{ignored.small_fwd_ms:,.4g} ms at micro-batch {ignored.small_mbs} ({ignored.small}) and "
            f"{ignored.large_fwd_ms:,.4g} ms at {ignored.large_mbs} ({ignored.large}), so the figures "
            f"count samples that were not trained and the optimum does not hold; {fix}, and tune again.")


def exit_step_line(result: TuningResult) -> str:
    """Where DeepSpeed's figure, one step, was off the run's other steps (a loaded or noisy
    machine): the runs' figures are the median of their steps; the line says how many, and how
    far the first one's was off."""
    if not result.exit_off:
        return ""
    name, engine, value = result.exit_off[0]
    metric = result.metric
    return (f"One-step figures: {len(result.exit_off)} run(s)' last step, the one DeepSpeed's figure "
            f"is made of, took less than half or more than twice the median of their profiled steps "
            f"({name}: DeepSpeed's {metric.with_unit(engine)}, its steps' {metric.with_unit(value)}): "
            "their figure is the median of their steps.")


def warmup_line(result: TuningResult) -> str:
    """Where runs' step times still fell across their profiled window (their warm-up not over,
    so DeepSpeed's one-step figure was not their speed): each ran again with its profiled steps
    later; the line names them, and those still falling then, whose figures stay below their
    speed."""
    if not result.warmed:
        return ""
    first = result.warmed[0]
    (start, end), (later, last) = first.windows[0], first.windows[-1]
    line = (f"Warm-up: {len(result.warmed)} run(s) still got faster across their profiled steps "
            f"({first.name}: {first.fell:.0%} over steps {start}-{end}), so DeepSpeed's one-step "
            f"figure was not their speed: each ran again with its profiled steps later (steps "
            f"{later}-{last})")
    unsettled = ", ".join([w.name for w in result.warmed if not w.settled][:3])
    if unsettled:
        return line + f"; still getting faster there, their figures are below their speed: {unsettled}."
    return line + ", where they held."


def pruned_line(result: TuningResult) -> str:
    """The runs the pruner ended before their profiled window did (clearly below the
    incumbent): how many, and the first with its figure and the bar it fell below."""
    if not result.pruned:
        return ""
    first, metric = result.pruned[0], result.metric
    return (f"Pruned: {len(result.pruned)} run(s) ended early, clearly below the best so far ({first.name}: "
            f"{metric.with_unit(first.figure)} over its first {first.steps} profiled steps, below "
            f"{metric.with_unit(first.bar)}, the best's {metric.with_unit(first.incumbent)} less what a slow run "
            "and the noise explain); each counts as measured from those steps.")


def _runs(n: int) -> str:
    return f"{n} run{'s' if n > 1 else ''}"


def unrun_lines(result: TuningResult) -> list[str]:
    """A line for each key listed with values no experiment ran with (a knob of
    ``zero_optimization``, the micro-batch size): the values, and why (a listed value is never
    dropped unsaid)."""
    by_path: dict[tuple[str, str], list[str]] = {}
    for u in result.unrun:
        by_path.setdefault((u.path, u.reason), []).append(u.setting.split("=", 1)[1])
    return [f"Listed but not run: {path} {', '.join(values)}: {reason}."
            for (path, reason), values in by_path.items()]


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
    """What follows the table: the time, what its values are, why the optimum, what its knob
    settings were worth, Optuna's own best trial where it differs, skipped stages, failures, the
    learning-rate advice."""
    lines = []
    duration = datetime.timedelta(seconds=round(result.duration))
    lines.append(f"Tuning completed in {duration}. Total number of experiments: {result.num_experiments}. "
                 "Each best_config_mean is the mean of its config's runs; summary.txt, in "
                 "DeepSpeed's form, gives as best_metric_val the best single run of that config.")
    if result.best is None:
        lines.append("No experiment ran successfully: see the stderr.log of each experiment under results_dir.")
    if ignored := ignored_batch_line(result):
        lines.append(ignored)
    lines += choice_lines(result)
    if knobs := knob_line(result):
        lines.append(knobs)
    if checkpointing := checkpointing_line(result):
        lines.append(checkpointing)
    if autotp := autotp_line(result):
        lines.append(autotp)
    if step := step_line(result):
        lines.append(step)
    if warmup := warmup_line(result):
        lines.append(warmup)
    if pruned := pruned_line(result):
        lines.append(pruned)
    if off := exit_step_line(result):
        lines.append(off)
    if note := optuna_best_note(result):
        lines.append(note)
    lines += stage_notes(result)
    lines += unrun_lines(result)
    if advice:
        lines.append(advice if isinstance(advice, str) else advice.text)
    return lines


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
