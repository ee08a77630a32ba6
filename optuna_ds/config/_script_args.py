from __future__ import annotations

import os
from collections.abc import Sequence

from optuna_ds._errors import ConfigError

CONFIG_FLAGS = ("--deepspeed_config", "--deepspeed")


def find_arg(args: Sequence[str], flag: str) -> tuple[int, str] | None:
    """Return ``(index, value)`` of ``flag VALUE`` or ``flag=VALUE`` in ``args``.

    The index is that of the element holding the value, so callers can substitute it.
    """
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return i + 1, args[i + 1]
        if _is_joined(arg, flag):
            return i, arg[len(flag) + 1 :]
    return None


def set_arg(args: Sequence[str], flag: str, value: str) -> list[str]:
    """Return a copy of ``args`` with ``flag`` set to ``value``, appended if absent.

    Always a copy: DeepSpeed's autotuner rewrote the one shared argument list in place, so the
    profile run's micro-batch size leaked into every later experiment.
    """
    out = list(args)
    found = find_arg(out, flag)
    if found is None:
        out += [flag, value]
    else:
        index, _ = found
        out[index] = f"{flag}={value}" if _is_joined(out[index], flag) else value
    return out


# What Hugging Face's argument parser reads as a boolean value (``string_to_bool``).
_TRUE = frozenset({"yes", "true", "t", "y", "1"})
_FALSE = frozenset({"no", "false", "f", "n", "0"})


def switch_state(args: Sequence[str], flag: str) -> bool:
    """Whether ``args`` turn the switch ``flag`` on: the bare flag (a ``store_true`` flag, or the
    Trainer's boolean, whose bare flag means true), ``flag true`` or ``flag=true``; the last
    occurrence wins, as argparse reads it."""
    on = False
    for i, arg in enumerate(args):
        if arg == flag:
            value = args[i + 1].lower() if i + 1 < len(args) else ""
            on = value not in _FALSE
        elif _is_joined(arg, flag):
            on = arg[len(flag) + 1:].lower() not in _FALSE
    return on


def set_switch(args: Sequence[str], flag: str, on: bool) -> list[str]:
    """Return a copy of ``args`` with the switch ``flag`` on (the bare flag, last) or off (no
    occurrence): both a ``store_true`` flag and the Trainer's boolean read it so. Its earlier
    occurrences go, with the boolean value that follows one (``--gradient_checkpointing False``)."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == flag:
            skip = i + 1 < len(args) and args[i + 1].lower() in _TRUE | _FALSE
            continue
        if _is_joined(arg, flag):
            continue
        out.append(arg)
    return out + [flag] if on else out


def _is_joined(element: str, flag: str) -> bool:
    return element.startswith(flag + "=")


def find_config_path(script_args: Sequence[str]) -> tuple[int, str]:
    """Locate the DeepSpeed config among the script arguments.

    ``--deepspeed_config ds.json`` (DeepSpeed) or ``--deepspeed ds.json`` (Hugging Face);
    a bare ``--deepspeed`` is DeepSpeed's boolean switch and is skipped.
    """
    for flag in CONFIG_FLAGS:
        found = find_arg(script_args, flag)
        if found is None:
            continue
        index, value = found
        if flag == "--deepspeed" and not (value.endswith(".json") or os.path.isfile(value)):
            continue
        return index, value
    raise ConfigError(
        "no DeepSpeed config in the script arguments: pass it as --deepspeed ds_config.json "
        "or --deepspeed_config ds_config.json"
    )


def replace_config_path(script_args: Sequence[str], path: str) -> list[str]:
    """Return a copy of the script arguments that points at ``path`` instead of the user's config."""
    index, _ = find_config_path(script_args)
    out = list(script_args)
    joined = [flag for flag in CONFIG_FLAGS if _is_joined(out[index], flag)]
    out[index] = f"{joined[0]}={path}" if joined else path
    return out
