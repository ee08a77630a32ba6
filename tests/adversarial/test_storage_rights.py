"""A database role that may read but not write Optuna's tables: one line naming the refused
right, exit status 2, nothing launched; not a lost storage to run again."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from conftest import assert_one_line_error
from conftest import reachable
from invariants import Hostile
from invariants import base_config
from invariants import hws  # noqa: F401


def _postgresql(name: str) -> Iterator[str]:
    import psycopg

    from optuna_ds.storage import create_storage

    admin = psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True)
    admin.execute(f"CREATE DATABASE {name}")
    admin.execute(f"CREATE ROLE {name} LOGIN")
    try:
        create_storage(f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}").engine.dispose()  # Optuna's tables
        with psycopg.connect(f"host=127.0.0.1 port=5432 user=postgres dbname={name}", autocommit=True) as db:
            db.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {name}")
        yield f"postgresql+psycopg://{name}@127.0.0.1:5432/{name}"
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"DROP ROLE IF EXISTS {name}")
        admin.close()


def _mysql(name: str) -> Iterator[str]:
    import pymysql

    from optuna_ds.storage import create_storage

    admin = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    with admin.cursor() as c:
        c.execute(f"CREATE DATABASE {name}")
        c.execute(f"CREATE USER '{name}'@'%'")
    try:
        create_storage(f"mysql+pymysql://root@127.0.0.1:3306/{name}").engine.dispose()
        with admin.cursor() as c:
            c.execute(f"GRANT SELECT ON {name}.* TO '{name}'@'%'")
        yield f"mysql+pymysql://{name}@127.0.0.1:3306/{name}"
    finally:
        with admin.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {name}")
            c.execute(f"DROP USER IF EXISTS '{name}'@'%'")
        admin.close()


@pytest.fixture(params=["postgresql", "mysql"])
def read_only_url(request: pytest.FixtureRequest) -> Iterator[str]:
    port = {"postgresql": 5432, "mysql": 3306}[request.param]
    if not reachable(port):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{request.param} is not reachable at 127.0.0.1:{port} in CI")
        pytest.skip(f"{request.param} is not reachable at 127.0.0.1:{port}")
    # Unique: test runs may share the server.
    yield from (_postgresql if request.param == "postgresql" else _mysql)(f"optuna_ds_ro_{uuid.uuid4().hex[:8]}")


def test_a_read_only_role_is_one_line_naming_the_refused_right(hws: Hostile, read_only_url: str) -> None:
    hws.config(base_config())
    for extra in ((), ("--overwrite",)):
        proc = hws.main("--storage", read_only_url, *extra)
        assert_one_line_error(proc, "INSERT", "grant", "role")
        assert "again" not in proc.stderr.replace("running again does not help", ""), proc.stderr
    assert hws.experiments() == []
    hws.assert_untouched()
