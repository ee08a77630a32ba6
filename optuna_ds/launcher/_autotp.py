"""What a failed run says of its AutoTP setting: the script or its model cannot run it.

Two causes are the script's, which no config fixes (:mod:`optuna_ds.space._autotp`): its model is
one AutoTP cannot shard (DeepSpeed's heuristic parser asserts it; a Hugging Face loader refuses
weight conversions under tensor parallelism), or its data differ between the ranks of a
tensor-parallel group (the engine's check of the first forward's inputs). A traceback through
DeepSpeed's AutoTP (a layer whose size the group does not divide) is the setting's too.
"""
from __future__ import annotations

import re

from optuna_ds.launcher._raised import error_lines

_SETTING_FAILURES = re.compile(
    r"AutoTP not supported for model\.[^\n]*"
    r"|Not able to determine model policy automatically\.[^\n]*"
    r"|Data inconsistency within the TP group\.[^\n]*"
    r"|Weight conversions \([^()\n]*\) with DeepSpeed Tensor Parallelism are not yet implemented"
    r"|vocab_parallel_lm_head requires [^\n]*"
)
# A failure inside DeepSpeed's AutoTP: its sharding of the model, its layers.
_IN_AUTOTP = re.compile(r"module_inject/(auto_tp|layers|tp_shard|replace_module|autotp_config)\.py\", line \d+"
                        r"|_apply_autotp_partitioning")


def autotp_failure(stderr_tail: str, *, crashed: bool = False) -> str:
    """What a failed run's stderr says its AutoTP setting cannot run: the model or its data
    refusing it, or (``crashed``: a failure already known not to be memory's) a traceback
    through DeepSpeed's AutoTP; ``""`` when nothing says so."""
    # The exception's own line, not its traceback's source (which quotes the assertion's other message).
    raised = [line for line in stderr_tail.splitlines() if re.search(r"\w(Error|Exception):", line)]
    for line in reversed(raised):
        if match := _SETTING_FAILURES.search(line):
            return match.group(0).strip()
    if match := _SETTING_FAILURES.search(stderr_tail):
        return match.group(0).strip()
    if crashed and _IN_AUTOTP.search(stderr_tail):
        lines = error_lines(stderr_tail)
        return f"it failed inside DeepSpeed's AutoTP: {lines[-1] if lines else 'see its stderr'}"
    return ""
