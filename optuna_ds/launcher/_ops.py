from __future__ import annotations

import contextlib
import glob
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping

# The ops DeepSpeed's CPU accelerator JIT-builds in an experiment (shared-memory collectives,
# Adam); the Makefile's `venv` builds the same ones (its CPU_OPS).
CPU_OPS = ("ShareMemCommBuilder", "FusedAdamBuilder")


def ops_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What an experiment's environment needs for DeepSpeed to load the ops built before (by
    ``make venv``, an earlier experiment) instead of building them again, minutes each.

    - ``TORCH_EXTENSIONS_DIR``: as given; else this environment's own ``torch_extensions``
      folder where there is one (``make venv`` builds the ops there), not torch's default in
      the home folder, which a shell that did not export it would build afresh.
    - ``PATH`` with this interpreter's folder first where it holds a ``ninja`` other than the
      first on ``PATH``: torch builds with the ``ninja`` it finds, and ninja 1.11 (a system's)
      and 1.13 (pip's, DeepSpeed's dependency) record their commands in the build log each
      its own way, so each takes the other's build as outdated and compiles every op again.
    """
    environ = os.environ if environ is None else environ
    env: dict[str, str] = {}
    own = os.path.join(sys.prefix, "torch_extensions")
    if not environ.get("TORCH_EXTENSIONS_DIR") and os.path.isdir(own):
        env["TORCH_EXTENSIONS_DIR"] = own
    here = os.path.dirname(sys.executable)
    ninja = os.path.join(here, "ninja")
    path = environ.get("PATH", os.defpath)
    found = shutil.which("ninja", path=path)
    if os.access(ninja, os.X_OK) and (found is None or not os.path.samefile(found, ninja)):
        env["PATH"] = os.pathsep.join([here, path])
    return env


def cpu_ops_to_build(environ: Mapping[str, str] | None = None) -> list[str]:
    """The CPU ops the first experiment will build, silent for minutes: those of DeepSpeed's CPU
    accelerator that the extension folder an experiment uses (:func:`ops_environment`, else
    torch's default, one folder per Python and device) lacks. None off CPU."""
    from deepspeed.accelerator import get_accelerator
    from torch.utils.cpp_extension import get_default_build_root

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        return []
    environ = os.environ if environ is None else environ
    root = ops_environment(environ).get("TORCH_EXTENSIONS_DIR") or environ.get("TORCH_EXTENSIONS_DIR")
    missing = []
    for builder in CPU_OPS:
        name = accelerator.create_op_builder(builder).name
        pattern = os.path.join(glob.escape(root), name, f"{name}.so") if root else \
            os.path.join(glob.escape(get_default_build_root()), "*", name, f"{name}.so")
        if not glob.glob(pattern):
            missing.append(name)
    return missing


def extensions_root(environ: Mapping[str, str] | None = None) -> str:
    """The extension folder an experiment builds DeepSpeed's ops in (:func:`ops_environment`'s,
    else ``TORCH_EXTENSIONS_DIR``, else torch's default for this Python and device)."""
    from torch.utils.cpp_extension import get_default_build_root

    environ = os.environ if environ is None else environ
    root = ops_environment(environ).get("TORCH_EXTENSIONS_DIR")
    root = root or environ.get("TORCH_EXTENSIONS_DIR")
    # torch's own folder for a CPU build (``_get_build_directory``): one per Python.
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return root or os.path.join(get_default_build_root(), f"{python}_cpu")


def build_progress(root: str, ops: Mapping[str, int], *, since: float) -> str:
    """How far the build of ``ops`` (each op's name, with its count of sources) has come in the
    extension folder ``root`` since ``since`` (``time.time()``): each op's sources compiled since
    then, until its library is built again; ``""`` once every one is."""
    parts = []
    for name, sources in ops.items():
        folder = os.path.join(root, name)
        if _made_since(os.path.join(folder, f"{name}.so"), since):
            continue
        objects = glob.glob(os.path.join(glob.escape(folder), "*.o"))
        compiled = sum(_made_since(o, since) for o in objects)
        parts.append(f"{name} {min(compiled, sources)} of {sources} sources compiled")
    return ", ".join(parts)


@contextlib.contextmanager
def watching_build(root: str, ops: Mapping[str, int], *, say: Callable[[str], None],
                   every: float = 30.0) -> Iterator[None]:
    """While the block runs, say every ``every`` seconds how far the build of ``ops`` has come
    (:func:`build_progress`) and how long it has taken, until all are built: a build of minutes
    shows that it moves."""
    if not ops:
        yield
        return
    done = threading.Event()
    since, start = time.time(), time.monotonic()

    def watch() -> None:
        while not done.wait(every):
            progress = build_progress(root, ops, since=since)
            if not progress:
                return
            elapsed = round(time.monotonic() - start)
            say(f"building DeepSpeed's CPU ops, {elapsed} s so far: {progress}")

    thread = threading.Thread(target=watch, name="ops-build-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def cpu_op_sources(names: list[str] | None = None) -> dict[str, int]:
    """DeepSpeed's CPU ops (:data:`CPU_OPS`), or those of ``names``, each with its count of
    sources: what :func:`build_progress` counts against."""
    from deepspeed.accelerator import get_accelerator

    builders = [get_accelerator().create_op_builder(b) for b in CPU_OPS]
    return {b.name: len(b.sources()) for b in builders if names is None or b.name in names}


def build_cpu_ops(*, say: Callable[[str], None], every: float = 30.0) -> None:
    """Build DeepSpeed's CPU ops into the extension folder experiments use (what ``make venv``
    runs), one after the other, saying how far each has come every ``every`` seconds."""
    from deepspeed.accelerator import get_accelerator

    root = extensions_root()
    for i, builder_name in enumerate(CPU_OPS, 1):
        builder = get_accelerator().create_op_builder(builder_name)
        say(f"building {builder.name} ({i} of {len(CPU_OPS)}, {len(builder.sources())} sources)")
        start = time.monotonic()
        with watching_build(root, {builder.name: len(builder.sources())}, say=say, every=every):
            builder.load()
        say(f"built {builder.name} in {round(time.monotonic() - start)} s")


def stale_build_locks(*, since: float | None = None) -> list[str]:
    """torch's extension build locks (``<op>/lock`` in the extension folder an experiment uses:
    :func:`ops_environment`'s, else torch's default) that no process of this node holds open; with
    ``since``, only those made at or after that time (``time.time()``). The process building an op
    holds its lock open until it removes it; one interrupted (Ctrl-C during the first
    experiment's build) leaves it behind, and every later experiment waits on it until its trial
    times out."""
    from torch.utils.cpp_extension import get_default_build_root

    root = ops_environment().get("TORCH_EXTENSIONS_DIR") or os.environ.get("TORCH_EXTENSIONS_DIR")
    pattern = os.path.join(glob.escape(root), "*", "lock") if root else \
        os.path.join(glob.escape(get_default_build_root()), "*", "*", "lock")
    # Only a lock of this user's (or root's view) can be proven stale: another user's build
    # holds it open in a process whose files this one may not look at.
    locks = {os.path.realpath(p) for p in glob.glob(pattern) if _provable(p) and (since is None or _made_since(p, since))}
    # A lock seen, then released and removed by its build before the scan, was never stale.
    return sorted(p for p in locks - _open_files(locks) if os.path.lexists(p)) if locks else []


def release_build_locks(*, since: float) -> list[str]:
    """Remove the build locks an experiment we ended left: made since it started (``since``),
    held by no process now that its process group is gone. torch's lock is a file its builder
    removes in a ``finally`` that SIGTERM skips, so ending an experiment while it loaded an op
    left one, and the next tuning was refused (or every experiment waited on it). Returns those
    removed."""
    removed = []
    for lock in stale_build_locks(since=since):
        with contextlib.suppress(FileNotFoundError):
            os.remove(lock)
            removed.append(lock)
    return removed


def _made_since(path: str, since: float) -> bool:
    try:
        return os.lstat(path).st_mtime >= since
    except OSError:
        return False


def _provable(path: str) -> bool:
    """Whether every process that could hold ``path`` open is one whose files we may read."""
    try:
        return os.geteuid() == 0 or os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


def _open_files(paths: set[str]) -> set[str]:
    """Which of ``paths`` some process of this node has open (those we may look at: ours); all of
    them where this process cannot read its own open files (``/proc`` hidden: nothing is proven)."""
    try:
        os.listdir(f"/proc/{os.getpid()}/fd")
    except OSError:
        return set(paths)
    held = set()
    for fd_dir in glob.glob("/proc/[0-9]*/fd"):
        with contextlib.suppress(OSError):
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    if (target := os.readlink(os.path.join(fd_dir, fd))) in paths:
                        held.add(target)
    return held
