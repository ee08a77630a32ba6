"""Folders the user cannot write: one line and exit status 2 before anything is launched.

The tests run as root, whom permissions do not stop: the CLI runs as ``nobody`` under
``setpriv``, in a tree that ``nobody`` can read but not write."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from invariants import HOSTILE
from invariants import base_config
from invariants import shared_tree  # noqa: F401
from conftest import assert_one_line_error
from conftest import LAUNCHER_OPTION

SETPRIV = shutil.which("setpriv")
pytestmark = pytest.mark.skipif(SETPRIV is None or os.geteuid() != 0,
                                reason="needs root and setpriv to run the CLI as an unprivileged user")


def _as_nobody(tree: Path, *args: str, path: str = "/usr/bin:/bin") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DS_ACCELERATOR="cpu", HOME=str(tree), PATH=path, FAKE_DS_LOG=str(tree / "writable" / "launches.jsonl"),
               OPTUNA_DS_LOCK_DIR=str(tree / "writable" / "locks"))
    return subprocess.run([SETPRIV, "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-m", "optuna_ds",
                           "tune", LAUNCHER_OPTION, HOSTILE, *args, "train.py", "--deepspeed_config", "ds_config.json"],
                          cwd=tree / "ws", env=env, capture_output=True, text=True, timeout=120)


def _tree(tree: Path) -> Path:
    ws = tree / "ws"
    ws.mkdir(mode=0o755)
    (ws / "train.py").write_text("print('train')\n")
    config = base_config()
    config["autotuning"] = {"enabled": True}  # a profile run would come first
    (ws / "ds_config.json").write_text(json.dumps(config))
    (tree / "writable").mkdir()
    (tree / "writable").chmod(0o777)
    (tree / "readonly").mkdir(mode=0o755)
    for path in (ws, ws / "train.py", ws / "ds_config.json"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return ws


@pytest.mark.parametrize("args, words", [
    ([], ["results_dir", "not writable"]),  # the default results folder, in a folder we cannot write
    (["--results-dir", "../readonly", "--exps-dir", "../writable/e"], ["results_dir", "not writable"]),
    (["--results-dir", "../writable/r", "--exps-dir", "../readonly/e"], ["exps_dir", "not writable"]),
    (["--results-dir", "../writable/r", "--exps-dir", "../writable/e", "--storage", "sqlite:///../readonly/db/optuna-ds.db"], ["SQLite"]),
])
def test_unwritable_places_are_one_line_before_the_profile_run(shared_tree: Path, args: list[str], words: list[str]) -> None:
    _tree(shared_tree)
    proc = _as_nobody(shared_tree, *args)
    assert_one_line_error(proc, *words)
    assert not (shared_tree / "writable" / "launches.jsonl").exists()  # not even the profile run
    assert os.listdir(shared_tree / "readonly") == []


def test_sqlite_database_in_a_read_only_folder(shared_tree: Path) -> None:
    _tree(shared_tree)
    db = shared_tree / "readonly" / "optuna-ds.db"
    import sqlite3

    sqlite3.connect(db).close()
    db.chmod(0o644)
    proc = _as_nobody(shared_tree, "--results-dir", "../writable/r", "--exps-dir", "../writable/e", "--storage", f"sqlite:///{db}")
    assert_one_line_error(proc, "SQLite")
    assert not (shared_tree / "writable" / "launches.jsonl").exists()


def test_an_unsearchable_folder_on_path_is_one_line(shared_tree: Path) -> None:
    """DeepSpeed's CPU accelerator counts devices by running numactl from PATH: a PATH folder
    the user may not search raises PermissionError there."""
    _tree(shared_tree)
    locked = shared_tree / "locked"
    locked.mkdir(mode=0o700)
    proc = _as_nobody(shared_tree, "--results-dir", "../writable/r", "--exps-dir", "../writable/e",
                      path=f"{locked}:/usr/bin:/bin")
    assert_one_line_error(proc, "accelerator")
    assert not (shared_tree / "writable" / "launches.jsonl").exists()


@pytest.mark.parametrize("made", ["open-to-all", "another-user's", "link"])
def test_a_lock_folder_another_user_made_first_is_refused_and_nothing_written_through_it(shared_tree: Path, made: str) -> None:
    """Row 4 of issue 34: another local user created the default lock folder first and planted
    `localhost-0.lock -> ~victim/file`: the tuner wrote its pid into the victim's file."""
    _tree(shared_tree)
    tmp = shared_tree / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    victim = shared_tree / "writable" / "victim.txt"
    victim.write_text("the victim's\n")
    victim.chmod(0o666)
    folder = tmp / "optuna-ds-gpus-65534"  # nobody's, made by root before nobody's tuning
    if made == "link":
        elsewhere = shared_tree / "writable" / "elsewhere"
        elsewhere.mkdir()
        os.chown(elsewhere, 65534, 65534)
        folder.symlink_to(elsewhere)
    else:
        folder.mkdir()
        folder.chmod(0o777 if made == "open-to-all" else 0o755)
        (folder / "localhost-0.lock").symlink_to(victim)
    env = dict(os.environ, DS_ACCELERATOR="cpu", HOME=str(shared_tree), PATH="/usr/bin:/bin", TMPDIR=str(tmp),
               FAKE_DS_LOG=str(shared_tree / "writable" / "launches.jsonl"))
    for name in ("OPTUNA_DS_LOCK_DIR", "XDG_RUNTIME_DIR"):
        env.pop(name, None)
    proc = subprocess.run([SETPRIV, "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-m", "optuna_ds",
                           "tune", LAUNCHER_OPTION, HOSTILE, "--results-dir", "../writable/r", "--exps-dir", "../writable/e",
                           "train.py", "--deepspeed_config", "ds_config.json"],
                          cwd=shared_tree / "ws", env=env, capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc, "lock folder", str(folder))
    assert victim.read_text() == "the victim's\n"
    assert not (shared_tree / "writable" / "launches.jsonl").exists()
