"""The pre-warmed launch server failing under a running tuning: killed, stopped, never ready.
Its experiments keep their measurements, a lost run runs again, and no wait on it is unbounded.

DeepSpeed's per-node launcher is the hostile one here (``adversarial/served``), so each
experiment and the server start take a fraction of a second."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from optuna_ds.domain import Config
from optuna_ds.domain import Experiment
from optuna_ds.domain import ExperimentResult
from optuna_ds.domain import Phase
from optuna_ds.launcher import CommandBuilder
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import Slot
from optuna_ds.launcher import _launch_server
from optuna_ds.launcher import _runner

SERVED = Path(__file__).parent / "adversarial" / "served"


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A fresh launch server whose per-node launcher is the hostile one, and a runner using it."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SERVED), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("HOSTILE_SERVED", "light")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("FAKE_DS_LOG", str(tmp_path / "launches.jsonl"))
    monkeypatch.setenv("OPTUNA_DS_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("OPTUNA_STORAGE", "sqlite:///never-inherited.db")  # the tuner's, never the experiments'
    server = _launch_server.LaunchServer()
    monkeypatch.setattr(_runner, "launch_server", lambda: server)
    (tmp_path / "train.py").write_text("")
    commands = CommandBuilder(deepspeed_bin=(sys.executable, str(SERVED / "served_deepspeed.py")), script=str(tmp_path / "train.py"),
                              script_args=("--deepspeed_config", "orig.json"), arg_mappings={})
    runner = ExperimentRunner(commands=commands, master_port=29700, metric_key="throughput", exps_dir=str(tmp_path / "exps"),
                              local_start=True)
    try:
        yield {"server": server, "runner": runner, "log": tmp_path / "launches.jsonl"}
    finally:
        if server._proc.poll() is None:  # a test stopped it: ours to end
            server._proc.kill()
        server.close()


def _experiment(tmp_path: Path, mbs: int = 2) -> Experiment:
    result_dir = str(tmp_path / "results" / f"z1_gas1_tmbspg{mbs}")
    config = {"train_micro_batch_size_per_gpu": mbs, "zero_optimization": {"stage": 1},
              "autotuning": {"enabled": True, "metric_path": f"{result_dir}/metrics.json"}}
    return Experiment(name=f"z1_gas1_tmbspg{mbs}", phase=Phase.MICRO_BATCH, config=Config(stage=1, micro_batch=mbs), ds_config=config,
                      result_dir=result_dir)


def _run(runner: ExperimentRunner, experiment: Experiment, *, limit: float = 30, **kw: Any) -> ExperimentResult:
    """``runner.run`` in a thread: a hang fails the test after ``limit`` seconds instead of stalling the suite."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(runner.run(experiment, slot=Slot({"localhost": [0]}), timeout=60, **kw)),
                              daemon=True)
    thread.start()
    thread.join(limit)
    assert out, f"the run did not end within {limit} s"
    return out[0]


def _launches(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _gated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, behaviour: str) -> Path:
    """Launches that wait, where ``behaviour`` waits, until the returned path exists: what a
    test does to the server while its launcher runs is done before the launcher ends, however
    late the tuner's thread gets to it on a loaded machine."""
    monkeypatch.setenv("HOSTILE_DS_TABLE", json.dumps({"default": behaviour}))
    gate = tmp_path / "gate"
    monkeypatch.setenv("HOSTILE_DS_GATE", str(gate))
    return gate


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_measurement_outlives_the_server_killed_under_it(served: dict[str, Any], tmp_path: Path, monkeypatch) -> None:
    gate = _gated(monkeypatch, tmp_path, "slow")
    server = served["server"]

    def kill_server(pid: int) -> None:
        server._proc.kill()
        server._proc.wait()
        gate.touch()

    result = _run(served["runner"], _experiment(tmp_path), on_start=kill_server)
    assert result.ok, result
    assert result.returncode is None and result.metrics["throughput"] == 20.0  # no status, but it measured
    assert len([e for e in _launches(served["log"]) if e["event"] == "start"]) == 1


def test_a_run_lost_with_the_server_runs_again_at_once(served: dict[str, Any], tmp_path: Path, monkeypatch) -> None:
    gate = _gated(monkeypatch, tmp_path, "fail_first")
    server, told = served["server"], []

    def kill_server(pid: int) -> None:  # on the first launch; the second starts without the server
        if server._proc.poll() is None:
            server._proc.kill()
            server._proc.wait()
        gate.touch()

    result = _run(served["runner"], _experiment(tmp_path), on_start=kill_server, on_retry=told.append)
    assert result.ok, result  # the second run, started without the dead server
    assert len(told) == 1 and "exit status was lost" in told[0], told
    starts = [e for e in _launches(served["log"]) if e["event"] == "start"]
    assert len(starts) == 2


def test_a_server_that_never_gets_ready_costs_its_deadline(served: dict[str, Any], tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOSTILE_DS_TABLE", json.dumps({"default": "ok"}))
    monkeypatch.setattr(_launch_server, "_READY_SECONDS", 1.0, raising=False)
    server = served["server"]
    os.kill(server._proc.pid, signal.SIGSTOP)  # long before its imports are done
    result = _run(served["runner"], _experiment(tmp_path))
    assert result.ok, result
    assert server._proc.poll() is not None, "a server that missed its deadline was kept"


def test_an_exit_status_the_stopped_server_never_sends_is_lost_not_waited_for(served: dict[str, Any], tmp_path: Path,
                                                                              monkeypatch) -> None:
    # The launcher ends once the server is stopped: were it to end first, the server would
    # send its status before the stop (a loaded machine ran the launcher to its end before the
    # tuner's thread stopped the server, and the status came: 0, not lost).
    gate = _gated(monkeypatch, tmp_path, "slow")
    monkeypatch.setattr(_launch_server, "_REPLY_SECONDS", 1.0, raising=False)
    server = served["server"]

    def stop_server(pid: int) -> None:
        os.kill(server._proc.pid, signal.SIGSTOP)
        while not _stopped(server._proc.pid):  # the run's limit bounds this
            time.sleep(0.01)
        gate.touch()

    result = _run(served["runner"], _experiment(tmp_path), on_start=stop_server)
    assert result.ok and result.returncode is None, result


def test_the_server_ends_its_launchers_when_the_tuner_is_gone(served: dict[str, Any], tmp_path: Path, monkeypatch) -> None:
    """The tuner died (its end of the socket closed) with an experiment running: the experiment
    has no one left to time it out, and ends."""
    monkeypatch.setenv("HOSTILE_DS_TABLE", json.dumps({"default": "hang"}))
    server = served["server"]
    (tmp_path / "c.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "autotuning": {"enabled": True}}))
    read, write = os.pipe()
    with open(os.devnull, "wb") as null:
        served_process = server.start(["--world_info=x", str(tmp_path / "train.py"), "--deepspeed_config", str(tmp_path / "c.json")],
                                      stdout=null.fileno(), stderr=null.fileno(), env=dict(os.environ), pass_fds=(write,))
    os.close(write)
    assert served_process is not None
    server._sock.close()  # as the tuner's death would
    # The launcher held the pipe's write end: EOF once it is gone.
    ready = __import__("select").select([read], [], [], 20)[0]
    os.close(read)
    assert ready, "the launcher outlived its tuner"


def test_neither_the_server_nor_its_launchers_carry_the_storage_url(served: dict[str, Any], tmp_path: Path,
                                                                     monkeypatch) -> None:
    monkeypatch.setenv("HOSTILE_DS_TABLE", json.dumps({"default": "ok"}))
    assert _run(served["runner"], _experiment(tmp_path)).ok
    with open(f"/proc/{served['server']._proc.pid}/environ", "rb") as f:
        assert b"OPTUNA_STORAGE=" not in f.read()
    starts = [e for e in _launches(served["log"]) if e["event"] == "start"]
    assert starts and [e["storage_env"] for e in starts] == [None] * len(starts)
