"""What a tuning found of its dimensions and runs beside the optimum: activation checkpointing,
AutoTP, runs still warming up, exit steps off their window, a micro-batch size that did not take
effect."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

from optuna.trial import TrialState

from optuna_ds.config import UserConfig
from optuna_ds.domain import Config
from optuna_ds.domain import FailureReason
from optuna_ds.domain import Run
from optuna_ds.planner import Priors
from optuna_ds.planner import checkpointing_ignored
from optuna_ds.space import build_autotp_space
from optuna_ds.studies._builder import checkpointing_space
from optuna_ds.studies._coordinator import observation_of
from optuna_ds.studies._runs import failure_text


@dataclasses.dataclass(frozen=True)
class CheckpointingOutcome:
    """What a tuning found of activation checkpointing, where it was a dimension: the script
    flag of its switch ("" where the section alone is tuned), its launches, the settings the
    script ignored (the setting named, and what shows it) and the runs that failed for a
    reason of the setting (the experiment, and why)."""

    switch: str = ""
    runs: int = 0
    ignored: tuple[tuple[str, str], ...] = ()
    failed: tuple[tuple[str, str], ...] = ()

    def named(self, knobs: Iterable[tuple[str, Any]]) -> str:
        """A checkpointing setting as the user sets it: the script flag, the section's keys."""
        return ", ".join(self.switch if k == "gradient_checkpointing" and self.switch else f"{k}={_json(v)}" for k, v in knobs)


def _json(value: Any) -> str:
    return "true" if value is True else "false" if value is False else str(value)


def checkpointing_outcome(runs: Sequence[Run], user: UserConfig) -> CheckpointingOutcome | None:
    """The tuning's checkpointing outcome from its runs (``None`` where it was no dimension):
    what the planner reads of its runs (:func:`~optuna_ds.planner.checkpointing_ignored`) is
    what the summary says."""
    space = checkpointing_space(user)
    if not space.settings():
        return None
    metric = user.autotuning.tuned_metric
    observations = [o for t, _ in runs if (o := observation_of(t, metric=metric, dead={})) is not None]
    outcome = CheckpointingOutcome(switch=space.switch)
    why = checkpointing_ignored(observations, Priors())
    failed = [(r.exp_name or "", failure_text(r)) for t, r in runs
              if t.state == TrialState.FAIL and r.reason is FailureReason.CHECKPOINTING]
    return dataclasses.replace(outcome, runs=sum(1 for o in observations if o.knobs.checkpointing),
                               ignored=tuple((outcome.named([kv]), text) for kv, text in why.items()), failed=tuple(failed))


@dataclasses.dataclass(frozen=True)
class AutotpOutcome:
    """What a tuning found of AutoTP, where it was a dimension: the sizes tried, its launches
    and the runs that failed for a reason of its own (the experiment, and why: said once, as no
    size is tried again)."""

    sizes: tuple[int, ...] = ()
    runs: int = 0
    failed: tuple[tuple[str, str], ...] = ()


def autotp_outcome(runs: Sequence[Run], user: UserConfig) -> AutotpOutcome | None:
    """The tuning's AutoTP outcome from its runs; ``None`` where it was no dimension."""
    space = build_autotp_space(user.autotp_section())
    if not space.sizes:
        return None
    metric = user.autotuning.tuned_metric
    observations = [o for t, _ in runs if (o := observation_of(t, metric=metric, dead={})) is not None]
    failed = [(r.exp_name or "", failure_text(r)) for t, r in runs if t.state == TrialState.FAIL and r.reason is FailureReason.AUTOTP]
    return AutotpOutcome(sizes=space.sizes, runs=sum(1 for o in observations if o.knobs.autotp > 1), failed=tuple(failed[:1]))


@dataclasses.dataclass(frozen=True)
class Warmed:
    """A run whose step times still fell across its profiled window: measured again later in
    the run (``windows``: each launch's steps, the figure's last), ``settled`` where they then
    held."""

    name: str
    windows: tuple[tuple[int, int], ...]
    fell: float  # the fall across its first window, as a share
    settled: bool


def warmed_runs(runs: Iterable[Run]) -> list[Warmed]:
    """The ``runs`` that were still warming up in their profiled window, oldest first."""
    found = []
    for _, record in runs:
        warmup = record.warmup or {}
        windows = [w for w in warmup.get("windows", []) if isinstance(w, dict)]
        if windows and record.exp_name:
            steps = tuple((int(w["steps"][0]), int(w["steps"][1])) for w in windows)
            found.append(Warmed(name=record.exp_name, windows=steps, fell=float(windows[0]["fell"]),
                                settled=bool(warmup.get("settled"))))
    return found


@dataclasses.dataclass(frozen=True)
class PrunedRun:
    """A run the pruner ended before its window did: its figure over the steps it logged, the
    bar it fell below and the incumbent's figure that bar comes from."""

    name: str
    figure: float
    steps: int
    bar: float
    incumbent: float


def pruned_runs(runs: Iterable[Run]) -> list[PrunedRun]:
    """The ``runs`` the pruner ended early, oldest first."""
    found = []
    for t, record in runs:
        p = record.pruned
        if t.state == TrialState.PRUNED and isinstance(p, dict) and record.exp_name:
            found.append(PrunedRun(name=record.exp_name, figure=float(p["figure"]), steps=int(p["steps"]), bar=float(p["bar"]),
                                   incumbent=float(p["incumbent"])))
    return found


def exits_off(runs: Iterable[Run]) -> list[tuple[str, float, float]]:
    """The runs whose exit step was off their window: name, DeepSpeed's figure, and the value
    (the median of their steps' figures)."""
    found = []
    for t, record in runs:
        if t.state == TrialState.COMPLETE and t.value is not None and record.engine_figure is not None:
            found.append((record.exp_name or "", float(record.engine_figure), float(t.value)))
    return found


@dataclasses.dataclass(frozen=True)
class IgnoredBatch:
    """Two runs of one config but for its micro-batch size whose forward pass took about the same
    time, though one trained at least ``_IGNORED_RATIO`` times the other's micro-batch: the
    script did not train the size the config set (its own batch flag, not in ``arg_mappings``,
    or a size of its own), and every figure counted samples it did not train."""

    small: str  # the two experiments' names
    large: str
    small_mbs: int
    large_mbs: int
    small_fwd_ms: float  # the forward pass of one micro-step, the fastest of its runs' profiled steps
    large_fwd_ms: float
    flag: str = ""  # the script's own batch argument as given (``--batch_size 8``), if any


# A forward pass of 4 times the samples in less than 1.1 times the time: no device is that idle
# at the smaller size and still worth tuning (docs/steps.md).
_IGNORED_RATIO = 4
_IGNORED_GROWTH = 1.1


def _batch_flag(script_args: Sequence[str], mapped: Iterable[str]) -> str:
    """The script's own batch-size argument, as given, where it has one that ``arg_mappings``
    does not map (so no experiment sets it): ``--batch_size 8``."""
    mapped = set(mapped)
    for i, arg in enumerate(script_args):
        flag, _, value = arg.partition("=")
        if flag.startswith("-") and "batch" in flag.lower() and flag not in mapped:
            if not value and i + 1 < len(script_args) and not script_args[i + 1].startswith("-"):
                value = script_args[i + 1]
            return f"{flag} {value}".strip()
    return ""


def ignored_batch(runs: Iterable[Run], *, script_args: Sequence[str] = (),
                  mapped: Iterable[str] = ()) -> IgnoredBatch | None:
    """Evidence that the micro-batch size did not take effect (:class:`IgnoredBatch`): of the
    runs of one config but for its micro-batch size and accumulation, the smallest size against
    one at least ``_IGNORED_RATIO`` times larger whose fastest forward pass grew less than
    ``_IGNORED_GROWTH`` times, by DeepSpeed's own timers (a step's wait on a loaded machine only
    lengthens it; runs recorded before the fastest was kept: their median); ``None`` where no
    such pair ran."""
    forward: dict[Config, list[float]] = {}
    names: dict[Config, str] = {}
    for t, record in runs:
        fwd = (record.fastest_ms or record.timers_ms or {}).get("fwd")
        ran = t.state == TrialState.COMPLETE and record.config is not None
        if ran and record.config is not None and isinstance(fwd, (int, float)) and fwd > 0:
            forward.setdefault(record.config, []).append(float(fwd) / record.config.accumulation)
            names.setdefault(record.config, record.exp_name or record.config.name)
    groups: dict[Config, list[Config]] = {}
    for config in forward:
        alike = dataclasses.replace(config, micro_batch=1, accumulation=1)
        groups.setdefault(alike, []).append(config)
    for configs in groups.values():
        configs.sort(key=lambda c: c.micro_batch)
        small = configs[0]
        for large in reversed(configs):
            if large.micro_batch < _IGNORED_RATIO * small.micro_batch:
                break
            fs, fl = min(forward[small]), min(forward[large])
            if fl < _IGNORED_GROWTH * fs:
                return IgnoredBatch(small=names[small], large=names[large],
                                    small_mbs=small.micro_batch, large_mbs=large.micro_batch,
                                    small_fwd_ms=fs, large_fwd_ms=fl, flag=_batch_flag(script_args, mapped))
    return None
