"""Paths at the system's limits and folders that are links: one line before anything runs, or a
tuning that runs; nothing outside the tuning's own folders written or deleted."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import optuna
import pytest

from conftest import assert_one_line_error
from invariants import Hostile
from invariants import base_config
from invariants import hws  # noqa: F401

NAME_MAX = os.pathconf("/", "PC_NAME_MAX")
PATH_MAX = os.pathconf("/", "PC_PATH_MAX")


def _deep(base: Path, length: int) -> str:
    """A relative folder path whose absolute path under ``base`` is ``length`` bytes long."""
    parts, size = [], len(str(base))
    while size + 1 + NAME_MAX < length:
        parts.append("d" * (NAME_MAX - 1))
        size += NAME_MAX
    parts.append("e" * (length - size - 1))
    return "/".join(parts)


def test_a_results_folder_named_at_name_max_and_a_study_name_at_the_storage_limit_tune(
        hws: Hostile) -> None:
    hws.config(base_config())
    name = "é" * 499 + "s"  # 500 characters, 999 bytes
    folder = "r" * NAME_MAX
    proc = hws.main("--study-name", name, "--results-dir", folder)
    assert proc.returncode == 0, proc.stderr
    hws.own.append(hws.root / folder)
    assert json.loads((hws.root / folder / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] == 4
    storage = f"sqlite:///{hws.root / folder / 'optuna-ds.db'}"
    sizes = [t.params.get("train_micro_batch_size_per_gpu") for t in optuna.load_study(study_name=f"{name}-z1", storage=storage).trials]
    assert sorted(set(sizes)) == [2, 4], sizes  # both sizes ran under names at the limits
    assert hws.main("--study-name", name, "--results-dir", folder, "--overwrite").returncode == 0
    hws.assert_nothing_left()
    hws.assert_untouched()


@pytest.mark.parametrize("what", ["--results-dir", "--exps-dir"])
def test_a_folder_too_long_for_its_experiments_files_is_one_line(hws: Hostile, what: str) -> None:
    """A folder that fits but leaves no room for the experiments' files under it crashed on the
    first file (or each experiment failed in turn)."""
    hws.config(base_config())
    folder = _deep(hws.root, PATH_MAX - 100)
    storage = f"sqlite:///{hws.base / 'db' / 'optuna-ds.db'}"
    hws.own.append(hws.base / "db")
    assert_one_line_error(hws.main(what, folder, "--storage", storage), what[2:].replace("-", "_"), "shorter")
    assert hws.events() == []
    hws.assert_untouched()


def test_a_default_storage_too_long_for_sqlite_is_one_line(hws: Hostile) -> None:
    hws.config(base_config())
    folder = _deep(hws.root, 600)
    hws.own.append(hws.root / folder.split("/")[0])
    assert_one_line_error(hws.main("--results-dir", folder), "SQLite", "512", "--storage")
    assert hws.events() == []
    hws.assert_untouched()


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def test_a_results_folder_that_is_a_link_loses_nothing_of_the_user_with_overwrite(
        hws: Hostile) -> None:
    """``autotuning_results`` a link to a folder of the user's elsewhere: the tuning writes its
    own files there, and ``--overwrite`` deletes those and nothing of the user's beside them."""
    target = hws.base / "outside" / "shared"
    (target / "mine").mkdir(parents=True)
    (target / "mine" / "data.txt").write_text("the user's\n")
    (target / "notes.txt").write_text("the user's notes\n")
    (target / "z1_elsewhere").symlink_to(hws.base / "outside")
    hws.results.symlink_to(target)
    users = _digests(target)
    hws.own.append(target)
    hws.config(base_config())
    assert hws.main().returncode == 0
    assert (target / "ds_config_optimal.json").is_file() and (target / "z1_gas1_tmbspg2" / "metrics.json").is_file()
    assert hws.main("--overwrite").returncode == 0
    assert hws.results.is_symlink()
    assert {k: v for k, v in _digests(target).items() if k in users} == users
    assert (hws.base / "outside" / "precious.txt").read_text() == "a user's file\n"
    hws.assert_nothing_left()
    hws.assert_untouched()


# Row 7 of issue 34: a link at one of the tuning's own file names, planted before the first run
# (or before --overwrite), once had the report written into an outside file.
_OWN_FILES = ["summary.txt", "report.html", "ds_config_optimal.json", "cmd_optimal.txt", ".optuna-ds-tuning.json",
              "optuna-ds.db", "optuna-ds.db-wal", "optuna-ds.db.lock", "z1_gas1_tmbspg2", "z1_gas1_tmbspg2/stdout.log",
              "z1_gas1_tmbspg2/cmd.txt", "z1_gas1_tmbspg2/exp.json", "exps:z1_gas1_tmbspg2.json"]


@pytest.mark.parametrize("name", _OWN_FILES)
@pytest.mark.parametrize("overwrite", [False, True], ids=["first-run", "overwrite"])
def test_a_link_at_a_file_of_the_tuning_is_one_line_and_nothing_is_written_through_it(
        hws: Hostile, name: str, overwrite: bool) -> None:
    hws.config(base_config())
    if overwrite:
        assert hws.main().returncode == 0
    folder, _, name = name.rpartition(":")
    place = (hws.root / "autotuning_exps" if folder else hws.results) / name
    place.parent.mkdir(parents=True, exist_ok=True)
    if place.is_dir():
        shutil.rmtree(place)
    elif place.exists():
        place.unlink()
    outside = hws.base / "outside"
    place.symlink_to(outside if name == "z1_gas1_tmbspg2" else outside / "precious.txt")
    proc = hws.main(*(["--overwrite"] if overwrite else []))
    if overwrite and "/" in name:
        # --overwrite deletes the experiment's folder, the link in it with it (not what it points to).
        assert proc.returncode == 0, proc.stderr
    else:
        assert_one_line_error(proc, name.rsplit("/", 1)[-1], "symbolic link")
        assert place.is_symlink()
    assert (outside / "precious.txt").read_text() == "a user's file\n"
    assert os.listdir(outside) == ["precious.txt"]
    hws.assert_nothing_left()
    hws.assert_untouched()


def test_a_results_folder_named_like_a_url_query_holds_its_own_database(hws: Hostile) -> None:
    """The default SQLite URL was built by formatting: 'res?mode=ro' put the database outside
    the folder, and 'x?a' and 'x?b' shared one."""
    hws.config(base_config())
    for folder in ("res?mode=ro", "x?a", "x?b"):
        proc = hws.main("--results-dir", folder, "--exps-dir", f"{folder}-exps")
        assert proc.returncode == 0, proc.stderr
        hws.own += [hws.root / folder, hws.root / f"{folder}-exps"]
        assert (hws.root / folder / "optuna-ds.db").is_file()
    assert not (hws.root / "res").exists() and not (hws.root / "x").exists()
    launched = len(hws.experiments())
    assert hws.main("--results-dir", "x?b", "--exps-dir", "x?b-exps").returncode == 0
    assert len(hws.experiments()) == launched  # resumed from its own database: nothing launched again
    hws.assert_untouched()


@pytest.mark.parametrize("where", ["config", "--results-dir", "--exps-dir"])
@pytest.mark.parametrize("bad", ["a\0b", "caf\udce9"], ids=["nul", "not-utf-8"])
def test_a_folder_no_path_or_storage_can_hold_is_one_line_before_anything_runs(hws: Hostile, where: str, bad: str) -> None:
    if where == "config":
        if "\0" not in bad:
            pytest.skip("JSON holds no byte that is not UTF-8")
        hws.config(base_config(autotuning={"enabled": True, "model_info": {"num_params": 1000000}, "results_dir": bad}))
        proc = hws.main()
    else:
        hws.config(base_config())
        proc = hws.main(where, bad)
    assert_one_line_error(proc, "NUL" if "\0" in bad else "UTF-8")
    assert hws.events() == []
    hws.assert_untouched()


def test_a_rank_log_folder_that_is_a_link_loses_no_log_of_the_folder_it_points_to(hws: Hostile) -> None:
    """Stale rank logs (``*_rank*.log``) of an experiment's folder under --enable_each_rank_log
    are deleted before it runs: through a link, they were another folder's."""
    logs = hws.base / "outside" / "logs"
    logs.mkdir()
    (logs / "train_rank0.log").write_text("the user's log\n")
    (hws.root / "ranks").mkdir()
    (hws.root / "ranks" / "z1_gas1_tmbspg2").symlink_to(logs)
    hws.own.append(hws.root / "ranks")
    hws._before = hws.snapshot()
    hws.config(base_config())
    assert_one_line_error(hws.main("--enable_each_rank_log", "ranks"), "z1_gas1_tmbspg2", "symbolic link")
    assert (logs / "train_rank0.log").read_text() == "the user's log\n"
    hws.assert_nothing_left()
    hws.assert_untouched()
