"""A process that has already imported DeepSpeed's per-node launcher and forks it per experiment.

DeepSpeed's ``deepspeed`` runner imports torch and DeepSpeed only to compute the world info
and spawn ``python -m deepspeed.launcher.launch``, which imports them again before it spawns
the ranks: two interpreters and two imports (seconds each) before the training script's first
line. This server pays the import once per tuning; each single-node experiment is a fork that
runs DeepSpeed's own ``launch.main()`` with the arguments the runner would have given it. The
fork is a session leader with the experiment's log files as stdout/stderr, the tuner's
environment and working directory, and the GPU locks, so it behaves as the per-node launcher
would: DeepSpeed sets ``CUDA_VISIBLE_DEVICES`` and the rendezvous variables, writes the rank
logs, and handles SIGINT/SIGTERM by ending its ranks; the tuner ends it by process group.
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from collections.abc import Sequence

_MAX_FDS = 64
_MAX_MESSAGE = 1 << 20
_READY = b"ready"


# -- the server --------------------------------------------------------------------------------


def _run_launch(sock: socket.socket, replies: Sequence[socket.socket], request: dict, fds: list[int]) -> None:
    """In the forked child: become the experiment's per-node launcher. Never returns."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        sock.close()
        for reply in replies:
            reply.close()
        stdout, stderr = fds[1], fds[2]
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        for fd in (devnull, fds[0], stdout, stderr):
            os.close(fd)
        for fd in fds[3:]:
            os.set_inheritable(fd, False)  # the GPU locks: held by this process, not its ranks
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["deepspeed.launcher.launch", *request["argv"]]
        from deepspeed.launcher import launch

        try:
            launch.main()
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
    except BaseException:  # noqa: BLE001 - a crash must still end this process, with a trace
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code & 0xFF)


def serve(fd: int) -> None:
    """Serve fork requests on the SEQPACKET socket ``fd`` until the tuner closes it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the tuner decides; an interrupt reaches it
    from deepspeed.accelerator import get_accelerator
    from deepspeed.launcher import launch  # noqa: F401 - the import paid once for every experiment

    get_accelerator()
    sock = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sock.send(_READY)
    children: dict[int, socket.socket] = {}
    open_ = True
    while open_ or children:
        readable, _, _ = select.select([sock, wake_r] if open_ else [wake_r], [], [], 1.0)
        if wake_r in readable:
            os.read(wake_r, 4096)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            reply = children.pop(pid, None)
            if reply is not None:
                with contextlib.suppress(OSError):
                    reply.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
                reply.close()
        if sock in readable:
            message, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, _MAX_FDS)
            if not message:
                open_ = False  # the tuner is gone: running experiments go on, as with the runner
                continue
            request = json.loads(message)
            reply = socket.socket(fileno=fds[0])
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _run_launch(sock, list(children.values()), request, fds)
            for received in fds[1:]:
                os.close(received)
            children[pid] = reply
            with contextlib.suppress(OSError):
                reply.send(json.dumps({"pid": pid}).encode())


# -- the client --------------------------------------------------------------------------------


class ServedProcess:
    """The tuner's handle on a forked launcher: ``pid``, ``poll()``, ``wait()``, ``returncode``,
    as :class:`subprocess.Popen` (the pid is its process group's id)."""

    def __init__(self, pid: int, reply: socket.socket, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._reply = reply

    def _receive(self, timeout: float | None) -> bool:
        if self.returncode is not None:
            return True
        readable, _, _ = select.select([self._reply], [], [], timeout)
        if not readable:
            return False
        message = self._reply.recv(_MAX_MESSAGE)
        if message:
            self.returncode = int(json.loads(message)["returncode"])
        else:  # the server died: the launcher's status is lost, wait for its group to end
            while _group_alive(self.pid):
                time.sleep(0.05)
            self.returncode = 1
        self._reply.close()
        return True

    def poll(self) -> int | None:
        self._receive(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._receive(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LaunchServer:
    """The client side: starts the server (its import runs while the tuner goes on) and asks
    it for one launcher per experiment. Thread-safe; ``None`` from :meth:`start` when the
    server could not start, so the caller falls back to spawning the launcher itself."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self._lock = threading.Lock()
        self._ready: bool | None = None
        self._proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "optuna_ds.launcher._launch_server", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        theirs.close()

    def _wait_ready(self) -> bool:
        if self._ready is None:
            try:
                self._ready = self._sock.recv(len(_READY)) == _READY
            except OSError:
                self._ready = False
        return self._ready

    def start(self, argv: list[str], *, stdout: int, stderr: int, env: Mapping[str, str], pass_fds: Sequence[int] = ()) -> ServedProcess | None:
        """Fork a per-node launcher running ``deepspeed.launcher.launch argv``."""
        request = json.dumps({"argv": argv, "env": dict(env), "cwd": os.getcwd()}).encode()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self._lock:
                if not self._wait_ready():
                    return None
                try:
                    socket.send_fds(self._sock, [request], [theirs.fileno(), stdout, stderr, *pass_fds])
                except OSError:
                    self._ready = False
                    return None
            theirs.close()
            message = ours.recv(_MAX_MESSAGE)
            if not message:
                return None
            pid = int(json.loads(message)["pid"])
        except BaseException:
            ours.close()
            raise
        finally:
            if theirs.fileno() != -1:
                theirs.close()
        return ServedProcess(pid, ours, ["deepspeed.launcher.launch", *argv])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)


_server: LaunchServer | None = None
_server_lock = threading.Lock()


def launch_server_enabled() -> bool:
    """``OPTUNA_DS_LAUNCH_SERVER=0`` starts each per-node launcher as its own process instead."""
    return os.environ.get("OPTUNA_DS_LAUNCH_SERVER", "1") != "0"


def launch_server() -> LaunchServer:
    """This process's server, started on first use and closed at exit."""
    global _server
    with _server_lock:
        if _server is None:
            import atexit

            _server = LaunchServer()
            atexit.register(_server.close)
        return _server


if __name__ == "__main__":
    serve(int(sys.argv[1]))
