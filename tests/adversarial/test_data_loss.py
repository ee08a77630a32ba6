"""Nothing the user paid for is lost, nothing outside the tuning's folders is written or
deleted, and two tunings never share a study."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import optuna
import pytest

from conftest import assert_one_line_error
from invariants import Hostile
from invariants import assert_no_traceback
from invariants import base_config
from invariants import hws  # noqa: F401


def test_knob_keys_that_climb_out_of_the_results_folder_are_refused_before_anything_runs(hws: Hostile) -> None:
    # Two keys whose acronyms collide and climb out of the results folder: DeepSpeed does not
    # know them, so the config is refused in one line before any launch, and nothing is written
    # outside (experiment names carrying them stay inside too: test_experiment_names_are_safe_identities).
    climb = "../../../../outside"
    hws.config(base_config(
        train_micro_batch_size_per_gpu=[2],
        zero_optimization={"stage": 1, f"{climb}/x_y": [1, 2], f"{climb}/z_y": [1, 2]},
        autotuning={"enabled": True, "fast": False, "tuner_type": "gridsearch", "tuner_num_trials": 3,
                    "tuner_early_stopping": 1, "model_info": {"num_params": 1000000}},
    ))
    for extra in ((), ("--overwrite",)):
        proc = hws.hostile("ds_config.json", *extra)
        assert_one_line_error(proc, "DeepSpeed does not know")
        assert not hws.experiments()
        hws.assert_untouched()


def test_stage_given_as_a_float_is_that_stage(hws: Hostile) -> None:
    hws.config(base_config(zero_optimization={"stage": 1.0}))
    assert hws.hostile().returncode == 0
    names = {s.study_name for s in optuna.get_all_study_summaries(hws.storage)}
    assert names == {"optuna-ds", "optuna-ds-z1"}
    assert all(e["name"].startswith("z1_") for e in hws.experiments())
    # The same tuning with the stage written as an int resumes it: nothing runs again.
    hws.config(base_config(zero_optimization={"stage": 1}))
    before = len(hws.experiments())
    assert hws.hostile("ds_config.json", "--overwrite").returncode == 0
    assert len(hws.experiments()) == 2 * before  # afresh, not the old study's results


def test_another_tunings_studies_are_never_ours(hws: Hostile) -> None:
    """A tuning named like another's stage study (stored before names ending in -z<digit> were
    refused) is neither written to nor deleted by that other tuning."""
    from optuna_ds.storage import claim_stage_study
    from optuna_ds.storage import create_storage
    from optuna_ds.storage import tuning_study_names
    from optuna_ds._errors import PlanMismatchError

    storage = create_storage(f"sqlite:///{hws.root}/s.db")
    other = optuna.create_study(study_name="gpt2-z1", storage=storage)
    other.set_user_attr("optuna_ds:plan", {"study_name": "gpt2-z1"})
    mine = optuna.create_study(study_name="gpt2-z2", storage=storage)
    claim_stage_study(mine, "gpt2")
    assert sorted(tuning_study_names(storage, "gpt2")) == ["gpt2-z2"]
    with pytest.raises(PlanMismatchError):
        claim_stage_study(other, "gpt2")


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.mark.parametrize("behaviour, killed_after, resume_after_end", [
    # it wrote its metrics, then is slow to exit: the resumed tuning ends it and keeps them. (One
    # still measuring ends with its tuner: test_signals.py::test_a_sigkilled_tuner_takes_its_experiments_with_it.)
    ("linger", "metrics", False),
])
def test_an_experiment_that_measured_after_its_tuner_died_is_kept(hws: Hostile, behaviour: str, killed_after: str,
                                                                   resume_after_end: bool) -> None:
    hws.config(base_config(train_micro_batch_size_per_gpu=[2, 4]))
    table = {"2": behaviour, "4": "ok"}
    tuner = hws.popen("tune", *hws.hostile_args(), table=table, HOSTILE_DS_SLOW="3")
    _wait_for(lambda: any(e["mbs"] == 2 and e["event"] == killed_after for e in hws.events()))
    os.kill(tuner.pid, signal.SIGKILL)  # the experiment goes on, orphaned
    tuner.communicate()
    if resume_after_end:
        _wait_for(lambda: any(e["event"] == "end" and e["mbs"] == 2 for e in hws.events()))
    proc = hws.hostile(table=table)
    assert proc.returncode == 0, proc.stderr
    assert [e["mbs"] for e in hws.experiments()].count(2) == 1
    study = optuna.load_study(study_name="optuna-ds-z1", storage=hws.storage)
    kept = [t for t in study.trials if t.user_attrs.get("micro_batch_size") == 2 and t.state.name == "COMPLETE"]
    assert kept and kept[0].value == 20.0
    hws.assert_finished_once()
    hws.assert_nothing_left()
    hws.assert_untouched()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_experiment_interrupted_after_it_measured_is_kept(hws: Hostile, signum: int) -> None:
    """Ctrl-C or SIGTERM after the run wrote its metrics but before its launcher was seen to exit
    (DeepSpeed's engine writes them, then exits; here it lingers): the run measured, so its
    trial keeps the result, and the resumed tuning does not run it again. (It was marked
    interrupted and ran again: the intermittent test_signals[outputs-15].)"""
    hws.config(base_config(train_micro_batch_size_per_gpu=[2, 4]))
    table = {"2": "linger", "4": "ok"}
    tuner = hws.popen("tune", *hws.hostile_args(), table=table)
    _wait_for(lambda: any(e["mbs"] == 2 and e["event"] == "metrics" for e in hws.events()))
    os.kill(tuner.pid, signum)
    _, err = tuner.communicate(timeout=60)
    assert tuner.returncode == 128 + signum, err
    study = optuna.load_study(study_name="optuna-ds-z1", storage=hws.storage)
    kept = [t for t in study.trials if t.user_attrs.get("micro_batch_size") == 2]
    assert [(t.state.name, t.value, t.user_attrs.get("recovered")) for t in kept] == [("COMPLETE", 20.0, "interrupted after it measured")]
    hws.assert_nothing_left()
    proc = hws.hostile(table={"default": "ok"})
    assert proc.returncode == 0, proc.stderr
    assert [e["mbs"] for e in hws.experiments()].count(2) == 1
    hws.assert_finished_once()
    hws.assert_untouched()


def test_sigkill_at_random_moments_then_resume(hws: Hostile) -> None:
    """Kill the tuner with SIGKILL at random moments (profile, experiments, writing the
    outputs); the same command then finishes, and no finished experiment ran twice."""
    rng = random.Random()
    config = base_config(train_micro_batch_size_per_gpu=[2, 4, 6, 8])
    config["autotuning"] = {"enabled": True}  # with the profile run
    hws.config(config)
    table = {"default": "slow"}
    for _ in range(3):
        tuner = hws.popen("tune", *hws.hostile_args(), table=table, HOSTILE_DS_SLOW="0.5")
        time.sleep(rng.uniform(0.5, 4.0))
        os.kill(tuner.pid, signal.SIGKILL)
        tuner.communicate()
    proc = hws.hostile(table=table, env=hws.env(HOSTILE_DS_TABLE=json.dumps(table), HOSTILE_DS_SLOW="0.5"))
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    assert json.loads((hws.results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] == 8
    hws.assert_finished_once()
    hws.assert_nothing_left()
    hws.assert_untouched()


@pytest.mark.parametrize("errno_", [28, 30], ids=["disk-full", "read-only"])
def test_results_that_can_no_longer_be_written_stop_the_tuning_in_one_line(hws: Hostile, monkeypatch, errno_: int) -> None:
    """The disk fills up, or the results folder turns read-only, in the middle of the tuning (the
    tuner's own writes fail, simulated in-process): one line, exit 2, the experiment that finished
    kept, the one about to run left to run again, and the resume runs nothing twice."""
    hws.config(base_config(train_micro_batch_size_per_gpu=[2, 4]))
    monkeypatch.setenv("HOSTILE_DS_TABLE", "{}")
    for key, value in hws.env().items():
        monkeypatch.setenv(key, value)
    real_open = os.open

    def failing_open(path, flags, *args, **kwargs):  # the tuner's files are all opened here (optuna_ds._files)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and "tmbspg4" in str(path):
            raise OSError(errno_, os.strerror(errno_), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing_open)
    proc = hws.main()
    monkeypatch.setattr(os, "open", real_open)
    assert_one_line_error(proc, os.strerror(errno_), "tmbspg4")
    states = {t.user_attrs.get("micro_batch_size"): (t.state.name, t.user_attrs.get("reason"))
              for t in optuna.load_study(study_name="optuna-ds-z1", storage=hws.storage).get_trials()}
    assert states[2] == ("COMPLETE", None) and states[4] == ("FAIL", "interrupted"), states
    assert not list(hws.results.rglob("*.tmp"))
    again = hws.main()
    assert again.returncode == 0, again.stderr
    assert json.loads((hws.results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] == 4
    hws.assert_finished_once()
    hws.assert_nothing_left()
    hws.assert_untouched()


def test_a_trial_failed_as_stale_while_its_experiment_ran_keeps_its_result(hws: Hostile, monkeypatch) -> None:
    """A process stopped, or cut from its database, past the heartbeat's grace period: another
    process fails its running trial as stale (simulated here, as Optuna's fail_stale_trials
    does, while the experiment of micro-batch 4 runs). When the experiment then finishes, its
    result is kept (no "Cannot tell a FAIL trial" crash), counted once, never as a failure, and
    never run again, nor on resume."""
    from optuna_ds.launcher import ExperimentRunner

    real = ExperimentRunner.run
    reaps: list[str] = []

    def reaped(self, experiment, **kwargs):  # type: ignore[no-untyped-def]
        result = real(self, experiment, **kwargs)
        if experiment.config.micro_batch == 4 and result.ok and not reaps:
            reaps.append(experiment.name)
            storage = optuna.storages.RDBStorage(hws.storage)
            study = optuna.load_study(study_name="optuna-ds-z1", storage=storage)
            for t in study.get_trials(states=(optuna.trial.TrialState.RUNNING,)):
                if t.user_attrs.get("exp_name") == experiment.name:
                    storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
        return result

    monkeypatch.setattr(ExperimentRunner, "run", reaped)
    hws.config(base_config())
    proc = hws.main()
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    assert "failed as stale by another process while its experiment ran" in proc.stdout, proc.stdout
    again = hws.main()
    assert again.returncode == 0 and "failed as stale" not in again.stdout, again.stdout + again.stderr
    trials = [t for t in optuna.load_study(study_name="optuna-ds-z1", storage=hws.storage).get_trials()
              if t.user_attrs.get("exp_name") == reaps[0]]
    states = sorted(t.state.name for t in trials)
    assert states == ["COMPLETE", "FAIL"], states
    kept = next(t for t in trials if t.state == optuna.trial.TrialState.COMPLETE)
    stale = next(t for t in trials if t.state == optuna.trial.TrialState.FAIL)
    assert kept.value == 40.0 and "stale" in kept.user_attrs["recovered"]
    assert kept.user_attrs["mark"] == stale.user_attrs["mark"]
    assert json.loads((hws.results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] == 4
    summary = (hws.results / "optuna_ds_summary.txt").read_text()
    assert "failed" not in summary, summary
    hws.assert_finished_once()
    hws.assert_untouched()


def test_a_malformed_database_is_said_so_never_resumable(hws: Hostile) -> None:
    """Issue 50 row 8: a malformed SQLite file was "... database disk image is malformed; the
    experiments that finished are kept in it: run the same command again to resume", and again
    on rerun. One line that names the file and what can be done, each time."""
    hws.config(base_config())
    assert hws.main().returncode == 0
    db = hws.results / "optuna-ds.db"
    data = bytearray(db.read_bytes())
    for page in range(4096, len(data), 4096):
        data[page:page + 100] = b"\xff" * 100
    db.write_bytes(bytes(data))
    for _ in range(2):
        line = assert_one_line_error(hws.main(), "malformed", str(db), "--results-dir or --storage")
        assert "resume" not in line.replace("be resumed", "") and "kept" not in line, line
    hws.assert_untouched()


def test_a_database_deleted_under_the_tuning_is_said_gone() -> None:
    """Issue 50 row 8: the results folder deleted mid-tuning ended in "no such table: studies;
    ... the experiments that finished are kept in it" (false). It says the storage is gone."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from optuna_ds._errors import OptunaDSError
    from optuna_ds.storage import storage_failures

    lost = OperationalError("SELECT studies.study_id FROM studies", {}, sqlite3.OperationalError("no such table: studies"))
    for url in ("sqlite:////nonexistent/results/optuna-ds.db", "postgresql+psycopg://u:secret@db/tuning"):
        with pytest.raises(OptunaDSError) as raised, storage_failures(url, advice="the experiments that finished are kept in it"):
            raise lost
        line = str(raised.value)
        assert "is gone" in line and "deleted" in line and "kept" not in line and "secret" not in line, line
    with pytest.raises(OptunaDSError) as raised, storage_failures("sqlite:////nonexistent/results/optuna-ds.db", advice="resume"):
        raise OperationalError("INSERT", {}, sqlite3.OperationalError("unable to open database file"))
    assert "is gone" in str(raised.value) and "/nonexistent/results/optuna-ds.db" in str(raised.value)


def test_a_full_disk_at_the_end_keeps_the_optimal_config_and_names_the_file(hws: Hostile, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills as the report is written: the optimal config and its command, written
    first, are there, and the tuning ends in one line naming the report, never an internal error."""
    import errno

    replace = os.replace

    def full_for_the_report(src: str, dst: str) -> None:
        if os.path.basename(dst) == "report.html":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), src, None, dst)
        replace(src, dst)

    hws.config(base_config())
    monkeypatch.setattr(os, "replace", full_for_the_report)
    proc = hws.main()
    assert_one_line_error(proc, f"cannot write {hws.results / 'report.html'}: {os.strerror(errno.ENOSPC)}",
                          "ds_config_optimal.json and cmd_optimal.txt are written")
    assert json.loads((hws.results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] in (2, 4)
    assert "--deepspeed_config" in (hws.results / "cmd_optimal.txt").read_text()
    assert not [p.name for p in hws.results.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.undo()
    # The same command again launches nothing and writes the rest.
    launched = len(hws.experiments())
    assert hws.main().returncode == 0
    assert len(hws.experiments()) == launched
    assert (hws.results / "report.html").is_file()


def test_a_full_disk_as_an_interrupted_tuning_writes_its_summary_is_one_line_naming_it(
        hws: Hostile, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills as an interrupted tuning writes its partial summary: the summary is still
    shown, the report still written, one line names the file, the interrupt ends the tuning as
    it would have (130), never an internal error; what finished runs not again on resume."""
    import errno

    from optuna_ds.domain import ExperimentRecord
    from optuna_ds.domain import is_finished_experiment
    from optuna_ds.studies import Tuning

    replace, run = os.replace, Tuning.run

    def full_for_the_summary(src: str, dst: str) -> None:
        if os.path.basename(dst) == "optuna_ds_summary.txt":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), src, None, dst)
        replace(src, dst)

    def interrupted_after_its_experiments(self: Tuning) -> object:
        run(self)
        raise KeyboardInterrupt

    hws.config(base_config())
    monkeypatch.setattr(os, "replace", full_for_the_summary)
    monkeypatch.setattr(Tuning, "run", interrupted_after_its_experiments)
    proc = hws.main()
    assert_no_traceback(proc)
    assert proc.returncode == 130, proc.stderr
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "optuna_ds_summary.txt" in line]
    full = os.strerror(errno.ENOSPC)
    assert said == [f"cannot write {hws.results / 'optuna_ds_summary.txt'} ({full}): the experiments that "
                    "finished are kept"], proc.stdout + proc.stderr
    assert "PARTIAL: interrupted" in proc.stdout + proc.stderr  # the summary, shown
    assert "PARTIAL: interrupted" in (hws.results / "report.html").read_text()
    assert not (hws.results / "optuna_ds_summary.txt").exists()
    assert not (hws.results / "summary.txt").exists()  # DeepSpeed's: written at the end alone
    assert not [p.name for p in hws.results.iterdir() if p.name.endswith(".tmp")]
    # What finished is in the storage: a resumed tuning runs it not again.
    study = optuna.load_study(study_name="optuna-ds-z1", storage=hws.storage)
    finished = {ExperimentRecord.from_trial(t).exp_name for t in study.get_trials()
                if is_finished_experiment(t)}
    assert finished == {e["name"] for e in hws.experiments()}
