from __future__ import annotations

import io
import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from typing import TextIO

from rich.console import Console
from rich.console import Group
from rich.console import RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from optuna_ds.config import Metric


class Progress:
    """What a tuning tells the person watching it.

    On a terminal, a live block stays at the bottom: the best so far first (globally, then per
    stage), a progress bar over the planner's current estimate of the experiments with elapsed
    and remaining time, then one line per busy GPU slot; finished experiments scroll above it.
    The remaining time comes from the observed rate of finished experiments across all slots,
    so parallel slots shorten it. When the estimate changes, a line says so. Elsewhere (a log
    file, CI) plain lines. ``quiet`` prints nothing but warnings; ``verbose`` adds each command
    and the end of each failure's stderr.
    """

    def __init__(self, *, quiet: bool = False, verbose: bool = False, stream: TextIO | None = None, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream or sys.stdout
        self._quiet = quiet
        self._verbose = verbose
        self._tty = self._stream.isatty() if tty is None else tty
        self._clock = clock
        self._lock = threading.RLock()
        self._planned = 0
        self._done = 0
        self._running: dict[tuple[int, int], tuple[str, str, float]] = {}
        self._best: dict[int, tuple[float, str]] = {}
        self._metric = Metric.named("throughput")  # until the tuning says its own
        self._start = clock()
        self._first_start: float | None = None
        self._live: Live | None = None

    # -- what the tuning reports -------------------------------------------------------------

    def log(self, text: str) -> None:
        if not self._quiet:
            self._write(text)

    def warn(self, text: str) -> None:
        self._write(text)

    def detail(self, text: str) -> None:
        if self._verbose:
            self._write(text)

    def plan(self, remaining: int, *, metric: Metric) -> None:
        with self._lock:
            old, self._planned = self._planned, self._done + remaining
            self._metric = metric
        if old and self._planned != old:
            self.log(f"estimate: ~{self._planned} experiments in all (was ~{old}), from what the stages so far showed")
        self._start_live()

    def started(self, *, stage: int, number: int, name: str, slot: str) -> None:
        with self._lock:
            now = self._clock()
            self._first_start = now if self._first_start is None else self._first_start
            self._running[(stage, number)] = (name, slot, now)
        self.log(f"[z{stage}] trial {number}: running {name} on {slot}")

    def finished(self, *, stage: int, number: int, name: str, value: float | None, duration: float, outcome: str) -> None:
        with self._lock:
            self._running.pop((stage, number), None)
            self._done += 1
            self._planned = max(self._planned, self._done)
            if value is not None:
                best = self._best.get(stage)
                if best is None or self._metric.better(value, best[0]):
                    self._best[stage] = (value, name)
        self.log(f"[z{stage}] trial {number}: {name} {outcome} in {duration:.1f}s")

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    # -- rendering ----------------------------------------------------------------------------

    def remaining(self) -> float | None:
        """Seconds left: the experiments still planned over the rate at which experiments have
        finished since the first started, all slots together; ``None`` before one finished."""
        with self._lock:
            if not self._done or self._first_start is None or self._planned <= self._done:
                return None
            rate = self._done / max(self._clock() - self._first_start, 1e-9)
            return (self._planned - self._done) / rate

    def best_line(self) -> str:
        with self._lock:
            if not self._best:
                return "best: none yet"
            value, name = self._metric.best(self._best.values(), key=lambda b: b[0])
            stages = " ".join(f"z{s} {v:.4g}" for s, (v, _) in sorted(self._best.items()))
            return f"best {value:.4g} {name} | {stages}"

    def slot_lines(self) -> list[str]:
        with self._lock:
            now = self._clock()
            return [f"{slot} {_clock(now - since)} {name}" for name, slot, since in
                    sorted(self._running.values(), key=lambda r: r[1])]

    def status(self) -> str:
        """The whole live block as plain text, one line per row."""
        return "\n".join(self.render(width=1000).splitlines())

    def render(self, *, width: int) -> str:
        """The live block as a terminal ``width`` wide shows it (no colours)."""
        out = io.StringIO()
        Console(file=out, width=width, color_system=None, force_terminal=False, legacy_windows=False).print(self._renderable())
        return out.getvalue()

    def _renderable(self) -> RenderableType:
        with self._lock:
            done, planned = self._done, self._planned
            elapsed = self._clock() - self._start
        left = self.remaining()
        bar = Table.grid(padding=(0, 1), expand=True)
        bar.add_column(no_wrap=True)
        bar.add_column(ratio=1)
        bar.add_column(no_wrap=True)
        share = done / planned if planned else 0.0
        times = f"{share:4.0%} {_clock(elapsed)} elapsed" + (f", ~{_clock(left)} left" if left is not None else "")
        bar.add_row(f"{done}/~{planned}", ProgressBar(total=max(planned, 1), completed=done), times)
        lines: list[RenderableType] = [Text(self.best_line(), no_wrap=True, overflow="ellipsis"), bar]
        lines += [Text(line, no_wrap=True, overflow="ellipsis") for line in self.slot_lines()]
        return Group(*lines)

    def _start_live(self) -> None:
        if not self._tty or self._quiet or self._live is not None:
            return
        console = Console(file=self._stream, force_terminal=True)
        self._live = Live(get_renderable=self._renderable, console=console, refresh_per_second=2, transient=True,
                          redirect_stdout=False, redirect_stderr=False)
        self._live.start()

    def _write(self, text: str) -> None:
        if self._live is not None:
            self._live.console.print(Text(text), soft_wrap=True)
        else:
            print(text, file=self._stream, flush=True)


def _clock(seconds: Any) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
