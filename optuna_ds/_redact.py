from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable
from typing import NamedTuple

# The one place that finds and hides secrets in URLs: every URL printed, logged or put in an error
# goes through here, and the CLI passes every message it prints through ``redact_text``.
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)(.*)", re.DOTALL)
_SECRET_PARAM = re.compile(r"(?i)([?&;][\w.-]*(?:pass|pwd|secret|token|key)[\w.-]*=)([^&]*)")
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

    rest = _SECRET_PARAM.sub(hide, rest)
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
    return _URL.sub(lambda m: redact_url(m.group(0)), text)
