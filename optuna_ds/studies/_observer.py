from __future__ import annotations

import threading
from typing import Protocol

from optuna_ds.config import Metric


class TuningObserver(Protocol):
    """What the tuning tells its watcher; ``optuna_ds.reporting.Progress`` shows it."""

    def log(self, text: str) -> None: ...

    def detail(self, text: str) -> None: ...

    def plan(self, remaining: int, *, metric: Metric) -> None: ...

    def started(self, *, stage: int, number: int, name: str, slot: str) -> None: ...

    def finished(self, *, stage: int, number: int, name: str, value: float | None, duration: float, outcome: str) -> None: ...


class PrintObserver:
    """Plain lines on stdout: the default for API users."""

    def log(self, text: str) -> None:
        print(text, flush=True)

    def detail(self, text: str) -> None:
        pass

    def plan(self, remaining: int, *, metric: Metric) -> None:
        pass

    def started(self, *, stage: int, number: int, name: str, slot: str) -> None:
        self.log(f"[z{stage}] trial {number}: running {name} on {slot}")

    def finished(self, *, stage: int, number: int, name: str, value: float | None, duration: float, outcome: str) -> None:
        self.log(f"[z{stage}] trial {number}: {name} {outcome} in {duration:.1f}s")


class LockedObserver:
    """Serialises the calls of several driver threads to one observer."""

    def __init__(self, observer: TuningObserver) -> None:
        self._observer = observer
        self._lock = threading.Lock()

    def log(self, text: str) -> None:
        with self._lock:
            self._observer.log(text)

    def detail(self, text: str) -> None:
        with self._lock:
            self._observer.detail(text)

    def plan(self, remaining: int, *, metric: Metric) -> None:
        with self._lock:
            self._observer.plan(remaining, metric=metric)

    def started(self, *, stage: int, number: int, name: str, slot: str) -> None:
        with self._lock:
            self._observer.started(stage=stage, number=number, name=name, slot=slot)

    def finished(self, *, stage: int, number: int, name: str, value: float | None, duration: float, outcome: str) -> None:
        with self._lock:
            self._observer.finished(stage=stage, number=number, name=name, value=value, duration=duration, outcome=outcome)
