"""A launcher that lies, floods, hides and refuses to die: results stay right, output stays
clean, and nothing it started outlives the tuning."""

from __future__ import annotations

import json
import os

import optuna

from conftest import assert_one_line_error
from invariants import Hostile
from invariants import assert_no_traceback
from invariants import base_config
from invariants import hws  # noqa: F401


def _trials(hws: Hostile) -> dict[int, optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="optuna-ds-z1", storage=hws.storage)
    return {t.user_attrs["micro_batch_size"]: t for t in study.get_trials() if "exp_name" in t.user_attrs}


def test_wrong_metrics_are_failures_never_the_optimum(hws: Hostile) -> None:
    table = {"2": "inf", "4": "ok", "6": "malformed", "8": "nan", "10": "negative", "12": "string", "14": "no_metrics"}
    hws.config(base_config(train_micro_batch_size_per_gpu=[2, 4, 6, 8, 10, 12, 14]))
    proc = hws.hostile(table=table)
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    optimal = json.loads((hws.results / "ds_config_optimal.json").read_text())
    assert optimal["train_micro_batch_size_per_gpu"] == 4
    trials = _trials(hws)
    reasons = {mbs: t.user_attrs.get("reason") for mbs, t in trials.items()}
    assert reasons == {2: "bad-metrics", 4: None, 6: "bad-metrics", 8: "bad-metrics", 10: "bad-metrics",
                       12: "bad-metrics", 14: "no-metrics"}
    assert "not valid JSON" in trials[6].user_attrs["detail"]
    assert "inf" in trials[2].user_attrs["detail"]
    hws.assert_finished_once()
    hws.assert_untouched()


def test_control_bytes_and_floods_of_stderr_reach_nobody_raw(hws: Hostile) -> None:
    hws.config(base_config(train_micro_batch_size_per_gpu=[2, 4, 6]))
    proc = hws.hostile("ds_config.json", "-v", table={"2": "control_bytes", "4": "huge_stderr", "6": "ok"})
    assert proc.returncode == 0, proc.stderr
    for text in (proc.stdout, proc.stderr):
        assert not any(c in text for c in "\x1b\x07\r"), repr(text[-500:])
    trials = _trials(hws)
    for t in trials.values():
        tail = t.user_attrs.get("stderr_tail", "")
        assert not any(ord(c) < 32 and c not in "\n\t" for c in tail), repr(tail)
    assert "RuntimeError: red" in trials[2].user_attrs["stderr_tail"]
    assert "the real cause at the end" in trials[4].user_attrs["detail"]
    assert len(trials[4].user_attrs["stderr_tail"]) < 30_000
    hws.assert_untouched()


def test_hung_deaf_escaping_and_dying_runs_are_ended(hws: Hostile) -> None:
    hws.config(base_config(train_micro_batch_size_per_gpu=[2, 4, 6, 8]))
    table = {"2": "hang", "4": "ignore_sigterm", "6": "setsid", "8": "die"}
    proc = hws.hostile("ds_config.json", "--trial-timeout", "2", table=table)
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    trials = _trials(hws)
    assert trials[2].user_attrs["reason"] == "timeout" and trials[4].user_attrs["reason"] == "timeout"
    assert "timed out" in trials[2].user_attrs["detail"]
    assert json.loads((hws.results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] == 6
    escaped = [c for e in hws.events() for c in e.get("children", [])]
    assert escaped, "the setsid scenario did not run"
    hws.assert_nothing_left()
    hws.assert_finished_once()
    hws.assert_untouched()


def test_the_summary_says_a_timeout_timed_out() -> None:
    from optuna_ds.config import Metric
    from optuna_ds.studies._results import stage_result

    study = optuna.create_study()
    for reason, detail in (("oom", "out of memory"), ("timeout", "timed out: killed at the trial timeout")):
        trial = study.ask()
        for key, value in {"exp_name": f"z1_{reason}", "reason": reason, "detail": detail,
                           "stderr_tail": "UserWarning: torch.distributed ErrorHandler is deprecated"}.items():
            trial.set_user_attr(key, value)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    last = stage_result(study, 1, metric=Metric.named("throughput")).last_failure
    assert "timed out" in last and "ErrorHandler" not in last, last


def test_extreme_and_tied_measurements_never_break_the_choice(hws: Hostile) -> None:
    """0 is no measurement; 1e300 is a number every computation of the planner must survive;
    a tie is settled."""
    table = {"2": "zero", "4": "tie", "6": "tie", "8": "huge"}
    hws.config(base_config(train_micro_batch_size_per_gpu=[2, 4, 6, 8]))
    proc = hws.hostile(table=table)
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    reasons = {mbs: t.user_attrs.get("reason") for mbs, t in _trials(hws).items()}
    assert reasons[2] == "bad-metrics" and reasons[4] is None and reasons[6] is None and reasons[8] is None, reasons
    optimal = json.loads((hws.results / "ds_config_optimal.json").read_text())
    assert optimal["train_micro_batch_size_per_gpu"] == 8
    summary = (hws.results / "optuna_ds_summary.txt").read_text()
    assert "nan" not in summary.lower() and "inf " not in summary.lower(), summary
    hws.assert_finished_once()
    hws.assert_nothing_left()
    hws.assert_untouched()


def test_a_metric_whose_rate_is_not_finite_is_a_bad_measurement_and_resumes(hws: Hostile) -> None:
    """A latency of 5e-324 is a rate of infinity, an integer of 401 digits no float: each is a
    bad measurement, the tuning ends with the run that measured, and its resume too."""
    table = {"2": "tiny", "4": "ok", "6": "bigint"}
    hws.config(base_config(train_micro_batch_size_per_gpu=[2, 4, 6],
                           autotuning={"enabled": True, "metric": "latency", "model_info": {"num_params": 1000000}}))
    for _ in range(2):
        proc = hws.hostile(table=table)
        assert proc.returncode == 0, proc.stderr
        assert_no_traceback(proc)
    reasons = {mbs: t.user_attrs.get("reason") for mbs, t in _trials(hws).items()}
    assert reasons == {2: "bad-metrics", 4: None, 6: "bad-metrics"}, reasons
    assert json.loads((hws.results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] == 4
    hws.assert_finished_once()
    hws.assert_untouched()


def test_a_proc_that_cannot_be_read_costs_no_result(hws: Hostile, monkeypatch) -> None:
    """/proc hidden (hidepid, a container): where the tool reads it (the runs' marks, process
    identities; simulated in-process, DeepSpeed's own reads left alone), escapees cannot be found
    and identities not told apart; the tuning still finishes, in one piece, and ends what it
    started by process group."""
    import builtins

    from optuna_ds.launcher import _tracking
    from optuna_ds.studies import _owner

    hws.config(base_config(train_micro_batch_size_per_gpu=[2, 4]))
    for key, value in hws.env(HOSTILE_DS_TABLE=json.dumps({"default": "ok"})).items():
        monkeypatch.setenv(key, value)
    real_open, real_listdir = builtins.open, os.listdir

    def denied(path: object) -> None:
        if str(path).startswith("/proc"):
            raise PermissionError(13, "Permission denied", str(path))

    def opener(path, *args, **kwargs):
        denied(path)
        return real_open(path, *args, **kwargs)

    def lister(path=".", *args, **kwargs):
        denied(path)
        return real_listdir(path, *args, **kwargs)

    for module in (_tracking, _owner):
        monkeypatch.setattr(module, "open", opener, raising=False)
    monkeypatch.setattr(os, "listdir", lister)
    proc = hws.main()
    monkeypatch.undo()
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert_no_traceback(proc)
    assert json.loads((hws.results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] == 4
    hws.assert_finished_once()
    hws.assert_nothing_left()
    hws.assert_untouched()


def test_no_free_rendezvous_port_is_the_nodes_fault_never_the_configs(hws: Hostile) -> None:
    """Its only port taken by another program: nothing is launched on a port it cannot have, the
    tuning stops in one line saying so, and once the port is free the same command measures
    every size (a port is never held against a config)."""
    import socket

    hws.config(base_config())
    with socket.socket() as squatter:
        squatter.bind(("", 65535))
        squatter.listen()
        proc = hws.main("--master_port", "65535")
        assert_one_line_error(proc, "no rendezvous port free on this node from 65535")
    assert hws.experiments() == []
    assert {t.user_attrs.get("reason") for t in _trials(hws).values()} == {"port"}
    proc = hws.main("--master_port", "65535")
    assert proc.returncode == 0, proc.stderr
    assert {mbs: t.state.name for mbs, t in _trials(hws).items()} == {2: "COMPLETE", 4: "COMPLETE"}
    hws.assert_finished_once()
    hws.assert_untouched()


def test_a_fifo_a_device_or_a_flood_as_metrics_is_a_bad_measurement_not_a_hang(hws: Hostile) -> None:
    """Row 8 of issue 34: a FIFO left as the metrics file blocked the tuner in open() past its
    trial timeout, deaf to SIGTERM; a link to /dev/zero would have been read without end."""
    table = {"2": "fifo", "4": "ok", "6": "dev_zero", "8": "flood_metrics"}
    hws.config(base_config(train_micro_batch_size_per_gpu=[2, 4, 6, 8]))
    proc = hws.hostile(table=table)
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    trials = _trials(hws)
    assert {mbs: t.user_attrs.get("reason") for mbs, t in trials.items()} == {
        2: "bad-metrics", 4: None, 6: "bad-metrics", 8: "bad-metrics"}
    assert "not a regular file" in trials[2].user_attrs["detail"]
    assert "symbolic link" in trials[6].user_attrs["detail"]
    assert "more than" in trials[8].user_attrs["detail"]
    assert json.loads((hws.results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] == 4
    hws.assert_finished_once()
    hws.assert_nothing_left()
    hws.assert_untouched()


def test_a_failed_runs_output_is_read_in_linear_time_whatever_it_holds() -> None:
    """Every pattern run over a run's output takes time linear in its length: 256 KB in one
    line (the most of a stderr tail read) of any shape takes no longer, within a generous
    factor, than 32 times 8 KB of it; a quadratic pattern takes 1,024 times as long (minutes)."""
    import re
    import time

    from optuna_ds.launcher._autotp import autotp_failure
    from optuna_ds.launcher._checkpointing import checkpointing_failure
    from optuna_ds.launcher._checkpointing import read_checkpointing
    from optuna_ds.launcher._classify import classify
    from optuna_ds.launcher._classify import telling_line
    from optuna_ds.launcher._steps import read_step_timers

    crash = ('  File "deepspeed/runtime/activation_checkpointing/checkpointing.py", line 1\n'
             '  File "deepspeed/module_inject/auto_tp.py", line 2\n')

    def read_all(text: str) -> None:
        classify(returncode=1, timed_out=False, metrics=None, stdout_tail=text, stderr_tail=text,
                 switches=("--gradient_checkpointing",), autotp=True)
        checkpointing_failure(text, crashed=True, switches=("--gradient_checkpointing",))
        autotp_failure(text, crashed=True)
        telling_line(text)
        read_checkpointing(text)
        read_step_timers(text)

    def seconds(text: str) -> float:
        start = time.perf_counter()
        read_all(text)
        return time.perf_counter() - start

    for unit in ("x", "a.", "'a", "x.error ", "aError ", "Weight conversions (", "time (ms) | fwd"):
        line = unit * (256 * 1024 // len(unit))
        baseline = min(seconds(crash + line[: 8 * 1024]) for _ in range(3))
        assert seconds(crash + line) < max(32 * 20 * baseline, 3.0), f"{unit!r} repeated is read in more than linear time"

    name = "M" * (256 * 1024)
    assert checkpointing_failure(f"ValueError: {name} does not support gradient checkpointing.") == (
        f"{name} does not support gradient checkpointing.")
    assert re.fullmatch(r"it failed inside DeepSpeed's checkpointing: RuntimeError: x", checkpointing_failure(
        crash + "aError without colon " * 1000 + "\nRuntimeError: x\n", crashed=True))
