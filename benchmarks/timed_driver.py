"""``optuna-ds`` with each launch's decision time appended to a file: `make bench-parallel`'s driver.

``python benchmarks/timed_driver.py DECISIONS ARGS...`` runs ``optuna-ds ARGS...`` and appends a
JSON line to ``DECISIONS`` per launch: the seconds from its slot becoming free to the launch, as
the tuning tells its observer (``TuningObserver.decided``).
"""
from __future__ import annotations

import json
import os
import sys

from optuna_ds.cli import main
from optuna_ds.reporting import Progress


def _appender(path: str):  # type: ignore[no-untyped-def]
    def decided(self: Progress, *, stage: int, number: int, name: str, seconds: float) -> None:
        entry = {"pid": os.getpid(), "stage": stage, "trial": number, "name": name, "seconds": round(seconds, 6)}
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    return decided


if __name__ == "__main__":
    Progress.decided = _appender(sys.argv[1])  # type: ignore[method-assign]
    main(sys.argv[2:])
