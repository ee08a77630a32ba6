"""Tunings at once on one storage: on one study they share the work and run each experiment
once; a name that would share another tuning's studies is refused; a tuning waiting for GPUs
another process holds says so."""

from __future__ import annotations

import collections
import fcntl
import os
import re
import select
import socket
import subprocess
import time

import pytest

from conftest import assert_one_line_error
from invariants import Hostile
from invariants import assert_no_traceback
from invariants import base_config
from invariants import hws  # noqa: F401


def test_concurrent_tunings_on_one_study_and_on_its_stage_name(hws: Hostile) -> None:
    hws.config(base_config(train_micro_batch_size_per_gpu=[2, 4, 6, 8]))
    env = {"LOCAL_SIZE": "2", "HOSTILE_DS_SLOW": "1"}
    table = {"default": "slow"}
    same = [hws.popen("tune", *hws.hostile_args("--num_gpus", "1", "--study-name", "gpt2"), table=table, **env) for _ in range(2)]
    stage_named = hws.popen("tune", *hws.hostile_args("--num_gpus", "1", "--study-name", "gpt2-z1"), table=table, **env)
    out, err = stage_named.communicate(timeout=120)
    assert_one_line_error(subprocess.CompletedProcess(stage_named.args, stage_named.returncode, out, err), "gpt2-z1")
    for p in same:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "Traceback" not in out + err
    starts = collections.Counter(e["name"] for e in hws.experiments())
    # The listed sizes, each launched once (a re-measurement, ``_r<k>``, is a launch of its own).
    assert {re.sub(r"_r\d+$", "", name) for name in starts} == {f"z1_gas1_tmbspg{m}" for m in (2, 4, 6, 8)}
    assert max(starts.values()) == 1, starts
    hws.assert_nothing_left()
    hws.assert_untouched()


def test_waiting_for_a_gpu_held_by_another_process_says_so(hws: Hostile) -> None:
    hws.config(base_config())
    locks = hws.base / "locks"
    locks.mkdir()
    fd = os.open(locks / "localhost-0.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{os.getpid()}\n".encode())
        tuner = hws.popen("tune", *hws.hostile_args(), table={})
        said = _read_until(tuner, "waiting for a free CPU device slot", timeout=120)  # no GPU here: not called one
        assert not any(True for _ in hws.experiments())
    finally:
        os.close(fd)
    out, err = tuner.communicate(timeout=120)
    assert tuner.returncode == 0, err
    assert_no_traceback(type("P", (), {"stdout": said + out, "stderr": err}))  # type: ignore[arg-type]
    assert "waiting for a free CPU device slot" in said and f"pid {os.getpid()}" in said, said + out


def test_a_resume_with_nothing_to_launch_does_not_wait_for_a_held_device(hws: Hostile) -> None:
    hws.config(base_config())
    first = hws.main()
    assert first.returncode == 0, first.stderr
    locks = hws.base / "locks"
    locks.mkdir(exist_ok=True)
    fd = os.open(locks / "localhost-0.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another tuning's experiment, for as long as this one runs
        again = hws.popen("tune", *hws.hostile_args())
        try:
            out, err = again.communicate(timeout=120)  # waiting for the device, it would not end before the lock is freed
        except subprocess.TimeoutExpired:
            again.kill()
            out, err = again.communicate()
    finally:
        os.close(fd)
    assert again.returncode == 0, err + out
    assert "waiting for" not in out and "the planner stopped" in out, out


def _read_until(proc: subprocess.Popen[str], text: str, *, timeout: float) -> str:
    """``proc``'s stdout up to ``text`` (the tuner flushes each line), however long a busy
    machine takes to start it; fails after ``timeout`` seconds. Read from the descriptor: what
    follows is left in the pipe for ``communicate``."""
    assert proc.stdout is not None
    fd, seen = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk:
            proc.kill()
            raise AssertionError(f"no {text!r} in {timeout} s; stdout: {seen.decode(errors='replace')}")
        seen += chunk
    return seen.decode()


@pytest.mark.timeout(300)  # a worker that waits for ever fails the test here
def test_a_worker_never_waits_for_a_profile_run_that_failed_was_abandoned_or_outlasts_its_wait(hws: Hostile) -> None:
    """A worker waiting for the tuning's profile run (issue 34, row 9): a profile run stored as
    failed, or whose process died on this host, ends it at once in one line; one still running
    ends it after --wait. Before, it printed "waiting for the profile run" for ever."""
    import signal

    hws.config(base_config(autotuning={"enabled": True}))  # no model_info: the tuning profiles first
    failed = hws.hostile(table={"profile": "no_metrics"})
    assert failed.returncode == 1 and "the profile run failed" in failed.stderr, failed.stderr
    worker = hws.cli("worker", "--storage", hws.storage, "--wait", "600")
    assert worker.returncode == 1 and "tuning 'optuna-ds': the profile run failed (no-metrics" in worker.stderr, worker.stderr
    assert len(worker.stderr.strip().splitlines()) == 1, worker.stderr

    tune = hws.popen("tune", *hws.hostile_args(), table={"profile": "hang"})
    try:
        deadline = time.monotonic() + 120
        while sum(e["profile"] and e["event"] == "start" for e in hws.events()) < 2:  # the first tune's, then this one's
            assert time.monotonic() < deadline and tune.poll() is None, tune.communicate()
            time.sleep(0.1)
        waiting = hws.cli("worker", "--storage", hws.storage, "--wait", "1")
        assert waiting.returncode == 1 and "has not ended after 1 s" in waiting.stderr, waiting.stderr
        os.killpg(tune.pid, signal.SIGKILL)
        tune.wait()
        abandoned = hws.cli("worker", "--storage", hws.storage, "--wait", "600")
        assert abandoned.returncode == 1 and "was abandoned: its process died" in abandoned.stderr, abandoned.stderr
    finally:
        if tune.poll() is None:
            os.killpg(tune.pid, signal.SIGKILL)
        tune.communicate()
        for e in hws.events():  # the hanging profile run, in a session of its own, if it outlived its tuner
            if e["profile"]:
                try:
                    os.kill(e["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
    hws.assert_untouched()


def test_overwrite_is_refused_while_another_process_runs_the_tuning(hws: Hostile) -> None:
    """`tune --overwrite` while the same tuning runs elsewhere deleted its studies under it: the
    first died with an internal error (issue 34, row 12). It is refused in one line while the
    tuning has an experiment running whose process is alive; once that process has ended (here
    by SIGTERM, its experiment marked to run again), --overwrite starts afresh."""
    import signal

    hws.config(base_config())
    first = hws.popen("tune", *hws.hostile_args(), table={"default": "slow"}, HOSTILE_DS_SLOW="600")
    try:
        deadline = time.monotonic() + 120
        while not any(e["event"] == "start" for e in hws.events()):
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.1)
        refused = hws.main("--overwrite")
        assert_one_line_error(refused, "--overwrite", "1 experiment(s) running", "stop its processes first")
        assert len(hws.experiments()) == 1
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 143, err
    assert_no_traceback(subprocess.CompletedProcess([], first.returncode, out, err))
    again = hws.main("--overwrite")
    assert again.returncode == 0, again.stderr
    assert len(hws.experiments()) > 1
    hws.assert_nothing_left()
    hws.assert_untouched()


def test_a_tuning_deleted_under_a_running_process_ends_it_in_one_line(hws: Hostile, monkeypatch) -> None:
    """An --overwrite elsewhere that deletes the tuning between its check and this process's
    next write (simulated: deleted while the first experiment runs) ends this process with one
    line saying so, never an internal error (issue 34, row 12)."""
    from optuna_ds.launcher import ExperimentRunner
    from optuna_ds.storage import create_storage
    from optuna_ds.storage import delete_tuning

    real = ExperimentRunner.run

    def deleted(self, experiment, **kwargs):  # type: ignore[no-untyped-def]
        result = real(self, experiment, **kwargs)
        delete_tuning(create_storage(hws.storage), "optuna-ds")
        return result

    monkeypatch.setattr(ExperimentRunner, "run", deleted)
    hws.config(base_config())
    proc = hws.main()
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "optuna-ds: error: tuning 'optuna-ds' was deleted while this process ran it (`optuna-ds tune --overwrite` elsewhere?)"]
    assert_no_traceback(proc)
    hws.assert_nothing_left()
    hws.assert_untouched()


def test_a_database_creation_held_by_a_stopped_process_is_one_line_not_a_hang(hws: Hostile, monkeypatch) -> None:
    """A tuning stopped (Ctrl-Z) while it created its SQLite database holds the creators' lock:
    every tune and worker on that database then waited in flock() for ever, saying nothing. It
    is waited for a while (SQLite's own wait for a writer), then told in one line."""
    from optuna_ds.storage import _storage

    monkeypatch.setattr(_storage, "_CREATION_WAIT", 0.5, raising=False)
    hws.config(base_config())
    hws.results.mkdir()
    lock = hws.results / "optuna-ds.db.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as the stopped creator holds it
        assert_one_line_error(hws.main(), "optuna-ds.db.lock", "stopped or hung")
        (hws.results / "optuna-ds.db").touch()  # a worker opening the database waits the same way
        assert_one_line_error(hws.main("worker", "--storage", hws.storage, "--wait", "600", config=None), "optuna-ds.db.lock")
    finally:
        os.close(fd)
    (hws.results / "optuna-ds.db").unlink()
    assert hws.main().returncode == 0  # the creator gone, the same command tunes
    assert hws.experiments()
    hws.assert_untouched()


def test_a_database_server_that_never_answers_is_one_line_not_a_hang(hws: Hostile, monkeypatch) -> None:
    """A MySQL or MariaDB port that accepts the connection and then says nothing (a stopped
    server, a tunnel whose far end is gone): the driver read its greeting with no timeout, and a
    worker or a tune waited for ever, saying nothing."""
    pytest.importorskip("pymysql")
    from optuna_ds.storage import _storage

    monkeypatch.setattr(_storage, "_SILENCE_LIMIT", 1, raising=False)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts into its backlog; nobody speaks
        url = f"mysql+pymysql://u:secret-pw@127.0.0.1:{silent.getsockname()[1]}/db"
        proc = hws.main("worker", "--storage", url, "--wait", "600", config=None)
    assert_one_line_error(proc, "127.0.0.1")
    assert "secret-pw" not in proc.stdout + proc.stderr
    hws.assert_untouched()
