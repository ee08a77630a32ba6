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
from typing import TypedDict

from optuna_ds.launcher._environment import child_environment

_MAX_FDS = 64
_MAX_MESSAGE = 1 << 20
_READY = b"ready"
# Every wait on the server has a deadline: a server that stops answering (stopped, swapped out,
# wedged) must cost a slot seconds, never its life, and never hold the trial timeout off.
_READY_SECONDS = 120.0  # its imports, on a node busy with experiments
_REPLY_SECONDS = 30.0  # a fork, or the exit status of a launcher that has exited
_END_GRACE = 10.0  # the tuner is gone: its launchers get this long after SIGTERM


class _Request(TypedDict):
    """What the tuner sends the server, as JSON, for one launcher (its log files and GPU locks
    travel beside it as descriptors)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str


# -- the server --------------------------------------------------------------------------------


def _run_launch(sock: socket.socket, replies: Sequence[socket.socket], request: _Request, fds: list[int]) -> None:
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
    kill_at = 0.0
    while open_ or children:
        if not open_ and time.monotonic() > kill_at:
            _signal_groups(children, signal.SIGKILL)
            kill_at = float("inf")
        watched: list[socket.socket | int] = [sock, wake_r] if open_ else [wake_r]
        readable, _, _ = select.select(watched, [], [], 1.0)
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
                # The tuner is gone (it closes the socket only once its experiments have ended):
                # its launchers have no one left to enforce their timeout or read their result,
                # so they end with it rather than hold their GPUs for hours.
                open_ = False
                _signal_groups(children, signal.SIGTERM)
                kill_at = time.monotonic() + _END_GRACE
                continue
            request: _Request = json.loads(message)
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


def _signal_groups(children: Mapping[int, socket.socket], signum: int) -> None:
    """Signal the process group of each launcher this server forked and has not reaped (so
    its pid is still its own)."""
    for pid in children:
        with contextlib.suppress(OSError):
            os.killpg(pid, signum)


# -- the client --------------------------------------------------------------------------------


class ServedProcess:
    """The tuner's handle on a forked launcher: ``pid``, ``poll()``, ``wait()``, ``returncode``,
    as :class:`subprocess.Popen` (the pid is its process group's id).

    The exit status comes from the server, which reaps the launcher. When the server dies, or
    has not answered ``_REPLY_SECONDS`` after the launcher exited, the status is lost: the
    launcher counts as ended once it has exited, with ``returncode`` ``None`` and ``lost`` set,
    so the caller judges the run by what it wrote, never by a made-up status.
    """

    def __init__(self, pid: int, reply: socket.socket, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self.lost = False
        self._reply: socket.socket | None = reply
        self._server_gone = False
        self._exited_at: float | None = None  # when the launcher was seen to exit, its status not yet come
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # exited and reaped already: its status is on its way
            self._pidfd, self._exited_at = None, time.monotonic()
        except (AttributeError, OSError):  # no pidfd (an old kernel): its process group is polled
            self._pidfd = None

    @property
    def _done(self) -> bool:
        return self.returncode is not None or self.lost

    def _launcher_exited(self, now: float) -> None:
        if self._exited_at is None:
            self._exited_at = now
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _settle(self, *, returncode: int | None) -> bool:
        self.returncode, self.lost = returncode, returncode is None
        if self._reply is not None:
            self._reply.close()
            self._reply = None
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return True

    def _status_lost(self, now: float) -> bool:
        """Whether the launcher has exited and its status will never come."""
        return self._exited_at is not None and (self._server_gone or now >= self._exited_at + _REPLY_SECONDS)

    def _receive(self, timeout: float | None) -> bool:
        """Whether the launcher has ended, waiting at most ``timeout`` seconds (``None``: until it has)."""
        if self._done:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            now = time.monotonic()
            if self._status_lost(now):
                return self._settle(returncode=None)
            reply = None if self._server_gone else self._reply
            waits: list[socket.socket | int] = [] if reply is None else [reply]
            if self._pidfd is not None:
                waits.append(self._pidfd)
            limits = [deadline - now] if deadline is not None else []
            if self._exited_at is not None:
                limits.append(self._exited_at + _REPLY_SECONDS - now)
            elif self._pidfd is None:
                limits.append(0.05)  # no pidfd: its process group is polled
            wait = max(0.0, min(limits)) if limits else None
            if waits:
                readable = select.select(waits, [], [], wait)[0]
            else:
                time.sleep(wait or 0.0)
                readable = []
            now = time.monotonic()
            if reply is not None and reply in readable:
                message = reply.recv(_MAX_MESSAGE)
                if message:
                    return self._settle(returncode=int(json.loads(message)["returncode"]))
                self._server_gone = True  # the server died: the launcher's status went with it
            if self._pidfd in readable or (self._pidfd is None and self._exited_at is None and not _group_alive(self.pid)):
                self._launcher_exited(now)
            if not self._status_lost(now) and deadline is not None and now >= deadline:
                return False

    def poll(self) -> int | None:
        self._receive(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status; ``None`` when it was lost (see the class)."""
        if not self._receive(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
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
    server could not start or stopped answering, so the caller falls back to spawning the
    launcher itself. A server that misses a deadline is given up (killed: it is our child) and
    not asked again."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self._lock = threading.Lock()
        self._ready: bool | None = None
        self._started = time.monotonic()
        self._proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "optuna_ds.launcher._launch_server", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=child_environment(),  # each launcher it forks gets its request's environment; the server none of the storage's
            start_new_session=True,
        )
        theirs.close()

    def _wait_ready(self) -> bool:
        if self._ready is None:
            remaining = self._started + _READY_SECONDS - time.monotonic()
            try:
                if select.select([self._sock], [], [], max(0.0, remaining))[0]:
                    self._ready = self._sock.recv(len(_READY)) == _READY
                else:
                    self._ready = False
            except OSError:
                self._ready = False
            if not self._ready:
                self._give_up()
        return self._ready

    def _give_up(self) -> None:
        """Never ask this server again; end it (not the launchers it forked: they run in
        sessions of their own, and their handles learn that their status is lost)."""
        self._ready = False
        with contextlib.suppress(OSError):
            self._sock.close()
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def start(self, argv: list[str], *, stdout: int, stderr: int, env: Mapping[str, str], pass_fds: Sequence[int] = ()) -> ServedProcess | None:
        """Fork a per-node launcher running ``deepspeed.launcher.launch argv``. ``None`` when the
        server cannot: a request it took but did not answer may still have forked one, which
        the caller must find (by its environment) and end before it starts another."""
        request = json.dumps(_Request(argv=argv, env=dict(env), cwd=os.getcwd())).encode()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self._lock:
                if not self._wait_ready():
                    ours.close()
                    return None
                try:
                    socket.send_fds(self._sock, [request], [theirs.fileno(), stdout, stderr, *pass_fds])
                except OSError:
                    self._give_up()
                    ours.close()
                    return None
            theirs.close()
            message = ours.recv(_MAX_MESSAGE) if select.select([ours], [], [], _REPLY_SECONDS)[0] else None
            if not message:
                with self._lock:
                    self._give_up()
                ours.close()
                return None
            pid = int(json.loads(message)["pid"])
        except BaseException:  # noqa: BLE001 - re-raised: the socket is closed first
            ours.close()
            raise
        finally:
            if theirs.fileno() != -1:
                theirs.close()
        return ServedProcess(pid, ours, ["deepspeed.launcher.launch", *argv])

    def close(self) -> None:
        """Close the socket; the server exits (ending any launcher still running, whose tuner
        this is) and is killed if it has not within a few seconds."""
        with contextlib.suppress(OSError):
            self._sock.close()
        try:
            self._proc.wait(timeout=_END_GRACE + 5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


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
