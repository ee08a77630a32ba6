from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.storages import _CachedStorage


class TrialCache(_CachedStorage):
    """Optuna's cache of an RDB storage, shared by every study of a stage this process opens.

    Optuna's cache reads again only the trials that are new or still running, but it does so at
    every read, and one ask reads several times (the waiting trials, the sampler's view). Within
    :meth:`freeze` and :meth:`thaw`, the reads of this thread come from the cache as it was just refreshed: a
    decision reads the storage once. Other threads (a claim's check against other workers, the
    pruner) keep reading afresh.

    It extends Optuna's private ``_CachedStorage``: Optuna has no public cache of an RDB storage
    (``optuna.create_study`` wraps one in this class itself), and none that could be told when to
    read again.
    """

    def __init__(self, backend: optuna.storages.RDBStorage) -> None:
        super().__init__(backend)
        self._frozen = threading.local()

    def freeze(self, study_id: int) -> None:
        """Refresh ``study_id``'s trials once, then serve this thread's reads from the cache
        until :meth:`thaw`."""
        self._read_trials_from_remote_storage(study_id)
        self._frozen.on = True

    def thaw(self) -> None:
        self._frozen.on = False

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Serve this thread's reads from the cache as this process last read it: for a read
        that follows one just made (the early-stopping check after a claim's check)."""
        before = getattr(self._frozen, "on", False)
        self._frozen.on = True
        try:
            yield
        finally:
            self._frozen.on = before

    def _read_trials_from_remote_storage(self, study_id: int) -> None:
        if getattr(self._frozen, "on", False):
            with self._lock:
                if study_id in self._studies:
                    return
        super()._read_trials_from_remote_storage(study_id)

    def set_trial_user_attrs(self, trial_id: int, attrs: Mapping[str, Any]) -> None:
        """Store several user attrs in one statement: a claim is a dozen attrs, one round trip
        instead of a dozen, and the others see it whole or not at all.

        Optuna's storage API sets one attr per transaction, so this upsert uses its private RDB
        models and session helper: the same table, the same check that the trial is still
        running, the same error (``StorageInternalError``) as its ``set_trial_user_attr``. A
        database without an upsert here gets that public call, attr by attr, in order.
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
            backend.check_trial_is_updatable(trial_id, trial.state)
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
