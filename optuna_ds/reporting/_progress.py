from __future__ import annotations

import sys
import time
from typing import Any
from typing import TextIO


class Progress:
    """What a tuning tells the person watching it.

    On a terminal, a status bar stays at the bottom: experiments done and planned, the one
    running and its GPU slot, the best so far per stage and globally, elapsed and estimated
    remaining time; finished experiments scroll above it. Elsewhere (a log file, CI) plain
    lines. ``quiet`` prints nothing but warnings; ``verbose`` adds each command and the end of
    each failure's stderr.
    """

    def __init__(self, *, quiet: bool = False, verbose: bool = False, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self._stream = stream or sys.stdout
        self._quiet = quiet
        self._verbose = verbose
        self._tty = self._stream.isatty() if tty is None else tty
        self._planned = 0
        self._done = 0
        self._durations: list[float] = []
        self._running: dict[int, tuple[str, str, float]] = {}
        self._best: dict[int, float] = {}
        self._maximize = True
        self._start = time.monotonic()
        self._bar: Any = None

    # -- what the tuning reports -------------------------------------------------------------

    def log(self, text: str) -> None:
        if not self._quiet:
            self._write(text)

    def warn(self, text: str) -> None:
        self._write(text)

    def detail(self, text: str) -> None:
        if self._verbose:
            self._write(text)

    def plan(self, remaining: int, *, maximize: bool) -> None:
        self._planned = self._done + remaining
        self._maximize = maximize
        self._refresh()

    def started(self, *, stage: int, number: int, name: str, slot: str) -> None:
        self._running[number * 10 + stage] = (name, slot, time.monotonic())
        self.log(f"[z{stage}] trial {number}: running {name} on {slot}")

    def finished(self, *, stage: int, number: int, name: str, value: float | None, duration: float, outcome: str) -> None:
        self._running.pop(number * 10 + stage, None)
        self._done += 1
        self._planned = max(self._planned, self._done)
        self._durations.append(duration)
        if value is not None:
            best = self._best.get(stage)
            if best is None or (value > best if self._maximize else value < best):
                self._best[stage] = value
        self.log(f"[z{stage}] trial {number}: {name} {outcome} in {duration:.1f}s")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # -- rendering ----------------------------------------------------------------------------

    def status(self) -> str:
        """The status line: done/planned, running, best per stage and global, time."""
        elapsed = time.monotonic() - self._start
        parts = [f"{self._done}/~{self._planned} experiments"]
        for name, slot, since in self._running.values():
            parts.append(f"running {name} on {slot} ({time.monotonic() - since:.0f}s)")
        if self._best:
            best = max(self._best.values()) if self._maximize else min(self._best.values())
            parts.append("best " + " ".join(f"z{s}={v:.4g}" for s, v in sorted(self._best.items())) + f" global={best:.4g}")
        parts.append(f"elapsed {_clock(elapsed)}")
        if self._durations and self._planned > self._done:
            mean = sum(self._durations) / len(self._durations)
            parts.append(f"~{_clock(mean * (self._planned - self._done))} left")
        return " | ".join(parts)

    def _refresh(self) -> None:
        if not self._tty or self._quiet:
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=0, bar_format="{desc}", file=self._stream, leave=False, dynamic_ncols=True)
        self._bar.set_description_str(self.status(), refresh=True)

    def _write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=self._stream)
        else:
            print(text, file=self._stream, flush=True)
        self._refresh()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
