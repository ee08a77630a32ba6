"""The one cleaner of the text optuna-ds shows or writes for a terminal or a shell to read.

Config values, script arguments, study names and a run's output are the user's (or a script's)
text: an escape sequence in one would drive the terminal that shows it, and a newline in a
comment of ``cmd_optimal.txt`` would start a command. Every such string passes through here.
"""

from __future__ import annotations

import re

# Terminal escape sequences (CSI, OSC, two-byte), then any other control byte but newline and tab.
_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SPACES = re.compile(r"[\n\t\u2028\u2029\x85]+")


def clean_text(text: str) -> str:
    """``text`` without terminal escapes and control characters (a lone CR ends a line)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", _ESCAPES.sub("", text))


def one_line(text: str) -> str:
    """:func:`clean_text` on one line: each run of line breaks and tabs is one space (a comment
    of a shell file, a line of a log)."""
    return _SPACES.sub(" ", clean_text(text)).strip()


def escaped(text: str) -> str:
    """``text`` with each character that is not printable shown as its escape (``\\n``,
    ``\\x1b``): an error message quoting a bad value shows what it holds, on one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
