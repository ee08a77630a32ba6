"""What a run measured step by step, besides its figure: the engine's timer lines.

In autotuning mode DeepSpeed's engine logs its global timers on rank 0 at every optimizer step
(``time (ms) | fwd: … | bwd: … | bwd_inner: … | bwd_allreduce: … | step: …``), resets them, and
at step ``end_profile_step + 1`` writes ``metrics.json`` from that one step's timers and exits.
The run's figure stays the engine's (one figure per run, the one its folder holds): a median
over the profiled steps measured alike between runs; unless its exit step is far off the steps
before it (:attr:`StepMeasurement.exit_off`, docs/steps.md). Runs of one config scatter by what
each
launch meets (its placement, clocks, neighbours), which all its steps share: on the recorded
H100 runs (benchmarks/replays) steps scatter 1.5% within a run and runs 4.7%, the median of a
run's steps 5.3% and its last step 4.8% between runs. So the steps are kept for what they do
show: where a step's time goes (forward, backward and its gradient all-reduce, the optimizer
step) and how steady the run was; the run-to-run noise is measured from launches.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import re
import statistics
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from optuna_ds.config import Metric
from optuna_ds.launcher._classify import BadMetrics
from optuna_ds.launcher._classify import read_metrics
from optuna_ds.launcher._classify import read_tail
from optuna_ds.launcher._paths import ExperimentFiles

_LINE = re.compile(r"time \(ms\)((?: \| [A-Za-z_]+: -?\d+(?:\.\d+)?)+)")
_FIELD = re.compile(r"(?<![A-Za-z_])([A-Za-z_]+): (-?\d+(?:\.\d+)?)")
_STEP_TIMERS = ("fwd", "bwd", "step")  # DeepSpeed's own step time (its latency) sums these
# The exit step in metrics.json against the last logged step: beyond this ratio either way, the
# two are not in the units this module takes them in (DeepSpeed's metrics file in microseconds,
# its lines in milliseconds), and the exit step is not put beside the lines.
_UNIT_SANITY = 20.0
# How far off the median of its window the exit step may be before DeepSpeed's one-step figure
# is not taken (docs/steps.md).
_EXIT_OFF = 2.0
# The fall across a profiled window that marks a run still warming up: several times the 1.5% by
# which the steps of a settled run scatter (docs/steps.md).
_FALLING = 0.10


def read_step_timers(text: str) -> list[dict[str, float]]:
    """Every global-step timer line rank 0 logged, oldest first, each its timers in ms."""
    steps = []
    for line in text.splitlines():
        match = _LINE.search(line)
        if match:
            timers = {k: float(v) for k, v in _FIELD.findall(match.group(1))}
            if all(k in timers for k in _STEP_TIMERS):
                steps.append(timers)
    return steps


def step_time_ms(timers: Mapping[str, float]) -> float:
    """One logged step's time (ms), as DeepSpeed sums its latency."""
    return sum(timers[k] for k in _STEP_TIMERS)


@dataclasses.dataclass(frozen=True)
class StepMeasurement:
    """A run's figure (the engine's) and the profiled steps it logged beside it."""

    value: float  # the engine's, in the metric's units
    step_times_ms: tuple[float, ...] = ()  # each profiled step, the exit step (the figure's) last; empty: none logged
    timers_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)  # each timer's median over the logged profiled steps
    fastest_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)  # each timer's minimum over them

    def figures(self, metric: Metric, *, first_step: int) -> list[tuple[int, float]]:
        """Each logged step's figure in the metric's units, by its global step (the first
        profiled one ``first_step``, the exit step last): the engine's figure scaled by the
        step's time, as the engine computes it from the exit step's."""
        if not self.step_times_ms:
            return []
        exit_ms = self.step_times_ms[-1]
        return [(first_step + k, self.value * (exit_ms / ms if metric.maximize else ms / exit_ms))
                for k, ms in enumerate(self.step_times_ms)]

    @property
    def exit_off(self) -> bool:
        """Whether the exit step, the one DeepSpeed's figure is made of, took less than half or
        more than twice the median of the profiled steps before it: one step of a loaded or
        noisy machine, not the run's speed."""
        if len(self.step_times_ms) < 3:
            return False
        median = statistics.median(self.step_times_ms[:-1])
        return not median / _EXIT_OFF <= self.step_times_ms[-1] <= median * _EXIT_OFF

    def figure(self, metric: Metric) -> float:
        """The run's figure: the engine's, unless its exit step is off its window
        (:attr:`exit_off`); then the median of every logged step's figure (:meth:`figures`)."""
        if not self.exit_off:
            return self.value
        return statistics.median(f for _, f in self.figures(metric, first_step=0))

    def to_attrs(self) -> dict[str, Any]:
        return {"step_times_ms": [round(t, 3) for t in self.step_times_ms],
                "timers_ms": {k: round(v, 3) for k, v in self.timers_ms.items()},
                "fastest_ms": {k: round(v, 3) for k, v in self.fastest_ms.items()}} if self.step_times_ms else {}


def measure_steps(*, metric: Metric, metrics: Mapping[str, Any], logged: Sequence[Mapping[str, float]],
                  profiled: int) -> StepMeasurement:
    """The run's figure, the engine's, with the last ``profiled`` logged steps and the exit
    step, and each timer's median and minimum over the logged ones; no steps where the lines are missing
    (a script that silences stdout, another engine) or do not agree with the figure in units."""
    value = float(metrics[metric.key])
    latency = metrics.get("latency")
    window = list(logged[-profiled:]) if profiled > 0 else []
    if not window or len(window) < profiled or not isinstance(latency, (int, float)) or not math.isfinite(latency) or latency <= 0:
        return StepMeasurement(value=value)
    exit_ms = float(latency) / 1000.0
    times = [step_time_ms(step) for step in window]
    if min(times) <= 0 or not 1 / _UNIT_SANITY <= exit_ms / times[-1] <= _UNIT_SANITY:
        return StepMeasurement(value=value)
    keys = [k for k in window[0] if all(k in step for step in window)]
    return StepMeasurement(value=value, step_times_ms=(*times, exit_ms),
                           timers_ms={k: statistics.median(step[k] for step in window) for k in keys},
                           fastest_ms={k: min(step[k] for step in window) for k in keys})


def profiled_steps(ds_config: Mapping[str, Any]) -> int:
    """How many steps an experiment's config profiles (``start_profile_step`` to
    ``end_profile_step``, DeepSpeed's defaults 3 and 5), the exit step not counted."""
    section = ds_config.get("autotuning")
    section = section if isinstance(section, Mapping) else {}
    start, end = section.get("start_profile_step", 3), section.get("end_profile_step", 5)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
        return 0
    return max(0, end - start + 1)


def still_falling(step_times_ms: Sequence[float]) -> float | None:
    """The share by which a run's step times still fell across its profiled window (the exit
    step, the figure's, included): its warm-up not over, its figure not its speed; ``None``
    where they hold (or rise, or fewer than four steps were logged: DeepSpeed's default window
    of three and its exit step; three steps fall in order by chance once in six).

    The steps trend when their times fall by at least ``_FALLING`` over the window (the
    Theil-Sen slope, robust to one slow step) and at most one pair in ten runs against it."""
    times = [float(t) for t in step_times_ms]
    n = len(times)
    if n < 4 or min(times) <= 0:
        return None
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    if sum(times[j] >= times[i] for i, j in pairs) > len(pairs) // 10:
        return None
    slope = statistics.median((times[j] - times[i]) / (j - i) for i, j in pairs)
    fell = -slope * (n - 1) / statistics.median(times)
    return fell if fell >= _FALLING else None


def profile_window(ds_config: Mapping[str, Any]) -> tuple[int, int]:
    """The steps an experiment's config profiles, ``(start_profile_step, end_profile_step)``."""
    section = ds_config.get("autotuning")
    section = section if isinstance(section, Mapping) else {}
    return int(section.get("start_profile_step", 3)), int(section.get("end_profile_step", 5))


def later_window(ds_config: Mapping[str, Any]) -> dict[str, Any]:
    """``ds_config`` with its profiled window moved past every step its launch ran (the exit
    step included): the same number of steps, measured once the first launch's are over."""
    start, end = profile_window(ds_config)
    moved = copy.deepcopy(dict(ds_config))
    moved["autotuning"] = {**moved.get("autotuning", {}), "start_profile_step": start + end + 1,
                           "end_profile_step": end + end + 1}
    return moved


def read_finished(result_dir: str, *, metric: Metric, ds_config: Mapping[str, Any]) -> tuple[dict[str, Any], StepMeasurement] | None:
    """What a run nobody saw end left in its folder (its tuner died, or was interrupted as it
    ended): its metrics file, whole, with the steps its output logged; ``None`` where it wrote
    no whole metrics file. Whose launch the file is, the caller proves."""
    files = ExperimentFiles(result_dir)
    try:
        metrics = read_metrics(files.metrics, metric.key)
    except BadMetrics:
        return None
    if metrics is None:
        return None
    return metrics, measure_steps(metric=metric, metrics=metrics, logged=read_step_timers(read_tail(files.stdout)),
                                  profiled=profiled_steps(ds_config))
