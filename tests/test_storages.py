"""Tunings in the RDB servers that many workers share: PostgreSQL and MySQL (MariaDB).

Where a server is not reachable the test skips and says so, except under CI=true, where the
servers exist and the test must run.
"""
from __future__ import annotations

import dataclasses
import collections
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import was_pruned

from conftest import FAKE_LAUNCHER
from conftest import LAUNCHER_OPTION
from conftest import Workspace
from conftest import assert_one_line_error
from conftest import reachable
from conftest import run_in_process

SERVERS = {
    "postgresql": ("postgresql+psycopg://postgres@127.0.0.1:5432/test", 5432),
    "mysql": ("mysql+pymysql://root@127.0.0.1:3306/test", 3306),
}
CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": [0, 1], "offload_optimizer": {"device": "cpu"}},
    "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 64},
}


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_tune_and_resume_in_a_server_storage(ws: Workspace, server: str) -> None:
    url, port = SERVERS[server]
    if not reachable(port):
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


# -- a server that refuses connections ------------------------------------------------------------

FAST = {**CONFIG, "zero_optimization": {"stage": 1}, "autotuning": {**CONFIG["autotuning"], "fast": True}}


class LimitedRole:
    """A PostgreSQL role of its own, owning a database of its own, whose connections the test
    limits or refuses; dropped at the end. Its name is unique: test runs may share the server."""

    def __init__(self) -> None:
        import psycopg

        self.name = f"optuna_ds_limited_{uuid.uuid4().hex[:8]}"
        self.url = f"postgresql+psycopg://{self.name}:S3cretRole@127.0.0.1:5432/{self.name}"  # trust auth: unused
        self._admin = psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True)
        self._admin.execute(f"CREATE ROLE {self.name} LOGIN CONNECTION LIMIT 1")
        self._admin.execute(f"CREATE DATABASE {self.name} OWNER {self.name}")

    def limit(self, connections: int) -> None:
        self._admin.execute(f"ALTER ROLE {self.name} CONNECTION LIMIT {connections}")

    def refuse(self) -> None:
        """The server turns the role away and drops every connection it has."""
        self._admin.execute(f"ALTER ROLE {self.name} NOLOGIN")
        self._admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (self.name,))

    def admit(self) -> None:
        self._admin.execute(f"ALTER ROLE {self.name} LOGIN")

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(f"host=127.0.0.1 port=5432 user={self.name} dbname={self.name}")

    def drop(self) -> None:
        self._admin.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        self._admin.execute(f"DROP ROLE IF EXISTS {self.name}")
        self._admin.close()


@pytest.fixture
def role() -> Iterator[LimitedRole]:
    if not reachable(5432):
        if os.environ.get("CI") == "true":
            pytest.fail("postgresql is not reachable at 127.0.0.1:5432 in CI")
        pytest.skip("postgresql is not reachable at 127.0.0.1:5432")
    role = LimitedRole()
    try:
        yield role
    finally:
        role.drop()


def test_a_role_at_its_connection_limit_is_one_line_and_exit_2(ws: Workspace, role: LimitedRole) -> None:
    """Opening Optuna's storage takes two connections at once: with one allowed, `tune`, `worker`
    and `report` each say why in one line, after waiting in case others' connections close (for
    OPTUNA_DS_CONNECT_PATIENCE seconds: 3 here, not the default 20)."""
    ws.config(FAST)
    env = ws.env(OPTUNA_DS_CONNECT_PATIENCE="3")
    start = time.monotonic()
    args = {"tune": ["tune", LAUNCHER_OPTION, FAKE_LAUNCHER, "--storage", role.url, "train.py", "--deepspeed_config", "ds_config.json"],
            "worker": ["worker", "--storage", role.url],
            "report": ["report", "--storage", role.url, "-o", str(ws.root / "r.html")]}
    procs = {k: subprocess.Popen([sys.executable, "-m", "optuna_ds", *a], cwd=ws.root, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for k, a in args.items()}
    for command, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        line = assert_one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), "too many connections for role",
                                     "connection limit")
        assert "S3cretRole" not in out + err
        assert role.name in line and "127.0.0.1:5432" in line, (command, line)
    assert time.monotonic() - start >= 3  # each waited out its patience (how much longer is the machine's load)
    assert not ws.launches()


def test_a_tuning_of_8_slots_needs_no_more_than_its_pool_of_connections(ws: Workspace, role: LimitedRole) -> None:
    """Eight slots and their heartbeats share the process's few connections: a role allowed
    only those tunes to the end (SQLAlchemy's default pool opened 11 and the server refused)."""
    role.limit(4)  # optuna-ds's pool: storage.POOL_SIZE + storage.POOL_OVERFLOW
    (ws.root / "hostfile").write_text("localhost slots=8\n")
    ws.config({**FAST, "train_micro_batch_size_per_gpu": [2, 4, 8, 12, 16, 24, 32, 48]})
    p = ws.tune("ds_config.json", "--hostfile", "hostfile", "--num_gpus", "1", "--storage", role.url,
                surface={"oom_above": {"1": 40}, "peak": 24, "duration": 0.5}, process=True)
    assert p.returncode == 0, p.stderr[-3000:]
    launches = [l for l in ws.launches() if not l.get("profile")]
    assert len(launches) >= 8 and len({l["include"] for l in launches}) >= 4  # slots ran side by side
    trials = optuna.load_study(study_name="optuna-ds-z1", storage=role.url).get_trials()
    # Every trial ran to its end, was pruned by the pruner (a run clearly below the best), or was
    # a handed-out experiment the decider withdrew before any slot launched it.
    unfinished = [t.number for t in trials if t.state not in (TrialState.COMPLETE, TrialState.FAIL)
                  and not was_pruned(t) and (t.state != TrialState.PRUNED or ExperimentRecord.from_trial(t).launched)]
    assert trials and not unfinished, [(t.number, t.user_attrs) for t in trials if t.number in unfinished]


def test_a_burst_of_refused_connections_is_waited_out(role: LimitedRole) -> None:
    """Other clients hold every connection the role may have: opening the storage waits for
    them to close instead of failing."""
    from optuna_ds.storage import create_storage

    role.limit(4)
    held = [role.connect() for _ in range(4)]
    timer = threading.Timer(3.0, lambda: [c.close() for c in held])
    start = time.monotonic()
    timer.start()
    try:
        storage = create_storage(role.url)
    finally:
        timer.join()
    assert time.monotonic() - start >= 3.0
    study = optuna.create_study(storage=storage, study_name="burst")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert len(study.trials) == 2
    storage.engine.dispose()


def test_a_trial_whose_storage_fails_at_its_end_raises_the_storage_error(role: LimitedRole) -> None:
    """The server refuses the role while a trial runs: the database's error is raised, not
    Optuna's UnboundLocalError from failing to read the trial back (optuna/optuna#5280)."""
    from optuna_ds.storage import create_storage
    from optuna_ds.storage import database_error
    from optuna_ds.studies._experiments import run_trial

    role.limit(10)
    storage = create_storage(role.url)
    study = optuna.create_study(storage=storage, study_name="refused")

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_float("x", 0.0, 1.0)
        role.refuse()
        return 1.0

    with pytest.raises(Exception) as raised:
        run_trial(study, objective)
    assert not isinstance(raised.value, UnboundLocalError)
    assert f'role "{role.name}" is not permitted to log in' in (database_error(raised.value) or ""), raised.value
    role.admit()
    storage.engine.dispose()


def test_a_trials_heartbeat_outlives_a_database_outage(role: LimitedRole, monkeypatch) -> None:
    """The server drops the role's connections and refuses new ones for a while (a restart):
    the beats it fails are tried again, and the first after it is back is recorded. Optuna's
    own heartbeat thread ended at the first failed beat, and after the grace period another
    process failed the trial as stale while its experiment ran on (issue 34, row 1)."""
    from optuna_ds._optuna_compat import heartbeat
    from optuna_ds.storage import create_storage
    from optuna_ds.storage import database_error

    role.limit(10)
    storage = create_storage(role.url)
    monkeypatch.setattr(storage, "heartbeat_interval", 1)  # a beat a second, not every 10 s
    outcomes: list[bool] = []
    failed, recovered = threading.Event(), threading.Event()
    record = storage.record_heartbeat

    def beat(trial_id: int) -> None:
        try:
            record(trial_id)
        except Exception:
            outcomes.append(False)
            failed.set()
            raise
        outcomes.append(True)
        if failed.is_set():
            recovered.set()

    monkeypatch.setattr(storage, "record_heartbeat", beat)
    study = optuna.create_study(storage=storage, study_name="beating")
    trial = study.ask()
    with heartbeat(study, trial, transient=lambda e: database_error(e) is not None):
        role.refuse()
        assert failed.wait(timeout=60), outcomes
        role.admit()
        assert recovered.wait(timeout=60), outcomes
    study.tell(trial, 1.0)
    storage.engine.dispose()


def test_a_database_lost_mid_tuning_keeps_the_finished_experiments(ws: Workspace, role: LimitedRole) -> None:
    """The server drops the tuning's connections and refuses new ones after a few experiments:
    one line says so and how to resume; rerun, the tuning resumes and runs no finished
    experiment again."""
    role.limit(50)
    (ws.root / "hostfile").write_text("localhost slots=4\n")
    ws.config({**FAST, "train_micro_batch_size_per_gpu": [2, 4, 8, 12, 16, 24, 32, 48]})
    surface = {"oom_above": {"1": 40}, "peak": 24, "duration": 1.5}
    env = ws.env(surface)
    args = [sys.executable, "-m", "optuna_ds", "tune", LAUNCHER_OPTION, FAKE_LAUNCHER, "--hostfile", "hostfile", "--num_gpus", "1",
            "--storage", role.url, "train.py", "--deepspeed_config", "ds_config.json"]
    proc = subprocess.Popen(args, cwd=ws.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finished: dict[int, float] = {}
    deadline = time.monotonic() + 120
    while len(finished) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.3)
        try:
            trials = optuna.load_study(study_name="optuna-ds-z1", storage=role.url).get_trials()
        except KeyError:  # not created yet
            continue
        finished = {t.number: t.value for t in trials if t.state == TrialState.COMPLETE}
    assert len(finished) >= 2, proc.communicate()
    role.refuse()
    out, err = proc.communicate(timeout=120)
    assert_one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), "lost the storage", "run the same command again to resume")
    assert "S3cretRole" not in out + err

    role.admit()
    names = {t.user_attrs["exp_name"]: t.number for t in optuna.load_study(study_name="optuna-ds-z1", storage=role.url).get_trials()
             if t.number in finished}
    p = run_in_process(args[3:], cwd=ws.root, env=env)  # resumed: `tune ...`, in this process
    assert p.returncode == 0, p.stderr[-3000:]
    trials = {t.number: t for t in optuna.load_study(study_name="optuna-ds-z1", storage=role.url).get_trials()}
    assert all(trials[n].state == TrialState.COMPLETE and trials[n].value == v for n, v in finished.items())
    launched = collections.Counter(l["args"][l["args"].index("--deepspeed_config") + 1].split("/")[-2]
                                   for l in ws.launches() if not l.get("profile") and not l.get("training"))
    assert all(launched[name] == 1 for name in names), launched
    assert (ws.results / "ds_config_optimal.json").exists()


@pytest.mark.parametrize("kind", ["sqlite", *sorted(SERVERS)])
def test_a_record_is_written_in_one_statement_whole_and_only_to_a_running_trial(tmp_path, kind: str) -> None:
    from optuna_ds._optuna_compat import trial_id
    from optuna_ds.domain import Config
    from optuna_ds.domain import ExperimentRecord
    from optuna_ds.storage import TrialCache
    from optuna_ds.storage import create_storage

    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    else:
        url, port = SERVERS[kind]
        if not reachable(port):
            pytest.skip(f"no {kind} server at 127.0.0.1:{port}")
    cache = TrialCache(create_storage(url))
    name = f"attrs-{uuid.uuid4().hex[:8]}"
    study = optuna.create_study(storage=cache, study_name=name)
    try:
        trial = study.ask()
        trial.set_user_attr("slot", "old")
        record = ExperimentRecord(slot="localhost:0", ds_config={"zero_optimization": {"stage": 1}}, config=Config(stage=1, micro_batch=8),
                                  exp_name="z1_x")
        cache.set_trial_user_attrs(trial_id(trial), record.attrs())
        stored = optuna.load_study(study_name=name, storage=url).trials[0]  # a fresh reader
        assert ExperimentRecord.from_trial(stored) == record  # the old value overwritten
        study.tell(trial, 1.0)
        with pytest.raises(RuntimeError):
            cache.set_trial_user_attrs(trial_id(trial), {"exp_name": "late"})
    finally:
        optuna.delete_study(study_name=name, storage=url)


def test_the_plan_is_read_from_the_storage_alone_and_from_a_root_of_before(tmp_path) -> None:
    """The plan is a system attr of the root study (its user attr, what `optuna studies` prints,
    its fingerprint only); a root that holds it whole in its user attrs, as tunings started before
    stored it, still resumes."""
    from optuna_ds.storage import TuningPlan
    from optuna_ds.storage import load_plan
    from optuna_ds.storage import open_root_study
    from optuna_ds.storage import tuning_names
    from optuna_ds.storage import tuning_study_names

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    plan = TuningPlan(study_name="t", script="train.py", script_args=["--deepspeed", "ds.json"], cwd=str(tmp_path),
                      config_path="ds.json", user_config={"autotuning": {"enabled": True}}, deepspeed_bin=["deepspeed"],
                      launcher_options={}, results_dir=str(tmp_path), exps_dir=str(tmp_path), trial_timeout=None)
    root = open_root_study(optuna.storages.RDBStorage(url), plan, direction="maximize")
    assert root.user_attrs == {"optuna_ds:plan": plan.fingerprint}
    fresh = optuna.storages.RDBStorage(url)  # another node's worker
    assert load_plan(fresh, "t") == plan and tuning_names(fresh) == ["t"] == tuning_study_names(fresh, "t")

    before = optuna.create_study(storage=fresh, study_name="old", direction="maximize")
    before.set_user_attr("optuna_ds:plan", dataclasses.replace(plan, study_name="old").to_dict())
    assert load_plan(fresh, "old") == dataclasses.replace(plan, study_name="old")
    open_root_study(fresh, dataclasses.replace(plan, study_name="old"), direction="maximize")


def test_a_stage_study_the_tuning_marks_while_another_of_its_processes_reads_it_is_ours(tmp_path) -> None:
    """A worker opening a stage study just as `tune` marks it reads its attrs before the mark and
    whatever it reads after it: the study is the tuning's (a worker exited 2 calling it another
    tool's when it read the attrs a second time); another tool's study is still refused."""
    from optuna_ds._errors import PlanMismatchError
    from optuna_ds.storage import claim_stage_study

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    optuna.create_study(storage=url, study_name="t-z1", direction="maximize")
    tune = optuna.load_study(study_name="t-z1", storage=url)

    class MarkedMeanwhile:
        """The worker's view of the study: `tune` marks it, then runs a trial, right after the
        worker's first read of its attrs."""

        def __init__(self) -> None:
            self._study = optuna.load_study(study_name="t-z1", storage=url)
            self.study_name, self.direction, self.reads = "t-z1", self._study.direction, 0

        @property
        def user_attrs(self) -> dict[str, Any]:
            attrs = self._study.user_attrs
            self.reads += 1
            if self.reads == 1:
                claim_stage_study(tune, "t", direction="maximize")
                tune.tell(tune.ask(), 1.0)
            return attrs

        def get_trials(self, deepcopy: bool = True) -> list[optuna.trial.FrozenTrial]:
            return self._study.get_trials(deepcopy=deepcopy)

        def set_user_attr(self, key: str, value: Any) -> None:
            self._study.set_user_attr(key, value)

    claim_stage_study(MarkedMeanwhile(), "t", direction="maximize")  # type: ignore[arg-type]
    assert tune.user_attrs == {"optuna_ds:tuning": "t"}
    other = optuna.create_study(storage=url, study_name="u-z1", direction="maximize")
    other.tell(other.ask(), 1.0)
    with pytest.raises(PlanMismatchError, match="not created by optuna-ds"):
        claim_stage_study(other, "u", direction="maximize")


def test_a_worker_opening_the_sqlite_file_tune_is_creating_waits_for_its_tables(tmp_path, monkeypatch) -> None:
    """A worker started first polls for the tuning's SQLite file; on a loaded machine it found
    the file while `tune` was still creating it (WAL mode, tables) and exited 2: "cannot open
    SQLite database ...: database is locked". It waits for the creation under way, as two
    creators do, and then opens the whole database; a database no tuning creates (a mistyped
    path beside no lock file) is opened at once and gets no lock file."""
    import fcntl

    from optuna_ds.storage import _storage
    from optuna_ds.storage import create_storage

    path = tmp_path / "optuna-ds.db"
    url = f"sqlite:///{path}"
    creating = open(f"{path}.lock", "a")  # `tune`, creating: the file is there, its tables not yet
    fcntl.flock(creating, fcntl.LOCK_EX)
    path.touch()
    waiting = threading.Event()
    real_flock = fcntl.flock

    def flock(f: Any, op: int) -> None:
        if threading.current_thread() is not threading.main_thread():
            waiting.set()
        real_flock(f, op)

    monkeypatch.setattr(_storage.fcntl, "flock", flock)
    opened: list[Any] = []
    worker = threading.Thread(target=lambda: opened.append(create_storage(url, create=False)), daemon=True)
    worker.start()
    while not waiting.is_set() and worker.is_alive():
        time.sleep(0.01)
    assert waiting.is_set() and not opened, "the worker opened the database tune was creating"
    optuna.storages.RDBStorage(url)  # tune's tables
    creating.close()  # and its lock
    worker.join(60)
    assert opened and opened[0].get_all_studies() == []
    other = tmp_path / "other.db"
    optuna.create_study(storage=f"sqlite:///{other}")
    create_storage(f"sqlite:///{other}", create=False)
    assert not (tmp_path / "other.db.lock").exists()
