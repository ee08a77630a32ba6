"""The speed-up of the optimum over the user's config: its factor, when one may be given, and
its uncertainty."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from optuna_ds.studies import TuningResult
from optuna_ds.studies import scatters


def speedup(result: TuningResult) -> float | None:
    """How much faster the optimum is than the user's own config, each the mean of its runs,
    where :func:`no_speedup` finds nothing against it; else ``None``."""
    base, best = result.baseline, result.best
    if no_speedup(result) or base is None or base.value is None or best is None:
        return None
    return best.mean / base.value if result.metric.maximize else base.value / best.mean


ALIKE_RUNS = 2  # runs of each config a speed-up factor rests on, at least


def no_speedup(result: TuningResult) -> str:
    """Why no speed-up factor is given, or ``""``: a factor compares the final choice with the
    user's config measured alike, at least :data:`ALIKE_RUNS` runs of each, interleaved in time
    (so that a change in the machine between them does not read as a speed-up)."""
    base, best = result.baseline, result.best
    if best is None:
        return "no experiment ran successfully"
    if base is None or base.value is None or not best.value or not base.value:
        return "your config was not measured"
    if not best.chosen:
        return "the planner has not chosen yet"
    if base.name == best.name:
        return ""
    mine, its = len(base.values), len(best.runs)
    if min(mine, its) < ALIKE_RUNS:
        return (
            f"your config ran {_times(mine)} and the optimum {_times(its)}; "
            f"a factor needs {ALIKE_RUNS} runs of each at least, measured alike"
        )
    if not _interleaved(base.starts, best.run_starts):
        return (
            "the runs of your config and of the optimum were not interleaved (all of one's came "
            "before the other's), so a change in the machine between them would read as a speed-up"
        )
    return ""


def _times(n: int) -> str:
    return {0: "no time", 1: "once", 2: "twice"}.get(n, f"{n} times")


def _interleaved(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two configs' runs (their start times) interleave: neither's all before the
    other's."""
    return bool(a) and bool(b) and min(a) < max(b) and min(b) < max(a)


@dataclasses.dataclass(frozen=True)
class SpeedupUncertainty:
    """Twice the deviation of the speed-up's log, and whether a config's own runs, scattering
    more than the noise explains, set it in place of the noise."""

    deviation: float
    scattered: bool


def _run_deviation(runs: Sequence[float], noise: float) -> tuple[float, bool]:
    """The deviation of one run's log: the measured noise, or the runs' own where they scatter
    beyond :data:`~optuna_ds.studies.SCATTER_WARNING` times it (a run taken under load, or a
    straggler the noise leaves out, is still in the mean the headline divides)."""
    if all(r > 0 for r in runs) and scatters(runs, noise):
        return max(noise, statistics.stdev(math.log(r) for r in runs)), True
    return noise, False


def speedup_uncertainty(result: TuningResult) -> SpeedupUncertainty | None:
    """Twice the deviation of :func:`speedup` (of its log), from the runs each mean rests on and
    the measured run-to-run noise, or a config's own scatter where the noise does not explain
    it; ``None`` where the noise was not measured."""
    base, best, noise = result.baseline, result.best, result.noise.value
    if noise is None or base is None or best is None:
        return None
    mine, mine_scattered = _run_deviation(base.values, noise)
    its, its_scattered = _run_deviation(best.runs, noise)
    deviation = 2 * (mine**2 / max(1, base.runs) + its**2 / len(best.runs)) ** 0.5
    return SpeedupUncertainty(deviation=deviation, scattered=mine_scattered or its_scattered)
