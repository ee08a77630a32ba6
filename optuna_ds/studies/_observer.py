from __future__ import annotations

from typing import Protocol

from optuna_ds._text import clean_text
from optuna_ds.config import Metric


class TuningObserver(Protocol):
    """What the tuning tells its watcher; ``optuna_ds.reporting.Progress`` shows it. The slots'
    driver threads call it at once: an observer that keeps state serialises its calls."""

    def log(self, text: str) -> None: ...

    def detail(self, text: str) -> None: ...

    def plan(self, remaining: int, *, metric: Metric) -> None: ...

    def decided(self, *, stage: int, number: int, name: str, seconds: float) -> None:
        """Trial ``number`` is about to launch ``name``, ``seconds`` after its slot became free:
        the decision's cost (the planner's or the knob search's, and the claim), which
        `make bench-parallel` reports."""

    def started(self, *, stage: int, number: int, name: str, slot: str) -> None: ...

    def finished(self, *, stage: int, number: int, name: str, value: float | None, duration: float, outcome: str) -> None: ...

    def resumed(self, *, stage: int, name: str, value: float, metric: Metric) -> None:
        """An experiment an earlier run of the tuning measured: a resumed tuning's best so far
        starts from the results it already has."""


class PrintObserver:
    """Plain lines on stdout: the default for API users."""

    def log(self, text: str) -> None:
        print(clean_text(text), flush=True)

    def detail(self, text: str) -> None:
        pass

    def plan(self, remaining: int, *, metric: Metric) -> None:
        pass

    def decided(self, *, stage: int, number: int, name: str, seconds: float) -> None:
        pass

    def started(self, *, stage: int, number: int, name: str, slot: str) -> None:
        self.log(f"[z{stage}] trial {number}: running {name} on {slot}")

    def finished(self, *, stage: int, number: int, name: str, value: float | None, duration: float, outcome: str) -> None:
        self.log(f"[z{stage}] trial {number}: {name} {outcome} in {duration:.1f}s")

    def resumed(self, *, stage: int, name: str, value: float, metric: Metric) -> None:
        pass
