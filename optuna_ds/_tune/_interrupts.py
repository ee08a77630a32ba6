"""A tuning stopped part way: SIGTERM and SIGHUP unwind it as Ctrl-C does, and the user is told
how to resume it."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator


# What a user whose database failed mid-tuning is told.
RESUME = "the experiments that finished are kept in it: run the same command again to resume"


class TuningInterrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the tuning is, so it unwinds like Ctrl-C: experiments are
    ended by process group and their trials marked ``interrupted``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# The terminal's descriptors, silenced once it hangs up (see _on_signal).
_terminal_fds: tuple[int, ...] = ()


def _on_signal(signum: int, _frame: object) -> None:
    if signum == signal.SIGHUP:
        # The terminal is gone (ssh dropped, window closed): writing to it fails (EIO), and the
        # summary and the interrupted trials must not die of a line nobody can read.
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in _terminal_fds:
            os.dup2(devnull, fd)
        os.close(devnull)
    raise TuningInterrupted(signum)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM and SIGHUP end the tuning as Ctrl-C does, not the process where it stands. A
    SIGHUP ignored when we started (``nohup``) stays ignored: the user asked to outlive the terminal."""
    global _terminal_fds
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signum == signal.SIGHUP and signal.getsignal(signum) is signal.SIG_IGN:
            continue
        previous[signum] = signal.signal(signum, _on_signal)
    _terminal_fds = tuple(fd for fd in (1, 2) if _isatty(fd))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def resume_advice(overwrite: bool | None, *, configured: bool) -> str:
    """How to resume: the same command, unless it would start afresh and delete what finished."""
    if overwrite:
        return "rerun the same command without --overwrite to resume"
    if overwrite is None and configured:
        return "rerun the same command with --no-overwrite to resume (autotuning.overwrite would start afresh)"
    return "rerun the same command to resume"
