from __future__ import annotations

import contextlib
import fcntl
import math
import os
import random
import re
import time
from collections.abc import Iterator
from typing import Any

import optuna

from optuna_ds._errors import OptunaDSError
from optuna_ds._files import check_own_file
from optuna_ds._files import open_lock
from optuna_ds._redact import redact_text
from optuna_ds._redact import redact_url
from optuna_ds._redact import url_password
from optuna_ds._redact import url_secrets

DB_FILENAME = "optuna-ds.db"
_SQLITE_MAX_PATHNAME = 512  # SQLite's default limit on a database's path, in bytes
HEARTBEAT_INTERVAL = 10
GRACE_PERIOD = 60
# A database server's connections per process. Every slot thread and every running trial's
# heartbeat thread borrows one for each query and gives it back at once, so a few are enough;
# SQLAlchemy's default pool (5 kept open, up to 15) had a process of 8 slots hold 11, and 8
# such processes exhaust PostgreSQL's default 100. A thread waits its turn instead.
POOL_SIZE = 2
POOL_OVERFLOW = 2
_POOL_WAIT = 600.0
# A server or role at its connection limit refuses a new one; others' close within moments, so
# a refused connection is tried again for this long before the process gives up
# (``OPTUNA_DS_CONNECT_PATIENCE`` overrides).
_CONNECT_PATIENCE = 20.0
# A creation takes moments: a creators' lock held longer is held by a process stopped or hung
# while it created the database (Ctrl-Z in its first seconds). Waited for as long as SQLite
# waits for a writer, then told in one line.
_CREATION_WAIT = 120.0
# A server that accepts the connection and then says nothing (stopped, or a port that is not
# the database's) was waited for without end by the MySQL drivers, which read its greeting and
# every answer with no timeout: silent this long, it is lost. PostgreSQL's psycopg has its own
# connect_timeout (130 s), kept.
_SILENCE_LIMIT = 600  # seconds; an int, as MySQLdb takes it
_refused_since: float | None = None  # when this process's connections began to be refused, until one is accepted
_FULL = re.compile(r"(?i)too many (clients|connections)|remaining connection slots|max_user_connections")
# SQLite's SQLITE_CORRUPT and SQLITE_NOTADB: the file holds no database it can read, now or ever.
_MALFORMED = re.compile(r"database disk image is malformed|file is not a database")
# The tuning's tables missing from a database that held them: deleted or emptied under the tuning.
_NO_TABLES = re.compile(r"no such table|relation \S{1,200} does not exist|Table \S{1,200} doesn't exist")


class StorageError(OptunaDSError):
    """The storage URL is invalid or its database cannot be reached."""


class NoDatabase(StorageError):
    """``create=False`` and the SQLite file does not exist (yet: a worker may wait for it)."""


def default_storage_url(results_dir: str) -> str:
    """The SQLite database in ``results_dir``, as a URL SQLAlchemy reads back to that path: a
    folder named ``res?mode=ro`` holds it, it does not become a query."""
    from sqlalchemy.engine import URL

    path = os.path.abspath(os.path.join(results_dir, DB_FILENAME))
    return URL.create("sqlite", database=path).render_as_string(hide_password=False)


def _sqlite_wal(path: str) -> None:
    """Readers then never block the writer, and a writer waits instead of failing. The
    journal mode is stored in the database file, so once is enough for every process."""
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(path, timeout=120)) as db:
            db.execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error as e:
        if len(os.fsencode(path)) >= _SQLITE_MAX_PATHNAME and "unable to open" in str(e):
            raise StorageError(f"cannot open SQLite database {path}: its path is {len(os.fsencode(path))} bytes long; SQLite "
                               f"opens paths of fewer than {_SQLITE_MAX_PATHNAME}: pass a shorter --results-dir, or "
                               "--storage sqlite:///SHORTER/PATH.db") from None
        raise StorageError(unusable_database(f"sqlite:///{path}", str(e)) or f"cannot open SQLite database {path}: {e}") from None


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
    _check_dialect(url, parsed)
    password = url_password(url)
    if password is not None and ("@" in password or "/" in password):
        # The URL parser would cut the password there and take its tail for the host.
        raise StorageError(f"storage {redact_url(url)}: its password holds '@' or '/'; percent-encode them as %40 and %2F")
    engine_kwargs: dict = {}
    sqlite_path: str | None = None
    if parsed.get_backend_name() == "sqlite":
        if parsed.host:
            # sqlite://tmp/x reads "tmp" as a host SQLite has none of, and opens x here.
            path = "/".join(p for p in (parsed.host, parsed.database) if p)
            raise StorageError(f"storage {redact_url(url)}: a SQLite URL names no host "
                               f"('{parsed.host}'): write sqlite:///{path} for {path} under the "
                               f"current folder, or sqlite:////{path} for /{path}")
        if parsed.database and parsed.database != ":memory:":
            sqlite_path = os.path.abspath(parsed.database)
            if not create and not os.path.isfile(sqlite_path):
                raise NoDatabase(f"no SQLite database at {sqlite_path}")
        engine_kwargs["connect_args"] = {"timeout": 120}
    else:
        _connect_patience()  # a bad setting is told now, not when the server first refuses
        engine_kwargs.update(pool_pre_ping=True, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW, pool_timeout=_POOL_WAIT)
    if sqlite_path and create:
        for side in ("-wal", "-shm", "-journal", ".lock"):
            check_own_file(sqlite_path + side)  # SQLite's and ours: written through a link, they would land elsewhere
    try:
        if sqlite_path and create:
            os.makedirs(os.path.dirname(sqlite_path), exist_ok=True)
        with _creation_lock(sqlite_path, create=create):
            if sqlite_path:
                _sqlite_wal(sqlite_path)
            storage = _open(url, parsed, engine_kwargs)
    except OSError as e:
        raise StorageError(f"cannot create SQLite database {sqlite_path}: {e.strerror or e}") from None
    if sqlite_path:
        _sqlite_sync_normal(storage)
    return storage


# The URL schemes of the drivers optuna-ds's extras install, by the database's family.
_SCHEMES = {"postgres": "postgresql+psycopg", "mysql": "mysql+pymysql", "mariadb": "mysql+pymysql", "sqlite": "sqlite"}


def _scheme_hint(drivername: str) -> str:
    family = next((s for k, s in _SCHEMES.items() if drivername.lower().startswith(k)), None)
    return f"; use {family}://..." if family else "; expected e.g. sqlite:///path.db or postgresql+psycopg://user@host/db"


def _check_dialect(url: str, parsed: Any) -> None:
    """A scheme SQLAlchemy has no dialect for (``postgres://``, as Heroku and many docs write
    it) is told with the one that works, not as SQLAlchemy's "Can't load plugin"."""
    from sqlalchemy.exc import NoSuchModuleError

    try:
        parsed.get_dialect()
    except NoSuchModuleError:
        raise StorageError(f"storage {redact_url(url)}: SQLAlchemy knows no database {parsed.drivername!r}"
                           f"{_scheme_hint(parsed.drivername)}") from None
    except ImportError:
        pass  # a known dialect whose driver is missing: told when it opens (see _open)


def _sqlite_sync_normal(storage: optuna.storages.RDBStorage) -> None:
    """In WAL mode, ``synchronous=NORMAL`` still never corrupts the database and loses nothing
    when a process dies; it skips the fsync of every commit (a trial makes a dozen)."""
    from sqlalchemy import event

    def on_connect(connection: Any, _record: Any) -> None:
        connection.execute("PRAGMA synchronous=NORMAL")

    event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()  # connections opened before the listener reconnect with it


@contextlib.contextmanager
def _creation_lock(sqlite_path: str | None, *, create: bool) -> Iterator[None]:
    """Local processes that open a new SQLite database together would race to create its
    tables: they take turns. One that opens an existing database only (``create=False``) waits
    for a creation under way, and makes no lock file: the file is there before its WAL mode and
    its tables, and a worker that opened it then exited 2, "database is locked"."""
    if not sqlite_path:
        yield
        return
    try:
        fd = open_lock(f"{os.path.abspath(sqlite_path)}.lock", create=create)
    except OSError:
        if create:
            raise
        yield  # no creation of ours under way
        return
    try:
        _lock_within(fd, sqlite_path, _CREATION_WAIT)
        yield
    finally:
        os.close(fd)


def _lock_within(fd: int, sqlite_path: str, seconds: float) -> None:
    """The creators' lock of ``sqlite_path``, or a :class:`StorageError` once another process
    has held it for ``seconds``: a blocking ``flock`` waited for a stopped process for ever."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise StorageError(
                    f"SQLite database {sqlite_path}: another process has been creating it for {seconds:g} s and holds "
                    f"{sqlite_path}.lock (stopped or hung?): end or resume it, then run again") from None
        time.sleep(0.05)


def _connect_patience() -> float:
    """How long a connection the server refuses for being full is tried again, in seconds:
    ``OPTUNA_DS_CONNECT_PATIENCE``, else ``_CONNECT_PATIENCE``. Longer where a burst of other
    clients outlasts it; 0 gives up at the first refusal."""
    value = os.environ.get("OPTUNA_DS_CONNECT_PATIENCE")
    if value is None:
        return _CONNECT_PATIENCE
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise StorageError(f"OPTUNA_DS_CONNECT_PATIENCE must be a number of seconds, 0 or more; got {value!r}")
    return seconds


def _patient_connections(dialect: type) -> None:
    """Connections of ``dialect`` refused because the server or the role is at its connection
    limit are tried again for :func:`_connect_patience` seconds: a burst of other clients must not
    end a tuning. Installed on the dialect, not on one engine: Optuna's storage connects while it
    is being created, before its engine is ours to configure."""
    from sqlalchemy import event

    if not event.contains(dialect, "do_connect", _connect_patiently):
        event.listen(dialect, "do_connect", _connect_patiently)


def _connect_patiently(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
    """The patience is the process's, not each connection's: once the server has refused it for
    :func:`_connect_patience` seconds, every thread gives up at once and the process ends soon."""
    global _refused_since
    if dialect.driver in ("pymysql", "mysqldb"):  # the URL's own settings win
        cparams.setdefault("read_timeout", _SILENCE_LIMIT)
        cparams.setdefault("write_timeout", _SILENCE_LIMIT)
    delay = 0.1
    while True:
        try:
            connection = dialect.connect(*cargs, **cparams)
        except Exception as e:  # noqa: BLE001 - each driver raises its own class: re-raised unless its message says the server is full
            if not _FULL.search(str(e)):
                raise
            now = time.monotonic()
            _refused_since = _refused_since or now
            if now + delay > _refused_since + _connect_patience():
                raise
        else:
            _refused_since = None
            return connection
        time.sleep(delay * random.uniform(0.5, 1.0))  # jittered: refused processes do not all retry in step
        delay = min(2.0, delay * 2)


def database_error(error: BaseException) -> str | None:
    """The database's own one-line account of ``error`` if the storage's database failed
    somewhere in its chain (Optuna hides the driver's error behind "An exception is raised
    during the commit ..."); ``None`` if it is no database failure."""
    from sqlalchemy import exc

    seen: set[int] = set()
    found: str | None = None
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, exc.DBAPIError) and e.orig is not None:
            return _one_line(str(e.orig)) or type(e.orig).__name__
        if isinstance(e, exc.TimeoutError):
            return f"no free connection to it in {_POOL_WAIT:.0f} s"
        if found is None and isinstance(e, (exc.SQLAlchemyError, optuna.exceptions.StorageInternalError)):
            found = _one_line(str(e)) or type(e).__name__
        e = e.__cause__ or e.__context__
    return found


# A right the database refused: PostgreSQL's SQLSTATE, MySQL's and MariaDB's error numbers (table,
# column, database, privilege, routine), SQLite's read-only file.
_PG_DENIED = "42501"
_MYSQL_DENIED = frozenset({1044, 1142, 1143, 1227, 1370})


def _grant(url: str) -> str:
    """What to do about a refused right."""
    if url.startswith("sqlite"):
        return "optuna-ds writes to the database: make its file and folder writable, or pass another --storage"
    return ("optuna-ds needs SELECT, INSERT, UPDATE and DELETE on Optuna's tables (and CREATE where they do not exist "
            "yet): grant them to the role, or use another role")


def permission_denied(error: BaseException) -> str | None:
    """What the database refused if ``error`` is a missing right somewhere in its chain: the
    statement's verb and the database's account of it; ``None`` for any other failure. Running
    again never helps there, unlike a lost connection."""
    from sqlalchemy import exc

    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, exc.DBAPIError) and e.orig is not None:
            orig = e.orig
            code = orig.args[0] if orig.args and isinstance(orig.args[0], int) else None
            message = _one_line(str(orig.args[1]) if code is not None and len(orig.args) > 1 else str(orig))
            if getattr(orig, "sqlstate", None) == _PG_DENIED or getattr(orig, "pgcode", None) == _PG_DENIED:
                verb = (e.statement or "").split(None, 1)[0].upper() if (e.statement or "").strip() else ""
                return f"{message} ({verb})" if verb else message  # PostgreSQL's names the table, not the right
            if code in _MYSQL_DENIED or "readonly database" in message:
                return message
        e = e.__cause__ or e.__context__
    return None


def _one_line(message: str) -> str:
    lines = [" ".join(line.split()) for line in message.strip().splitlines()]
    return next((line for line in lines if line), "")


def _explain(url: str, cause: str) -> str:
    """``cause`` with every secret of ``url`` hidden, and what to do where the server is full."""
    cause = redact_text(cause, secrets=url_secrets(url))
    if _FULL.search(cause):
        cause += (f" (each optuna-ds process uses up to {POOL_SIZE + POOL_OVERFLOW} connections: raise the server's "
                  "max_connections or the role's connection limit, or run fewer processes)")
    return cause


@contextlib.contextmanager
def storage_failures(url: str, *, advice: str) -> Iterator[None]:
    """A failure of the storage's database inside the block becomes one :class:`StorageError`
    naming it and saying ``advice`` (how to resume), whatever raised it: a slot's thread, the
    coordinator, the summary's writer."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - re-raised unless a database's failure is in it, whichever driver or wrapper raised it
        cause = database_error(e)
        if cause is None:
            raise
        denied = permission_denied(e)
        if denied is not None:
            raise StorageError(f"storage {redact_url(url)}: {_explain(url, denied)}: {_grant(url)} (running again "
                               "does not help)") from None
        raise StorageError(unusable_database(url, cause) or f"lost the storage {redact_url(url)}: {_explain(url, cause)}; {advice}") from None


def _sqlite_file(url: str) -> str | None:
    """The file of a SQLite storage URL; ``None`` for a server's (or an in-memory one)."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - a URL SQLAlchemy cannot read holds no file
        return None
    database = parsed.database if parsed.get_backend_name() == "sqlite" else None
    return os.path.abspath(database) if database and database != ":memory:" else None


def unusable_database(url: str, cause: str) -> str | None:
    """The one line that says the storage's database holds nothing to resume from, when
    ``cause`` (the database's account of a failure) says so: a SQLite file that is malformed
    (resuming it fails every time), or the tuning's database deleted or emptied while it ran.
    ``None`` for any other failure (a connection lost, a server restarting: run again)."""
    path = _sqlite_file(url)
    shown = path or redact_url(url)
    if _MALFORMED.search(cause):
        return (f"storage {shown} is malformed ({_explain(url, cause)}): no tuning can be resumed from it; move it away "
                "to start afresh, or pass another --results-dir or --storage")
    if (path is not None and not os.path.exists(path)) or _NO_TABLES.search(cause):
        return (f"storage {shown} is gone ({_explain(url, cause)}): its database, or the folder holding it, was deleted or "
                "emptied while the tuning ran, and the experiments recorded in it with it; run the command again to start afresh")
    return None


def _open(url: str, parsed: Any, engine_kwargs: dict) -> optuna.storages.RDBStorage:
    try:
        if parsed.get_backend_name() != "sqlite":
            _patient_connections(parsed.get_dialect())
        for attempt in range(5):
            try:
                return optuna.storages.RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=HEARTBEAT_INTERVAL,
                    grace_period=GRACE_PERIOD,
                )
            except Exception as e:  # noqa: BLE001 - each driver raises its own class: re-raised unless it names the race below
                # Processes started together race to create Optuna's tables: the loser retries.
                if not any(m in str(e) for m in ("already exists", "Duplicate", "duplicate key", "UNIQUE constraint")) or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")
    except ImportError as e:
        driver = "" if "+" in parsed.drivername else _scheme_hint(parsed.drivername)  # the default driver, not the extra's
        raise StorageError(f"storage {redact_url(url)}: database driver missing ({e}); install optuna-ds[postgres] or "
                           f"optuna-ds[mysql]{driver}") from None
    except Exception as e:  # noqa: BLE001 - whatever opening the storage fails with (driver, SQLAlchemy, Optuna) is told in one line
        denied = permission_denied(e)
        if denied is not None:
            raise StorageError(f"cannot open storage {redact_url(url)}: {_explain(url, denied)}: {_grant(url)}") from None
        cause = database_error(e) or _one_line(str(e)) or type(e).__name__
        raise StorageError(unusable_database(url, cause) or f"cannot open storage {redact_url(url)}: {_explain(url, cause)}") from None
