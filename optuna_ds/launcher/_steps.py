"""What a run measured step by step: the engine's timer lines, and the run's figure over its
profiled steps.

In autotuning mode DeepSpeed's engine logs its global timers on rank 0 at every optimizer step
(``time (ms) | fwd: … | bwd: … | bwd_inner: … | bwd_allreduce: … | step: …``), resets them, and
at step ``end_profile_step + 1`` writes ``metrics.json`` from that one step's timers and exits.
Its figure is one step, however many steps the config says it profiles; the lines give every
profiled step, so the figure here is their median with the exit step's: one straggler step (a
collection, a neighbour's burst) moves it no more than the other steps let it.
"""
from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from optuna_ds.config import Metric

_LINE = re.compile(r"time \(ms\)((?: \| [A-Za-z_]+: -?\d+(?:\.\d+)?)+)")
_FIELD = re.compile(r"([A-Za-z_]+): (-?\d+(?:\.\d+)?)")
_STEP_TIMERS = ("fwd", "bwd", "step")  # DeepSpeed's own step time (its latency) sums these
# The exit step in metrics.json against the last logged step: beyond this ratio either way, the
# two are not in the units this module takes them in (DeepSpeed's metrics file in microseconds,
# its lines in milliseconds), and the engine's own figure stands.
_UNIT_SANITY = 20.0
# The lines print each timer to 0.01 ms, three to a step: a step time read from them is off by
# up to 0.015 ms. They make the figure only where that is at most 1% of a step (steps of 1.5 ms
# and more); a tiny model's sub-millisecond steps keep the engine's own figure, to the microsecond.
_LINE_RESOLUTION_MS = 0.015
_ROUNDING = 0.01


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


@dataclasses.dataclass(frozen=True)
class StepMeasurement:
    """A run's figure over its profiled steps, and what it was made of."""

    value: float  # in the metric's units, as the engine's own figure is
    step_times_ms: tuple[float, ...] = ()  # each profiled step, the exit step last; empty: the engine's one step
    timers_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)  # each timer's median over the logged profiled steps

    def to_attrs(self) -> dict[str, Any]:
        return {"step_times_ms": [round(t, 3) for t in self.step_times_ms],
                "timers_ms": {k: round(v, 3) for k, v in self.timers_ms.items()}} if self.step_times_ms else {}


def measure_steps(*, metric: Metric, metrics: Mapping[str, Any], logged: Sequence[Mapping[str, float]],
                  profiled: int) -> StepMeasurement:
    """The run's figure: the engine's, scaled by its exit step's time over the median time of
    the last ``profiled`` logged steps and the exit step (every metric is a rate of steps or a
    step's time). The engine's own figure where the lines are missing (a script that silences
    stdout, another engine), do not agree with it in units, or are too coarse for the steps."""
    value = float(metrics[metric.key])
    latency = metrics.get("latency")
    window = list(logged[-profiled:]) if profiled > 0 else []
    if not window or len(window) < profiled or not isinstance(latency, (int, float)) or not math.isfinite(latency) or latency <= 0:
        return StepMeasurement(value=value)
    exit_ms = float(latency) / 1000.0
    times = [sum(step[k] for k in _STEP_TIMERS) for step in window]
    if min(times) <= 0 or not 1 / _UNIT_SANITY <= exit_ms / times[-1] <= _UNIT_SANITY \
            or statistics.median(times) * _ROUNDING < _LINE_RESOLUTION_MS:
        return StepMeasurement(value=value)
    times.append(exit_ms)
    median = statistics.median(times)
    scaled = value * (exit_ms / median if metric.maximize else median / exit_ms)
    keys = [k for k in window[0] if all(k in step for step in window)]
    return StepMeasurement(value=scaled, step_times_ms=tuple(times),
                           timers_ms={k: statistics.median(step[k] for step in window) for k in keys})


def profiled_steps(ds_config: Mapping[str, Any]) -> int:
    """How many steps an experiment's config profiles (``start_profile_step`` to
    ``end_profile_step``, DeepSpeed's defaults 3 and 5), the exit step not counted."""
    section = ds_config.get("autotuning")
    section = section if isinstance(section, Mapping) else {}
    start, end = section.get("start_profile_step", 3), section.get("end_profile_step", 5)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
        return 0
    return max(0, end - start + 1)
