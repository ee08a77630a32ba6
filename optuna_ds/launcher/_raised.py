"""The lines of a run's output that state an exception (``ValueError: ...``), found in time
linear in the output's length, whatever a program wrote."""
from __future__ import annotations

import re

_NAMED = re.compile(r"\w(?:Error|Exception)\b")


def states_error(line: str) -> bool:
    """Whether ``line`` names an error or an exception (a word ending in ``Error`` or
    ``Exception``) with a colon somewhere after the name."""
    named = _NAMED.search(line)
    return named is not None and ":" in line[named.end():]


def error_lines(text: str) -> list[str]:
    """Each line of ``text`` that :func:`states_error`, stripped, in order."""
    return [line.strip() for line in text.splitlines() if states_error(line)]
