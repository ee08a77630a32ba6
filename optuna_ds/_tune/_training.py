"""``optuna-ds run``'s training with the optimal config, after the tuning."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence

from optuna_ds._tune._interrupts import TuningInterrupted
from optuna_ds._tune._interrupts import sigterm_raises
from optuna_ds.launcher import MARK_VAR
from optuna_ds.launcher import child_environment
from optuna_ds.launcher import deferred_signals
from optuna_ds.launcher import dies_with_this_process
from optuna_ds.launcher import end_marked
from optuna_ds.launcher import kill_process_group
from optuna_ds.launcher import new_mark
from optuna_ds.launcher import ops_environment


def run_training(command: Sequence[str]) -> int:
    """Train with the optimal config, streaming its output; return its exit status.

    Interrupted (Ctrl-C, SIGTERM or SIGHUP), it ends the training's process group and returns
    128 + the signal number. It also ends with this process, however it dies.
    """
    mark = new_mark()
    env = child_environment(**ops_environment(), **{MARK_VAR: mark})
    proc = subprocess.Popen(dies_with_this_process(command), start_new_session=True, env=env)
    try:
        with sigterm_raises():
            return proc.wait()
    except KeyboardInterrupt as e:
        with deferred_signals():
            kill_process_group(proc.pid, leader=proc)
            proc.wait()
            end_marked(mark)
        return 128 + (e.signum if isinstance(e, TuningInterrupted) else signal.SIGINT)
