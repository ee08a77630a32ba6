"""Why the optimum is the optimum, and what its settings (knobs, checkpointing, AutoTP) were
worth against the best config without them, by the planner's one rule for equivalent configs."""

from __future__ import annotations

import json

from optuna_ds.config import format_number
from optuna_ds.studies import Measured
from optuna_ds.studies import Optimum
from optuna_ds.studies import TuningResult
from optuna_ds.studies import departures

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


def _runs(n: int) -> str:
    return f"{n} run{'s' if n > 1 else ''}"


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
