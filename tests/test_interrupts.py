"""Interrupts and kills: nothing lost, nothing left running, the tuning resumes."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from conftest import FAKE_LAUNCHER
from conftest import LAUNCHER_OPTION
from conftest import Workspace

CONFIG = {
    "train_micro_batch_size_per_gpu": [2, 4, 8],
    "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
    "zero_optimization": {"stage": 1},
    "autotuning": {"enabled": True},
}


def _start(ws: Workspace, surface: dict) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "optuna_ds", "tune", LAUNCHER_OPTION, FAKE_LAUNCHER, "train.py", "--deepspeed_config", "ds_config.json"],
        cwd=ws.root, env=ws.env(surface), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _wait_for_launch(ws: Workspace, name: str, *, hangs: bool = False, timeout: float = 60) -> dict[str, int]:
    """The pids printed by the fake launcher of experiment ``name`` once it runs."""
    log = ws.results / name / "stdout.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        launcher, child = re.search(r"pid (\d+)", text), re.search(r"child pid (\d+)", text)
        if launcher and (child or not hangs):
            return {"launcher": int(launcher.group(1)), **({"child": int(child.group(1))} if child else {})}
        time.sleep(0.1)
    raise AssertionError(f"{name} never started")


def _gone(pid: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _trials(ws: Workspace) -> dict[int, optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="optuna-ds-z1", storage=ws.storage)
    return {t.number: t for t in study.get_trials()}


def _first_runs(ws: Workspace) -> list[int]:
    """The sizes launched, each launch of a config's name once (not the planner's re-measurements,
    ``<name>_r<k>``, which are experiments of their own)."""
    sizes = []
    for launch in ws.launches():
        config = launch["args"][launch["args"].index("--deepspeed_config") + 1] if "--deepspeed_config" in launch["args"] else ""
        if not launch.get("profile") and not re.search(r"_r\d+$", os.path.basename(os.path.dirname(config))):
            sizes.append(launch["mbs"])
    return sizes


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_ends_experiments_keeps_results_and_resumes(ws: Workspace, sig: int, code: int) -> None:
    ws.config(CONFIG)
    proc = _start(ws, {"hang_at": [4]})
    pids = _wait_for_launch(ws, "z1_gas1_tmbspg4", hangs=True)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert err.strip().splitlines()[-1] == f"optuna-ds: interrupted by {signal.Signals(sig).name}"
    assert _gone(pids["launcher"]) and _gone(pids["child"]), "an experiment process survived"

    states = {t.user_attrs["micro_batch_size"]: (t.state, t.user_attrs.get("reason")) for t in _trials(ws).values()}
    assert states == {2: (TrialState.COMPLETE, None), 4: (TrialState.FAIL, "interrupted")}
    # Interrupted is not done: a partial summary of what finished, no optimum and no verdicts.
    summary = (ws.results / "optuna_ds_summary.txt").read_text()
    # Its count agrees with the table's, which counts the experiment cut short (issue #35).
    assert summary.startswith("PARTIAL: interrupted after 1 experiment(s) finished and 1 cut short, which run again; "
                              "rerun the same command to resume."), summary
    assert "| z1             |                 2 |" in summary and "failed" not in summary, summary
    assert not (ws.results / "summary.txt").exists()  # DeepSpeed's summary: a finished tuning's, as DeepSpeed writes it
    assert "z1_gas1_tmbspg2" in summary and summary in out  # what finished is reported, and shown
    assert "optimum" not in summary.lower() and "expected no gain" not in summary
    assert not (ws.results / "ds_config_optimal.json").exists() and not (ws.results / "cmd_optimal.txt").exists()
    assert "PARTIAL: interrupted" in (ws.results / "report.html").read_text()

    p = ws.tune()  # no hang this time
    assert p.returncode == 0, p.stderr
    summary = (ws.results / "optuna_ds_summary.txt").read_text()
    assert not summary.startswith("PARTIAL")
    # The experiment cut short ran again: no failure left of it, in the summary or the report.
    assert "interrupted" not in summary and "failed" not in summary, summary
    table = (ws.results / "report.html").read_text().split('<table class="experiments')[1].split("</table>")[0]
    assert "interrupted" not in table and "z1_gas1_tmbspg4" in table
    assert json.loads((ws.results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] in (2, 4, 8)
    runs = _first_runs(ws)
    assert runs.count(2) == 1, "a finished experiment ran again"
    assert runs.count(4) == 2 and runs.count(8) == 1  # the interrupted launch, then its retry
    # DeepSpeed's table counts experiments as DeepSpeed does, one folder each: the launch cut
    # short and its retry are one experiment, in the row and in the closing count.
    folders = [d for d in ws.results.iterdir() if d.is_dir() and d.name.startswith("z1_")]
    deepspeed_summary = (ws.results / "summary.txt").read_text()
    assert f"| z1             | {len(folders):17d} |" in deepspeed_summary, deepspeed_summary
    assert deepspeed_summary.endswith(f"Total number of experiments: {len(folders)}."), deepspeed_summary
    # What was spent counts every launch, and says which ones the table does not.
    spent = len([launch for launch in ws.launches() if not launch.get("profile")]) + 1
    assert f"Spent: {spent} experiment(s) (the profile run and 1 cut short by an interrupt included), " in summary, summary
    assert {t.user_attrs["micro_batch_size"] for t in _trials(ws).values() if t.state == TrialState.COMPLETE} == {2, 4, 8}


def test_sigkilled_tuner_resumes_ends_the_orphan_and_matches_an_uninterrupted_run(ws: Workspace, tmp_path: Path) -> None:
    ws.config(CONFIG)
    proc = _start(ws, {"duration_at": {"4": 60}})
    pids = _wait_for_launch(ws, "z1_gas1_tmbspg4")
    proc.kill()
    proc.wait()
    assert not _gone(pids["launcher"], timeout=0.5)  # SIGKILL left the experiment running

    start = time.monotonic()
    p = ws.tune()
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - start < 50, "resume waited for the heartbeat instead of noticing the dead tuner"
    assert _gone(pids["launcher"]), "the orphaned experiment was not ended"
    assert "its process died" in p.stdout
    runs = _first_runs(ws)
    assert runs.count(2) == 1 and runs.count(8) == 1

    (tmp_path / "uninterrupted").mkdir()
    other = Workspace(tmp_path / "uninterrupted")
    other.config(CONFIG)
    assert other.tune().returncode == 0
    best = json.loads((ws.results / "ds_config_optimal.json").read_text())
    assert best == json.loads((other.results / "ds_config_optimal.json").read_text().replace(str(other.root), str(ws.root)))


def test_an_interrupted_knob_experiment_runs_again_on_resume(ws: Workspace) -> None:
    """Ctrl-C during the knob search's first experiment: the resumed search runs it again (the
    grid had counted its point as visited, and early stopping had counted it as a trial that
    brought nothing, so it never ran)."""
    ws.config({"train_micro_batch_size_per_gpu": [8],
               "zero_optimization": {"stage": 2, "overlap_comm": [False, True], "reduce_scatter": True, "contiguous_gradients": True,
                                     "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8},
               "autotuning": {"enabled": True, "fast": False, "tuner_type": "gridsearch", "tuner_early_stopping": 1}})
    proc = _start(ws, {"knob_duration": {"overlap_comm": {"true": 60}}})
    name = "z2_gas1_tmbspg8_ocT"  # DeepSpeed's recommended setting, the search's first
    _wait_for_launch(ws, name)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    p = ws.tune()
    assert p.returncode == 0, p.stderr
    study = optuna.load_study(study_name="optuna-ds-z2", storage=ws.storage)
    runs = [t.state for t in study.get_trials() if t.user_attrs.get("exp_name") == name]
    assert runs == [TrialState.FAIL, TrialState.COMPLETE], p.stdout


# `optuna-ds` SIGKILLing itself when its first trial is about to publish its claim: after the
# trial was taken (its `worker` written, its params asked), before its experiment is claimed.
_KILLED_AT_CLAIM = """
import os, signal
import optuna_ds.studies._experiments as experiments
experiments._store = lambda trial, record: os.kill(os.getpid(), signal.SIGKILL)
from optuna_ds.cli import main
main()
"""


def test_a_tuner_killed_before_its_claim_resumes_with_nothing_lost_or_counted(ws: Workspace) -> None:
    """Issue #28, on purpose: a trial whose process died between its creation and its claim is
    lost with no experiment. The resumed tuning reaps it at once, runs every experiment once, and
    the summary, the report, the dashboard's note and `optuna-ds report` count no experiment for it."""
    ws.config(CONFIG)
    victim = subprocess.run([sys.executable, "-c", _KILLED_AT_CLAIM, "tune", LAUNCHER_OPTION, FAKE_LAUNCHER, "train.py",
                             "--deepspeed_config", "ds_config.json"], cwd=ws.root, env=ws.env({}), capture_output=True,
                            text=True, timeout=120)
    assert victim.returncode == -signal.SIGKILL, victim.stderr
    taken = [t for t in _trials(ws).values() if t.state == TrialState.RUNNING]
    assert taken and all("worker" in t.user_attrs and "exp_name" not in t.user_attrs for t in taken)
    assert not [l for l in ws.launches() if not l.get("profile")]

    p = ws.tune()
    assert p.returncode == 0, p.stderr
    for t in taken:
        assert f"trial {t.number}: its process died before it claimed an experiment; it launched nothing" in p.stdout
    trials = _trials(ws)
    lost = [t for t in trials.values() if t.user_attrs.get("lost")]
    assert [t.number for t in lost] == [t.number for t in taken]
    assert all(t.state == TrialState.FAIL and t.user_attrs["reason"] == "interrupted" and "exp_name" not in t.user_attrs
               for t in lost)
    first = _first_runs(ws)
    assert sorted(first) == sorted(set(first)), "an experiment ran twice"
    runs = [l["mbs"] for l in ws.launches() if not l.get("profile")]  # re-measurements included
    ran = [t for t in trials.values() if "exp_name" in t.user_attrs]
    assert len(ran) == len(runs) and all(t.state == TrialState.COMPLETE for t in ran)

    summary = (ws.results / "optuna_ds_summary.txt").read_text()
    assert f"Total number of experiments: {len(runs)}." in summary and "failed" not in summary and "None" not in summary
    page = (ws.results / "report.html").read_text()
    rows = page.split('<table class="experiments', 1)[1]
    assert rows.count('<tr class="complete') == rows.count("<tr class=") == len(runs)  # one row per experiment
    import optuna_dashboard

    note = optuna_dashboard.get_note(optuna.load_study(study_name="optuna-ds-z1", storage=ws.storage))
    assert "\n**Your config" in note and "failed" not in note
    again = ws.cli("report", "--storage", ws.storage, "--study-name", "optuna-ds", "-o", str(ws.root / "again.html"))
    assert again.returncode == 0, again.stderr
    assert "| global " in again.stdout and "failed" not in again.stdout
