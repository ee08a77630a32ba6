"""The files a tuning writes and reads in its folders, safe from what another process put there.

Anyone who can write in a results folder (another user of a shared one, a launcher that
misbehaves) can put a link, a FIFO or a device where a file of ours goes. A link would have the
tuning overwrite a file of the user's elsewhere; a FIFO would block the read of a run's metrics
forever, ``/dev/zero`` would never end it. So every file is written to a new temp file in its
folder (created exclusively, never through a link) and renamed over, and a link or anything but
a regular file where ours should be is refused in one line; reads open without following a
link or blocking, check the file is regular, and read a bounded amount.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat

from optuna_ds._errors import OptunaDSError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
READ_LIMIT = 16 * 1024 * 1024  # a metrics file, a description, a claim: a few KiB; a report: a few MiB


class UnsafeFileError(OptunaDSError):
    """A link, or anything but a regular file, where optuna-ds writes or reads a file of its own."""


def _not_ours(path: str, mode: int, *, kind: str = "file") -> UnsafeFileError:
    what = ("a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode)
            else "a file put there while optuna-ds wrote it" if stat.S_ISREG(mode) else "not a regular file")
    return UnsafeFileError(f"{path} is {what}, where optuna-ds keeps a {kind} of its own: optuna-ds never writes or reads "
                           "through it; remove it (and check who put it there), then run again")


def check_own_file(path: str) -> None:
    """Refuse ``path`` if something other than a regular file is there (a missing one is fine)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise _not_ours(path, mode)


def own_folder(path: str) -> None:
    """Create the folder ``path`` (its parents as needed), or check that the one there is a
    folder and not a link: an experiment's folder must not lead elsewhere."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        os.mkdir(path)
    except FileExistsError:
        mode = os.lstat(path).st_mode
        if not stat.S_ISDIR(mode):
            raise _not_ours(path, mode, kind="folder") from None


def private_folder(path: str) -> None:
    """Create the folder ``path`` readable by this user only (0700), or check the one there: a
    folder, not a link, owned by this user and writable by no one else. The GPU and port locks
    live there: another user who made it first could plant links to have our lock files
    created or written where they point, or hold the locks to stall the tuning."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022:
        return
    why = ("is not a folder" if not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode) else "is a symbolic link"
           if stat.S_ISLNK(st.st_mode) else f"belongs to uid {st.st_uid}, not to this user ({os.getuid()})"
           if st.st_uid != os.getuid() else f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})")
    raise UnsafeFileError(f"lock folder {path} {why}: optuna-ds keeps its GPU and port locks only in a folder of this "
                          "user's that no one else can write; remove it, or set OPTUNA_DS_LOCK_DIR to such a folder")


def open_lock(path: str, *, create: bool = True) -> int:
    """A descriptor of the lock file ``path`` (created 0600 unless ``create`` is false, then
    :class:`FileNotFoundError` where there is none), never opened through a link."""
    flags = os.O_RDWR | os.O_CREAT if create else os.O_RDONLY
    try:
        return os.open(path, flags | _NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _not_ours(path, stat.S_IFLNK, kind="lock file") from None
        raise


def write_file(path: str, data: str | bytes, *, sync: bool = False) -> None:
    """Write ``path`` whole: into a temp file of its folder, created exclusively (never through
    a link), then renamed over it, so a reader sees the old file or the new one and nothing
    planted there is written through. ``sync`` flushes it to disk first (a crash keeps it).
    An :class:`OSError` names ``path``."""
    check_own_file(path)
    folder, name = os.path.split(path)
    temp = os.path.join(folder, f".{name[:200]}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:  # told as the file's, not its temp's
        raise OSError(e.errno, e.strerror, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException as e:  # noqa: BLE001 - re-raised: no temp file is left behind
        with contextlib.suppress(OSError):
            os.remove(temp)
        if isinstance(e, OSError) and e.errno is not None:  # told as the file's, not its temp's
            raise OSError(e.errno, e.strerror, path) from None
        raise


def create_file(path: str) -> int:
    """A descriptor of a new, empty ``path`` for writing (a run's output, streamed as it comes,
    so not written whole): the old file is removed first, never truncated, as a hard link to a
    file elsewhere may stand there; a link or a file put there meanwhile is refused."""
    check_own_file(path)
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_CLOEXEC, 0o666)
    except FileExistsError:
        raise _not_ours(path, os.lstat(path).st_mode) from None


def _open_regular(path: str) -> int:
    """``path`` open for reading: not through a link, not blocking (a FIFO), a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _not_ours(path, stat.S_IFLNK) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_ours(path, mode)
    return fd


def read_file(path: str, *, limit: int = READ_LIMIT) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (a larger file is an
    :class:`UnsafeFileError`): never through a link, never blocking, never without end."""
    fd = _open_regular(path)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFileError(f"{path} holds more than {limit} bytes: it is no file optuna-ds wrote or expects")
    return data


def read_tail_bytes(path: str, *, limit: int) -> bytes:
    """The last ``limit`` bytes of the regular file ``path`` (a run's output, which may be huge)."""
    fd = _open_regular(path)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - limit))
        return f.read(limit)
