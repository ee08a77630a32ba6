from __future__ import annotations


class OptunaDSError(Exception):
    """A problem with the user's input or environment.

    The CLI prints the message as one line and exits with status 2, never a traceback:
    every message names the file, key or option at fault.
    """

    exit_code = 2

    def __init__(self, message: str = "", *args: object) -> None:
        # A message quotes the user's keys and values: a newline or control character in one
        # would break the promised single line, so such characters are shown escaped.
        super().__init__("".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message)), *args)


class ConfigError(OptunaDSError):
    """The DeepSpeed config, its ``autotuning`` section or the script arguments are invalid."""


class ResourceError(OptunaDSError):
    """Hostfile, ``--include``/``--exclude`` or GPU discovery cannot give the experiment GPUs, or
    the node rendezvous ports."""


class PlanMismatchError(OptunaDSError):
    """The study name already holds a tuning of a different plan."""


class ScriptError(OptunaDSError):
    """An experiment failed in a way no config can fix (the script's arguments, a missing module
    or file): every other experiment would fail alike, so the tuning stops at the first one."""

    exit_code = 1


class ResultsError(OptunaDSError):
    """The results or experiments folder can no longer be written (disk full, turned read-only):
    the tuning stops, its running trial to be run again once the user has fixed it."""
