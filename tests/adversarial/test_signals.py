"""Ctrl-C and SIGTERM at each phase: the process exits with 128 + the signal, without a
traceback, leaves no process behind, and the same command resumes without running again
what finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from invariants import Hostile
from invariants import assert_no_traceback
from invariants import base_config
from invariants import hws  # noqa: F401


def _as_from_a_terminal(**kwargs) -> subprocess.Popen:
    """The tuner as a terminal starts it: with SIGHUP's default action. A suite run under
    ``nohup`` (or any parent that ignores SIGHUP) would pass the ignored SIGHUP on, and the tuner
    rightly outlives it, as a user's ``nohup optuna-ds tune`` must."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        return subprocess.Popen(**kwargs)
    finally:
        signal.signal(signal.SIGHUP, previous)


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def _resumes_to_its_choice(hws: Hostile) -> None:
    """Nothing of the stopped tuning is left running; run again, it finishes with the choice an
    uninterrupted run makes, each experiment once, and nothing outside its places touched."""
    hws.assert_nothing_left()
    again = hws.hostile(table={"default": "ok"})
    assert again.returncode == 0, again.stderr
    assert json.loads((hws.results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] == 4
    hws.assert_finished_once()
    hws.assert_nothing_left()
    hws.assert_untouched()


@pytest.mark.parametrize("phase, signum", [
    ("profile", signal.SIGTERM),
    ("experiment", signal.SIGINT),
    ("outputs", signal.SIGTERM),
])
def test_a_signal_at_each_phase_of_tune(hws: Hostile, phase: str, signum: int) -> None:
    config = base_config(train_micro_batch_size_per_gpu=[2, 4])
    if phase == "profile":
        config["autotuning"] = {"enabled": True}
    hws.config(config)
    table = {"profile": "slow", "2": "slow", "4": "ok"}
    tuner = hws.popen("tune", *hws.hostile_args(), table=table, HOSTILE_DS_SLOW="3")
    moment = {
        "profile": lambda: any(e["profile"] for e in hws.events()),
        "experiment": lambda: any(e["mbs"] == 2 and not e["profile"] for e in hws.events()),
        # the last experiment ended: the summary, report and optimal files are being written
        "outputs": lambda: any(e["event"] == "end" and e["mbs"] == 4 for e in hws.events()),
    }[phase]
    _wait_for(moment)
    os.kill(tuner.pid, signum)
    out, err = tuner.communicate(timeout=60)
    proc = type("P", (), {"stdout": out, "stderr": err})
    assert_no_traceback(proc)  # type: ignore[arg-type]
    assert tuner.returncode in ((0, 128 + signum) if phase == "outputs" else (128 + signum,)), (tuner.returncode, err)
    if tuner.returncode:
        assert f"interrupted by {signal.Signals(signum).name}" in err
    _resumes_to_its_choice(hws)


def test_sigterm_during_runs_training(hws: Hostile) -> None:
    hws.config(base_config())
    runner = hws.popen("run", *hws.hostile_args(), table={"training": "setsid"}, HOSTILE_DS_TRAIN_SECONDS="60")
    _wait_for(lambda: any(e["training"] and e["children"] for e in hws.events()))
    os.kill(runner.pid, signal.SIGTERM)
    out, err = runner.communicate(timeout=60)
    assert runner.returncode == 143, (runner.returncode, err)
    assert "Traceback" not in out + err
    hws.assert_nothing_left()
    hws.assert_untouched()


def _study_states(hws: Hostile) -> list[str]:
    import optuna

    return [t.state.name for t in optuna.load_study(study_name="optuna-ds-z1", storage=hws.storage).get_trials()]


def test_sighup_with_the_terminal_gone_ends_the_tuning_as_sigterm_does(hws: Hostile) -> None:
    """ssh dropped: the terminal hangs up (writes to it fail) and the tuner gets SIGHUP. It ends
    its experiment, marks the trial interrupted, writes the partial summary, and exits 129."""
    import pty
    import select
    import subprocess
    import sys
    import threading

    hws.config(base_config(train_micro_batch_size_per_gpu=[2, 4]))
    master, slave = pty.openpty()
    env = hws.env(HOSTILE_DS_TABLE=json.dumps({"2": "ok", "4": "hang"}))
    tuner = _as_from_a_terminal(args=[sys.executable, "-m", "optuna_ds", "tune", *hws.hostile_args()], cwd=hws.root, env=env,
                                stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    # The terminal is read while it is there, as a terminal is: the progress display redraws
    # twice a second, and a pty nobody reads takes about 20 KB (some 40 s of it) before the
    # tuner's next write blocks, for good. On a loaded machine the second experiment started
    # later than that, and never did.
    gone = threading.Event()

    def terminal() -> None:
        while not gone.is_set():
            if select.select([master], [], [], 0.05)[0] and not os.read(master, 65536):
                return

    reader = threading.Thread(target=terminal, daemon=True)
    reader.start()
    try:
        # Deadlines against a hang only: on a loaded machine the tuner takes seconds to start.
        _wait_for(lambda: any(e["mbs"] == 4 and e["event"] == "start" for e in hws.events()), timeout=300)
        gone.set()
        reader.join()
        os.close(master)  # the terminal is gone
        master = -1
        os.kill(tuner.pid, signal.SIGHUP)
        assert tuner.wait(timeout=300) == 128 + signal.SIGHUP
    finally:
        gone.set()
        reader.join()
        if master != -1:
            os.close(master)
        if tuner.poll() is None:
            tuner.kill()
    assert (hws.results / "optuna_ds_summary.txt").read_text().startswith("PARTIAL: interrupted after 1 experiment(s)")
    assert not (hws.results / "ds_config_optimal.json").exists()
    assert "RUNNING" not in _study_states(hws)
    _resumes_to_its_choice(hws)


def test_a_sigkilled_tuner_takes_its_experiments_with_it(hws: Hostile) -> None:
    """No handler runs on SIGKILL: the experiment, in a session of its own, would run on with no
    timeout and its GPUs leased. It gets SIGTERM from the kernel when its tuner dies; what it
    started outside its group is ended by the resume (by its mark), and it runs again."""
    hws.config(base_config(train_micro_batch_size_per_gpu=[2]))
    tuner = hws.popen("tune", *hws.hostile_args(), table={"2": "setsid"}, HOSTILE_DS_SLOW="600")
    _wait_for(lambda: any(e["event"] == "child" and not e["profile"] for e in hws.events()))
    os.kill(tuner.pid, signal.SIGKILL)
    tuner.communicate(timeout=60)
    launcher = next(e["pid"] for e in hws.events() if e["event"] == "start")
    def gone() -> bool:
        try:
            with open(f"/proc/{launcher}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    _wait_for(gone, timeout=60)  # generous: a loaded machine is slow to reap
    again = hws.hostile(table={"default": "ok"})
    assert again.returncode == 0, again.stderr
    assert [e["mbs"] for e in hws.experiments()].count(2) == 2
    hws.assert_finished_once()
    hws.assert_nothing_left()
    hws.assert_untouched()


# In the tuner, the report's temp file is made, the test told, and the write waits for the signal.
_HOLD_THE_REPORT = """
import os, sys, time, types
from optuna_ds import _files
def fdopen(fd, *args, **kwargs):
    if ".report.html." in os.readlink(f"/proc/self/fd/{fd}"):
        open(os.environ["HOLD_MARK"], "w").close()
        while True:
            time.sleep(0.05)  # the test's signal arrives here
    return os.fdopen(fd, *args, **kwargs)
_files.os = types.SimpleNamespace(**{**vars(os), "fdopen": fdopen})
from optuna_ds.cli import main
sys.argv[0] = "optuna-ds"
main()
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_the_outputs_are_written_unwinds_and_leaves_no_temp_file(hws: Hostile, signum: int) -> None:
    """SIGTERM or SIGHUP while the summary, report and optimal files were written killed the
    tuner where it stood: no "interrupted" line, and the report's temp file left in the results
    folder for good (one more each time). The outputs unwind as Ctrl-C does."""
    import subprocess
    import sys

    hws.config(base_config())
    mark = hws.base / "writing-the-report"
    env = hws.env(HOSTILE_DS_TABLE="{}", HOLD_MARK=str(mark))
    tuner = _as_from_a_terminal(args=[sys.executable, "-c", _HOLD_THE_REPORT, "tune", *hws.hostile_args()], cwd=hws.root, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for(lambda: mark.exists() or tuner.poll() is not None, timeout=300)
    assert mark.exists(), tuner.communicate()
    os.kill(tuner.pid, signum)
    out, err = tuner.communicate(timeout=60)
    assert tuner.returncode == 128 + signum, (tuner.returncode, err)
    assert f"interrupted by {signal.Signals(signum).name}" in err
    assert_no_traceback(type("P", (), {"stdout": out, "stderr": err}))  # type: ignore[arg-type]
    assert not [f for f in os.listdir(hws.results) if f.endswith(".tmp")], os.listdir(hws.results)
    mark.unlink()
    _resumes_to_its_choice(hws)


@pytest.mark.parametrize("watched", [True, False])
def test_a_run_lasts_until_its_own_exit_not_until_the_stopped_tuner_sees_it(
        tmp_path, monkeypatch, watched: bool) -> None:
    """Issue 50 row 9: the tuner stopped (SIGSTOP) for 120 s during a 15 s run recorded 130 s,
    and the summary's device-hours and the planner's price of a launch with it. Here the slot's
    thread does not run from the launch until a while after the run has exited (its on_start
    callback is where it stops): the run's duration is its own, up to its exit. ``watched``: a
    slot told to stop the tuning (the tuning's runs) or not (the profile run)."""
    import sys
    import threading

    from conftest import FAKE_LAUNCHER
    from optuna_ds.domain import Config
    from optuna_ds.domain import Experiment
    from optuna_ds.domain import Phase
    from optuna_ds.launcher import CommandBuilder
    from optuna_ds.launcher import ExperimentRunner
    from optuna_ds.launcher import Resources

    monkeypatch.setenv("FAKE_DS_SURFACE", json.dumps({"duration": 0.3}))
    script = tmp_path / "train.py"
    script.write_text("")
    commands = CommandBuilder(deepspeed_bin=(sys.executable, FAKE_LAUNCHER), script=str(script),
                              script_args=("--deepspeed_config", "orig.json"), arg_mappings={})
    runner = ExperimentRunner(commands=commands, master_port=29760, metric_key="throughput",
                              exps_dir=str(tmp_path / "exps"))
    result_dir = str(tmp_path / "results" / "z1_gas1_tmbspg2")
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 1},
              "autotuning": {"enabled": True, "metric_path": f"{result_dir}/metrics.json"}}
    experiment = Experiment(name="z1_gas1_tmbspg2", phase=Phase.MICRO_BATCH, ds_config=config,
                            config=Config(stage=1, micro_batch=2), result_dir=result_dir)
    slot = Resources(hosts={"localhost": [0]}, gpus_per_node=1, nodes_per_experiment=1,
                     device_memory=1e9, hostfile=None, multi_node=False).slots()[0]
    exited: list[float] = []

    def stopped_until_after_the_exit(pid: int) -> None:
        # The launcher is a zombie once it has exited, until this process reaps it.
        with open(f"/proc/{pid}/stat") as f:
            _wait_for(lambda: f.seek(0) == 0 and f.read().rsplit(")", 1)[1].split()[0] == "Z")
        exited.append(time.monotonic())
        time.sleep(1.0)  # the tuner stopped a while longer: the run is over meanwhile

    started = time.monotonic()
    result = runner.run(experiment, slot=slot, timeout=60, on_start=stopped_until_after_the_exit,
                        stop=threading.Event() if watched else None)
    assert result.ok, result.detail
    assert 0.3 <= result.duration <= exited[0] - started, (result.duration, exited[0] - started)
