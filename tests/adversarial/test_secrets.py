"""No storage password is ever printed or written, whatever its form."""

from __future__ import annotations

import re
import socket
import time
import urllib.parse
import uuid

import optuna
import pytest
from hypothesis import assume
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from conftest import assert_one_line_error
from invariants import Hostile
from invariants import assert_no_secret
from invariants import base_config
from invariants import hws  # noqa: F401
from optuna_ds._redact import redact_text
from optuna_ds._redact import redact_url
from optuna_ds._redact import url_password
from optuna_ds._redact import url_secrets

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


@settings(max_examples=200, deadline=None)
@given(password=_PASSWORD, form=st.sampled_from(["userinfo", "query"]))
def test_a_percent_encoded_password_is_hidden_in_both_forms(password: str, form: str) -> None:
    """A driver's error may echo the password decoded: that form is hidden too."""
    encoded = urllib.parse.quote(password, safe="")
    url = (f"postgresql+psycopg://user:{encoded}@db.example:5432/tuning" if form == "userinfo"
           else f"postgresql+psycopg://user@db.example:5432/tuning?sslmode=require&password={encoded}")
    assume(len(password) >= 4 and password not in "postgresql+psycopg://user@db.example:5432/tuning?sslmode=require&password=")
    shown = redact_text(f"cannot open storage {url}: password {password!s} refused; again {encoded}", secrets=url_secrets(url))
    assert password not in shown and encoded not in shown, shown


@pytest.mark.parametrize(("url", "password"), [
    ("postgresql+psycopg://u:p@ss/w0rd@h:5432/db", "p@ss/w0rd"),
    ("postgresql+psycopg://u:pa?ss#x@h/db?sslmode=require", "pa?ss#x"),
    ("postgresql+psycopg://u:a:b@h/db", "a:b"),
    ("postgresql+psycopg://u:p%40ss@h/db", "p%40ss"),
    ("postgresql+psycopg://u@h/db?password=q@x", None),  # a query password is no user info
    ("postgresql+psycopg://u:@h/db", ""),
    ("postgresql+psycopg://h/db", None),
    ("sqlite:////tmp/a:b@c.db", None),
    ("not a url", None),
])
def test_the_user_info_password_is_read_whole(url: str, password: str | None) -> None:
    """The one reading of a URL's password: what ``create_storage`` checks for '@' and '/' and
    what ``redact_url`` hides."""
    assert url_password(url) == password
    if password:
        assert password not in redact_url(url).replace("postgresql+psycopg://u:", ""), redact_url(url)
        assert redact_url(url).startswith("postgresql+psycopg://u:***@")


@pytest.mark.parametrize("hostile", [
    "a." * 30_000,  # a scheme may start at every letter: seconds, the pattern tried at each
    "1." * 30_000 + "://",  # one "://" after them, no letter that may start its scheme
    "x://db/?" + "pass" * 16_000,  # a secret's parameter name at every 4th character, no "="
    "x://db/?" + "token." * 10_000 + "x",
])
def test_redacting_hostile_text_takes_linear_time(hostile: str) -> None:
    """A driver's error or a run's output may quote anything: the URL and query patterns read it
    in linear time (``\\b[A-Za-z][A-Za-z0-9+.-]*://`` tried at every word took seconds on 60 KB),
    and still find the URL after it."""
    tail = " then postgresql://u:hunter22@db/t?sslpassword=s3cret&x=1"
    started = time.perf_counter()
    shown = redact_text(hostile + tail)
    assert time.perf_counter() - started < 1.0
    assert "hunter22" not in shown and "s3cret" not in shown
    assert shown.endswith("postgresql://u:***@db/t?sslpassword=***&x=1")


def test_url_secrets_are_every_password_as_written_and_decoded() -> None:
    url = "postgresql+psycopg://u:p%40ss%2Fw@h/db?sslpassword=s%26t&token=tok+en&sslmode=require"
    assert {"p%40ss%2Fw", "p@ss/w", "s%26t", "s&t", "tok+en", "tok en"} <= url_secrets(url)
    assert "require" not in url_secrets(url) and "u" not in url_secrets(url)
    assert url_secrets("sqlite:///tmp/x.db") == set()


def test_a_password_the_url_parser_would_cut_is_refused_without_showing_it() -> None:
    from optuna_ds.storage import StorageError
    from optuna_ds.storage import create_storage

    with pytest.raises(StorageError, match="percent-encode") as raised:
        create_storage("postgresql+psycopg://u:S3cret@pw@127.0.0.1:1/db")
    assert "S3cret" not in str(raised.value)


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
        again = str(hws.results / "again.html")
        report = hws.cli("report", "--storage", url, "--study-name", name, "-o", again)
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


def test_experiments_and_the_training_never_see_the_storage_url(hws: Hostile) -> None:
    """Row 6 of issue 34: OPTUNA_STORAGE, password included, was inherited by every experiment,
    every rank and `run`'s training; a script that prints its environment wrote it to stdout.log."""
    hws.config(base_config())
    url = f"sqlite:///{hws.results / 'optuna-ds.db'}"
    proc = hws.hostile(command="run", env=hws.env(HOSTILE_DS_TABLE="{}", OPTUNA_STORAGE=url))
    assert proc.returncode == 0, proc.stderr
    launches = [e for e in hws.events() if e["event"] == "start"]
    assert any(e["training"] for e in launches) and any(not e["training"] for e in launches), launches
    assert [e["storage_env"] for e in launches] == [None] * len(launches)


def test_the_readme_keeps_passwords_off_the_command_line() -> None:
    """`ps` shows every process's arguments to every user of the node."""
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    on_argv = re.findall(r"--storage[ =]\S*://[^\s/@]*:[^\s@]*@", readme)
    assert not on_argv, on_argv
