"""The lines under the summary's table: what the runs showed (timers, warm-up, pruning, one-step
figures, an ignored micro-batch), what was left out, and the learning-rate advice."""

from __future__ import annotations

import datetime

from optuna_ds.domain import MBS_KEY
from optuna_ds.studies import TuningResult
from optuna_ds.reporting._configs import LearningRateAdvice
from optuna_ds.reporting._worth import autotp_line
from optuna_ds.reporting._worth import checkpointing_line
from optuna_ds.reporting._worth import choice_lines
from optuna_ds.reporting._worth import knob_line

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
    lines += [line for build in (knob_line, checkpointing_line, autotp_line, step_line, warmup_line, pruned_line,
                                 exit_step_line, optuna_best_note) if (line := build(result))]
    lines += stage_notes(result)
    lines += unrun_lines(result)
    if advice:
        lines.append(advice if isinstance(advice, str) else advice.text)
    return lines
