from __future__ import annotations

import re

# The one place that hides secrets in URLs: every URL printed, logged or put in an error goes
# through here, and the CLI passes every message it prints through ``redact_text``.
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)(.*)", re.DOTALL)
_SECRET_PARAM = re.compile(r"(?i)([?&;][\w.-]*(?:pass|pwd|secret|token|key)[\w.-]*=)[^&#;]*")
HIDDEN = "***"


def redact_url(url: str) -> str:
    """The URL with every password hidden: in the user info, whatever characters it holds
    (``@`` and ``/`` included: everything up to the last ``@`` before the query is user info),
    and in the query string (``?password=…``, ``sslpassword``, tokens, keys)."""
    match = _SCHEME.fullmatch(url)
    if match is None:
        return url
    scheme, rest = match.groups()
    query_at = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    head, tail = rest[:query_at], rest[query_at:]
    at = head.rfind("@")
    if at >= 0 and not head.startswith("/"):  # sqlite:////path@x.db has no user info
        user, sep, _ = head[:at].partition(":")
        head = f"{user}:{HIDDEN}" if sep else user
        head += rest[at:query_at]
    return scheme + head + _SECRET_PARAM.sub(lambda m: m.group(1) + HIDDEN, tail)


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)
