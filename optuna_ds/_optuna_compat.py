"""The one door to Optuna beyond its public API.

Every use optuna-ds makes of Optuna's private names is here, each with what it relies on;
``tests/test_optuna_contract.py`` pins each of those behaviours in a test named after it, so an
Optuna upgrade that changes one fails that test, not a tuning. Everything else in the package
uses Optuna's public API only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import warnings
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import _CachedStorage
from optuna.trial import FrozenTrial


def storage_of(study: optuna.Study) -> optuna.storages.BaseStorage:
    """The storage ``study`` reads and writes, as Optuna holds it: the ``_CachedStorage`` it
    wraps an RDB storage in, or the one passed in if it is a cache already (``Study._storage``).

    Optuna has no public accessor; its own samplers read ``study._storage`` too."""
    return study._storage


def study_id(study: optuna.Study) -> int:
    """``study``'s id in its storage (``Study._study_id``), without the query that the public
    ``storage.get_study_id_from_name`` makes: the knob decision reads it once per decision."""
    return study._study_id


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """``trial``'s id in its storage (``Trial._trial_id``, ``FrozenTrial._trial_id``): the
    storage's per-trial methods take it, and a trial's public number does not name it without a
    query (``storage.get_trial_id_from_study_id_trial_number``)."""
    return trial._trial_id


class _Unlogged(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self._prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return self._prefix not in record.getMessage()


def hide_in_memory_studies(prefix: str) -> None:
    """Drop Optuna's log line of each in-memory study whose name starts with ``prefix`` (a
    working copy, not the user's), for every thread, without touching Optuna's verbosity, which is
    global: a slot thread that lowered and restored it raced the others.

    Optuna logs the creation with the logger of ``optuna.storages._in_memory``, its module."""
    logger = logging.getLogger("optuna.storages._in_memory")
    if not any(isinstance(f, _Unlogged) and f._prefix == prefix for f in logger.filters):
        logger.addFilter(_Unlogged(prefix))


def contains(distribution: BaseDistribution, value: Any) -> bool:
    """Whether a trial whose param has ``distribution`` can take ``value``: a sampler's own list
    may hold values the trial's suggestion does not admit (another range, another type).

    ``BaseDistribution._contains`` on the internal representation, as Optuna's samplers check."""
    try:
        return bool(distribution._contains(distribution.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False


# After a beat the database failed, the next is tried this soon (seconds), not a whole interval later.
_BEAT_RETRY = 1.0
# Optuna warns at each ask outside ``study.optimize`` on a storage with heartbeats, where nothing
# would beat: :func:`heartbeat` does.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial, *, transient: Callable[[BaseException], bool]) -> Iterator[None]:
    """``trial``'s heartbeat while the block runs, recorded as ``study.optimize`` records it,
    but one that a failing database does not end: a beat that fails with an error ``transient``
    accepts is tried again after ``_BEAT_RETRY`` seconds.

    Optuna's own (``optuna.storages._heartbeat.HeartbeatThread``, started by ``_run_trial``)
    has no ``try``: one beat lost to a database restart ends its thread for good, and after the
    grace period another process fails the trial as stale while its experiment still runs. This
    relies on ``is_heartbeat_enabled(storage)``, ``BaseHeartbeat`` and its ``record_heartbeat(trial_id)``
    and ``get_heartbeat_interval()``, which that thread calls.
    """
    from optuna.storages._heartbeat import BaseHeartbeat
    from optuna.storages._heartbeat import is_heartbeat_enabled

    storage = storage_of(study)
    if not (is_heartbeat_enabled(storage) and isinstance(storage, BaseHeartbeat)):
        yield
        return
    interval = float(storage.get_heartbeat_interval() or 0)
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                storage.record_heartbeat(trial_id(trial))
                wait = interval
            except Exception as e:  # noqa: BLE001 - re-raised unless ``transient`` accepts it, whichever driver raised it
                if not transient(e):
                    raise
                wait = min(interval, _BEAT_RETRY)
            if stop.wait(wait):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def stale_trial_ids(study: optuna.Study) -> set[int]:
    """The ids of ``study``'s running trials whose heartbeat is older than the storage's grace
    period: those ``optuna.storages.fail_stale_trials`` would fail now. A storage without
    heartbeats has none. Optuna's ``_get_stale_trial_ids(study_id)``, which that function reads."""
    from optuna.storages._heartbeat import BaseHeartbeat
    from optuna.storages._heartbeat import is_heartbeat_enabled

    storage = storage_of(study)
    if not (is_heartbeat_enabled(storage) and isinstance(storage, BaseHeartbeat)):
        return set()
    return set(storage._get_stale_trial_ids(study_id(study)))


class TrialCache(_CachedStorage):
    """Optuna's cache of an RDB storage, shared by every study of a stage this process opens.

    Optuna's cache reads again only the trials that are new or still running. It extends
    Optuna's private ``_CachedStorage``: Optuna has no public cache of an RDB storage
    (``optuna.create_study`` wraps one in this class itself, and uses a ``_CachedStorage`` it is
    given as it is), and none that stores a claim's attrs in one statement.
    """

    def set_trial_user_attrs(self, trial_id: int, attrs: Mapping[str, Any]) -> None:
        """Store several user attrs in one statement: a claim is a dozen attrs, one round trip
        instead of a dozen, and the others see it whole or not at all.

        Optuna's storage API sets one attr per transaction, so this upsert uses its private RDB
        models (``optuna.storages._rdb.models``: ``TrialModel.find_or_raise_by_id``,
        ``TrialUserAttributeModel`` with columns ``trial_id``, ``key``, ``value_json`` unique on
        the first two) and session helper (``_create_scoped_session``): the same table, the same
        check that the trial is still running, the same error (``UpdateFinishedTrialError``) as
        its ``set_trial_user_attr``. A database without an upsert here gets that public call,
        attr by attr, in order.
        """
        backend = self._backend
        dialect = backend.engine.name
        if dialect not in ("postgresql", "sqlite", "mysql"):
            for key, value in attrs.items():
                backend.set_trial_user_attr(trial_id, key, value)
            return

        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        table = models.TrialUserAttributeModel
        rows = [{"trial_id": trial_id, "key": key, "value_json": json.dumps(value)} for key, value in attrs.items()]
        with _create_scoped_session(backend.scoped_session, True) as session:
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
            backend.check_trial_is_updatable(trial_id, trial.state)  # type: ignore[arg-type, unused-ignore]  # the ORM column's value: a TrialState
            if dialect in ("postgresql", "sqlite"):
                from sqlalchemy.dialects import postgresql
                from sqlalchemy.dialects import sqlite

                insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table).values(rows)
                session.execute(insert.on_conflict_do_update(index_elements=[table.trial_id, table.key],
                                                             set_={"value_json": insert.excluded.value_json}))
            else:
                from sqlalchemy.dialects import mysql

                upsert = mysql.insert(table).values(rows)
                session.execute(upsert.on_duplicate_key_update(value_json=upsert.inserted.value_json))


def take_waiting_trial(storage: optuna.storages.BaseStorage, trial_id: int, attrs: Mapping[str, Any]) -> bool:
    """Move a WAITING trial to RUNNING, for this caller only, with the user attrs ``attrs`` (who
    took it: a process killed a moment later leaves a trial the reaper can tell as its): ``True``
    where it was waiting and is now this caller's. Optuna's own pop (``set_trial_state_values``)
    reads the state and then writes it, under a row lock PostgreSQL and MySQL take but SQLite
    does not: two processes on one SQLite file both took one trial. On an RDB storage this is one
    transaction: a conditional ``UPDATE ... WHERE state = 'WAITING'`` through Optuna's private
    ORM models (``optuna.storages._rdb.models.TrialModel``, columns ``trial_id``, ``state``,
    ``datetime_start``; ``TrialUserAttributeModel``, as :meth:`TrialCache.set_trial_user_attrs`)
    and session helper (``_create_scoped_session``); elsewhere (in memory, under its lock)
    Optuna's public calls."""
    backend = storage._backend if isinstance(storage, _CachedStorage) else storage
    if not isinstance(backend, optuna.storages.RDBStorage):
        try:
            if not storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.RUNNING):
                return False
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        for key, value in attrs.items():
            storage.set_trial_user_attr(trial_id, key, value)
        return True
    import datetime

    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    table = models.TrialModel
    with _create_scoped_session(backend.scoped_session, True) as session:
        taken = session.query(table).filter(table.trial_id == trial_id, table.state == optuna.trial.TrialState.WAITING).update(
            {"state": optuna.trial.TrialState.RUNNING, "datetime_start": datetime.datetime.now()}, synchronize_session=False)
        if taken:
            session.add_all([models.TrialUserAttributeModel(trial_id=trial_id, key=key, value_json=json.dumps(value))
                             for key, value in attrs.items()])
    return bool(taken)
