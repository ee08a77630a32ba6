from __future__ import annotations


class OptunaDSError(Exception):
    """A problem with the user's input or environment.

    The CLI prints the message as one line and exits with status 2, never a traceback:
    every message names the file, key or option at fault.
    """

    exit_code = 2


class ConfigError(OptunaDSError):
    """The DeepSpeed config, its ``autotuning`` section or the script arguments are invalid."""


class ResourceError(OptunaDSError):
    """Hostfile, ``--include``/``--exclude`` or GPU discovery cannot give the experiment GPUs."""


class PlanMismatchError(OptunaDSError):
    """The study name already holds a tuning of a different plan."""
