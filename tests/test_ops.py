"""DeepSpeed's CPU ops are found where ``make venv`` built them, with the ninja that built them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from optuna_ds.launcher import ops_environment


def _environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, folder: bool, ninja: bool) -> Path:
    prefix = tmp_path / "venv"
    (prefix / "bin").mkdir(parents=True)
    if folder:
        (prefix / "torch_extensions").mkdir()
    if ninja:
        (prefix / "bin" / "ninja").write_text("#!/bin/sh\n")
        (prefix / "bin" / "ninja").chmod(0o755)
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.setattr(sys, "executable", str(prefix / "bin" / "python"))
    return prefix


def test_the_environments_own_extensions_folder_unless_one_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = _environment(tmp_path, monkeypatch, folder=True, ninja=False)
    assert ops_environment({"PATH": "/usr/bin"}) == {"TORCH_EXTENSIONS_DIR": str(prefix / "torch_extensions")}
    assert ops_environment({"PATH": "/usr/bin", "TORCH_EXTENSIONS_DIR": "/mine"}) == {}


def test_no_folder_of_its_own_leaves_torchs_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _environment(tmp_path, monkeypatch, folder=False, ninja=False)
    assert ops_environment({"PATH": "/usr/bin"}) == {}


def test_the_interpreters_ninja_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another ninja first on PATH (a system's 1.11 beside pip's 1.13) would read the build log
    the other wrote as every command changed, and build every op again."""
    prefix = _environment(tmp_path, monkeypatch, folder=False, ninja=True)
    system = tmp_path / "usr" / "bin"
    system.mkdir(parents=True)
    (system / "ninja").write_text("#!/bin/sh\n")
    (system / "ninja").chmod(0o755)
    bin_ = str(prefix / "bin")
    assert ops_environment({"PATH": str(system)}) == {"PATH": os.pathsep.join([bin_, str(system)])}
    assert ops_environment({"PATH": os.pathsep.join([bin_, str(system)])}) == {}  # an activated environment
    assert ops_environment({"PATH": "/nowhere"})["PATH"].startswith(bin_ + os.pathsep)


def test_a_build_lock_of_another_user_is_not_called_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its build runs in a process whose open files this user may not read: a lock it holds
    looked stale, and a tuning run beside that build was refused (seen under CI as ``nobody``)."""
    from optuna_ds.launcher import stale_build_locks

    (tmp_path / "op").mkdir()
    (tmp_path / "op" / "lock").touch()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    mine = os.lstat(tmp_path / "op" / "lock").st_uid
    monkeypatch.setattr(os, "geteuid", lambda: mine + 1)
    assert stale_build_locks() == []
    monkeypatch.setattr(os, "geteuid", lambda: mine)
    assert stale_build_locks() == [str((tmp_path / "op" / "lock").resolve())]


def test_a_build_lock_is_not_called_stale_where_proc_cannot_be_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc hidden (hidepid, a container): no process can be seen holding a lock, so a build
    running beside the tuning looked stale and the tuning was refused."""
    from optuna_ds.launcher import stale_build_locks

    (tmp_path / "op").mkdir()
    (tmp_path / "op" / "lock").touch()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    listdir = os.listdir

    def hidden(path: object = ".") -> list[str]:
        if str(path).startswith("/proc"):
            raise PermissionError(13, "Permission denied", str(path))
        return listdir(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "listdir", hidden)
    assert stale_build_locks() == []


def test_a_build_of_minutes_shows_its_progress(tmp_path: Path) -> None:
    """Issue 49: DeepSpeed's op build, 4.5 minutes at set-up, said nothing once announced. While
    it runs, each op's sources compiled so far are said, until its library is built."""
    import queue

    from optuna_ds.launcher import watching_build

    (tmp_path / "fused_adam").mkdir()
    (tmp_path / "fused_adam" / "stale.o").write_text("")  # an earlier build's: not this one's progress
    os.utime(tmp_path / "fused_adam" / "stale.o", (0, 0))
    said: queue.Queue[str] = queue.Queue()
    with watching_build(str(tmp_path), {"fused_adam": 2}, say=said.put, every=0.01):
        assert said.get(timeout=30).endswith("s so far: fused_adam 0 of 2 sources compiled")
        (tmp_path / "fused_adam" / "fused_adam.o").write_text("")
        while not said.get(timeout=30).endswith("fused_adam 1 of 2 sources compiled"):
            pass
        (tmp_path / "fused_adam" / "fused_adam.so").write_text("")  # built: the watch ends by itself
        while not said.empty():
            said.get()
    assert said.empty()
