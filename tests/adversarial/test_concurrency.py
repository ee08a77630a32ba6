"""Tunings at once on one storage: on one study they share the work and run each experiment
once; a name that would share another tuning's studies is refused; a tuning waiting for GPUs
another process holds says so."""

from __future__ import annotations

import collections
import fcntl
import os
import re
import select
import subprocess
import time

from invariants import Hostile
from invariants import assert_no_traceback
from invariants import assert_one_line_error
from invariants import base_config
from invariants import hws  # noqa: F401


def test_concurrent_tunings_on_one_study_and_on_its_stage_name(hws: Hostile) -> None:
    hws.config(base_config(train_micro_batch_size_per_gpu=[2, 4, 6, 8]))
    env = {"LOCAL_SIZE": "2", "HOSTILE_DS_SLOW": "1"}
    table = {"default": "slow"}
    same = [hws.popen("tune", *hws.hostile_args("--num_gpus", "1", "--study-name", "gpt2"), table=table, **env) for _ in range(2)]
    stage_named = hws.popen("tune", *hws.hostile_args("--num_gpus", "1", "--study-name", "gpt2-z1"), table=table, **env)
    out, err = stage_named.communicate(timeout=120)
    assert_one_line_error(type("P", (), {"returncode": stage_named.returncode, "stdout": out, "stderr": err}), "gpt2-z1")  # type: ignore[arg-type]
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
