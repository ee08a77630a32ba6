from __future__ import annotations

from typing import Any


def _abbreviate(key: str) -> str:
    return "".join(word[0] for word in key.split("_") if word)


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "T" if value else "F"
    if isinstance(value, (int, float)) and abs(value) >= 10000:
        mantissa, exponent = f"{float(value):.1e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).replace("/", "-").replace(" ", "")


def experiment_name(*, stage: int, mbs: int, gas: int, knobs: dict[str, Any] | None = None) -> str:
    """DeepSpeed-style experiment name: ``z1_gas1_tmbspg3``, then the tuned knobs by acronym.

    The name identifies the experiment: same name, same config, so a rerun can tell that an
    experiment already finished.
    """
    knobs = knobs or {}
    labels = {key: _abbreviate(key) for key in knobs}
    if len(set(labels.values())) < len(labels):
        labels = {key: key for key in knobs}  # acronyms collide: the name must stay an identity
    name = f"z{stage}_gas{gas}_tmbspg{mbs}"
    for key in sorted(knobs):
        name += f"_{labels[key]}{_format_value(knobs[key])}"
    return name
