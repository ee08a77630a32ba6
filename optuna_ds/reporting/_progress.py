from __future__ import annotations

import io
import math
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.console import Group
from rich.console import RenderableType
from rich.live import Live
from rich.progress import BarColumn
from rich.progress import Progress as RichProgress
from rich.progress import ProgressColumn
from rich.progress import Task
from rich.table import Column
from rich.text import Text

from optuna_ds._text import clean_text
from optuna_ds.config import Metric
from optuna_ds.config import format_number
from optuna_ds.studies import started_line


# Rates are taken over this window: long enough to span several experiments, short enough to
# follow a tuning whose experiments grow (larger micro-batches, later stages).
_RATE_WINDOW = 3600.0
# A running experiment's share is sampled at most this often: rich keeps 1000 samples, so the
# window above holds, and a redraw twice a second does not crowd out older samples.
_SAMPLE_SECONDS = 5.0
# A running experiment past the mean duration is most of one, never a whole one: only its
# end says it is done.
_RUNNING_CAP = 0.9
# rich measures a rate from its first sample on, that sample's progress left out: the first
# start leaves this much, so the rate counts from there.
_ANCHOR = 1e-9
_BARS = " ▁▂▃▄▅▆▇█"
_SPARK_WIDTH = 24  # the busy slots line's history: this many spans of the time since the first start


def busy_slots(changes: list[tuple[float, int]], now: float, *, width: int = _SPARK_WIDTH) -> tuple[str, float, int]:
    """The busy slots over time from ``changes`` (each: when, how many busy from then on, in
    time order): a sparkline of ``width`` equal spans from the first change to ``now``, each
    its mean busy slots against the peak; the mean over the whole time, and the peak."""
    if not changes or now <= changes[0][0]:
        return "", 0.0, max((n for _, n in changes), default=0)
    start, peak = changes[0][0], max(n for _, n in changes)
    step = (now - start) / width
    area = [0.0] * width
    ends = [t for t, _ in changes[1:]] + [now]
    for (t0, n), t1 in zip(changes, ends):
        for i in range(width):
            lo, hi = start + i * step, start + (i + 1) * step
            area[i] += n * max(0.0, min(t1, hi) - max(t0, lo))
    line = "".join(_BARS[round(a / step / peak * (len(_BARS) - 1))] if peak else _BARS[0] for a in area)
    return line, sum(area) / (now - start), peak


class _CountColumn(ProgressColumn):
    """``7/~20 (2 running)``: experiments finished of the estimate, ``~`` until the planner
    stopped, and those under way."""

    def __init__(self) -> None:
        super().__init__(table_column=Column(no_wrap=True))

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("starting")
        approx = "" if task.fields["stopped"] else "~"
        running = f" ({task.fields['running']} running)" if task.fields["running"] else ""
        return Text(f"{task.fields['done']}/{approx}{int(task.total)}{running}", no_wrap=True)


class _PercentColumn(ProgressColumn):
    """Rounded down, so 100% means every experiment ended and the planner stopped."""

    def __init__(self) -> None:
        super().__init__(table_column=Column(no_wrap=True))

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("")
        share = 1.0 if task.finished else min(task.completed / task.total if task.total else 0.0, 0.99)
        return Text(f"{int(share * 100):3d}%")


class _TimesColumn(ProgressColumn):
    """Elapsed, then rich's estimate of the time left from the task's rate (``task.time_remaining``)."""

    def __init__(self) -> None:
        super().__init__(table_column=Column(no_wrap=True))

    def render(self, task: Task) -> Text:
        text = f"{_clock(task.elapsed or 0)} elapsed"
        left = task.time_remaining
        if left is not None and not task.finished:
            text += f", ~{_clock(left)} left"
        return Text(text, no_wrap=True)


class Progress:
    """What a tuning tells the person watching it.

    On a terminal, a live block stays at the bottom: the fastest single run so far first (globally, then per
    stage), a ``rich.progress`` bar with elapsed and remaining time, this process's busy slots over
    time (:func:`busy_slots`), then one line per busy GPU slot; finished experiments scroll above it. Elsewhere (a log file, CI) plain lines.
    ``quiet`` prints none of the progress (the summary follows it); ``verbose`` adds each command and the end of each
    failure's stderr.

    The bar's total is the experiments finished, those running and the planner's estimate of
    those still to start; its progress counts a running experiment by its share of the mean
    duration so far (half of it: half an experiment). rich's rate over that progress, all slots
    together, gives the time left, which so stays put while one long experiment runs. The total
    is ``~`` and the bar short of 100% until the planner stopped and nothing runs. When the
    planner's estimate changes, a line says so.
    """

    def __init__(self, *, quiet: bool = False, verbose: bool = False, stream: TextIO | None = None, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream or sys.stdout
        self._quiet = quiet
        self._verbose = verbose
        self._tty = self._stream.isatty() if tty is None else tty
        self._clock = clock
        self._lock = threading.RLock()
        self._to_start: int | None = None  # the planner's estimate of the experiments not yet started
        self._said: int | None = None  # the total the last estimate line gave
        self._starting = 0  # proposed, not yet started
        self._earlier = 0  # experiments an earlier run of the tuning measured: in the estimate's words, not the bar
        self._ceiling: int | None = None  # the most experiments a tuning launches
        self._done = 0
        self._durations = 0.0
        self._running: dict[tuple[int, int], tuple[str, str, float]] = {}
        self._busy: list[tuple[float, int]] = []  # this process's busy slots from each start or end on
        self._best: dict[int, tuple[float, str]] = {}
        self._metric = Metric.named("throughput")  # until the tuning says its own
        self._sampled = -math.inf
        self._bar = RichProgress(
            _CountColumn(), BarColumn(bar_width=None, table_column=Column(ratio=1)), _PercentColumn(), _TimesColumn(),
            get_time=clock, speed_estimate_period=_RATE_WINDOW, auto_refresh=False, expand=True,
            console=Console(file=io.StringIO()),
        )
        self._task = self._bar.add_task("experiments", total=None, done=0, running=0, stopped=False)
        self._live: Live | None = None

    # -- what the tuning reports -------------------------------------------------------------

    def log(self, text: str) -> None:
        if not self._quiet:
            self._write(text)

    def detail(self, text: str) -> None:
        if self._verbose:
            self._write(text)

    def plan(self, remaining: int, *, metric: Metric, ceiling: int | None = None, starting: int = 0) -> None:
        """The planner's estimate of the experiments still to start (0 once it stopped), beside
        the ``starting`` ones it just proposed, which count until they start."""
        with self._lock:
            self._to_start = remaining
            self._starting = starting
            self._metric = metric
            self._ceiling = ceiling or self._ceiling
            self._update(sample=True)
        self._tell_estimate(down=True)
        self._start_live()

    def _tell_estimate(self, *, down: bool = False) -> None:
        """Say the estimate each time it rises (an experiment finished and the planner still
        expects as many more), and when the planner lowers it (``down``): a total that only
        ever grew in silence read as a promise broken."""
        with self._lock:
            total, said, stopped = self._total(), self._said, self._to_start == 0
            if total is None or total == said or (said is not None and total < said and not down) or stopped:
                return
            if said is None and not (self._running or self._done):
                return  # first said with the first experiment, which it counts
            self._said = total
            earlier = self._earlier
        if said is not None:
            self.log(f"estimate: ~{total + earlier} experiments in all (was ~{said + earlier}), from what the results so far showed")
        elif self._ceiling:
            before = f", {earlier} of them measured before this run" if earlier else ""
            self.log(f"estimate: ~{total + earlier} experiments in all{before}, at most {self._ceiling}: a guess the planner "
                     f"revises as results come in (it stops once no experiment is expected to pay), each revision said")

    def decided(self, *, stage: int, number: int, name: str, seconds: float) -> None:
        pass

    def started(self, *, stage: int, number: int, name: str, slot: str, why: str = "") -> None:
        with self._lock:
            self._running[(stage, number)] = (name, slot, self._clock())
            self._busy.append((self._clock(), len(self._running)))
            self._starting = max(0, self._starting - 1)
            self._update(sample=True)
        self.log(started_line(stage=stage, number=number, name=name, slot=slot, why=why))
        self._tell_estimate()

    def resumed(self, *, stage: int, name: str, value: float, metric: Metric) -> None:
        with self._lock:
            self._metric = metric
            self._earlier += 1
            self._keep_best(stage, name, value)

    def _keep_best(self, stage: int, name: str, value: float) -> None:
        best = self._best.get(stage)
        if best is None or self._metric.better(value, best[0]):
            self._best[stage] = (value, name)

    def finished(self, *, stage: int, number: int, name: str, value: float | None, duration: float, outcome: str) -> None:
        with self._lock:
            if self._running.pop((stage, number), None) is not None:
                self._busy.append((self._clock(), len(self._running)))
            self._done += 1
            self._durations += duration
            if value is not None:
                self._keep_best(stage, name, value)
                outcome = f"{self._metric.name} {self._with_unit(value)}"
            self._update(sample=True)
        self.log(f"[z{stage}] trial {number}: {name} {outcome} in {duration:.1f}s")
        self._tell_estimate()

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    # -- the estimate -------------------------------------------------------------------------

    def _total(self) -> int | None:
        if self._to_start is None:
            return None
        return self._done + len(self._running) + self._starting + self._to_start

    def _under_way(self, now: float) -> float:
        """The running experiments as a number of experiments: each its time so far over the
        mean duration of those that finished; none before one finished."""
        if not self._done or not self._durations:
            return 0.0
        mean = self._durations / self._done
        return sum(min((now - since) / mean, _RUNNING_CAP) for _, _, since in self._running.values())

    def _update(self, *, sample: bool) -> None:
        """Bring the rich task up to date; ``sample`` records the progress for the rate (events
        always; a redraw at most every ``_SAMPLE_SECONDS``)."""
        now = self._clock()
        task = self._bar.tasks[0]
        total = self._total()
        # Never backwards (a rate counts only progress), never a finished experiment's worth
        # for a running one.
        ceiling = self._done + _RUNNING_CAP * len(self._running)
        completed = min(max(task.completed, self._done + self._under_way(now), _ANCHOR if self._running else 0.0), ceiling)
        if not (sample or now - self._sampled >= _SAMPLE_SECONDS):
            completed = task.completed
        if completed > task.completed:
            self._sampled = now
        # Set directly: update(total=...) starts the task afresh, dropping the rate's samples,
        # and this total is an estimate that moves with each experiment.
        task.total = float(total) if total is not None else None
        if task.total is None or completed < task.total:
            task.finished_time = None  # rich keeps a bar finished once it reached its total, even as the estimate rises
        self._bar.update(self._task, completed=completed, done=self._done, running=len(self._running),
                         stopped=self._to_start == 0)

    def remaining(self) -> float | None:
        """Seconds left, as the bar shows them; ``None`` while no rate is known."""
        with self._lock:
            self._update(sample=False)
            task = self._bar.tasks[0]
            return None if task.finished else task.time_remaining

    # -- rendering ----------------------------------------------------------------------------

    def _with_unit(self, value: float) -> str:
        unit = self._metric.unit
        return f"{format_number(value)} {unit}" if unit else format_number(value)

    def best_line(self) -> str:
        with self._lock:
            best = self._metric.best(self._best.values(), key=lambda b: b[0])
            if best is None:
                return "fastest run: none yet"
            value, name = best
            stages = " ".join(f"z{s} {format_number(v)}" for s, (v, _) in sorted(self._best.items()))
            return f"fastest run {self._with_unit(value)} {name} | {stages}"

    def busy_line(self) -> str:
        """This process's busy slots over time: now, their mean and peak since the first start,
        and a sparkline of them (width shows: several at once)."""
        with self._lock:
            line, mean, peak = busy_slots(self._busy, self._clock())
            if not self._busy:
                return "busy slots: none yet"
            return f"busy slots {len(self._running)} now, {mean:.1f} on average, {peak} at most {line}".rstrip()

    def slot_lines(self) -> list[str]:
        with self._lock:
            now = self._clock()
            return [f"{slot} {_clock(now - since)} {name}" for name, slot, since in
                    sorted(self._running.values(), key=lambda r: r[1])]

    def status(self) -> str:
        """The whole live block as plain text, one line per row."""
        return "\n".join(line.rstrip() for line in self.render(width=1000).splitlines())

    def render(self, *, width: int) -> str:
        """The live block as a terminal ``width`` wide shows it (no colours)."""
        out = io.StringIO()
        Console(file=out, width=width, color_system=None, force_terminal=False, legacy_windows=False).print(self._renderable())
        return out.getvalue()

    def _renderable(self) -> RenderableType:
        with self._lock:
            self._update(sample=False)
            lines: list[RenderableType] = [Text(self.best_line(), no_wrap=True, overflow="ellipsis"),
                                           self._bar.make_tasks_table(self._bar.tasks),
                                           Text(self.busy_line(), no_wrap=True, overflow="ellipsis")]
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
        text = clean_text(text)
        if self._live is not None:
            self._live.console.print(Text(text), soft_wrap=True)
        else:
            print(text, file=self._stream, flush=True)


def _clock(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"
