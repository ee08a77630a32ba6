from __future__ import annotations

import json
import math
import re
import signal
from collections.abc import Sequence
from typing import Any
from typing import TypeGuard

from optuna_ds._files import UnsafeFileError
from optuna_ds._files import read_file
from optuna_ds._files import read_tail_bytes
from optuna_ds._text import clean_text
from optuna_ds.domain import FailureReason
from optuna_ds.launcher._autotp import autotp_failure
from optuna_ds.launcher._checkpointing import checkpointing_failure

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
# The rendezvous port taken by someone else (torch's DistNetworkError, or older RuntimeError):
# the node's state, not the config's fault.
PORT_IN_USE = re.compile(r"EADDRINUSE|[Aa]ddress already in use")
# The machine failing the run, whatever its config: a disk full or over quota, a folder read-only or
# not writable (as Python's OSError and the C library say it), a node the launcher cannot reach
# (pdsh's ssh). Every pattern starts with a literal, and none repeats a class that can overlap it:
# linear in the text a program wrote.
MACHINE_FAILURE = re.compile(
    r"\[Errno (?:13|28|30|122)\][^\n]{0,200}"
    r"|No space left on device|Read-only file system|Disk quota exceeded"
    r"|ssh exited with exit code 255|ssh: connect to host [^\n]{0,200}|ssh: Could not resolve hostname[^\n]{0,200}"
)
_TAIL_BYTES = 256 * 1024
_METRICS_LIMIT = 1024 * 1024  # the engine writes a few hundred bytes
# Failures that do not depend on the config: the script's command line (argparse's "PROG: error:
# unrecognized arguments", a launcher flag put after the script), a module it imports or a file
# it opens that is missing, the script itself missing or not valid Python. They happen before
# DeepSpeed reads the config, and experiments differ only in their config and in the batch-size
# flags, which are positive integers: every experiment would fail alike.
_SCRIPT_FAILURES = re.compile(
    r"^(?:\[rank\d+\]:\s*)?("
    r"(?![\w.]*(?:Error|Exception|Warning):)[\w./-]+: error: .+"
    r"|ModuleNotFoundError: No module named .+"
    r"|ImportError: cannot import name .+"
    r"|\S+: can't open file .+"
    r"|FileNotFoundError: \[Errno 2\] No such file or directory: .+"
    r"|(?:SyntaxError|IndentationError|TabError): .+"
    r")$"
)
# ...unless DeepSpeed was building one of its ops (a compiler, a header or a module missing): which
# ops it builds depends on the optimizer and offload, so on the config.
_OP_BUILD = re.compile(r"op_builder|cpp_extension|torch_extensions")
# A setting the accelerator cannot run: an op DeepSpeed has no kernel for on it (ZeRO++'s
# quantizer on the CPU accelerator), or a feature it asserts for another (SuperOffload on
# anything but CUDA). Its own reason: the setting failed, not the stage or the micro-batch size.
_UNSUPPORTED = re.compile(
    r"This op had not been implemented on \w+ backend\.?"
    r"|'\w+' is not supported on the \w+ accelerator backend\.?"
    r"|Unable to JIT load the \w+ op due to it not being compatible"
    r"|SuperOffload only supports NVIDIA CUDA GPUs[^\n]*"
)
# The op DeepSpeed was loading, as its traceback names it (``QuantizerBuilder().load()``).
_OP_LOADED = re.compile(r"\b(\w+)Builder\(\)\.load\(")


def read_tail(path: str, *, max_bytes: int = _TAIL_BYTES) -> str:
    """The end of a run's output file, as clean text."""
    try:
        return clean_text(read_tail_bytes(path, limit=max_bytes).decode("utf-8", errors="replace"))
    except (OSError, UnsafeFileError):
        return ""


def last_lines(text: str, n: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


_ERROR_NAME = re.compile(r"\s*[\w.]*?(?:Error|Exception)\b", re.IGNORECASE)
_OUT_OF_MEMORY = re.compile(r"out of memory", re.IGNORECASE)


def _states_error(line: str) -> bool:
    """Whether ``line`` begins with an error's or an exception's name (``torch.cuda.XError``,
    any case) with a colon after it, or says "out of memory"."""
    named = _ERROR_NAME.match(line)
    return bool(named and ":" in line[named.end():]) or _OUT_OF_MEMORY.search(line) is not None


def telling_line(stderr_tail: str) -> str:
    """The line of a failed experiment's stderr that says why: the last out-of-memory or
    ``...Error: ...`` line, not a shutdown warning printed after it."""
    lines = [line.strip() for line in stderr_tail.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if OOM_PATTERNS.search(line) or _states_error(line):
            return line
    return lines[-1] if lines else ""


def script_failure(stderr_tail: str) -> str:
    """The line of a failed run's stderr that says it failed whatever the config (see
    ``_SCRIPT_FAILURES``); ``""`` when nothing says so."""
    if _OP_BUILD.search(stderr_tail):
        return ""
    for line in stderr_tail.splitlines():
        match = _SCRIPT_FAILURES.match(line.strip())
        if match:
            return match.group(1)
    return ""


def unsupported(stderr_tail: str) -> str:
    """What a failed run's stderr says this accelerator cannot run (see ``_UNSUPPORTED``), with
    the op DeepSpeed was loading where its traceback names it; ``""`` when nothing says so."""
    match = _UNSUPPORTED.search(stderr_tail)
    if match is None:
        return ""
    ops = _OP_LOADED.findall(stderr_tail[: match.start()])
    return (f"DeepSpeed's {ops[-1]} op: " if ops else "") + match.group(0).strip()


class BadMetrics(ValueError):
    """The metrics file exists but does not hold a usable measurement."""


def read_metrics(path: str, metric_key: str | None) -> dict[str, Any] | None:
    """The engine's metrics file; ``None`` when there is none. Raises :class:`BadMetrics` when
    it is no regular file of at most ``_METRICS_LIMIT`` bytes (read without following a link or
    blocking on a FIFO), not a JSON object or ``metric_key`` is not a measurement (:func:`is_measurement`):
    a throughput of ``Infinity`` or ``-5`` is a broken run, never the best config."""
    try:
        raw = read_file(path, limit=_METRICS_LIMIT)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise BadMetrics(f"metrics file unreadable: [Errno {e.errno}] {e.strerror}" if e.errno else
                         f"metrics file unreadable: {e}") from None
    except UnsafeFileError as e:  # a FIFO, a link, a device, a flood: a broken run, never a hang
        raise BadMetrics(f"metrics file unusable: {clean_text(str(e))[:200]}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise BadMetrics(f"metrics file is not valid JSON ({clean_text(str(e))[:100]})") from None
    if not isinstance(data, dict):
        raise BadMetrics(f"metrics file holds {type(data).__name__}, not a JSON object")
    if metric_key is not None:
        value = data.get(metric_key)
        if value is None:
            raise BadMetrics(f"metrics file has no {metric_key!r}")
        if not is_measurement(value):
            raise BadMetrics(f"metrics file's {metric_key} is {clean_text(repr(value))[:60]}, not a positive finite number "
                             "with a finite reciprocal")
    return data


def is_measurement(value: Any) -> TypeGuard[float]:
    """Whether ``value`` is a metric a tuning can use: a positive finite number whose rate is
    finite too, as the planner models every metric (a throughput itself, a latency inverted): a
    latency of 5e-324 is a rate of infinity, an integer of 400 digits no float at all."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        number = float(value)
    except OverflowError:
        return False
    return math.isfinite(number) and number > 0 and math.isfinite(1.0 / number)


def classify(
    *,
    returncode: int | None,
    timed_out: bool,
    metrics: dict[str, Any] | None,
    stdout_tail: str,
    stderr_tail: str,
    metrics_problem: str = "",
    switches: Sequence[str] = (),
    autotp: bool = False,
    timeout: float | None = None,
) -> tuple[FailureReason | None, str]:
    """Decide an experiment's outcome from structured signals: timeout, the metrics file,
    out-of-memory signatures, the exit status. Returns the failure reason (``None`` for
    success) and a short explanation (a timeout's names ``timeout``, the seconds it ran under).

    ``returncode`` ``None`` means the status was lost (the launch server died): only a
    measurement or an explicit out-of-memory error then judges the config; anything else is
    :attr:`FailureReason.INTERRUPTED`, a run to make again. A failure to rendezvous because the
    port was in use is :attr:`FailureReason.PORT`, the node's. A checkpointing setting the
    script, its model or DeepSpeed's checkpointing refuses (the script's parser refusing one of
    the ``switches`` the run turned on among them) is :attr:`FailureReason.CHECKPOINTING`: the
    setting's, never the stage's or the size's, nor a failure of every config. So is a run with
    ``autotp`` whose model or data AutoTP cannot split: :attr:`FailureReason.AUTOTP`. A run the
    machine failed (:data:`MACHINE_FAILURE` in its stderr, or its metrics file unreadable for
    it) is :attr:`FailureReason.MACHINE`: never the config's.
    """
    if (returncode != 0 or timed_out) and (cause := unsupported(stderr_tail)):
        # Before the timeout: DeepSpeed's ranks can hang once they raised it (0.19.8's ZeRO++
        # quantizer on the CPU accelerator did, until killed).
        return FailureReason.UNSUPPORTED, f"not supported here: {cause}" + (" (its ranks then hung until the trial timeout)" if timed_out else "")
    if returncode not in (0, None) and (cause := checkpointing_failure(stderr_tail, switches=switches)):
        return FailureReason.CHECKPOINTING, f"checkpointing cannot run as set: {cause[:300]}"
    if autotp and returncode not in (0, None) and (cause := autotp_failure(stderr_tail)):
        return FailureReason.AUTOTP, f"AutoTP cannot run here: {cause[:300]}"
    if timed_out:
        return FailureReason.TIMEOUT, "timed out: killed at the trial timeout" + (f" of {timeout:g} s" if timeout is not None else "")
    if returncode in (0, None) and metrics is not None:
        return None, ""
    for text in (stderr_tail, stdout_tail):
        match = OOM_PATTERNS.search(text)
        if match:
            return FailureReason.OOM, f"out of memory ({match.group(0)})"
    if returncode is None:
        return FailureReason.INTERRUPTED, "its exit status was lost (the launch server died) and it wrote no metrics"
    if returncode != 0 and (match := MACHINE_FAILURE.search(stderr_tail) or MACHINE_FAILURE.search(stdout_tail)):
        return FailureReason.MACHINE, f"exit status {returncode}: the machine failed it ({clean_text(match.group(0))[:200]})"
    if metrics_problem and (match := MACHINE_FAILURE.search(metrics_problem)):
        return FailureReason.MACHINE, f"the machine failed it: {metrics_problem[:200]}"
    match = PORT_IN_USE.search(stderr_tail) or PORT_IN_USE.search(stdout_tail)
    if returncode != 0 and match:
        return FailureReason.PORT, f"its rendezvous port was in use ({match.group(0)})"
    if returncode is not None and returncode in (-signal.SIGKILL, 128 + signal.SIGKILL) or re.search(
        r"return code = -9\b", stdout_tail + stderr_tail
    ):
        return FailureReason.OOM, "a process was killed by SIGKILL, most likely by the kernel's OOM killer"
    if returncode != 0 and (cause := checkpointing_failure(stderr_tail, crashed=True)):
        return FailureReason.CHECKPOINTING, f"checkpointing cannot run as set: {cause[:300]}"
    if autotp and returncode != 0 and (cause := autotp_failure(stderr_tail, crashed=True)):
        return FailureReason.AUTOTP, f"AutoTP cannot run here: {cause[:300]}"
    if returncode != 0 and (cause := script_failure(stderr_tail)):
        return FailureReason.SCRIPT, f"exit status {returncode}: {cause[:300]}"
    if returncode != 0:
        cause = telling_line(stderr_tail)
        return FailureReason.ERROR, f"exit status {returncode}" + (f": {cause[:200]}" if cause else "")
    if metrics_problem:
        return FailureReason.BAD_METRICS, metrics_problem
    return FailureReason.NO_METRICS, "exited with status 0 but wrote no metrics"
