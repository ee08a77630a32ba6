from __future__ import annotations

import dataclasses
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.launcher import FailureReason
from optuna_ds.launcher import telling_line

# Failures that say something about the config itself; anything else (an interrupt, a dead
# worker) leaves the experiment to be run again.
DEFINITIVE_FAILURES = frozenset(r.value for r in FailureReason if r is not FailureReason.INTERRUPTED)


def is_finished_experiment(trial: FrozenTrial) -> bool:
    """Whether the trial's experiment has a result that must never be paid for again."""
    if trial.state == TrialState.COMPLETE:
        return True
    return trial.state == TrialState.FAIL and trial.user_attrs.get("reason") in DEFINITIVE_FAILURES


LOST_ATTR = "lost"


def given_up(trials: list[FrozenTrial]) -> dict[str, FrozenTrial]:
    """Experiments whose worker died twice while running them (killed, or no heartbeat for the
    grace period): retried once, then counted as failed so they cannot kill workers forever."""
    lost: dict[str, list[FrozenTrial]] = {}
    for t in trials:
        attrs = t.user_attrs
        if t.state == TrialState.FAIL and "exp_name" in attrs and (attrs.get(LOST_ATTR) or "reason" not in attrs):
            lost.setdefault(attrs["exp_name"], []).append(t)
    return {name: ts[-1] for name, ts in lost.items() if len(ts) >= 2}


def launched(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Trials that ran an experiment (duplicates and early-stopped asks launch nothing)."""
    return [t for t in trials if "exp_name" in t.user_attrs and t.state != TrialState.PRUNED]


@dataclasses.dataclass(frozen=True)
class BestExperiment:
    name: str
    stage: int
    value: float
    trial_number: int
    ds_config: dict[str, Any]
    result_dir: str
    cmd: list[str]
    micro_batch_size: int
    gradient_accumulation_steps: int

    @property
    def train_batch_size(self) -> int | None:
        value = self.ds_config.get("train_batch_size")
        return value if isinstance(value, int) else None

    @classmethod
    def from_trial(cls, trial: FrozenTrial, stage: int) -> BestExperiment:
        attrs = trial.user_attrs
        assert trial.value is not None
        return cls(
            name=attrs["exp_name"],
            stage=stage,
            value=trial.value,
            trial_number=trial.number,
            ds_config=attrs.get("ds_config", {}),
            result_dir=attrs.get("result_dir", ""),
            cmd=attrs.get("cmd", []),
            micro_batch_size=int(attrs.get("micro_batch_size", 0)),
            gradient_accumulation_steps=int(attrs.get("gradient_accumulation_steps", 1)),
        )


@dataclasses.dataclass(frozen=True)
class StageResult:
    """The outcome of one ZeRO stage: tuned (with its best) or skipped (with the reason)."""

    stage: int
    status: str
    reason: str = ""
    num_experiments: int = 0
    num_failed: int = 0
    best: BestExperiment | None = None
    last_failure: str = ""

    @property
    def name(self) -> str:
        return f"z{self.stage}"


def stage_result(study: optuna.Study, stage: int, *, status: str = "tuned", reason: str = "") -> StageResult:
    trials = launched(study.get_trials(deepcopy=False))
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    best = None
    if complete:
        pick = max if study.direction == optuna.study.StudyDirection.MAXIMIZE else min
        best = BestExperiment.from_trial(pick(complete, key=lambda t: t.value), stage)
    failed = [t for t in trials if t.state == TrialState.FAIL]
    last_failure = ""
    if failed:
        t = failed[-1]
        reason = t.user_attrs.get("reason", "failed")
        # stderr says why a run crashed; a timeout or a missing metric is said by our own detail
        # (the last stderr line of a killed run is whatever it printed last).
        crashed = reason in (FailureReason.ERROR.value, FailureReason.OOM.value)
        line = telling_line(t.user_attrs.get("stderr_tail") or "") if crashed else t.user_attrs.get("detail", "")
        last_failure = f"{t.user_attrs.get('exp_name')}: {reason}" + (f": {line}" if line else "")
    return StageResult(
        stage=stage,
        status=status,
        reason=reason,
        num_experiments=len(trials),
        num_failed=len(failed),
        best=best,
        last_failure=last_failure,
    )


@dataclasses.dataclass(frozen=True)
class TuningResult:
    """Every stage's outcome and the global best: what the summary and optimal files show."""

    metric: str
    direction: str
    stages: list[StageResult]
    duration: float
    model_info: dict[str, Any]

    @property
    def num_experiments(self) -> int:
        return sum(s.num_experiments for s in self.stages)

    @property
    def best(self) -> BestExperiment | None:
        bests = [s.best for s in self.stages if s.best is not None]
        if not bests:
            return None
        pick = max if self.direction == "maximize" else min
        return pick(bests, key=lambda b: b.value)
