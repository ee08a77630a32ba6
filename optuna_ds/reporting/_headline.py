"""The summary's first lines: the user's config, the optimum and its speed-up, the spend, the
memory, and what the training costs."""

from __future__ import annotations

import dataclasses
import datetime
import math

from optuna_ds.config import format_number
from optuna_ds.studies import SCATTER_WARNING
from optuna_ds.studies import Baseline
from optuna_ds.studies import TuningResult
from optuna_ds.studies import relative_spread
from optuna_ds.studies import scatters
from optuna_ds.reporting._speedup import no_speedup
from optuna_ds.reporting._speedup import speedup
from optuna_ds.reporting._speedup import speedup_uncertainty


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
