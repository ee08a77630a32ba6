"""The user's own config as a tuning measured it."""
from __future__ import annotations

import dataclasses
import statistics

from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.domain import DEFINITIVE_FAILURES
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import Phase
from optuna_ds.studies._runs import completed_of
from optuna_ds.studies._runs import starts


@dataclasses.dataclass(frozen=True)
class Baseline:
    """The user's own config (their stage and micro-batch size) as this tuning measured it;
    ``reason`` says why there is no measurement."""

    stage: int | None
    micro_batch_size: int | None
    name: str = ""
    value: float | None = None
    status: str = ""  # "complete", a failure reason, or "" when it did not run
    reason: str = ""
    listed: tuple[int, ...] = ()  # the stages the user's config lists
    runs: int = 1  # how many runs ``value`` is the mean of
    values: tuple[float, ...] = ()  # those runs, where they completed
    starts: tuple[float, ...] = ()  # when each of them started (seconds since the epoch)


def find_baseline(*, stages: dict[int, list[FrozenTrial]], order: list[int], skipped: dict[int, str],
                  micro_batch_size: int | None, user_list: bool) -> Baseline:
    """The user's config in this tuning: the first stage the tuning explored (their stage when
    they gave one) at their micro-batch size, which that stage runs first."""
    listed = tuple(order)
    explored = [s for s in order if s not in skipped]
    stage = explored[0] if explored else (order[0] if order else None)
    if micro_batch_size is None:
        why = ("your config lists micro-batch sizes, so it has no single baseline" if user_list
               else "your config gives no micro-batch size (set one, or map \"auto\" to a script flag)")
        return Baseline(stage=stage, micro_batch_size=None, reason=why, listed=listed)
    if not explored:
        return Baseline(stage=stage, micro_batch_size=micro_batch_size, reason=f"z{stage} was skipped: {skipped.get(stage, '') if stage is not None else ''}",
                        listed=listed)
    assert stage is not None
    runs = [(t, r) for t in stages.get(stage, []) if t.state != TrialState.PRUNED and (r := ExperimentRecord.from_trial(t)).claimed
            and r.phase is Phase.MICRO_BATCH and r.config is not None and r.config.micro_batch == micro_batch_size]
    done = [(t, r) for t, r in runs if t.state == TrialState.COMPLETE] or [(t, r) for t, r in runs if r.reason in DEFINITIVE_FAILURES]
    if not done:
        why = "it has not run yet" if stage in stages else f"z{stage} has not started"
        if any(t.state == TrialState.COMPLETE for t in stages.get(stage, [])):
            why = "it is above the largest size predicted to fit"
        return Baseline(stage=stage, micro_batch_size=micro_batch_size, reason=why, listed=listed)
    t, record = done[0]
    assert record.exp_name is not None
    status = "complete" if t.state == TrialState.COMPLETE or record.reason is None else record.reason.value
    complete = t.state == TrialState.COMPLETE and record.config is not None
    completed = completed_of(t, stages.get(stage, [])) if complete else []
    values = [float(c.value) for c in completed]  # type: ignore[arg-type]
    return Baseline(stage=stage, micro_batch_size=micro_batch_size, name=record.exp_name,
                    value=statistics.fmean(values) if values else t.value, status=status,
                    reason="" if status == "complete" else f"it failed ({status})", listed=listed, runs=max(1, len(values)),
                    values=tuple(values), starts=starts(completed))
