from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from collections.abc import Iterable
from typing import TypeVar

_T = TypeVar("_T")


_LARGE = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"))


def format_number(value: float, digits: int = 4) -> str:
    """A figure as people read it: ``digits`` significant digits, thousands separated, never an
    exponent (``15,970``, ``123.5``, ``0.01234``); from a million up, three digits and a prefix
    (``2.5M``, ``312T``)."""
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    for scale, prefix in _LARGE:
        if abs(value) >= scale:
            return f"{format_number(value / scale, 3)}{prefix}"
    if value == 0:
        return "0"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    if decimals <= 0:
        return f"{int(round(value, decimals)):,}"
    return f"{value:,.{decimals}f}".rstrip("0").rstrip(".")


@dataclasses.dataclass(frozen=True)
class Metric:
    """The metric a tuning optimizes: its name as the user writes it, its key in the engine's
    metrics file, and whether higher or lower is better. Every comparison of two measurements
    goes through it, so no caller carries a sign or a direction string of its own.
    """

    name: str
    key: str
    direction: str  # "maximize" or "minimize", as Optuna takes a study's direction
    unit: str = ""  # as the engine measures it

    def __post_init__(self) -> None:
        if self.direction not in ("maximize", "minimize"):
            raise ValueError(f"direction must be 'maximize' or 'minimize', got {self.direction!r}")

    @classmethod
    def named(cls, name: str) -> Metric:
        """The metric the config names (``throughput``, ``latency`` or ``flops``)."""
        return METRICS[name]

    @property
    def label(self) -> str:
        """The name with its unit: ``throughput (samples/s)``."""
        return f"{self.name} ({self.unit})" if self.unit else self.name

    def with_unit(self, value: float) -> str:
        """A measurement as people read it: ``15,970 samples/s``."""
        return f"{format_number(value)} {self.unit}" if self.unit else f"{self.name} {format_number(value)}"

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"

    def oriented(self, value: float) -> float:
        """``value`` turned so that higher is better (a latency negated)."""
        return value if self.maximize else -value

    def rate(self, value: float) -> float:
        """``value`` as a positive rate, higher is better (a latency inverted): the planner
        models its logarithm, so relative gains read alike for every metric."""
        return value if self.maximize else 1.0 / value

    def better(self, a: float, b: float) -> bool:
        """Whether measurement ``a`` is strictly better than ``b``."""
        return self.oriented(a) > self.oriented(b)

    def best(self, items: Iterable[_T], *, key: Callable[[_T], float]) -> _T | None:
        """The item whose measurement ``key`` is best (the first of equals); ``None`` if none."""
        return max(items, key=lambda item: self.oriented(key(item)), default=None)


# By the names users write in the config. DeepSpeed's own autotuner looks up "flops" although
# the engine writes "FLOPS_per_gpu".
METRICS: dict[str, Metric] = {
    "throughput": Metric(name="throughput", key="throughput", direction="maximize", unit="samples/s"),
    "latency": Metric(name="latency", key="latency", direction="minimize", unit="ms"),
    "flops": Metric(name="flops", key="FLOPS_per_gpu", direction="maximize", unit="FLOPS per GPU"),
}
