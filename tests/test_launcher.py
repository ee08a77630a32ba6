from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import FAKE_LAUNCHER
from optuna_ds.domain import Config
from optuna_ds.domain import Experiment
from optuna_ds.domain import FailureReason
from optuna_ds.domain import Phase
from optuna_ds.launcher import CommandBuilder
from optuna_ds.launcher import ExperimentFiles
from optuna_ds.launcher import ExperimentInterrupted
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import Resources
from optuna_ds.launcher import Slot
from optuna_ds.launcher import BadMetrics
from optuna_ds.launcher import classify
from optuna_ds.launcher import read_metrics

HOSTILE = Path(__file__).parent / "adversarial" / "hostile_deepspeed.py"


def test_success_needs_exit_zero_and_metrics_not_silence_in_stderr() -> None:
    warn = "UserWarning: ErrorHandler is deprecated\nERROR in a log line that is harmless"
    assert classify(returncode=0, timed_out=False, metrics={"throughput": 1.0}, stdout_tail="", stderr_tail=warn) == (None, "")


@pytest.mark.parametrize(
    ("returncode", "metrics", "stderr", "reason"),
    [
        (1, None, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB", FailureReason.OOM),
        (1, None, "RuntimeError: RESOURCE_EXHAUSTED: failed to allocate", FailureReason.OOM),
        (-9, None, "", FailureReason.OOM),
        (1, None, "RuntimeError: NCCL error", FailureReason.ERROR),
        (0, None, "", FailureReason.NO_METRICS),
        (2, {"throughput": 1.0}, "", FailureReason.ERROR),
    ],
)
def test_failures_are_classified_from_structured_signals(returncode, metrics, stderr, reason) -> None:
    got, detail = classify(returncode=returncode, timed_out=False, metrics=metrics, stdout_tail="", stderr_tail=stderr)
    assert got is reason and detail


@pytest.mark.parametrize(
    ("stderr", "reason", "line"),
    [
        ("usage: train.py [-h]\ntrain.py: error: unrecognized arguments: --num_gpus 1\n[ERROR] [launch.py:325] exits with return code = 2",
         FailureReason.SCRIPT, "train.py: error: unrecognized arguments: --num_gpus 1"),
        ("[rank0]: ModuleNotFoundError: No module named 'datasets'", FailureReason.SCRIPT, "No module named 'datasets'"),
        ("/usr/bin/python: can't open file '/x/train.py': [Errno 2] No such file or directory", FailureReason.SCRIPT, "can't open file"),
        ("FileNotFoundError: [Errno 2] No such file or directory: 'data/train.bin'", FailureReason.SCRIPT, "data/train.bin"),
        # DeepSpeed building an op (which ops depends on the optimizer and offload): the config's.
        ('File "/d/deepspeed/ops/op_builder/builder.py"\nFileNotFoundError: [Errno 2] No such file or directory: \'nvcc\'', FailureReason.ERROR, "nvcc"),
        ("RuntimeError: error: something in the engine", FailureReason.ERROR, "RuntimeError"),
    ],
)
def test_a_failure_no_config_can_fix_is_told_apart(stderr: str, reason: FailureReason, line: str) -> None:
    got, detail = classify(returncode=2, timed_out=False, metrics=None, stdout_tail="", stderr_tail=stderr)
    assert got is reason and line in detail


@pytest.mark.parametrize(
    ("stderr", "line"),
    [
        ("Traceback (most recent call last):\nOSError: [Errno 28] No space left on device: '/r/z2/metrics.json'", "[Errno 28]"),
        ("PermissionError: [Errno 13] Permission denied: '/r/z2/metrics.json'", "[Errno 13]"),
        ("OSError: [Errno 30] Read-only file system: '/r/z2/metrics.json'", "Read-only file system"),
        ("RuntimeError: No space left on device", "No space left on device"),
        ("pdsh@node0: node1: ssh exited with exit code 255", "ssh exited with exit code 255"),
        ("ssh: connect to host node1 port 22: No route to host", "No route to host"),
    ],
)
def test_a_failure_of_the_machine_never_judges_the_config(stderr: str, line: str) -> None:
    """Issue 50 row 1: the disk full, a folder read-only or unwritable, a node lost: the machine's
    failure, which runs again on resume, never the config's; a metrics file the machine keeps from
    being read alike."""
    got, detail = classify(returncode=1, timed_out=False, metrics=None, stdout_tail="", stderr_tail=stderr)
    assert got is FailureReason.MACHINE and line in detail and not got.judges_config
    problem = "metrics file unreadable: [Errno 13] Permission denied"
    assert classify(returncode=0, timed_out=False, metrics=None, stdout_tail="", stderr_tail="", metrics_problem=problem)[0] is FailureReason.MACHINE


def test_a_lost_exit_status_is_judged_by_the_measurement_never_made_up() -> None:
    """The launch server died with the status: a metrics file is a result, an explicit OOM is an
    OOM, anything else runs again (interrupted), never "exit status 1"."""
    assert classify(returncode=None, timed_out=False, metrics={"throughput": 1.0}, stdout_tail="", stderr_tail="") == (None, "")
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"
    assert classify(returncode=None, timed_out=False, metrics=None, stdout_tail="", stderr_tail=oom)[0] is FailureReason.OOM
    reason, detail = classify(returncode=None, timed_out=False, metrics=None, stdout_tail="", stderr_tail="RuntimeError: x")
    assert reason is FailureReason.INTERRUPTED and "lost" in detail


@pytest.mark.parametrize("text", ['{"latency": 5e-324}', '{"latency": 1%s}' % ("0" * 400), '{"latency": 1e-320}'])
def test_a_metric_whose_rate_is_not_finite_is_a_bad_measurement(tmp_path: Path, text: str) -> None:
    # 1 / 5e-324 is infinite, a 401-digit integer is no float: the planner's log rate would be
    # NaN, and a resume would crash on the stored value.
    path = tmp_path / "metrics.json"
    path.write_text(text)
    with pytest.raises(BadMetrics, match="finite"):
        read_metrics(str(path), "latency")
    path.write_text('{"latency": 1e-300}')
    assert read_metrics(str(path), "latency") == {"latency": 1e-300}


def test_timeout_wins() -> None:
    assert classify(returncode=-15, timed_out=True, metrics=None, stdout_tail="", stderr_tail="")[0] is FailureReason.TIMEOUT


def _runner(tmp_path: Path, script: Path) -> ExperimentRunner:
    commands = CommandBuilder(
        deepspeed_bin=(sys.executable, FAKE_LAUNCHER), script=str(script), script_args=("--deepspeed_config", "orig.json", "--bs", "1"),
        arg_mappings={"train_micro_batch_size_per_gpu": "--bs"},
    )
    return ExperimentRunner(commands=commands, master_port=29700, metric_key="throughput", exps_dir=str(tmp_path / "exps"))


def _experiment(tmp_path: Path, mbs: int) -> Experiment:
    result_dir = str(tmp_path / "results" / f"z1_gas1_tmbspg{mbs}")
    config = {"train_micro_batch_size_per_gpu": mbs, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 1},
              "autotuning": {"enabled": True, "metric_path": f"{result_dir}/metrics.json"}}
    return Experiment(name=f"z1_gas1_tmbspg{mbs}", phase=Phase.MICRO_BATCH, config=Config(stage=1, micro_batch=mbs), ds_config=config,
                      result_dir=result_dir)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("")
    return path


def test_runner_writes_deepspeeds_files_and_maps_args(tmp_path: Path, script: Path, monkeypatch) -> None:
    log = tmp_path / "launches.jsonl"
    monkeypatch.setenv("FAKE_DS_LOG", str(log))
    monkeypatch.setenv("FAKE_DS_SURFACE", "{}")
    runner = _runner(tmp_path, script)
    exp = _experiment(tmp_path, 8)
    slot = Resources(hosts={"localhost": [0, 1]}, gpus_per_node=1, nodes_per_experiment=1, device_memory=1e9, hostfile=None, multi_node=False).slots()[1]
    result = runner.run(exp, slot=slot, slot_index=1, timeout=60)
    assert result.ok, result
    assert result.metrics["throughput"] > 0
    files = sorted(os.listdir(exp.result_dir))
    assert files == ["cmd.txt", "ds_config.json", "exp.json", "metrics.json", "stderr.log", "stdout.log"]
    assert (tmp_path / "exps" / "z1_gas1_tmbspg8.json").exists()
    launch = json.loads(log.read_text())
    assert launch["include"] == "localhost:1" and launch["master_port"] == 29701
    assert launch["args"] == ["--deepspeed_config", f"{exp.result_dir}/ds_config.json", "--bs", "8"]
    assert "--include localhost:1 --master_port 29701" in (Path(exp.result_dir) / "cmd.txt").read_text()


def test_a_stale_metrics_file_is_never_read(tmp_path: Path, script: Path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_DS_SURFACE", json.dumps({"no_metrics_at": [4]}))
    exp = _experiment(tmp_path, 4)
    os.makedirs(exp.result_dir)
    Path(ExperimentFiles(exp.result_dir).metrics).write_text(json.dumps({"throughput": 999.0}))
    result = _runner(tmp_path, script).run(exp, slot=_slot(), timeout=60)
    assert result.reason is FailureReason.NO_METRICS


def _slot():
    return Resources(hosts={"localhost": [0]}, gpus_per_node=1, nodes_per_experiment=1, device_memory=1e9, hostfile=None, multi_node=False).slots()[0]


def test_timeout_kills_the_whole_process_group(tmp_path: Path, script: Path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_DS_SURFACE", json.dumps({"hang_at": [2]}))
    exp = _experiment(tmp_path, 2)
    start = time.monotonic()
    result = _runner(tmp_path, script).run(exp, slot=_slot(), timeout=3)
    assert result.reason is FailureReason.TIMEOUT
    assert time.monotonic() - start < 20
    child = int(re.search(r"child pid (\d+)", (Path(exp.result_dir) / "stdout.log").read_text()).group(1))
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail("the launcher's child survived the timeout")


def test_a_build_lock_the_ended_experiment_left_is_removed_and_no_other(tmp_path: Path, script: Path, monkeypatch) -> None:
    """Ended while a rank held torch's build lock (loading an op), an experiment left it, and the
    next tuning was refused for it (torch removes it in a ``finally`` that SIGTERM skips). The
    lock made during the run and held by nobody once its group is gone is removed; one older
    than the run (another build's, whoever left it) is not the runner's to remove."""
    extensions = tmp_path / "extensions"
    (extensions / "older_op").mkdir(parents=True)
    (extensions / "older_op" / "lock").touch()
    past = time.time() - 60
    os.utime(extensions / "older_op" / "lock", (past, past))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
    monkeypatch.setenv("FAKE_DS_SURFACE", json.dumps({"hang_at": [2], "build_lock": "fused_adam"}))
    exp = _experiment(tmp_path, 2)
    stop = threading.Event()
    log = Path(exp.result_dir) / "stdout.log"
    # Ended (as Ctrl-C ends it) once the rank holds the lock, whatever the load.
    def end_once_it_holds_the_lock() -> None:
        while not (log.exists() and "holding the build lock" in log.read_text()):
            time.sleep(0.05)
        stop.set()

    threading.Thread(target=end_once_it_holds_the_lock, daemon=True).start()
    with pytest.raises(ExperimentInterrupted):
        _runner(tmp_path, script).run(exp, slot=_slot(), timeout=None, stop=stop)
    assert not (extensions / "fused_adam" / "lock").exists()
    assert (extensions / "older_op" / "lock").exists()
    # Timed out the same way: the lock removed, and said in the run's detail.
    (extensions / "fused_adam").rename(extensions / "fused_adam_done")
    result = _runner(tmp_path, script).run(exp, slot=_slot(), timeout=2)
    assert result.reason is FailureReason.TIMEOUT
    if "holding the build lock" in log.read_text():  # a loaded machine may time it out before
        assert not (extensions / "fused_adam" / "lock").exists()
        assert f"the op build lock it left as it was ended removed ({extensions / 'fused_adam' / 'lock'})" in result.detail
    assert (extensions / "older_op" / "lock").exists()


def test_oom_keeps_the_last_lines_of_stderr(tmp_path: Path, script: Path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_DS_SURFACE", json.dumps({"oom_above": {"1": 16}}))
    result = _runner(tmp_path, script).run(_experiment(tmp_path, 32), slot=_slot(), timeout=60)
    assert result.reason is FailureReason.OOM
    assert "CUDA out of memory" in result.stderr_tail


def test_slot_pool_never_leases_a_gpu_twice_and_a_dead_holder_frees_it(tmp_path: Path) -> None:
    import subprocess
    import threading

    from optuna_ds.launcher import Resources
    from optuna_ds.launcher import SlotPool

    resources = Resources(hosts={"localhost": [0, 1, 2, 3]}, gpus_per_node=2, nodes_per_experiment=1, device_memory=1e9, hostfile=None, multi_node=False)
    a, b = SlotPool(resources, lock_dir=str(tmp_path)), SlotPool(resources, lock_dir=str(tmp_path))
    first, second = a.try_acquire(), b.try_acquire()
    assert first is not None and second is not None
    assert {first.index, second.index} == {0, 1} and set(first.slot.hosts["localhost"]).isdisjoint(second.slot.hosts["localhost"])
    assert a.try_acquire() is None and b.try_acquire() is None  # all four GPUs taken
    # A child that inherits a lease (as an experiment's launcher does) keeps the GPUs after release.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], pass_fds=first.fds, start_new_session=True)
    a.release(first)
    assert b.try_acquire() is None
    child.kill()
    child.wait()
    again = b.acquire(threading.Event())
    assert again is not None and again.index == first.index


def test_rank_logs_of_an_experiment_are_its_own_and_classify_it(tmp_path: Path, script: Path, monkeypatch) -> None:
    """With --enable_each_rank_log the ranks write there: an OOM in a rank log is an OOM, and a
    previous run's rank log of the same experiment is not read."""
    from optuna_ds.launcher import LauncherOptions

    monkeypatch.setenv("FAKE_DS_SURFACE", "{}")
    ranks = tmp_path / "ranks"
    commands = CommandBuilder(deepspeed_bin=(sys.executable, FAKE_LAUNCHER), script=str(script), script_args=("--deepspeed_config", "o.json"),
                              arg_mappings={}, options=LauncherOptions(enable_each_rank_log=str(ranks)))
    runner = ExperimentRunner(commands=commands, master_port=29700, metric_key="throughput", exps_dir=str(tmp_path / "exps"))
    exp = _experiment(tmp_path, 4)
    (ranks / exp.name).mkdir(parents=True)
    (ranks / exp.name / "20250101000000_rank0.log").write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n")
    monkeypatch.setenv("FAKE_DS_SURFACE", json.dumps({"error_at": [4]}))
    result = runner.run(exp, slot=_slot(), timeout=60)
    assert result.reason is FailureReason.ERROR  # the stale OOM log was removed, not read
    assert "--enable_each_rank_log" in (Path(exp.result_dir) / "cmd.txt").read_text()
    # An OOM that a rank writes into its log during the run is found there.
    monkeypatch.setenv("FAKE_DS_SURFACE", json.dumps({"error_at": [4], "rank_log_text": "torch.OutOfMemoryError: CUDA out of memory."}))
    result = runner.run(exp, slot=_slot(), timeout=60)
    assert result.reason is FailureReason.OOM, result


def test_a_waiting_slot_sleeps_until_its_experiment_ends_or_the_tuning_stops() -> None:
    import subprocess
    import threading

    from optuna_ds.launcher import ExperimentInterrupted
    from optuna_ds.launcher._runner import _wait

    stop = threading.Event()
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.3); sys.exit(3)"])
    assert _wait(proc, timeout=None, stop=stop) == 3
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    threading.Timer(0.2, stop.set).start()
    start = time.monotonic()
    with pytest.raises(ExperimentInterrupted):
        _wait(proc, timeout=None, stop=stop)
    assert time.monotonic() - start < 5
    proc.kill()
    proc.wait()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    with pytest.raises(subprocess.TimeoutExpired):
        _wait(proc, timeout=0.3, stop=threading.Event())
    proc.kill()
    proc.wait()


def _hostile_runner(tmp_path: Path, script: Path, name: str) -> ExperimentRunner:
    """A tuning's runner with the hostile launcher, from the default port as every tuning starts."""
    commands = CommandBuilder(deepspeed_bin=(sys.executable, str(HOSTILE)), script=str(script), script_args=("--deepspeed_config", "orig.json"),
                              arg_mappings={})
    return ExperimentRunner(commands=commands, master_port=29733, metric_key="throughput", exps_dir=str(tmp_path / name / "exps"))


@pytest.fixture
def rendezvous(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOSTILE_DS_TABLE", json.dumps({"default": "rendezvous"}))
    monkeypatch.setenv("HOSTILE_DS_SLOW", "1")
    monkeypatch.setenv("FAKE_DS_LOG", str(tmp_path / "launches.jsonl"))
    monkeypatch.setenv("OPTUNA_DS_LOCK_DIR", str(tmp_path / "locks"))


def test_two_tunings_on_one_node_never_share_a_rendezvous_port(tmp_path: Path, script: Path, rendezvous) -> None:
    """``--include localhost:0`` and ``localhost:1``: both first slots, both from one base port."""
    import threading

    results: dict[int, Any] = {}
    threads = [threading.Thread(target=lambda gpu=gpu: results.update({gpu: _hostile_runner(tmp_path, script, f"t{gpu}").run(
        _experiment(tmp_path / f"t{gpu}", 2), slot=Slot({"localhost": [gpu]}), slot_index=0, timeout=60)})) for gpu in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r.ok for r in results.values()), results
    ports = {json.loads((tmp_path / f"t{gpu}" / "results" / "z1_gas1_tmbspg2" / "exp.json").read_text())["master_port"] for gpu in (0, 1)}
    assert len(ports) == 2, ports


def test_a_port_someone_else_listens_on_is_passed_and_one_taken_at_bind_runs_again(tmp_path: Path, script: Path, rendezvous,
                                                                                   monkeypatch) -> None:
    import socket

    runner = _hostile_runner(tmp_path, script, "t")
    with socket.socket() as squatter:
        squatter.bind(("", runner.port(0)))
        squatter.listen()
        result = runner.run(_experiment(tmp_path, 2), slot=Slot({"localhost": [0]}), timeout=60)
        assert result.ok and result.metrics["throughput"] == 20.0, result
        # Taken between the check and the bind (the check cannot see it): the node's fault, run again.
        from optuna_ds.launcher import _ports

        monkeypatch.setattr(_ports, "port_free", lambda port: True)
        told: list[str] = []
        result = runner.run(_experiment(tmp_path, 4), slot=Slot({"localhost": [0]}), timeout=60, on_retry=told.append)
    assert result.ok, result
    assert len(told) == 1 and "EADDRINUSE" in told[0], told
