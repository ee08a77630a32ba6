from __future__ import annotations

import os
import signal
import time
import uuid

# Every process an experiment starts inherits this variable with the experiment's own token,
# so a rank that leaves the experiment's process group (setsid, a daemonizing helper) is still
# found and ended. A process that also clears its environment escapes: the kernel keeps no
# other trace of who started it short of a cgroup.
MARK_VAR = "OPTUNA_DS_EXPERIMENT"
_GRACE = 2.0


def new_mark() -> str:
    return uuid.uuid4().hex


def marked_processes(mark: str) -> list[int]:
    """The processes of this user whose environment carries ``mark`` (read from /proc)."""
    needle = f"{MARK_VAR}={mark}".encode()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue  # gone, or not ours to read
    return found


def end_marked(mark: str, *, grace: float = _GRACE) -> list[int]:
    """End every process still carrying ``mark``: SIGTERM, then SIGKILL after ``grace``.
    Called once the experiment's process group is gone; returns the pids it found."""
    pids = marked_processes(mark)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 0)
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = set(marked_processes(mark))  # one scan of /proc a poll, not one a pid
            pids = [p for p in pids if p in alive]
        if not pids:
            break
    return pids
