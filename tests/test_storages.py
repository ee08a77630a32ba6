"""Tunings in the RDB servers that many workers share: PostgreSQL and MySQL (MariaDB).

Where a server is not reachable the test skips and says so, except under CI=true, where the
servers exist and the test must run.
"""
from __future__ import annotations

import os
import socket
import uuid

import optuna
import pytest
from optuna.trial import TrialState

from conftest import Workspace

SERVERS = {
    "postgresql": ("postgresql+psycopg://postgres@127.0.0.1:5432/test", 5432),
    "mysql": ("mysql+pymysql://root@127.0.0.1:3306/test", 3306),
}
CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": [0, 1], "offload_optimizer": {"device": "cpu"}},
    "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 64},
}


def _reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_tune_and_resume_in_a_server_storage(ws: Workspace, server: str) -> None:
    url, port = SERVERS[server]
    if not _reachable(port):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{server} is not reachable at 127.0.0.1:{port} in CI")
        pytest.skip(f"{server} is not reachable at 127.0.0.1:{port}")
    name = f"t-{uuid.uuid4().hex[:10]}"
    ws.config(CONFIG)
    p = ws.tune("ds_config.json", "--storage", url, "--study-name", name)
    assert p.returncode == 0, p.stderr
    try:
        study = optuna.load_study(study_name=f"{name}-z1", storage=url)
        trials = study.get_trials()
        assert trials and all(t.state == TrialState.COMPLETE for t in trials)
        assert trials[0].user_attrs["ds_config"]["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
        assert "plan" in "".join(optuna.load_study(study_name=name, storage=url).user_attrs)
        launched = len(ws.launches())
        p = ws.tune("ds_config.json", "--storage", url, "--study-name", name)
        assert p.returncode == 0, p.stderr
        assert len(ws.launches()) == launched
        assert not (ws.results / "optuna-ds.db").exists()  # nothing in the default SQLite file
    finally:
        for suffix in ("", "-z0", "-z1"):
            try:
                optuna.delete_study(study_name=name + suffix, storage=url)
            except KeyError:
                pass


@pytest.mark.parametrize("kind", ["sqlite", *sorted(SERVERS)])
def test_a_record_is_written_in_one_statement_whole_and_only_to_a_running_trial(tmp_path, kind: str) -> None:
    from optuna_ds.storage import ExperimentRecord
    from optuna_ds.storage import TrialCache
    from optuna_ds.storage import create_storage

    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    else:
        url, port = SERVERS[kind]
        if not _reachable(port):
            pytest.skip(f"no {kind} server at 127.0.0.1:{port}")
    cache = TrialCache(create_storage(url))
    name = f"attrs-{uuid.uuid4().hex[:8]}"
    study = optuna.create_study(storage=cache, study_name=name)
    try:
        trial = study.ask()
        trial.set_user_attr("slot", "old")
        record = ExperimentRecord(slot="localhost:0", ds_config={"zero_optimization": {"stage": 1}}, micro_batch_size=8, exp_name="z1_x")
        cache.set_trial_user_attrs(trial._trial_id, record.attrs())
        stored = optuna.load_study(study_name=name, storage=url).trials[0]  # a fresh reader
        assert ExperimentRecord.from_trial(stored) == record  # the old value overwritten
        study.tell(trial, 1.0)
        with pytest.raises(RuntimeError):
            cache.set_trial_user_attrs(trial._trial_id, {"exp_name": "late"})
    finally:
        optuna.delete_study(study_name=name, storage=url)
