"""Rendezvous ports: each running experiment of this node on one of its own.

A port is leased like a GPU: an exclusive ``flock`` on one file per port in the node's lock
folder, shared by every optuna-ds process of this user, so two tunings on one node (``--include
localhost:0`` and ``localhost:1``, both from port 29500) never hand out one port twice; and
only a port nothing else listens on is handed out. The launcher inherits the lock, so the port
stays leased as long as it runs. Someone may still take the port between the check and
DeepSpeed's bind: that run fails with ``EADDRINUSE``, which is the node's fault, not the
config's, and runs again on another port (see :meth:`ExperimentRunner.run`); with no port free,
nothing is launched. A port past 65535 is never handed out: :func:`check_ports` refuses a base
port whose slots would need one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import socket
from collections.abc import Container

from optuna_ds._errors import ResourceError

_SEARCH = 256  # ports tried above the first
_LAST = 65535


@dataclasses.dataclass(frozen=True)
class PortLease:
    """A rendezvous port and the descriptor of its lock (``None``: no free port was found)."""

    port: int
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


def check_ports(*, first: int, slots: int) -> None:
    """Refuse a base port whose slots would run past the last port: slot ``i`` starts its
    search at ``first + i``."""
    last = first + slots - 1
    if last > _LAST:
        raise ResourceError(f"--master_port {first} with {slots} experiment slots: slot {slots - 1}'s rendezvous port would be "
                            f"{last}, past {_LAST}; pass --master_port {_LAST - slots + 1} or lower")


def lease_port(*, first: int, lock_dir: str, local: bool, skip: Container[int] = ()) -> PortLease:
    """The first port from ``first`` up that no experiment of ours holds and, for an experiment
    on this node (``local``), nothing listens on; ports in ``skip`` (found in use) are passed.
    With none free, ``first`` unleased (``fd`` ``None``): nothing is launched on it."""
    os.makedirs(lock_dir, exist_ok=True)
    for port in range(first, min(first + _SEARCH, _LAST + 1)):
        if port in skip:
            continue
        fd = os.open(os.path.join(lock_dir, f"port-{port}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        if local and not port_free(port):
            os.close(fd)
            continue
        return PortLease(port=port, fd=fd)
    return PortLease(port=first, fd=None)


def port_free(port: int) -> bool:
    """Whether a TCP listener could bind ``port`` on every IPv4 address now, as the rank-0
    store does (a socket in TIME_WAIT does not count: the store reuses the address)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True
