"""A running launch's step times, read as its engine logs them (docs/steps.md, "Pruned runs")."""
from __future__ import annotations

import os
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence

from optuna_ds.launcher._steps import read_step_timers

# Given every step-timer line the launch logged so far (oldest first, ms by timer), a reason to
# end it now, or ``None`` to let it run on.
Judge = Callable[[Sequence[Mapping[str, float]]], "str | None"]


class RunPruned(Exception):
    """The judge ended the launch; the message is its reason."""


class LiveSteps:
    """The timer lines of the file ``path`` (a launch's stdout) as it grows: each :meth:`read`
    reads only what was written since the last, and a line counts once its newline is written."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._offset = 0
        self._partial = b""
        self._steps: list[dict[str, float]] = []

    def read(self) -> list[dict[str, float]] | None:
        """Every timer line logged so far, oldest first; ``None`` when no new one was written."""
        try:
            size = os.stat(self._path).st_size
        except OSError:
            return None
        if size <= self._offset:
            return None
        with open(self._path, "rb") as f:
            f.seek(self._offset)
            data = f.read(size - self._offset)
        self._offset += len(data)
        whole, _, self._partial = (self._partial + data).rpartition(b"\n")
        new = read_step_timers(whole.decode(errors="replace")) if whole else []
        if not new:
            return None
        self._steps.extend(new)
        return list(self._steps)
