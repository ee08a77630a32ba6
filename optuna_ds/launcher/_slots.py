from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable

from optuna_ds._files import open_lock
from optuna_ds._files import private_folder
from optuna_ds.launcher._resources import Resources
from optuna_ds.launcher._resources import Slot

_POLL_SECONDS = 0.05
_TELL_AFTER = 2.0


def default_lock_dir() -> str:
    """Where this node's GPU leases live: one lock file per GPU, shared by every optuna-ds
    process of this user on the node (``OPTUNA_DS_LOCK_DIR`` overrides). In the user's own
    runtime folder (``XDG_RUNTIME_DIR``) where there is one, else in the temp folder, which
    others can write too (see :func:`private_folder`)."""
    given = os.environ.get("OPTUNA_DS_LOCK_DIR")
    if given:
        return given
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    with contextlib.suppress(OSError):
        if runtime and os.path.isabs(runtime) and os.stat(runtime).st_uid == os.getuid():
            return os.path.join(runtime, "optuna-ds-gpus")
    return os.path.join(tempfile.gettempdir(), f"optuna-ds-gpus-{os.getuid()}")


@dataclasses.dataclass(frozen=True)
class Lease:
    """A slot held by one experiment: its GPUs, its index (for the master port) and the locks."""

    slot: Slot
    index: int
    fds: tuple[int, ...]


class SlotPool:
    """Hands out the GPU slots of this node, never one GPU to two experiments at once.

    A slot is leased by taking an exclusive ``flock`` on one file per GPU. The kernel drops the
    locks when the holder dies, however it dies, so a crashed process or experiment frees its
    GPUs at once; several optuna-ds processes on one node (``tune`` and ``worker``s) share the
    GPUs without any coordinator.
    """

    def __init__(self, resources: Resources, *, lock_dir: str | None = None, device: str = "GPU") -> None:
        self._slots = resources.slots()
        self._device = device if device == "GPU" else f"{device} device"  # a CPU is no GPU
        self._lock_dir = lock_dir or default_lock_dir()
        private_folder(self._lock_dir)
        self._mutex = threading.Lock()
        self._holders: dict[str, str] = {}

    @property
    def size(self) -> int:
        return len(self._slots)

    @property
    def gpus(self) -> tuple[str, ...]:
        """The GPUs its slots lease, each as its lock file (in the lock folder): processes whose
        slots lease one lock file share that GPU; a folder of its own makes GPUs of their own."""
        return tuple(self._path(host, gpu) for slot in self._slots for host, ids in slot.hosts.items() for gpu in ids)

    def _path(self, host: str, gpu: int) -> str:
        return os.path.join(self._lock_dir, f"{re.sub(r'[^A-Za-z0-9_.-]', '_', host)}-{gpu}.lock")

    def _try(self, slot: Slot) -> tuple[int, ...] | None:
        fds: list[int] = []
        for host, ids in slot.hosts.items():
            for gpu in ids:
                fd = open_lock(self._path(host, gpu))
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    self._holders[f"{host}:{gpu}"] = os.pread(fd, 32, 0).decode(errors="replace").strip()
                    os.close(fd)
                    for held in fds:
                        os.close(held)
                    return None
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # who holds it, for those who wait
                fds.append(fd)
        return tuple(fds)

    def busy(self) -> str:
        """Who holds the GPUs the last failed lease wanted, for a waiting process to say."""
        held = ", ".join(f"{gpu} by pid {pid or '?'}" for gpu, pid in sorted(self._holders.items()))
        return f"waiting for a free {self._device} slot: {held or 'all slots busy'} (locks in {self._lock_dir})"

    def try_acquire(self) -> Lease | None:
        """A free slot, leased, or ``None`` if every slot is busy."""
        # flock is per open file: two threads of this process must not both think they won.
        with self._mutex:
            for index, slot in enumerate(self._slots):
                fds = self._try(slot)
                if fds is not None:
                    return Lease(slot=slot, index=index, fds=fds)
        return None

    def acquire(self, stop: threading.Event, *, on_wait: Callable[[str], None] | None = None) -> Lease | None:
        """Wait for a free slot; ``None`` once ``stop`` is set. A wait longer than a few
        seconds is told once to ``on_wait``, naming who holds the GPUs."""
        told = time.monotonic() + _TELL_AFTER
        while not stop.is_set():
            lease = self.try_acquire()
            if lease is not None:
                return lease
            if on_wait is not None and time.monotonic() > told:
                on_wait(self.busy())
                on_wait = None
            stop.wait(_POLL_SECONDS)
        return None

    def release(self, lease: Lease) -> None:
        for fd in lease.fds:
            os.close(fd)  # closing the last descriptor drops the lock
