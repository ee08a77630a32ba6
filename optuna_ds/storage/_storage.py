from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from typing import Any

import optuna

from optuna_ds._errors import OptunaDSError
from optuna_ds._redact import HIDDEN
from optuna_ds._redact import redact_text
from optuna_ds._redact import redact_url

DB_FILENAME = "optuna-ds.db"
HEARTBEAT_INTERVAL = 10
GRACE_PERIOD = 60


class StorageError(OptunaDSError):
    """The storage URL is invalid or its database cannot be reached."""


def default_storage_url(results_dir: str) -> str:
    return f"sqlite:///{os.path.abspath(os.path.join(results_dir, DB_FILENAME))}"


def _sqlite_wal(path: str) -> None:
    """Readers then never block the writer, and a writer waits instead of failing. The
    journal mode is stored in the database file, so once is enough for every process."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(path, timeout=120)) as db:
            db.execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error as e:
        raise StorageError(f"cannot open SQLite database {path}: {e}") from None


def _password_in_userinfo(url: str) -> str | None:
    """The password as the user wrote it: everything between the first ``:`` and the last
    ``@`` of the user info (``None`` if there is none)."""
    scheme, sep, rest = url.partition("://")
    if not sep or rest.startswith("/"):
        return None
    head = rest.split("?", 1)[0].split("#", 1)[0]
    userinfo = head[: head.rfind("@")] if "@" in head else ""
    return userinfo.partition(":")[2] or None


def create_storage(url: str, *, create: bool = True) -> optuna.storages.RDBStorage:
    """Open the RDB storage that holds the plan and every study of a tuning.

    Heartbeats are on so that a trial whose process died is failed and its experiment run
    again. SQLite runs in WAL mode and waits for locks, so several local workers never fail
    with "database is locked". ``create=False`` (``report``, ``dashboard``) opens an existing
    database only: a mistyped SQLite path creates neither folders nor a file.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise StorageError(f"invalid storage URL {redact_url(url)!s}: expected e.g. sqlite:///path.db or postgresql+psycopg://user@host/db") from None
    password = _password_in_userinfo(url)
    if password is not None and ("@" in password or "/" in password):
        # The URL parser would cut the password there and take its tail for the host.
        raise StorageError(f"storage {redact_url(url)}: its password holds '@' or '/'; percent-encode them as %40 and %2F")
    engine_kwargs: dict = {}
    sqlite_path: str | None = None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            sqlite_path = os.path.abspath(parsed.database)
            if not create and not os.path.isfile(sqlite_path):
                raise StorageError(f"no SQLite database at {sqlite_path}")
        engine_kwargs["connect_args"] = {"timeout": 120}
    else:
        engine_kwargs["pool_pre_ping"] = True
    try:
        if sqlite_path and create:
            os.makedirs(os.path.dirname(sqlite_path), exist_ok=True)
        with _creation_lock(sqlite_path if create else None):
            if sqlite_path:
                _sqlite_wal(sqlite_path)
            storage = _open(url, parsed, engine_kwargs)
    except OSError as e:
        raise StorageError(f"cannot create SQLite database {sqlite_path}: {e.strerror or e}") from None
    if sqlite_path:
        _sqlite_sync_normal(storage)
    return storage


def _sqlite_sync_normal(storage: optuna.storages.RDBStorage) -> None:
    """In WAL mode, ``synchronous=NORMAL`` still never corrupts the database and loses nothing
    when a process dies; it skips the fsync of every commit (a trial makes a dozen)."""
    from sqlalchemy import event

    def on_connect(connection: Any, _record: Any) -> None:
        connection.execute("PRAGMA synchronous=NORMAL")

    event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()  # connections opened before the listener reconnect with it


@contextlib.contextmanager
def _creation_lock(sqlite_path: str | None) -> Iterator[None]:
    """Local processes that open a new SQLite database together would race to create its
    tables: they take turns."""
    if not sqlite_path:
        yield
        return
    with open(f"{os.path.abspath(sqlite_path)}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _open(url: str, parsed: Any, engine_kwargs: dict) -> optuna.storages.RDBStorage:
    try:
        for attempt in range(5):
            try:
                return optuna.storages.RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=HEARTBEAT_INTERVAL,
                    grace_period=GRACE_PERIOD,
                )
            except Exception as e:
                # Processes started together race to create Optuna's tables: the loser retries.
                if not any(m in str(e) for m in ("already exists", "Duplicate", "duplicate key", "UNIQUE constraint")) or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")
    except ImportError as e:
        raise StorageError(f"storage {redact_url(url)}: database driver missing ({e}); install optuna-ds[postgres] or optuna-ds[mysql]") from None
    except Exception as e:
        cause = str(getattr(e, "orig", None) or e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        for secret in {parsed.password, _password_in_userinfo(url)} - {None, ""}:
            cause = cause.replace(str(secret), HIDDEN)
        raise StorageError(f"cannot open storage {redact_url(url)}: {redact_text(cause)}") from None
