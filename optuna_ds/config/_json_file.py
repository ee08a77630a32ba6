"""Reading a JSON config file, with one-line errors that say where it is broken."""

from __future__ import annotations

import json
import os
from typing import Any

from optuna_ds._errors import ConfigError


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def load_json_file(path: str, *, what: str = "DeepSpeed config") -> dict[str, Any]:
    """Read a JSON object, with one-line errors that say where the file is broken."""
    if not os.path.exists(path):
        raise ConfigError(f"{what} {path} not found")
    if os.path.isdir(path):
        raise ConfigError(f"{what} {path} is a directory, not a JSON file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} {path} cannot be read: {e}") from None
    try:
        data = json.loads(text, object_pairs_hook=_reject_duplicates)
    except RecursionError:
        raise ConfigError(f"{what} {path} is nested too deeply") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what} {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:
        raise ConfigError(f"{what} {path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must hold a JSON object, not {type(data).__name__}")
    if _depth(data) > MAX_DEPTH:
        raise ConfigError(f"{what} {path} is nested more than {MAX_DEPTH} levels deep")
    return data


MAX_DEPTH = 64  # DeepSpeed configs nest three or four levels; copying a deeper one could overflow the stack


def _depth(data: Any) -> int:
    deepest, todo = 0, [(data, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            todo.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest
