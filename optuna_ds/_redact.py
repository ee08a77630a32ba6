from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from typing import NamedTuple

# The one place that finds and hides secrets in URLs: every URL printed, logged or put in an error
# goes through here, and the CLI passes every message it prints through ``redact_text``.
# Every pattern runs in linear time on any text (a driver's error may quote megabytes): a URL is
# found from its "://" (:func:`_urls`), never by trying a scheme at every word.
_SEPARATOR = re.compile("://")
_BODY = re.compile(r"[^\s'\"<>]*")  # a URL's rest, after its "://"
_SCHEME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+.-")
_SCHEME_START = re.compile(r"\b[A-Za-z]")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)(.*)", re.DOTALL)
_PARAM = re.compile(r"[?&;]([\w.-]*)=")  # a query parameter's name: one run of name characters
_SECRET_NAME = re.compile(r"(?i)pass|pwd|secret|token|key")
_SECRET_VALUE = re.compile(r"([?&;][\w.-]*=)(.*)", re.DOTALL)  # matched over one parameter only
HIDDEN = "***"


class _Parts(NamedTuple):
    scheme: str  # "scheme://"
    user: str | None  # None: no user info
    password: str | None  # None: no password
    rest: str  # from the "@" on, its query secrets hidden
    query_secrets: list[str]


def _split(url: str) -> _Parts | None:
    """``url`` in its parts; ``None`` if it is no URL.

    Everything up to the URL's last ``@`` counts as user info, so a password holding ``@``, ``/``,
    ``?`` or ``#`` is found whole; the query is read first, as its password may hold ``@`` too.
    """
    match = _SCHEME.fullmatch(url)
    if match is None:
        return None
    scheme, rest = match.groups()
    query_secrets: list[str] = []

    def hide(m: re.Match[str]) -> str:
        query_secrets.append(m.group(2))
        return m.group(1) + HIDDEN

    rest = _hide_params(rest, hide)
    at = rest.rfind("@")
    if at < 0 or rest.startswith("/"):  # sqlite:////path@x.db has no user info
        return _Parts(scheme, None, None, rest, query_secrets)
    user, sep, password = rest[:at].partition(":")
    return _Parts(scheme, user, password if sep else None, rest[at:], query_secrets)


def url_password(url: str) -> str | None:
    """The password of ``url``'s user info as the user wrote it (``None`` if there is none)."""
    parts = _split(url)
    return parts.password if parts else None


def url_secrets(url: str) -> set[str]:
    """Every secret ``url`` holds (the user info's password, the query's passwords, tokens and
    keys), as written and percent-decoded: the forms a database driver may echo in its errors."""
    parts = _split(url)
    if parts is None:
        return set()
    written = [s for s in (parts.password, *parts.query_secrets) if s]
    return {form for s in written for form in (s, urllib.parse.unquote(s), urllib.parse.unquote_plus(s)) if form}


def redact_url(url: str) -> str:
    """The URL with every password hidden: in the user info, whatever characters it holds, and
    in the query string (``?password=…``, ``sslpassword``, tokens, keys)."""
    parts = _split(url)
    if parts is None:
        return url
    if parts.user is None:
        return parts.scheme + parts.rest
    return parts.scheme + (f"{parts.user}:{HIDDEN}" if parts.password is not None else parts.user) + parts.rest


def redact_text(text: str, *, secrets: Iterable[str] = ()) -> str:
    """``text`` with every URL in it redacted, and each of ``secrets`` (see :func:`url_secrets`)
    hidden wherever it stands alone, as in a database driver's error message."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    out: list[str] = []
    done = 0
    for start, end in _urls(text):
        out += [text[done:start], redact_url(text[start:end])]
        done = end
    return "".join(out) + text[done:]


def _urls(text: str) -> Iterator[tuple[int, int]]:
    """Where each URL of ``text`` starts and ends, as ``\\b[A-Za-z][A-Za-z0-9+.-]*://[^\\s'"<>]*``
    finds them (its leftmost matches), in time linear in ``text``: each "://" is found once, and
    its scheme read back from it over characters no other URL's scheme reads."""
    done = 0
    for separator in _SEPARATOR.finditer(text):
        at = separator.start()
        if at < done:
            continue  # inside the URL before
        first = at
        while first > done and text[first - 1] in _SCHEME_CHARS:
            first -= 1
        start = _SCHEME_START.search(text, first, at)
        if start is None:
            continue
        body = _BODY.match(text, separator.end())
        assert body is not None  # it matches the empty string
        done = body.end()
        yield start.start(), done


def _hide_params(query: str, hide: Callable[[re.Match[str]], str]) -> str:
    """``query`` with each value of a parameter whose name says it is secret replaced by what
    ``hide`` makes of the match (group 1: ``?name=``, group 2: the value up to the next ``&``), in
    time linear in ``query``."""
    out: list[str] = []
    done = 0
    while (param := _PARAM.search(query, done)) is not None:
        if not _SECRET_NAME.search(param.group(1)):
            out.append(query[done:param.end()])
            done = param.end()
            continue
        end = query.find("&", param.end())
        end = len(query) if end < 0 else end
        whole = _SECRET_VALUE.match(query, param.start(), end)
        assert whole is not None
        out += [query[done:param.start()], hide(whole)]
        done = end
    return "".join(out) + query[done:]
