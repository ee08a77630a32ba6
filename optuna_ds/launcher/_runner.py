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
from typing import Protocol

from optuna_ds._errors import ResultsError
from optuna_ds._files import create_file
from optuna_ds._files import own_folder
from optuna_ds._files import write_file
from optuna_ds.domain import Experiment
from optuna_ds.domain import ExperimentResult
from optuna_ds.domain import FailureReason
from optuna_ds.domain import Phase
from optuna_ds.launcher._classify import BadMetrics
from optuna_ds.launcher._classify import classify
from optuna_ds.launcher._classify import last_lines
from optuna_ds.launcher._classify import read_metrics
from optuna_ds.launcher._classify import read_tail
from optuna_ds.launcher._commands import CommandBuilder
from optuna_ds.launcher._commands import local_launch_command
from optuna_ds.launcher._commands import shell_line
from optuna_ds.launcher._environment import child_environment
from optuna_ds.launcher._gpu_memory import PeakGpuMemory
from optuna_ds.launcher._launch_server import launch_server
from optuna_ds.launcher._launch_server import launch_server_enabled
from optuna_ds.launcher._ops import ops_environment
from optuna_ds.launcher._ops import release_build_locks
from optuna_ds.launcher._parent_death import dies_with_this_process
from optuna_ds.launcher._paths import ExperimentFiles
from optuna_ds.launcher._paths import rank_logs
from optuna_ds.launcher._ports import lease_port
from optuna_ds.launcher._resources import Slot
from optuna_ds.launcher._checkpointing import read_checkpointing
from optuna_ds.launcher._live import Judge
from optuna_ds.launcher._live import LiveSteps
from optuna_ds.launcher._live import RunPruned
from optuna_ds.launcher._steps import read_step_timers
from optuna_ds.launcher._slots import default_lock_dir
from optuna_ds.launcher._tracking import MARK_VAR
from optuna_ds.launcher._tracking import end_marked
from optuna_ds.launcher._tracking import new_mark
from optuna_ds.space import autotp_size
from optuna_ds.space import samples_per_second

_KILL_GRACE = 10.0
_STOP_POLL_SECONDS = 0.1  # how soon a waiting slot sees the tuning stopped
# A run lost to the node, not to its config (its exit status lost with the launch server), is
# made again at once, this many times in all; the trial of the last one runs again later.
_ATTEMPTS = 3


def _write_json(path: str, data: object) -> None:
    write_file(path, json.dumps(data, indent=2, default=str), sync=True)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP while a cleanup must finish; they are delivered afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
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


def _unwritable(e: OSError) -> ResultsError:
    """An experiment's files cannot be written (disk full, a folder turned read-only): the
    node's state, which every experiment after it would meet too, so the tuning stops with one
    line rather than record each config as failed."""
    return ResultsError(f"cannot write {e.filename or 'an experiment file'}: {e.strerror or e}; the experiments that finished are "
                        "kept: fix it and run the same command again to resume")


class ExperimentInterrupted(Exception):
    """The tuning was stopped while this experiment ran; it was ended by its process group."""


class _Watch:
    """What a waiting slot saw of its launcher (``time.monotonic()``): when it last saw it
    running, and when it saw it exit."""

    def __init__(self, started: float) -> None:
        self.running = started
        self.exited: float | None = None

    def ended(self, paths: Sequence[str]) -> float:
        """When the launcher exited: when it was seen to, where the slot watched it (a poll or
        two apart); else, the tuner not running meanwhile (stopped, swapped out), at the run's
        last write to ``paths`` between the two sightings (its own clock: the files' times), so
        that the minutes the tuner was away are not the run's."""
        assert self.exited is not None
        if self.exited - self.running <= 2 * _STOP_POLL_SECONDS:
            return self.exited
        now = time.time() - time.monotonic()
        writes = []
        for path in paths:
            with contextlib.suppress(OSError):
                writes.append(os.stat(path).st_mtime - now)
        return min(self.exited, max([self.running, *writes]))


def _wait(proc: subprocess.Popen, *, timeout: float | None, stop: threading.Event | None,
          watch: _Watch | None = None, look: Callable[[], None] | None = None) -> int | None:
    """The launcher's exit status (``None``: lost, see :class:`ServedProcess`), its sightings
    kept in ``watch`` where given; :class:`ExperimentInterrupted` once ``stop`` is set; ``look``
    called at each poll while it runs (what it raises ends the wait).

    A slot waits here for most of its life, so it sleeps on a pidfd (woken by the exit, or to
    look at ``stop`` ten times a second): ``Popen.wait(timeout)`` would poll the child every
    few milliseconds.
    """
    stop = stop or threading.Event()
    watch = watch or _Watch(time.monotonic())
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (an old kernel): poll
        pidfd = None
    try:
        while True:
            looked = time.monotonic()  # running then, if it has not exited when looked at
            if pidfd is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    returncode = proc.wait(timeout=0.05)
                    watch.exited = time.monotonic()
                    return returncode
            elif select.select([pidfd], [], [], _STOP_POLL_SECONDS)[0]:
                watch.exited = time.monotonic()
                return proc.wait()
            watch.running = looked
            if stop.is_set():
                raise ExperimentInterrupted("the tuning was stopped")
            if look is not None:
                look()
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout or 0.0)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _looker(live: LiveSteps, judge: Judge) -> Callable[[], None]:
    """A poll's look at a running launch: its new step lines to ``judge``, :class:`RunPruned`
    where it gives a reason."""

    def look() -> None:
        steps = live.read()
        why = judge(steps) if steps is not None else None
        if why:
            raise RunPruned(why)

    return look


class Spawn(Protocol):
    """Starts an experiment's launcher command line ``launched`` in a session of its own (its
    process group), its output to ``stdout`` and ``stderr``, and returns the started process. The
    default starts a real process; a benchmark's simulated world passes its own."""

    def __call__(self, launched: list[str], *, stdout: IO[bytes], stderr: IO[bytes], env: dict[str, str],
                 pass_fds: Sequence[int]) -> subprocess.Popen: ...


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
        lock_dir: str | None = None,
        spawn: Spawn | None = None,
    ) -> None:
        self._commands = commands
        self._spawned = spawn
        self._master_port = master_port
        self._lock_dir = lock_dir or default_lock_dir()
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
        """The first rendezvous port tried for an experiment on slot ``slot_index``; it runs on
        the first one from there that is free (see :mod:`._ports`)."""
        return self._master_port + slot_index

    def command(self, experiment: Experiment, config_path: str, *, slot: Slot, port: int) -> list[str]:
        """The experiment as a ``deepspeed`` command line (what ``cmd.txt`` holds)."""
        return self._commands.experiment(name=experiment.name, config=experiment.ds_config, config_path=config_path, slot=slot, port=port,
                                         switches=experiment.switches)

    def launched(self, experiment: Experiment, config_path: str, *, slot: Slot, port: int) -> list[str]:
        """What is actually started: the per-node launcher for a local experiment with
        ``local_start``, else the ``deepspeed`` command line."""
        if self._local_start and self._commands.is_local(slot):
            return local_launch_command(
                self._commands.local_launch(name=experiment.name, config=experiment.ds_config, config_path=config_path, slot=slot, port=port,
                                            switches=experiment.switches)
            )
        return self.command(experiment, config_path, slot=slot, port=port)

    def _spawn(self, launched: list[str], *, stdout: IO[bytes], stderr: IO[bytes], env: dict[str, str], pass_fds: Sequence[int]) -> Any:
        """Start the experiment in its own session: the per-node launcher forked from the
        pre-warmed server when it can, else as a process of its own (or by the ``spawn`` given)."""
        if self._spawned is not None:
            return self._spawned(launched, stdout=stdout, stderr=stderr, env=env, pass_fds=pass_fds)
        if launched[1:4] == ["-u", "-m", "deepspeed.launcher.launch"] and launch_server_enabled():
            served = launch_server().start(launched[4:], stdout=stdout.fileno(), stderr=stderr.fileno(), env=env, pass_fds=pass_fds)
            if served is not None:
                return served
            # A server that took the request but never answered may have forked it: never two
            # launchers of one experiment on its GPUs.
            end_marked(env[MARK_VAR])
        return subprocess.Popen(
            dies_with_this_process(launched), stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
            pass_fds=tuple(pass_fds),
        )

    def run(
        self,
        experiment: Experiment,
        *,
        slot: Slot,
        slot_index: int = 0,
        timeout: float | None,
        on_start: Callable[[int], None] | None = None,
        on_command: Callable[[list[str]], None] | None = None,
        on_retry: Callable[[str], None] | None = None,
        stop: threading.Event | None = None,
        pass_fds: Sequence[int] = (),
        mark: str = "",
        on_exit: Callable[[], None] | None = None,
        judge: Judge | None = None,
    ) -> ExperimentResult:
        """Run one experiment to completion, timeout, interrupt or prune, and classify the outcome.

        ``mark``: the token its processes carry (a new one if not given), recorded by the caller
        where a resumed tuning finds it.

        ``stop`` set from another thread ends the experiment and raises
        :class:`ExperimentInterrupted`. ``pass_fds`` (the slot's GPU locks) are inherited by the
        launcher, so its GPUs stay leased as long as it runs, even if this process dies. A run
        lost to the node (:attr:`FailureReason.INTERRUPTED`: its status lost;
        :attr:`FailureReason.PORT`: its port taken) is made again at once, on another port, up to
        ``_ATTEMPTS`` runs, each told to ``on_retry``. With no port free, nothing is launched: the
        result is :attr:`FailureReason.PORT`.
        ``on_command`` is given each run's ``deepspeed`` command line before it starts;
        ``on_exit`` is called the moment its launcher has exited by itself (the caller holds
        signals from then until its result is stored: a finished run is not lost to a signal).
        ``judge`` is given the step-timer lines the run has logged each time new ones appear
        (read from its stdout as it runs); a reason it returns ends the run by its process group,
        as a timeout does, and the result is :attr:`FailureReason.PRUNED` with that reason.

        Files land where DeepSpeed's autotuner puts them: ``exps_dir/<name>.json`` and
        ``results_dir/<name>/`` with cmd.txt, ds_config.json, exp.json, metrics.json,
        stdout.log and stderr.log.
        """
        mark = mark or new_mark()
        taken: set[int] = set()
        for attempt in range(1, _ATTEMPTS + 1):
            port = lease_port(first=self.port(slot_index), lock_dir=self._lock_dir, local=self._commands.is_local(slot), skip=taken)
            if port.fd is None:
                return ExperimentResult(name=experiment.name, returncode=None, duration=0.0, cmd=[], reason=FailureReason.PORT,
                                        detail=f"no rendezvous port free on this node from {self.port(slot_index)} up")
            try:
                result = self._run_once(experiment, slot=slot, port=port.port, timeout=timeout, on_start=on_start,
                                        on_command=on_command, stop=stop, mark=mark, pass_fds=(*pass_fds, port.fd), on_exit=on_exit,
                                        judge=judge)
            finally:
                port.release()
            if result.reason not in (FailureReason.INTERRUPTED, FailureReason.PORT) or attempt == _ATTEMPTS:
                return result
            taken.add(port.port)
            if on_retry is not None:
                on_retry(f"{experiment.name}: {result.detail}; running it again ({attempt + 1} of {_ATTEMPTS})")
        raise AssertionError("unreachable")

    def _run_once(
        self,
        experiment: Experiment,
        *,
        slot: Slot,
        port: int,
        timeout: float | None,
        on_start: Callable[[int], None] | None,
        on_command: Callable[[list[str]], None] | None,
        stop: threading.Event | None,
        mark: str,
        pass_fds: Sequence[int],
        on_exit: Callable[[], None] | None = None,
        judge: Judge | None = None,
    ) -> ExperimentResult:
        try:
            files = ExperimentFiles(experiment.result_dir, self._exps_dir)
            own_folder(files.result_dir)
            os.makedirs(self._exps_dir, exist_ok=True)
            # A stale metrics file from an earlier run must never be read as this run's result.
            rank_dir = self._commands.rank_log_dir(experiment.name)
            if rank_dir:
                own_folder(rank_dir)  # its stale logs are deleted: never those of a folder it links to
            for stale in (files.metrics, files.model_info, *(rank_logs(rank_dir) if rank_dir else ())):
                if os.path.lexists(stale):  # a link too, dangling or not: the engine would write through it
                    os.remove(stale)
            config_path = files.ds_config
            _write_json(config_path, experiment.ds_config)
            cmd = self.command(experiment, config_path, slot=slot, port=port)
            if on_command is not None:
                on_command(cmd)
            launched = self.launched(experiment, config_path, slot=slot, port=port)
            # In the description too: the folder is this launch's while it names it.
            description = experiment.to_dict() | {"cmd": cmd, "slot": slot.hosts, "master_port": port, "mark": mark}
            if launched != cmd:
                description["launched"] = launched
            _write_json(files.description, description)
            _write_json(files.exp, description)
            write_file(files.cmd, shell_line(cmd) + "\n")
        except OSError as e:
            raise _unwritable(e) from None
        stdout_path, stderr_path = files.stdout, files.stderr
        env = child_environment(PYTHONUNBUFFERED="1", **ops_environment(), **{MARK_VAR: mark})
        start, launched_at = time.monotonic(), time.time()
        watch = _Watch(start)
        timed_out = ended = False
        pruned = ""
        unlocked: list[str] = []
        look = None if judge is None else _looker(LiveSteps(stdout_path), judge)

        with contextlib.ExitStack() as logs:
            try:
                out, err = (logs.enter_context(os.fdopen(create_file(path), "wb")) for path in (stdout_path, stderr_path))
            except OSError as e:
                raise _unwritable(e) from None
            memory = logs.enter_context(PeakGpuMemory(slot))
            proc = self._spawn(launched, stdout=out, stderr=err, env=env, pass_fds=pass_fds)
            try:
                if on_start is not None:
                    on_start(proc.pid)  # the process group id, recorded so a resumed tuning can end it
                returncode: int | None = _wait(proc, timeout=timeout, stop=stop, watch=watch, look=look)
                if on_exit is not None:
                    on_exit()
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_process_group(proc.pid, leader=proc)
                returncode = proc.wait()
            except RunPruned as e:
                pruned = str(e)
                kill_process_group(proc.pid, leader=proc)
                returncode = proc.wait()
            except BaseException:  # noqa: BLE001 - re-raised: a signal or an error ends the experiment's process group first
                with deferred_signals():
                    kill_process_group(proc.pid, leader=proc)
                    proc.wait()
                ended = True
                raise
            finally:
                # Ranks the launcher left behind die with their group, and those that left it.
                kill_process_group(proc.pid, grace=2.0, leader=proc)
                end_marked(mark)
                if timed_out or ended or pruned:  # ended by us, perhaps while it loaded an op
                    unlocked = release_build_locks(since=launched_at)
        # A run that ended by itself lasted until its launcher's exit, not until the tuner saw it.
        outputs = (stdout_path, stderr_path, files.metrics, files.model_info,
                   *(rank_logs(rank_dir) if rank_dir else ()))
        duration = (time.monotonic() if watch.exited is None else watch.ended(outputs)) - start

        stdout_tail, stderr_tail = read_tail(stdout_path), read_tail(stderr_path)
        rank0 = ""
        if rank_dir:  # --enable_each_rank_log: the ranks' output is there, not in stdout/stderr
            ranks = rank_logs(rank_dir)
            stderr_tail += "".join(read_tail(path) for path in ranks)
            rank0 = "".join(read_tail(path) for path in ranks if path.endswith("_rank0.log"))
        problem = ""
        try:
            if experiment.phase is Phase.PROFILE:
                metrics = read_metrics(files.model_info, "num_params")
            else:
                metrics = read_metrics(files.metrics, self._metric_key)
                metrics = samples_per_second(metrics, experiment.ds_config) if metrics is not None else None
        except BadMetrics as e:
            metrics, problem = None, str(e)
        reason, detail = classify(
            returncode=returncode, timed_out=timed_out, metrics=metrics, stdout_tail=stdout_tail, stderr_tail=stderr_tail,
            metrics_problem=problem, switches=[flag for flag, on in experiment.switches.items() if on],
            autotp=autotp_size(experiment.ds_config) > 1, timeout=timeout,
        )
        if pruned:
            reason, detail = FailureReason.PRUNED, pruned
        if unlocked:
            detail = f"{detail}; the op build lock it left as it was ended removed ({', '.join(unlocked)})"
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
            logged_steps=tuple(read_step_timers(stdout_tail + "\n" + rank0)) if experiment.phase is not Phase.PROFILE else (),
            checkpointing=read_checkpointing(stdout_tail + "\n" + rank0),
        )
