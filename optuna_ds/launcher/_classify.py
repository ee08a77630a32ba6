from __future__ import annotations

import json
import os
import re
import signal
from typing import Any

from optuna_ds.launcher._experiment import FailureReason

# Explicit out-of-memory signatures of torch and the accelerators DeepSpeed supports. The word
# "error" alone proves nothing: harmless warnings contain it.
OOM_PATTERNS = re.compile(
    r"torch\.(cuda\.)?OutOfMemoryError"
    r"|\b(CUDA|HIP|XPU|NPU|MPS) out of memory"
    r"|RESOURCE_EXHAUSTED"
    r"|CUBLAS_STATUS_ALLOC_FAILED"
    r"|DefaultCPUAllocator: (can't|not enough memory)"
    r"|\bMemoryError\b"
    r"|out of memory\. Tried to allocate"
)
_TAIL_BYTES = 256 * 1024


def read_tail(path: str, *, max_bytes: int = _TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def last_lines(text: str, n: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


_ERROR_LINE = re.compile(r"^\s*[\w.]*(Error|Exception)\b.*:|out of memory", re.IGNORECASE)


def telling_line(stderr_tail: str) -> str:
    """The line of a failed experiment's stderr that says why: the last out-of-memory or
    ``...Error: ...`` line, not a shutdown warning printed after it."""
    lines = [line.strip() for line in stderr_tail.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if OOM_PATTERNS.search(line) or _ERROR_LINE.search(line):
            return line
    return lines[-1] if lines else ""


def read_metrics(path: str, metric_key: str | None) -> dict[str, Any] | None:
    """The engine's metrics file, or ``None`` when absent, unreadable or lacking the metric."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if metric_key is not None:
        value = data.get(metric_key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            return None
    return data


def classify(
    *,
    returncode: int | None,
    timed_out: bool,
    metrics: dict[str, Any] | None,
    stdout_tail: str,
    stderr_tail: str,
) -> tuple[FailureReason | None, str]:
    """Decide an experiment's outcome from structured signals: timeout, the metrics file,
    out-of-memory signatures, the exit status. Returns the failure reason (``None`` for
    success) and a short explanation."""
    if timed_out:
        return FailureReason.TIMEOUT, "killed at the trial timeout"
    if returncode == 0 and metrics is not None:
        return None, ""
    for text in (stderr_tail, stdout_tail):
        match = OOM_PATTERNS.search(text)
        if match:
            return FailureReason.OOM, f"out of memory ({match.group(0)})"
    if returncode is not None and returncode in (-signal.SIGKILL, 128 + signal.SIGKILL) or re.search(
        r"return code = -9\b", stdout_tail + stderr_tail
    ):
        return FailureReason.OOM, "a process was killed by SIGKILL, most likely by the kernel's OOM killer"
    if returncode != 0:
        cause = telling_line(stderr_tail)
        return FailureReason.ERROR, f"exit status {returncode}" + (f": {cause[:200]}" if cause else "")
    return FailureReason.NO_METRICS, "exited with status 0 but wrote no metrics"
