from __future__ import annotations

import re

# The one place that hides secrets in URLs: every URL printed, logged or put in an error goes
# through here, and the CLI passes every message it prints through ``redact_text``.
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)(.*)", re.DOTALL)
_SECRET_PARAM = re.compile(r"(?i)([?&;][\w.-]*(?:pass|pwd|secret|token|key)[\w.-]*=)[^&]*")
HIDDEN = "***"


def redact_url(url: str) -> str:
    """The URL with every password hidden: in the user info, whatever characters it holds
    (everything up to the URL's last ``@`` counts as user info, so a password holding ``@``,
    ``/``, ``?`` or ``#`` is hidden whole), and in the query string (``?password=…``,
    ``sslpassword``, tokens, keys)."""
    match = _SCHEME.fullmatch(url)
    if match is None:
        return url
    scheme, rest = match.groups()
    rest = _SECRET_PARAM.sub(lambda m: m.group(1) + HIDDEN, rest)  # first: a query password may hold "@"
    at = rest.rfind("@")
    if at >= 0 and not rest.startswith("/"):  # sqlite:////path@x.db has no user info
        user, sep, _ = rest[:at].partition(":")
        rest = (f"{user}:{HIDDEN}" if sep else user) + rest[at:]
    return scheme + rest


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)
