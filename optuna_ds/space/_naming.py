from __future__ import annotations

import hashlib
import re
from typing import Any

# A name is one path component made of these characters, whatever the config's keys and values.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")
_MAX_NAME = 200  # file systems allow 255 bytes a component; room for ".json" and ".tmp"


def _safe(text: str) -> str:
    return _UNSAFE.sub("-", text)


def _abbreviate(key: str) -> str:
    return "".join(word[0] for word in key.split("_") if word)


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "T" if value else "F"
    if isinstance(value, (int, float)) and 10000 <= abs(value) < 1e300:  # also not inf, nan or a 400-digit int
        mantissa, exponent = f"{float(value):.1e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).replace(" ", "")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]


def experiment_name(*, stage: int, mbs: int, gas: int, knobs: dict[str, Any] | None = None) -> str:
    """DeepSpeed-style experiment name: ``z1_gas1_tmbspg3``, then the tuned knobs by acronym.

    The name identifies the experiment (same name, same config, so a rerun can tell that an
    experiment already finished) and is one safe path component: characters a key or value
    could use to leave the results folder (``/``, ``..`` as a component, NUL) are replaced, and
    where that or the acronyms would merge two configs, or the name grows too long, a digest
    of the exact knobs keeps it an identity.
    """
    knobs = knobs or {}
    labels = {key: _abbreviate(key) for key in knobs}
    if len(set(labels.values())) < len(labels):
        labels = {key: key for key in knobs}  # acronyms collide: the full keys
    name = f"z{stage}_gas{gas}_tmbspg{mbs}"
    exact = name
    for key in sorted(knobs):
        part = f"_{labels[key]}{_format_value(knobs[key])}"
        exact += part
        name += _safe(part)
    if name != exact or len(name) > _MAX_NAME:
        name = f"{name[:_MAX_NAME - 11]}_{_digest(exact)}"
    return name
