"""Every job of the benchmarks by name: the hand-made surfaces and each generator's jobs.

The generators import the shared types from benchmarks/surfaces.py; this module, above them all,
reads a job's name and asks the generator that made it (imported then: a simulated launch loads
its own generator alone).
"""
from __future__ import annotations

from surfaces import SURFACES
from surfaces import Surface


def by_name(name: str) -> Surface:
    """A hand-made surface, ``random-<seed>``: the generated job of that seed, ``phys-...``:
    a job of the second generator (benchmarks/physical_jobs.py), ``blind-<seed>``: one of the
    third (benchmarks/blind_jobs.py), ``blind4-<seed>``: one of the fourth, held out
    (benchmarks/blind4_jobs.py), or ``replay-...``: a job of recorded real runs
    (benchmarks/replays.py)."""
    for s in SURFACES:
        if s.name == name:
            return s
    if name.startswith("replay-"):
        import replays

        return replays.by_name(name)  # type: ignore[return-value]
    if name.startswith(("phys-", "zpp-")):
        import physical_jobs

        return physical_jobs.by_name(name)  # type: ignore[return-value]
    if name.startswith("blind-"):
        import blind_jobs

        return blind_jobs.by_name(name)  # type: ignore[return-value]
    if name.startswith("blind4-"):
        import blind4_jobs

        return blind4_jobs.by_name(name)  # type: ignore[return-value]
    if name.startswith("random-") and name[len("random-"):].isdigit():
        import jobs

        return jobs.random_job(int(name[len("random-"):]))
    raise KeyError(name)
