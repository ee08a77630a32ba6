"""The per-process coordinator in-process, with stand-in stages: what it does with the planner's
proposals when an experiment does not launch."""
from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import optuna
import pytest

from optuna_ds.config import Metric
from optuna_ds.domain import Config
from optuna_ds.planner import Arm
from optuna_ds.planner import Problem
from optuna_ds.studies._coordinator import Coordinator
from optuna_ds.studies._coordinator import PlannerLoop


class _Pool:
    size = 1

    def try_acquire(self) -> object | None:
        return object()

    def acquire(self, stop: threading.Event, **_: Any) -> object | None:
        return None if stop.is_set() else object()

    def release(self, lease: object) -> None:
        pass


class _Stage:
    """A stage whose every experiment stands down: nothing reaches its study."""

    def __init__(self) -> None:
        self.study = optuna.create_study(direction="maximize")
        self.asked: list[Config] = []

    def reap(self) -> None:
        pass

    def run(self, config: Config, lease: object, **_: Any) -> bool:
        self.asked.append(config)
        return False


def test_a_proposal_that_never_launches_ends_the_tuning_in_one_line_at_its_second_ask() -> None:
    """The planner is a pure function of the storage: a proposal that launched nothing and left
    the storage as it was comes back for ever (the knob search's bracket, pruned each time, did)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stage = _Stage()
    lines: list[str] = []
    observer = SimpleNamespace(log=lines.append, detail=lines.append, plan=lambda *a, **k: None)
    ctx = SimpleNamespace(pool=_Pool(), stop=threading.Event(), observer=observer,
                          metric=Metric(name="throughput", key="throughput", direction="maximize"))
    problem = Problem(arms=(Arm(stage=1, free=60e9, cap=64),), device_memory=80e9)
    coordinator = Coordinator(problem=problem, stages={1: stage}, ctx=ctx, root=None)  # type: ignore[arg-type]
    with pytest.raises(PlannerLoop) as raised:
        coordinator.run()
    assert len(stage.asked) == 2 and stage.asked[0] == stage.asked[1]
    message = str(raised.value)
    assert "\n" not in message and stage.asked[0].name in message and "twice" in message
    assert PlannerLoop.exit_code != 0
