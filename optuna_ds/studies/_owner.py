from __future__ import annotations

import os
import socket
from typing import Any

import optuna
from optuna.trial import TrialState

from optuna_ds.launcher import FailureReason
from optuna_ds.launcher import kill_process_group
from optuna_ds.studies._results import LOST_ATTR
from optuna_ds.studies._results import PROCESS_ATTR

OWNER_ATTR = "worker"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_identity(pid: int) -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": pid, "started": _start_time(pid)}


def this_process() -> dict[str, Any]:
    return process_identity(os.getpid())


def _dead(owner: dict[str, Any]) -> bool:
    """Whether the process that ran a trial is known to be gone. Only a process on this host
    can be checked; elsewhere the storage's heartbeat decides."""
    if owner.get("host") != socket.gethostname():
        return False
    pid = int(owner.get("pid", 0))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    started = owner.get("started")
    return started is not None and _start_time(pid) not in (None, started)


def fail_orphaned_trials(study: optuna.Study) -> list[int]:
    """Fail the running trials whose process died on this host (killed with SIGKILL, say), so
    that their experiments run again at once instead of after the heartbeat's grace period,
    and end the experiment such a process left running, by its process group id."""
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.user_attrs.get(OWNER_ATTR)
        if isinstance(owner, dict) and _dead(owner):
            try:
                for key, value in {"reason": FailureReason.INTERRUPTED.value, "detail": "its process died", LOST_ATTR: True}.items():
                    study._storage.set_trial_user_attr(t._trial_id, key, value)
                study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            except RuntimeError:
                continue  # finished meanwhile
            experiment = t.user_attrs.get(PROCESS_ATTR)
            if isinstance(experiment, dict) and not _dead(experiment):
                kill_process_group(int(experiment["pid"]))  # the orphaned experiment, by its group id
            failed.append(t.number)
    return failed
