from __future__ import annotations

from typing import Protocol

from optuna_ds._text import clean_text
from optuna_ds.config import Metric


class TuningObserver(Protocol):
    """What the tuning tells its watcher; ``optuna_ds.reporting.Progress`` shows it. The slots'
    driver threads call it at once: an observer that keeps state serialises its calls."""

    def log(self, text: str) -> None: ...

    def detail(self, text: str) -> None: ...

    def plan(self, remaining: int, *, metric: Metric, ceiling: int | None = None, starting: int = 0) -> None:
        """The planner's estimate of the experiments still to start (0 once it stopped) beside
        the ``starting`` ones it proposed just now, and ``ceiling``, the most a tuning launches."""

    def decided(self, *, stage: int, number: int, name: str, seconds: float) -> None:
        """Trial ``number`` is about to launch ``name``, ``seconds`` after its slot became free:
        the decision's cost (the planner's or the knob search's, and the claim), which
        `make bench-parallel` reports."""

    def started(self, *, stage: int, number: int, name: str, slot: str, why: str = "") -> None:
        """An experiment launched; ``why``: the planner's reason for it, in a few words."""

    def finished(self, *, stage: int, number: int, name: str, value: float | None, duration: float, outcome: str) -> None: ...

    def resumed(self, *, stage: int, name: str, value: float, metric: Metric) -> None:
        """An experiment an earlier run of the tuning measured: a resumed tuning's best so far
        starts from the results it already has."""


def started_line(*, stage: int, number: int, name: str, slot: str, why: str = "") -> str:
    """An experiment's line as it starts, with the planner's reason: a search the user can follow."""
    return f"[z{stage}] trial {number}: running {name} on {slot}" + (f" ({why})" if why else "")


class PrintObserver:
    """Plain lines on stdout: the default for API users."""

    def log(self, text: str) -> None:
        print(clean_text(text), flush=True)

    def detail(self, text: str) -> None:
        pass

    def plan(self, remaining: int, *, metric: Metric, ceiling: int | None = None, starting: int = 0) -> None:
        pass

    def decided(self, *, stage: int, number: int, name: str, seconds: float) -> None:
        pass

    def started(self, *, stage: int, number: int, name: str, slot: str, why: str = "") -> None:
        self.log(started_line(stage=stage, number=number, name=name, slot=slot, why=why))

    def finished(self, *, stage: int, number: int, name: str, value: float | None, duration: float, outcome: str) -> None:
        self.log(f"[z{stage}] trial {number}: {name} {outcome} in {duration:.1f}s")

    def resumed(self, *, stage: int, name: str, value: float, metric: Metric) -> None:
        pass
