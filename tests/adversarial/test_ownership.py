"""What optuna-ds did not create is not its own: a study of another tool under one of the
tuning's names is refused, never adopted, read as experiments or deleted."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator

import optuna
import pytest

from conftest import assert_one_line_error
from invariants import Hostile
from invariants import base_config
from invariants import hws  # noqa: F401


def _foreign_study(hws: Hostile, name: str, *, exp_name: bool) -> list[int]:
    """A study of plain Optuna in the tuning's storage; returns its trials' ids."""
    hws.results.mkdir(exist_ok=True)
    study = optuna.create_study(study_name=name, storage=hws.storage, direction="maximize")
    for mbs, value in ((2, 5.0), (4, 7.0)):
        trial = study.ask()
        trial.suggest_int("train_micro_batch_size_per_gpu", 1, 8)
        if exp_name:  # what optuna-ds's trials carry, and the name optuna-ds would give mbs 2
            trial.set_user_attr("exp_name", f"z1_gas1_tmbspg{mbs}")
        study.tell(trial, value)
    study.set_user_attr("owner", "someone else")
    return [t._trial_id for t in study.trials]


def _unchanged(hws: Hostile, name: str, ids: list[int]) -> None:
    study = optuna.load_study(study_name=name, storage=hws.storage)
    assert [t._trial_id for t in study.trials] == ids
    assert study.user_attrs == {"owner": "someone else"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("exp_name", [True, False])
def test_a_foreign_stage_study_is_refused_and_never_deleted(hws: Hostile, exp_name: bool) -> None:
    """With trials that carry ``exp_name``, the tuning looped for ever adding pruned trials;
    without, it adopted the study, and ``--overwrite`` deleted it with the user's trials."""
    hws.config(base_config())
    ids = _foreign_study(hws, "optuna-ds-z1", exp_name=exp_name)
    for extra in ((), ("--overwrite",)):
        assert_one_line_error(hws.main(*extra), "optuna-ds-z1", "not created by optuna-ds", "--study-name")
        _unchanged(hws, "optuna-ds-z1", ids)
    assert hws.experiments() == []
    hws.assert_nothing_left()
    hws.assert_untouched()


def test_a_foreign_study_named_like_the_tuning_is_refused(hws: Hostile) -> None:
    hws.config(base_config())
    ids = _foreign_study(hws, "gpt2", exp_name=False)
    for extra in ((), ("--overwrite",)):
        assert_one_line_error(hws.main("--study-name", "gpt2", *extra), "'gpt2'", "not created by optuna-ds")
        _unchanged(hws, "gpt2", ids)
    assert hws.experiments() == []
    hws.assert_untouched()


@pytest.mark.timeout(60)
def test_a_trial_whose_claim_the_planner_cannot_read_ends_the_tuning(hws: Hostile) -> None:
    """The tuning's own stage study holding a finished trial of the planner's experiment written
    by another tool: one line, not a loop of pruned trials."""
    hws.config(base_config())
    hws.results.mkdir()
    study = optuna.create_study(study_name="optuna-ds-z1", storage=hws.storage, direction="maximize")
    study.set_user_attr("optuna_ds:tuning", "optuna-ds")
    trial = study.ask()
    trial.set_user_attr("exp_name", "z1_gas1_tmbspg2")
    study.tell(trial, 5.0)
    assert_one_line_error(hws.main(), "trial 0", "z1_gas1_tmbspg2", "--study-name")
    assert len(optuna.load_study(study_name="optuna-ds-z1", storage=hws.storage).trials) < 10
    assert "z1_gas1_tmbspg2" not in {e["name"] for e in hws.experiments()}
    hws.assert_nothing_left()
    hws.assert_untouched()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_resumed_tuning_ends_and_reads_only_what_its_trial_launched(hws: Hostile) -> None:
    """An orphaned trial whose folder another launch has taken since (its exp.json names another
    token, its metrics are another run's): the resumed tuning read the token from the folder and
    SIGTERMed the other launch's live process, and took its metrics as the trial's result."""
    hws.config(base_config())
    hws.results.mkdir()
    folder = hws.results / "z1_gas1_tmbspg2"
    folder.mkdir()
    (folder / "exp.json").write_text(json.dumps({"name": "z1_gas1_tmbspg2", "mark": "theirs" + uuid.uuid4().hex}))
    (folder / "metrics.json").write_text(json.dumps({"throughput": 999.0}))
    theirs = json.loads((folder / "exp.json").read_text())["mark"]
    other = subprocess.Popen(["sleep", "120"], env={**os.environ, "OPTUNA_DS_EXPERIMENT": theirs}, start_new_session=True)
    try:
        study = optuna.create_study(study_name="optuna-ds-z1", storage=hws.storage, direction="maximize")
        study.set_user_attr("optuna_ds:tuning", "optuna-ds")
        trial = study.ask()  # left running by a driver that died with its experiment
        dead = {"host": socket.gethostname(), "pid": _dead_pid(), "started": "1"}
        for key, value in {"worker": dead, "phase": "micro_batch", "micro_batch_size": 2, "gradient_accumulation_steps": 1,
                           "result_dir": str(folder), "mark": uuid.uuid4().hex, "experiment_process": dead,
                           "exp_name": "z1_gas1_tmbspg2"}.items():
            trial.set_user_attr(key, value)
        assert hws.main().returncode == 0
        assert other.poll() is None, "another launch's process was ended"
        assert optuna.load_study(study_name="optuna-ds-z1", storage=hws.storage).trials[0].state.name == "FAIL"
        assert "z1_gas1_tmbspg2" in {e["name"] for e in hws.experiments()}  # runs again, for a result of its own
        assert json.loads((hws.results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] == 4
    finally:
        other.kill()
        other.wait()
    hws.assert_finished_once()
    hws.assert_nothing_left()
    hws.assert_untouched()


def _digests(folder) -> dict[str, str]:
    import hashlib
    import os

    seen = {}
    for here, _, files in os.walk(folder):
        for f in files:
            path = os.path.join(here, f)
            if not f.startswith("optuna-ds.db"):  # the storage both tunings share
                with open(path, "rb") as fh:
                    seen[os.path.relpath(path, folder)] = hashlib.sha256(fh.read()).hexdigest()
    return seen


@pytest.mark.parametrize("claimed", [True, False], ids=["claimed", "before-claims"])
def test_a_second_tuning_in_the_same_folder_is_refused(hws: Hostile, claimed: bool) -> None:
    """A second tuning (another --study-name) in the same working directory overwrote the
    first's outputs and experiments, and its --overwrite deleted them. ``before-claims``: the
    first tuning ran before folders were claimed (its claim file is not there)."""
    hws.config(base_config())
    assert hws.main().returncode == 0
    first = optuna.load_study(study_name="optuna-ds-z1", storage=hws.storage).trials
    if not claimed:
        (hws.results / ".optuna-ds-tuning.json").unlink(missing_ok=True)
        (hws.root / "autotuning_exps" / ".optuna-ds-tuning.json").unlink(missing_ok=True)
    results, exps = _digests(hws.results), _digests(hws.root / "autotuning_exps")
    launched = len(hws.experiments())
    for extra in ((), ("--overwrite",)):
        assert_one_line_error(hws.main("--study-name", "other", *extra), "'optuna-ds'", "--results-dir", "'other'")
    assert _digests(hws.results) == results and _digests(hws.root / "autotuning_exps") == exps
    assert len(hws.experiments()) == launched
    assert all(os.path.isdir(t.user_attrs["result_dir"]) for t in first)
    hws.assert_finished_once()
    # Given folders of its own, it runs (the same experiment names, elsewhere); and the first
    # resumes as before, launching nothing.
    assert hws.main("--study-name", "other", "--results-dir", "r2", "--exps-dir", "e2").returncode == 0
    hws.own += [hws.root / "r2", hws.root / "e2"]
    assert hws.main().returncode == 0
    assert len(hws.experiments()) == 2 * launched  # the same job, tuned once more in its own folders
    hws.assert_nothing_left()
    hws.assert_untouched()


@pytest.fixture
def mariadb() -> Iterator[str]:
    """A database of its own on the MariaDB server at 127.0.0.1:3306 (root, no password)."""
    from conftest import reachable

    if not reachable(3306):
        if os.environ.get("CI") == "true":
            pytest.fail("MariaDB is not reachable at 127.0.0.1:3306 in CI")
        pytest.skip("MariaDB is not reachable at 127.0.0.1:3306")
    import pymysql

    name = f"optuna_ds_case_{uuid.uuid4().hex[:8]}"
    admin = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    with admin.cursor() as c:
        c.execute(f"CREATE DATABASE {name}")
    try:
        yield f"mysql+pymysql://root@127.0.0.1:3306/{name}"
    finally:
        with admin.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()


def test_a_study_name_the_database_matches_by_case_or_trailing_space_is_another_tuning(hws: Hostile, mariadb: str) -> None:
    """Row 13 of issue 34: MySQL and MariaDB compare names by a case-insensitive collation that
    ignores trailing spaces: `--study-name MY` joined and wrote to tuning `my`."""
    hws.config(base_config())
    assert hws.main("--storage", mariadb, "--study-name", "my").returncode == 0
    storage = optuna.storages.RDBStorage(mariadb)

    def state() -> dict[str, tuple[dict, int]]:
        return {s.study_name: (s.user_attrs, s.n_trials) for s in optuna.get_all_study_summaries(storage)}

    before = state()
    launched = len(hws.experiments())
    for i, name in enumerate(("MY", "my ", "My ")):
        proc = hws.main("--storage", mariadb, "--study-name", name, "--results-dir", f"r{i}", "--exps-dir", f"e{i}")
        hws.own += [hws.root / f"r{i}", hws.root / f"e{i}"]
        assert_one_line_error(proc, repr(name), "'my'")
        worker = hws.main("worker", "--storage", mariadb, "--study-name", name, "--wait", "0", config=None)
        assert_one_line_error(worker, "holds no tuning named", "'my'")
    assert state() == before
    assert len(hws.experiments()) == launched
    storage.engine.dispose()
    hws.assert_untouched()
