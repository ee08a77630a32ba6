from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence

from optuna_ds.config import replace_config_path
from optuna_ds.config import set_arg
from optuna_ds.launcher._classify import BadMetrics
from optuna_ds.launcher._classify import classify
from optuna_ds.launcher._classify import last_lines
from optuna_ds.launcher._classify import read_metrics
from optuna_ds.launcher._classify import read_tail
from optuna_ds.launcher._experiment import Experiment
from optuna_ds.launcher._experiment import ExperimentResult
from optuna_ds.launcher._experiment import Phase
from optuna_ds.launcher._resources import Resources
from optuna_ds.launcher._resources import Slot
from optuna_ds.launcher._tracking import MARK_VAR
from optuna_ds.launcher._tracking import end_marked
from optuna_ds.launcher._tracking import new_mark

_KILL_GRACE = 10.0


def _write_json(path: str, data: object) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _lookup(config: dict, key: str) -> object:
    """Find ``key`` anywhere in a nested config, as DeepSpeed's arg_mappings do."""
    if key in config:
        return config[key]
    for value in config.values():
        if isinstance(value, dict):
            found = _lookup(value, key)
            if found is not None:
                return found
    return None


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
    if stop is None:
        return proc.wait(timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            return proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            if stop.is_set():
                raise ExperimentInterrupted("the tuning was stopped") from None
            if deadline is not None and time.monotonic() >= deadline:
                raise


class ExperimentRunner:
    """Launches experiments as ``deepspeed --include HOST:IDS --master_port PORT SCRIPT ARGS``.

    Each launch gets its own process group, so a timeout or an interrupt ends the launcher
    and every rank it started by group id, never by name and never over ssh on one node.
    """

    def __init__(
        self,
        *,
        launcher: Sequence[str],
        script: str,
        script_args: Sequence[str],
        arg_mappings: dict[str, str],
        resources: Resources,
        master_port: int,
        master_addr: str = "",
        metric_key: str | None,
        exps_dir: str,
    ) -> None:
        self._launcher = list(launcher)
        self._script = script
        self._script_args = list(script_args)
        self._arg_mappings = dict(arg_mappings)
        self._resources = resources
        self._master_port = master_port
        self._master_addr = master_addr
        self._metric_key = metric_key
        self._exps_dir = exps_dir

    @property
    def master_port(self) -> int:
        return self._master_port

    def port(self, slot_index: int) -> int:
        """The rendezvous port of an experiment on slot ``slot_index``: one per slot, so
        experiments running at once on one node never share a port."""
        return self._master_port + slot_index

    def command(self, experiment: Experiment, config_path: str, *, slot: Slot, port: int) -> list[str]:
        args = replace_config_path(self._script_args, config_path)
        for key, flag in self._arg_mappings.items():
            value = _lookup(experiment.ds_config, key)
            if value is not None and value != "auto":
                args = set_arg(args, flag, str(value))
        launcher_args: list[str] = []
        if self._resources.multi_node and self._resources.hostfile:
            launcher_args += ["--hostfile", self._resources.hostfile]
        launcher_args += ["--include", slot.include, "--master_port", str(port)]
        if self._master_addr:
            launcher_args += ["--master_addr", self._master_addr]
        return self._launcher + launcher_args + [self._script] + args

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
    ) -> ExperimentResult:
        """Run one experiment to completion, timeout or interrupt, and classify the outcome.

        ``stop`` set from another thread ends the experiment and raises
        :class:`ExperimentInterrupted`. ``pass_fds`` (the slot's GPU locks) are inherited by the
        launcher, so its GPUs stay leased as long as it runs, even if this process dies.

        Files land where DeepSpeed's autotuner puts them: ``exps_dir/<name>.json`` and
        ``results_dir/<name>/`` with cmd.txt, ds_config.json, exp.json, metrics.json,
        stdout.log and stderr.log.
        """
        result_dir = experiment.result_dir
        os.makedirs(result_dir, exist_ok=True)
        os.makedirs(self._exps_dir, exist_ok=True)
        # A stale metrics file from an earlier run must never be read as this run's result.
        for stale in (experiment.metric_path, experiment.model_info_path):
            if os.path.exists(stale):
                os.remove(stale)
        config_path = os.path.join(result_dir, "ds_config.json")
        _write_json(config_path, experiment.ds_config)
        port = self.port(slot_index)
        cmd = self.command(experiment, config_path, slot=slot, port=port)
        mark = new_mark()  # in the description too: a resumed tuning ends an orphan's escapees by it
        description = experiment.to_dict() | {"cmd": cmd, "slot": slot.hosts, "master_port": port, "mark": mark}
        _write_json(os.path.join(self._exps_dir, f"{experiment.name}.json"), description)
        _write_json(os.path.join(result_dir, "exp.json"), description)
        with open(os.path.join(result_dir, "cmd.txt"), "w", encoding="utf-8") as f:
            f.write(" ".join(cmd) + "\n")

        stdout_path = os.path.join(result_dir, "stdout.log")
        stderr_path = os.path.join(result_dir, "stderr.log")
        env = dict(os.environ, PYTHONUNBUFFERED="1", **{MARK_VAR: mark})
        start = time.monotonic()
        timed_out = False
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, start_new_session=True, pass_fds=tuple(pass_fds)
            )
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
        problem = ""
        try:
            if experiment.phase is Phase.PROFILE:
                metrics = read_metrics(experiment.model_info_path, "num_params")
            else:
                metrics = read_metrics(experiment.metric_path, self._metric_key)
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
        )
