"""The tuning's own files: written and read never through a link, a FIFO or a device, and the
one cleaner of text a terminal or a shell reads."""

from __future__ import annotations

import os
import signal
import stat
import threading
import time
from pathlib import Path

import pytest

from optuna_ds._files import UnsafeFileError
from optuna_ds._files import create_file
from optuna_ds._files import open_lock
from optuna_ds._files import own_folder
from optuna_ds._files import private_folder
from optuna_ds._files import read_file
from optuna_ds._files import write_file
from optuna_ds._text import clean_text
from optuna_ds._text import one_line
from optuna_ds.launcher import read_metrics
from optuna_ds.launcher._slots import default_lock_dir
from optuna_ds.studies._coordinator import run_slots


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir()
    path.write_text("the user's\n")
    return path


def test_a_link_where_our_file_goes_is_refused_and_its_target_untouched(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "summary.txt").symlink_to(victim)
    for write in (lambda p: write_file(p, "ours"), create_file):
        with pytest.raises(UnsafeFileError, match="symbolic link"):
            write(str(tmp_path / "summary.txt"))
    assert victim.read_text() == "the user's\n"
    assert sorted(os.listdir(tmp_path)) == ["outside", "summary.txt"]  # no temp file left


def test_a_hard_link_is_replaced_never_written_through(tmp_path: Path, victim: Path) -> None:
    for name, write in (("a.json", lambda p: write_file(p, "ours")), ("stdout.log", lambda p: os.close(create_file(p)))):
        os.link(victim, tmp_path / name)
        write(str(tmp_path / name))
        assert victim.read_text() == "the user's\n"
    assert (tmp_path / "a.json").read_text() == "ours"


def test_a_file_is_written_whole_with_the_umask_s_mode(tmp_path: Path) -> None:
    path = tmp_path / "ds_config_optimal.json"
    write_file(str(path), "one")
    write_file(str(path), "two", sync=True)
    assert path.read_text() == "two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()
    assert os.listdir(tmp_path) == ["ds_config_optimal.json"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_experiment_folder_that_is_a_link_is_refused(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "z1_gas1_tmbspg2").symlink_to(victim.parent)
    with pytest.raises(UnsafeFileError, match="folder"):
        own_folder(str(tmp_path / "z1_gas1_tmbspg2"))
    own_folder(str(tmp_path / "z1_gas1_tmbspg4"))
    own_folder(str(tmp_path / "z1_gas1_tmbspg4"))
    assert (tmp_path / "z1_gas1_tmbspg4").is_dir()


def test_reads_never_block_follow_or_run_without_end(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "big").write_bytes(b"x" * 101)
    done = threading.Event()

    def read_all() -> None:
        for name, words in (("fifo", "not a regular file"), ("zero", "symbolic link"), ("big", "more than 100 bytes")):
            with pytest.raises(UnsafeFileError, match=words):
                read_file(str(tmp_path / name), limit=100)
        done.set()

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    if not done.wait(30):
        with open(tmp_path / "fifo", "w"):  # unblock a reader stuck in open()
            pass
        pytest.fail("a read blocked on a FIFO")
    reader.join()


def test_a_fifo_metrics_file_is_a_bad_measurement_not_a_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "metrics.json")
    from optuna_ds.launcher import BadMetrics

    with pytest.raises(BadMetrics, match="not a regular file"):
        read_metrics(str(tmp_path / "metrics.json"), "throughput")


def test_the_lock_folder_is_private_and_refused_unless_it_is_ours_alone(tmp_path: Path) -> None:
    mine = tmp_path / "locks"
    private_folder(str(mine))
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700
    private_folder(str(mine))  # again: it is ours
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafeFileError, match="writable by others"):
        private_folder(str(shared))
    (tmp_path / "link").symlink_to(mine)
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        private_folder(str(tmp_path / "link"))
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(UnsafeFileError, match="belongs to uid 65534"):
            private_folder(str(theirs))


def test_a_lock_file_is_never_opened_through_a_link(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "localhost-0.lock").symlink_to(victim)
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        open_lock(str(tmp_path / "localhost-0.lock"))
    assert victim.read_text() == "the user's\n"


def test_the_lock_folder_is_in_the_user_s_runtime_folder_where_there_is_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPTUNA_DS_LOCK_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_lock_dir() == str(tmp_path / "optuna-ds-gpus")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert default_lock_dir().endswith(f"optuna-ds-gpus-{os.getuid()}")
    monkeypatch.setenv("OPTUNA_DS_LOCK_DIR", str(tmp_path / "given"))
    assert default_lock_dir() == str(tmp_path / "given")


def test_one_line_leaves_no_line_break_or_escape() -> None:
    text = "SGD\nsh -c 'touch /tmp/x'\r\x1b[31mred\x1b[0m\x1b]0;title\x07\u2028\x85end\x00"
    assert one_line(text) == "SGD sh -c 'touch /tmp/x' red end"
    assert clean_text("a\r\nb\x1b[2Jc\td") == "a\nbc\td"


def test_an_interrupt_ends_the_slots_within_their_grace_even_one_stuck(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot stuck in I/O must not keep the process from ending on a signal."""
    from optuna_ds.studies import _coordinator

    monkeypatch.setattr(_coordinator, "_STOP_GRACE", 0.5)
    stuck = threading.Event()
    started = threading.Event()

    def slot() -> None:
        started.set()
        stuck.wait()  # deaf to the stop, as a read blocked on a FIFO was

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)
    rescue = threading.Timer(20, stuck.set)  # before the fix: the wait ended only when the slot did
    rescue.start()
    threading.Thread(target=lambda: started.wait() and os.kill(os.getpid(), signal.SIGUSR1), daemon=True).start()
    halted = threading.Event()
    begin = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_slots([slot], halt=halted.set)
        assert time.monotonic() - begin < 10
        assert halted.is_set()
    finally:
        signal.signal(signal.SIGUSR1, previous)
        stuck.set()
        rescue.cancel()
