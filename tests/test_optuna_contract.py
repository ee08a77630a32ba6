"""What optuna-ds relies on in Optuna beyond its public API (``optuna_ds._optuna_compat``), and
the behaviours of its public API that are easy to lose in an upgrade: one test per reliance, so
an Optuna release that breaks one fails a test that names it."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy.exc
from optuna.distributions import CategoricalDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution
from optuna.trial import TrialState

from optuna_ds._optuna_compat import TrialCache
from optuna_ds._optuna_compat import contains
from optuna_ds._optuna_compat import heartbeat
from optuna_ds._optuna_compat import hide_in_memory_studies
from optuna_ds._optuna_compat import stale_trial_ids
from optuna_ds._optuna_compat import storage_of
from optuna_ds._optuna_compat import study_id
from optuna_ds._optuna_compat import take_waiting_trial
from optuna_ds._optuna_compat import trial_id

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'db.sqlite'}"


def test_a_cache_given_to_create_study_is_the_study_storage(url: str) -> None:
    cache = TrialCache(optuna.storages.RDBStorage(url))
    assert storage_of(optuna.create_study(storage=cache, study_name="s")) is cache
    assert storage_of(optuna.load_study(storage=cache, study_name="s")) is cache


def test_study_id_and_trial_id_name_them_in_the_storage(url: str) -> None:
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    assert study_id(study) == storage.get_study_id_from_name("s")
    assert storage.get_trial(trial_id(trial)).number == trial.number
    frozen = study.get_trials(deepcopy=False)[0]
    assert trial_id(frozen) == trial_id(trial)


@pytest.mark.parametrize(("distribution", "value", "expected"), [
    (CategoricalDistribution([True, False]), False, True),
    (CategoricalDistribution([5e7, 5e8]), 1e9, False),
    (IntDistribution(7, 10), 9, True),
    (IntDistribution(7, 10), 11, False),
    (IntDistribution(2, 8, step=2), 5, False),
    (FloatDistribution(0.0, 1.0), 0.5, True),
    (IntDistribution(1, 4), "two", False),
])
def test_contains_says_whether_a_distribution_admits_a_value(distribution, value, expected: bool) -> None:
    assert contains(distribution, value) is expected


class _BeatsFailing(optuna.storages.RDBStorage):
    """Fails its first ``failures`` heartbeats as a database away for a while does; sets
    ``recovered`` at the first beat recorded after them."""

    def __init__(self, url: str, failures: int) -> None:
        super().__init__(url, heartbeat_interval=1, grace_period=60)
        self.failures = failures
        self.beats = 0
        self.recovered = threading.Event()

    def record_heartbeat(self, trial_id: int) -> None:
        self.beats += 1
        if self.beats <= self.failures:
            raise sqlalchemy.exc.OperationalError("UPDATE trial_heartbeats", {}, Exception("server closed the connection"))
        super().record_heartbeat(trial_id)
        if self.beats > self.failures:
            self.recovered.set()


def test_optunas_heartbeat_thread_beats_through_the_storage_and_ends_at_a_failed_beat(url: str) -> None:
    # Why heartbeat() is ours: Optuna's thread calls the storage's record_heartbeat with no try,
    # so one beat lost to a database restart ends it. When this fails, Optuna's thread survives:
    # heartbeat() could start Optuna's again.
    from optuna.storages._heartbeat import HeartbeatThread

    storage = _BeatsFailing(url, failures=1)
    trial = optuna.create_study(storage=storage, study_name="s").ask()
    errors: list[BaseException] = []
    hook, threading.excepthook = threading.excepthook, lambda args: errors.append(args.exc_value)  # type: ignore[assignment]
    try:
        beating = HeartbeatThread(trial_id(trial), storage)
        beating.start()
        assert beating._thread is not None
        beating._thread.join(timeout=60)
        assert not beating._thread.is_alive() and storage.beats == 1 and errors
    finally:
        threading.excepthook = hook
        beating.join()


def test_heartbeat_beats_on_after_the_database_failed_beats(url: str) -> None:
    storage = _BeatsFailing(url, failures=2)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    with heartbeat(study, trial, transient=lambda e: isinstance(e, sqlalchemy.exc.OperationalError)):
        assert storage.recovered.wait(timeout=60), "no beat recorded after the failed ones"
    assert trial_id(trial) not in storage._get_stale_trial_ids(study_id(study))


def test_stale_trial_ids_are_the_running_trials_past_the_grace_period(url: str) -> None:
    # live_trials (the --overwrite check) reads Optuna's _get_stale_trial_ids through stale_trial_ids.
    storage = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=storage, study_name="s")
    beating, silent, _unbeaten = study.ask(), study.ask(), study.ask()
    storage.record_heartbeat(trial_id(silent))
    deadline = time.monotonic() + 60
    while trial_id(silent) not in stale_trial_ids(study):
        assert time.monotonic() < deadline, "a trial silent past the grace period is not stale"
        storage.record_heartbeat(trial_id(beating))
        time.sleep(0.2)
    assert stale_trial_ids(study) == {trial_id(silent)}  # one that never beat is not stale either
    assert stale_trial_ids(optuna.create_study()) == set()  # no heartbeats: none


def test_a_trial_another_process_failed_is_not_told_again(url: str) -> None:
    # run_trial tells with skip_if_finished: a trial failed as stale meanwhile stays failed, and
    # the tell raises nothing (Optuna's optimize raised "Cannot tell a FAIL trial").
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    storage.set_trial_state_values(trial_id(trial), TrialState.FAIL)
    study.tell(trial, 1.0, skip_if_finished=True)
    assert study.get_trials()[0].state == TrialState.FAIL


def test_a_trial_added_whole_keeps_its_attrs_and_start(url: str) -> None:
    # A stale trial's run is kept in a trial added with the record, start and params of the stale one.
    study = optuna.create_study(storage=optuna.storages.RDBStorage(url), study_name="s")
    stale = study.ask()
    stale.suggest_int("mbs", 1, 8)
    stale.set_user_attr("exp_name", "z1_mbs2")
    frozen = study.get_trials()[0]
    study.add_trial(optuna.trial.FrozenTrial(
        number=-1, trial_id=-1, state=TrialState.COMPLETE, value=2.0, datetime_start=frozen.datetime_start,
        datetime_complete=frozen.datetime_start, params=frozen.params, distributions=frozen.distributions,
        user_attrs={"exp_name": "z1_mbs2", "recovered": "why"}, system_attrs={}, intermediate_values={}))
    kept = study.get_trials()[1]
    assert (kept.state, kept.value, kept.params, kept.user_attrs["recovered"]) == (TrialState.COMPLETE, 2.0, frozen.params, "why")
    assert kept.datetime_start == frozen.datetime_start


def test_user_attrs_written_in_one_statement_are_optuna_user_attrs(url: str) -> None:
    # TrialCache.set_trial_user_attrs writes Optuna's user attr table through its private RDB
    # models: what it writes Optuna reads back as user attrs, an attr written again is
    # overwritten, and a finished trial is refused with Optuna's error.
    cache = TrialCache(optuna.storages.RDBStorage(url))
    study = optuna.create_study(storage=cache, study_name="s")
    trial = study.ask()
    trial.set_user_attr("slot", "old")
    cache.set_trial_user_attrs(trial_id(trial), {"slot": "localhost:0", "config": {"stage": [1, 2]}})
    stored = optuna.load_study(study_name="s", storage=url).get_trials()[0]
    assert stored.user_attrs == {"slot": "localhost:0", "config": {"stage": [1, 2]}}
    study.tell(trial, 1.0)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        cache.set_trial_user_attrs(trial_id(trial), {"slot": "late"})


def optuna_studies(url: str) -> str:
    """``optuna studies --storage URL``'s output. In a process of its own: Optuna's command adds
    its user attrs column to a list it keeps from one call to the next."""
    main = "import sys; from optuna.cli import main; sys.exit(main())"
    p = subprocess.run([sys.executable, "-c", main, "studies", "--storage", url], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_optuna_studies_prints_user_attrs_and_no_system_attrs(url: str) -> None:
    # The tuning's plan is a system attr so that `optuna studies` (one line per study) stays readable.
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name="s")
    study.set_user_attr("shown", "yes")
    storage.set_study_system_attr(study_id(study), "hidden", "x" * 5000)
    out = optuna_studies(url)
    assert "shown" in out and "hidden" not in out and "xxxxx" not in out


def test_a_trial_failed_in_the_storage_is_refused_its_end(url: str) -> None:
    # A trial a reaper failed (its process looked dead) cannot then be told complete: the
    # storage raises UpdateFinishedTrialError, a RuntimeError, which the reaper and the runner catch.
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    storage.set_trial_state_values(trial_id(trial), TrialState.FAIL)
    with pytest.raises(RuntimeError):
        storage.set_trial_state_values(trial_id(trial), TrialState.COMPLETE, [1.0])


def test_hide_in_memory_studies(caplog: pytest.LogCaptureFixture) -> None:
    """Optuna logs an in-memory study's creation with its module's logger, the name in the message."""
    optuna.logging.enable_propagation()
    try:
        with caplog.at_level("INFO", logger="optuna"):
            hide_in_memory_studies("hidden-")
            optuna.create_study(study_name="hidden-copy")
            optuna.create_study(study_name="shown-study")
    finally:
        optuna.logging.disable_propagation()
    messages = [r.getMessage() for r in caplog.records if r.name == "optuna.storages._in_memory"]
    assert any("shown-study" in m for m in messages) and not any("hidden-copy" in m for m in messages)


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_a_waiting_trial_is_taken_once_with_its_takers_attrs(url: str, kind: str) -> None:
    """Optuna's queued trials (``enqueue_trial``) taken by :func:`take_waiting_trial`: RUNNING,
    started, with the taker's attrs; a second taker, or a taker of a finished trial, gets none."""
    storage = TrialCache(optuna.storages.RDBStorage(url)) if kind == "sqlite" else optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, study_name="q")
    study.enqueue_trial({}, user_attrs={"handed": 1})
    (waiting,) = study.get_trials(states=(TrialState.WAITING,))
    assert take_waiting_trial(storage, trial_id(waiting), {"worker": {"pid": 1}})
    assert not take_waiting_trial(storage, trial_id(waiting), {"worker": {"pid": 2}})
    (taken,) = study.get_trials()
    assert taken.state == TrialState.RUNNING and taken.datetime_start is not None
    assert taken.user_attrs == {"handed": 1, "worker": {"pid": 1}}
    study.tell(optuna.Trial(study, trial_id(taken)), 1.0)
    assert not take_waiting_trial(storage, trial_id(taken), {"worker": {"pid": 3}})
