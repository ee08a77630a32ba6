"""What optuna-ds relies on in Optuna beyond its public API (``optuna_ds._optuna_compat``), and
the behaviours of its public API that are easy to lose in an upgrade: one test per reliance, so
an Optuna release that breaks one fails a test that names it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution
from optuna.trial import TrialState

from optuna_ds._optuna_compat import TrialCache
from optuna_ds._optuna_compat import contains
from optuna_ds._optuna_compat import hide_in_memory_studies
from optuna_ds._optuna_compat import optimize_once
from optuna_ds._optuna_compat import storage_of
from optuna_ds._optuna_compat import study_id
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


class _Lost(Exception):
    """The storage's database went away."""


class _FailingStorage(optuna.storages.InMemoryStorage):
    """Once the objective has run, fails to record the trial's end and then to read the trial
    back, as a lost database does."""

    lost = False

    def set_trial_state_values(self, trial_id, state, values=None):  # type: ignore[no-untyped-def]
        if self.lost:
            raise _Lost("cannot record")
        return super().set_trial_state_values(trial_id, state, values)

    def get_trial(self, trial_id):  # type: ignore[no-untyped-def]
        if self.lost:
            raise _Lost("cannot read")
        return super().get_trial(trial_id)


def _losing(storage: _FailingStorage):  # type: ignore[no-untyped-def]
    def objective(trial: optuna.Trial) -> float:
        storage.lost = True
        return 1.0

    return objective


def test_optuna_5280_a_storage_failing_at_a_trial_end_raises_unbound_local_error() -> None:
    # optuna/optuna#5280. When this fails, Optuna raises the storage's error itself: drop the
    # workaround in optimize_once.
    storage = _FailingStorage()
    study = optuna.create_study(storage=storage)
    with pytest.raises(UnboundLocalError) as raised:
        study.optimize(_losing(storage), n_trials=1)
    assert isinstance(raised.value.__context__, _Lost)


@pytest.mark.parametrize("is_storage_error", [True, False])
def test_optimize_once_raises_the_storage_error_instead(is_storage_error: bool) -> None:
    storage = _FailingStorage()
    study = optuna.create_study(storage=storage)
    with pytest.raises(_Lost if is_storage_error else UnboundLocalError):  # another error: as Optuna raised it
        optimize_once(study, _losing(storage), catch=(), storage_failed=lambda e: is_storage_error)


def test_an_objective_that_returns_nan_fails_its_trial_and_optimize_goes_on(url: str) -> None:
    # A failed experiment's objective returns NaN (optuna_ds.studies._experiments): the trial is
    # FAIL, with no value, its user attrs kept, and optimize returns as for any other trial.
    study = optuna.create_study(storage=url)

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("reason", "oom")
        return float("nan")

    optimize_once(study, objective, catch=(), storage_failed=lambda e: False)
    [trial] = study.get_trials()
    assert (trial.state, trial.value, trial.user_attrs) == (TrialState.FAIL, None, {"reason": "oom"})


def test_cached_storage_reads_trials_through_read_trials_from_remote_storage(url: str) -> None:
    # TrialCache.freeze relies on it: every read of a study's trials refreshes them there first,
    # so skipping it serves the trials as last read.
    cache = TrialCache(optuna.storages.RDBStorage(url))
    study = optuna.create_study(storage=cache, study_name="s")
    study.tell(study.ask(), 1.0)
    other = optuna.load_study(study_name="s", storage=url)  # another worker
    other.tell(other.ask(), 2.0)
    cache.freeze(study)
    other.tell(other.ask(), 3.0)
    assert len(study.get_trials(deepcopy=False)) == 2  # as frozen
    cache.thaw()
    assert len(study.get_trials(deepcopy=False)) == 3


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
