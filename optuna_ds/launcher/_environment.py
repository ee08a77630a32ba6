from __future__ import annotations

import os

# Our variables that may carry the storage URL, its password included. Experiments, their ranks
# and `run`'s training are the user's scripts: one that prints its environment would put the
# password in its stdout.log, and they have no use for the tuning's database.
STORAGE_VARS = ("OPTUNA_STORAGE",)


def child_environment(**extra: str) -> dict[str, str]:
    """The environment of a process we start for the user's script: ours, without the storage
    URL, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in STORAGE_VARS}
    env.update(extra)
    return env
