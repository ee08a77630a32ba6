"""Launched processes end with the tuner that launched them.

An experiment runs in a session of its own (so that it is ended by its process group, and a
Ctrl-C on the terminal reaches only the tuner); the tuner ends it on every way out it sees. One
it cannot see, a SIGKILL, would leave the experiment running with no timeout and its GPUs
leased, for hours. So each launcher asks the kernel for SIGTERM when its parent dies
(``PR_SET_PDEATHSIG``), which DeepSpeed's launcher answers by ending its ranks.

The request is made in the child between fork and exec, by a tiny exec shim rather than a
``preexec_fn`` (not safe in a process with threads: the slots are threads). The kernel sends the
signal when the *thread* that forked the child exits: a slot's thread outlives its experiment,
so only the process's death fires it.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence

_PR_SET_PDEATHSIG = 1
# argv: the parent's pid, then the command. A parent already gone (it died before prctl) ends it.
_SHIM = (
    "import ctypes, os, signal, sys\n"
    f"ctypes.CDLL(None, use_errno=True).prctl({_PR_SET_PDEATHSIG}, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(128 + signal.SIGTERM)\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as e:\n"
    "    print(f'optuna-ds: cannot run {sys.argv[2]}: {e.strerror or e}', file=sys.stderr)\n"
    "    os._exit(127)\n"
)


def dies_with_this_process(command: Sequence[str]) -> list[str]:
    """``command`` run so that it gets SIGTERM when this process dies (the pid and the
    process group stay the command's own: the shim execs it)."""
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-I", "-S", "-c", _SHIM, str(os.getpid()), *command]
