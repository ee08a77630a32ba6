"""What a run says of its activation checkpointing: the settings DeepSpeed's checkpointing
logged it configured, and a failure of the setting itself.

``deepspeed.checkpointing.configure()`` (the script's call; the engine never makes it) logs on
rank 0 what it configured::

    Activation Checkpointing Information
    ----Partition Activations False, CPU CHECKPOINTING True
    ----contiguous Memory Checkpointing False with None total layers
    ----Synchronization False
    ----Profiling time in checkpointing False

DeepSpeed's ranks log at WARNING unless the script lowers it, so these lines are there only
where the ranks log at INFO (as DeepSpeed's own INFO lines from a rank show): there, a run whose
config sets the ``activation_checkpointing`` section but whose output holds no such lines ran a
script that never configures DeepSpeed's checkpointing, and the section did nothing; elsewhere
the output says nothing either way.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from optuna_ds.launcher._raised import error_lines

_LINES = (
    (re.compile(r"----Partition Activations (\w+), CPU CHECKPOINTING (\w+)"), ("partition_activations", "cpu_checkpointing")),
    (re.compile(r"----contiguous Memory Checkpointing (\w+) with (\w+) total layers"),
     ("contiguous_memory_optimization", "number_checkpoints")),
    (re.compile(r"----Synchronization (\w+)"), ("synchronize_checkpoint_boundary",)),
    (re.compile(r"----Profiling time in checkpointing (\w+)"), ("profile",)),
)
# A setting the script or its model cannot run: a Hugging Face model without checkpointing
# support (``gradient_checkpointing_enable``), or the section's combinations DeepSpeed's
# ``configure()`` asserts against.
_SETTING_FAILURES = re.compile(
    r"(?<!\S)\S+ does not support gradient checkpointing\.?"
    r"|Contiguous Checkpointing is only available with partitioned activations[^\n]*"
    r"|Must specify the number of layers with contiguous memory checkpointing"
)
_ARGPARSE = re.compile(r"^(?:\[rank\d+\]:\s*)?[\w./-]+: error: (.+)$")
# DeepSpeed's INFO lines from a rank (its launcher's own, launch.py and runner.py, log at INFO anyway).
_RANK_INFO = re.compile(r"\[INFO\] \[(?!launch\.py:|runner\.py:)[\w.]+:\d+:")
# A failure inside DeepSpeed's checkpointing (its recompute, its copies to the host): the setting's.
_IN_CHECKPOINTING = re.compile(r"activation_checkpointing/checkpointing\.py\", line \d+")


def _value(text: str) -> Any:
    if text in ("True", "False"):
        return text == "True"
    if text.isdigit():
        return int(text)
    return None if text == "None" else text


def read_checkpointing(text: str) -> dict[str, Any] | None:
    """The settings DeepSpeed's checkpointing logged it configured (the section's keys, the
    last configuration logged); ``{}`` where the ranks logged at INFO and configured none;
    ``None`` where the output cannot tell (the ranks logged no INFO line)."""
    found: dict[str, Any] = {}
    for line in text.splitlines():
        if "Activation Checkpointing Information" in line:
            found = {}
        for pattern, keys in _LINES:
            match = pattern.search(line)
            if match:
                found.update(zip(keys, map(_value, match.groups())))
    return found if found or _RANK_INFO.search(text) else None


def checkpointing_failure(stderr_tail: str, *, switches: Iterable[str] = (), crashed: bool = False) -> str:
    """What a failed run's stderr says the checkpointing setting itself cannot run: the model
    or DeepSpeed's checkpointing refusing it, the script's argument parser refusing one of the
    ``switches`` it was given on, or (``crashed``: a failure already known not to be memory's)
    a traceback through DeepSpeed's checkpointing; ``""`` when nothing says so."""
    match = _SETTING_FAILURES.search(stderr_tail)
    if match:
        return match.group(0).strip()
    if crashed and _IN_CHECKPOINTING.search(stderr_tail):
        lines = error_lines(stderr_tail)
        return f"it failed inside DeepSpeed's checkpointing: {lines[-1] if lines else 'see its stderr'}"
    for flag in switches:
        for line in stderr_tail.splitlines():
            parsed = _ARGPARSE.match(line.strip())
            if parsed and re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", parsed.group(1)):
                return f"the script refuses {flag}: {parsed.group(1)}"
    return ""
