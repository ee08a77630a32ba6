"""No storage password is ever printed or written, whatever its form."""

from __future__ import annotations

import socket
import uuid

import optuna
import pytest
from hypothesis import assume
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from invariants import Hostile
from invariants import assert_no_secret
from invariants import assert_one_line_error
from invariants import base_config
from invariants import hws  # noqa: F401
from optuna_ds._redact import redact_text
from optuna_ds._redact import redact_url

_PASSWORD = st.text(alphabet="abcXYZ019@/:?&#%!$=+;", min_size=4, max_size=20)


@settings(max_examples=200, deadline=None)
@given(password=_PASSWORD, form=st.sampled_from(["userinfo", "query", "sslpassword"]))
def test_no_url_form_shows_its_password(password: str, form: str) -> None:
    base = "postgresql+psycopg://user{}@db.example:5432/tuning{}"
    url = {"userinfo": base.format(":" + password, ""),
           "query": base.format("", "?sslmode=require&password=" + password.replace("&", "")),
           "sslpassword": base.format("", "?sslpassword=" + password.replace("&", ""))}[form]
    secret = password if form == "userinfo" else password.replace("&", "")
    assume(len(secret) >= 4 and secret not in url.replace(secret, "", 1))
    for shown in (redact_url(url), redact_text(f"cannot open storage {url}: refused")):
        assert secret not in shown, shown


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("auth", ["?password=S3cretQuery", ":p@ss/w0rdS3cret@"])
def test_unreachable_database_errors_hide_the_password(hws: Hostile, auth: str) -> None:
    port = _unused_port()
    if auth.startswith("?"):
        url = f"postgresql+psycopg://u@127.0.0.1:{port}/db{auth}"
    else:
        url = f"postgresql+psycopg://u{auth}127.0.0.1:{port}/db"
    hws.config(base_config())
    for proc in (hws.main("--storage", url),
                 hws.main("report", "--storage", url, "-o", str(hws.root / "r.html"), config=None),
                 hws.main("worker", "--storage", url, config=None)):
        assert_one_line_error(proc)
        for piece in ("S3cret", "w0rd", "ss/"):
            assert_no_secret(piece, proc.stdout, proc.stderr)
    assert_no_secret("S3cret", hws.base)
    hws.assert_untouched()


def test_a_tuning_on_postgres_with_the_password_in_the_query_never_shows_it(hws: Hostile) -> None:
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=1).close()
    except OSError:
        pytest.skip("no PostgreSQL at 127.0.0.1:5432")
    url = "postgresql+psycopg://postgres@127.0.0.1:5432/test?password=S3cretPG"  # trust auth: accepted, unused
    name = f"secret-{uuid.uuid4().hex[:8]}"
    hws.config(base_config())
    try:
        proc = hws.hostile("ds_config.json", "-v", "--storage", url, "--study-name", name)
        assert proc.returncode == 0, proc.stderr
        report = hws.cli("report", "--storage", url, "--study-name", name, "-o", str(hws.results / "again.html"))
        assert report.returncode == 0, report.stderr
        assert "127.0.0.1" in proc.stdout
        for text in (proc.stdout, proc.stderr, report.stdout, report.stderr):
            assert_no_secret("S3cretPG", text)
        assert_no_secret("S3cretPG", hws.base)
        hws.assert_untouched()
    finally:
        storage = optuna.storages.RDBStorage(url.split("?")[0])
        for summary in optuna.get_all_study_summaries(storage):
            if summary.study_name.startswith(name):
                optuna.delete_study(study_name=summary.study_name, storage=storage)
