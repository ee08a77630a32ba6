from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import optuna

from optuna_ds.config import Metric
from optuna_ds.domain import Config
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import SlotPool
from optuna_ds.studies._builder import ExperimentBuilder
from optuna_ds.studies._observer import TuningObserver


@dataclasses.dataclass(frozen=True)
class StageContext:
    """What every stage of one tuning shares."""

    storage: optuna.storages.BaseStorage
    builder: ExperimentBuilder
    runner: ExperimentRunner
    pool: SlotPool
    stop: threading.Event
    metric: Metric
    tuner_type: str
    fast: bool
    early_stopping: int
    num_trials: int
    timeout: float | None
    observer: TuningObserver
    # The device's memory less the user's margin (--memory-margin): a run measured above it
    # counts as out of memory, so the chosen config keeps that headroom.
    memory_limit: float | None = None
    # A worker's check before it launches: the live tune process ending the tuning (its identity),
    # if any; then the worker launches nothing more. Tune's own is always None.
    ending_tune: Callable[[], dict[str, Any] | None] = lambda: None
    # Whether a config's runs are never pruned: the user's own (at their micro-batch size).
    protected: Callable[[Config], bool] = lambda config: False
