from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import IO
from typing import Any

from optuna_ds.launcher._classify import BadMetrics
from optuna_ds.launcher._classify import classify
from optuna_ds.launcher._classify import last_lines
from optuna_ds.launcher._classify import read_metrics
from optuna_ds.launcher._classify import read_tail
from optuna_ds.launcher._experiment import Experiment
from optuna_ds.launcher._experiment import ExperimentResult
from optuna_ds.launcher._experiment import Phase
from optuna_ds.launcher._commands import CommandBuilder
from optuna_ds.launcher._commands import local_launch_command
from optuna_ds.launcher._commands import shell_line
from optuna_ds.launcher._launch_server import launch_server
from optuna_ds.launcher._launch_server import launch_server_enabled
from optuna_ds.launcher._paths import ExperimentFiles
from optuna_ds.launcher._paths import rank_logs
from optuna_ds.launcher._gpu_memory import PeakGpuMemory
from optuna_ds.launcher._resources import Slot
from optuna_ds.launcher._tracking import MARK_VAR
from optuna_ds.launcher._tracking import end_marked
from optuna_ds.launcher._tracking import new_mark

_KILL_GRACE = 10.0
_STOP_POLL_SECONDS = 0.1  # how soon a waiting slot sees the tuning stopped


def _write_json(path: str, data: object) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while a cleanup must finish; they are delivered afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def kill_process_group(pgid: int, *, grace: float = _KILL_GRACE, leader: subprocess.Popen | None = None) -> None:
    """End a process group we started: SIGTERM, then SIGKILL after ``grace`` seconds.

    ``leader``, the group's first process when it is our child, is reaped meanwhile: as a zombie
    it would keep the group alive for the whole grace period.
    """
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if leader is not None:
            leader.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class ExperimentInterrupted(Exception):
    """The tuning was stopped while this experiment ran; it was ended by its process group."""


def _wait(proc: subprocess.Popen, *, timeout: float | None, stop: threading.Event | None) -> int:
    """The launcher's exit status; :class:`ExperimentInterrupted` once ``stop`` is set.

    A slot waits here for most of its life, so it sleeps on a pidfd (woken by the exit, or to
    look at ``stop`` ten times a second): ``Popen.wait(timeout)`` would poll the child every
    few milliseconds.
    """
    if stop is None:
        return proc.wait(timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (an old kernel): poll
        pidfd = None
    try:
        while True:
            if pidfd is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    return proc.wait(timeout=0.05)
            elif select.select([pidfd], [], [], _STOP_POLL_SECONDS)[0]:
                return proc.wait()
            if stop.is_set():
                raise ExperimentInterrupted("the tuning was stopped")
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout or 0.0)
    finally:
        if pidfd is not None:
            os.close(pidfd)


class ExperimentRunner:
    """Launches experiments on their slot's GPUs, each in its own process group, so a timeout
    or an interrupt ends the launcher and every rank it started by group id, never by name.

    With ``local_start`` (the executable is DeepSpeed's own runner), a single-node experiment
    starts DeepSpeed's per-node launcher directly with the world info the runner would compute,
    skipping the runner's interpreter; ``cmd.txt`` still holds the equivalent ``deepspeed``
    command line. Multi-node experiments go through the runner and its ``--launcher`` backend.
    """

    def __init__(
        self,
        *,
        commands: CommandBuilder,
        master_port: int,
        metric_key: str | None,
        exps_dir: str,
        local_start: bool = False,
    ) -> None:
        self._commands = commands
        self._master_port = master_port
        self._metric_key = metric_key
        self._exps_dir = exps_dir
        self._local_start = local_start
        if local_start and launch_server_enabled():
            launch_server()  # its imports run while the tuning sets up

    @property
    def commands(self) -> CommandBuilder:
        return self._commands

    @property
    def master_port(self) -> int:
        return self._master_port

    def port(self, slot_index: int) -> int:
        """The rendezvous port of an experiment on slot ``slot_index``: one per slot, so
        experiments running at once on one node never share a port."""
        return self._master_port + slot_index

    def command(self, experiment: Experiment, config_path: str, *, slot: Slot, port: int) -> list[str]:
        """The experiment as a ``deepspeed`` command line (what ``cmd.txt`` holds)."""
        return self._commands.experiment(name=experiment.name, config=experiment.ds_config, config_path=config_path, slot=slot, port=port)

    def launched(self, experiment: Experiment, config_path: str, *, slot: Slot, port: int) -> list[str]:
        """What is actually started: the per-node launcher for a local experiment with
        ``local_start``, else the ``deepspeed`` command line."""
        if self._local_start and self._commands.is_local(slot):
            return local_launch_command(
                self._commands.local_launch(name=experiment.name, config=experiment.ds_config, config_path=config_path, slot=slot, port=port)
            )
        return self.command(experiment, config_path, slot=slot, port=port)

    def _spawn(self, launched: list[str], *, stdout: IO[bytes], stderr: IO[bytes], env: dict[str, str], pass_fds: Sequence[int]) -> Any:
        """Start the experiment in its own session: the per-node launcher forked from the
        pre-warmed server when it can, else as a process of its own."""
        if launched[1:4] == ["-u", "-m", "deepspeed.launcher.launch"] and launch_server_enabled():
            served = launch_server().start(launched[4:], stdout=stdout.fileno(), stderr=stderr.fileno(), env=env, pass_fds=pass_fds)
            if served is not None:
                return served
        return subprocess.Popen(
            launched, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, env=env, start_new_session=True, pass_fds=tuple(pass_fds)
        )

    def run(
        self,
        experiment: Experiment,
        *,
        slot: Slot,
        slot_index: int = 0,
        timeout: float | None,
        on_start: Callable[[int], None] | None = None,
        stop: threading.Event | None = None,
        pass_fds: Sequence[int] = (),
        mark: str = "",
    ) -> ExperimentResult:
        """Run one experiment to completion, timeout or interrupt, and classify the outcome.

        ``mark``: the token its processes carry (a new one if not given), recorded by the caller
        where a resumed tuning finds it.

        ``stop`` set from another thread ends the experiment and raises
        :class:`ExperimentInterrupted`. ``pass_fds`` (the slot's GPU locks) are inherited by the
        launcher, so its GPUs stay leased as long as it runs, even if this process dies.

        Files land where DeepSpeed's autotuner puts them: ``exps_dir/<name>.json`` and
        ``results_dir/<name>/`` with cmd.txt, ds_config.json, exp.json, metrics.json,
        stdout.log and stderr.log.
        """
        files = ExperimentFiles(experiment.result_dir, self._exps_dir)
        os.makedirs(files.result_dir, exist_ok=True)
        os.makedirs(self._exps_dir, exist_ok=True)
        # A stale metrics file from an earlier run must never be read as this run's result.
        rank_dir = self._commands.rank_log_dir(experiment.name)
        for stale in (files.metrics, files.model_info, *(rank_logs(rank_dir) if rank_dir else ())):
            if os.path.exists(stale):
                os.remove(stale)
        config_path = files.ds_config
        _write_json(config_path, experiment.ds_config)
        port = self.port(slot_index)
        cmd = self.command(experiment, config_path, slot=slot, port=port)
        launched = self.launched(experiment, config_path, slot=slot, port=port)
        mark = mark or new_mark()  # in the description too: the folder is this launch's while it names it
        description = experiment.to_dict() | {"cmd": cmd, "slot": slot.hosts, "master_port": port, "mark": mark}
        if launched != cmd:
            description["launched"] = launched
        _write_json(files.description, description)
        _write_json(files.exp, description)
        with open(files.cmd, "w", encoding="utf-8") as f:
            f.write(shell_line(cmd) + "\n")

        stdout_path, stderr_path = files.stdout, files.stderr
        env = dict(os.environ, PYTHONUNBUFFERED="1", **{MARK_VAR: mark})
        start = time.monotonic()
        timed_out = False
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err, PeakGpuMemory(slot) as memory:
            proc = self._spawn(launched, stdout=out, stderr=err, env=env, pass_fds=pass_fds)
            try:
                if on_start is not None:
                    on_start(proc.pid)  # the process group id, recorded so a resumed tuning can end it
                returncode: int | None = _wait(proc, timeout=timeout, stop=stop)
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_process_group(proc.pid, leader=proc)
                returncode = proc.wait()
            except BaseException:
                with deferred_signals():
                    kill_process_group(proc.pid, leader=proc)
                    proc.wait()
                raise
            finally:
                # Ranks the launcher left behind die with their group, and those that left it.
                kill_process_group(proc.pid, grace=2.0, leader=proc)
                end_marked(mark)
        duration = time.monotonic() - start

        stdout_tail, stderr_tail = read_tail(stdout_path), read_tail(stderr_path)
        if rank_dir:  # --enable_each_rank_log: the ranks' output is there, not in stdout/stderr
            stderr_tail += "".join(read_tail(path) for path in rank_logs(rank_dir))
        problem = ""
        try:
            if experiment.phase is Phase.PROFILE:
                metrics = read_metrics(files.model_info, "num_params")
            else:
                metrics = read_metrics(files.metrics, self._metric_key)
        except BadMetrics as e:
            metrics, problem = None, str(e)
        reason, detail = classify(
            returncode=returncode, timed_out=timed_out, metrics=metrics, stdout_tail=stdout_tail, stderr_tail=stderr_tail,
            metrics_problem=problem,
        )
        tail_source = stderr_tail if stderr_tail.strip() else stdout_tail
        return ExperimentResult(
            name=experiment.name,
            returncode=returncode,
            duration=duration,
            cmd=cmd,
            metrics=metrics or {},
            reason=reason,
            detail=detail,
            stderr_tail=last_lines(tail_source) if reason is not None else "",
            peak_memory=memory.peak,
        )
