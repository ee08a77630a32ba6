"""Parallel tuning: `tune` and `worker` processes sharing one storage and one node's GPUs.

Four simulated GPUs (a hostfile with `localhost slots=4`, one GPU per experiment) and the fake
launcher, which logs the start, end and GPUs of every launch. PostgreSQL tests skip with the
reason where no server is reachable, except under CI=true. Last, in-process: what two
processes' coordinators hand the planner from one storage.
"""
from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from conftest import FAKE_LAUNCHER
from conftest import LAUNCHER_OPTION
from conftest import Workspace
from conftest import assert_one_line_error
from test_storages import SERVERS
from conftest import reachable
from optuna_ds.domain import was_pruned
from optuna_ds.storage import create_storage

# A fixed micro-batch list: the experiments are then the same however many run at once (an
# adaptive search explores k sizes at a time with k slots), so the best must be the same.
CONFIG = {
    "train_micro_batch_size_per_gpu": [4, 8, 12, 16, 24, 32, 40, 48],
    # One knob of two values: the planner's knob search is the one setting it may try at each
    # of the two best sizes, so every process, alone or together, ends with the same optimum.
    "zero_optimization": {"stage": 1, "allgather_bucket_size": [5e8, 1e9], "reduce_bucket_size": 5e8},
    "autotuning": {"enabled": True, "fast": False, "max_train_micro_batch_size_per_gpu": 64, "tuner_type": "gridsearch",
                   "num_tuning_micro_batch_sizes": 2, "tuner_early_stopping": 100},
}
SURFACE = {"oom_above": {"1": 40}, "peak": 24, "duration": 1.2,
           "knob_gain": {"allgather_bucket_size": {"1000000000.0": 1.1}, "reduce_bucket_size": {"500000000.0": 1.05}}}


def _storage(kind: str, ws: Workspace) -> str:
    if kind == "sqlite":
        return ws.storage
    url, port = SERVERS["postgresql"]
    if not reachable(port):
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but no PostgreSQL server at 127.0.0.1:5432")
        pytest.skip("no PostgreSQL server at 127.0.0.1:5432")
    return url


class Cluster:
    """`tune` and workers of one tuning, with the 4-GPU hostfile and one lock folder."""

    def __init__(self, ws: Workspace, storage: str, name: str) -> None:
        self.ws, self.storage, self.name = ws, storage, name
        (ws.root / "hostfile").write_text("localhost slots=4\n")
        self.env = ws.env(SURFACE, OPTUNA_DS_LOCK_DIR=str(ws.root / "locks"))
        self.gpus = ("--hostfile", "hostfile", "--num_gpus", "1")
        self.common = ["--storage", storage, "--study-name", name]
        self._storage: optuna.storages.BaseStorage | None = None

    def _start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """The process, its output in a file (``log``) the test can read while it runs."""
        log = self.ws.root / f"{args[0]}-{len(list(self.ws.root.glob('*.log')))}.log"
        with open(log, "w") as out:
            p = subprocess.Popen([sys.executable, "-m", "optuna_ds", *args], cwd=self.ws.root, env=env or self.env,
                                 stdout=out, stderr=subprocess.STDOUT, text=True)
        p.log = log  # type: ignore[attr-defined]
        return p

    def worker(self, *gpus: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return self._start("worker", *(gpus or self.gpus), *self.common, env=env)

    def tune(self, *gpus: str) -> subprocess.Popen[str]:
        return self._start("tune", LAUNCHER_OPTION, FAKE_LAUNCHER, *(gpus or self.gpus), *self.common, "train.py", "--deepspeed_config",
                           "ds_config.json")

    def study(self) -> optuna.Study:
        # Opened as a worker opens it: Optuna's own storage creates a SQLite file that is not
        # there yet, in rollback-journal mode, and the test polling it before tune had made it
        # held it locked while tune and the worker set it up ("database is locked", exit 2).
        if self._storage is None:
            self._storage = create_storage(self.storage, create=False)
        return optuna.load_study(study_name=f"{self.name}-z1", storage=self._storage)


def _wait_until(event: Callable[[], bool], *procs: subprocess.Popen[str]) -> None:
    """Until ``event``; an error if one of ``procs`` ends first (the deadline only stops a hang),
    the others then killed."""
    deadline = time.monotonic() + 600
    while not event():
        ended = next((p for p in procs if p.poll() is not None), None)
        if ended is not None or time.monotonic() > deadline:
            for p in procs:
                p.kill()
            assert ended is not None, "hung"
            raise AssertionError(f"{ended.args[3]} ended first ({ended.returncode}): {_output(ended)}")
        time.sleep(0.1)


def _experiments(ws: Workspace) -> list[dict]:
    launches = [l for l in ws.launches() if not l.get("profile") and not l.get("training")]
    for l in launches:
        config = l["args"][l["args"].index("--deepspeed_config") + 1]
        l["name"] = Path(config).parent.name
    return launches


def _assert_no_port_shared(launches: list[dict]) -> None:
    by_port = collections.defaultdict(list)
    for l in launches:
        by_port[l["master_port"]].append((l["start"], l["end"], l["name"]))
    for port, spans in by_port.items():
        spans.sort()
        for (s1, e1, n1), (s2, e2, n2) in zip(spans, spans[1:]):
            assert s2 >= e1, f"{n1} and {n2} overlap on port {port}"


def _assert_no_gpu_shared(launches: list[dict]) -> int:
    """No two launches overlap on a GPU; returns the most launches that ran at once."""
    by_gpu = collections.defaultdict(list)
    for l in launches:
        host, ids = l["include"].split(":")
        for gpu in ids.split(","):
            by_gpu[(host, gpu)].append((l["start"], l["end"], l["name"]))
    for gpu, spans in by_gpu.items():
        spans.sort()
        for (s1, e1, n1), (s2, e2, n2) in zip(spans, spans[1:]):
            assert s2 >= e1, f"{n1} and {n2} overlap on GPU {gpu}"
    events = sorted([(l["start"], 1) for l in launches] + [(l["end"], -1) for l in launches])
    most = running = 0
    for _, delta in events:
        running += delta
        most = max(most, running)
    return most


def _config_name(trial: optuna.trial.FrozenTrial) -> str:
    # A re-measurement (``_r<k>``) is a run of the same config: on a noiseless surface it ties
    # with the first run.
    return re.sub(r"_r\d+$", "", trial.user_attrs["exp_name"])


def _measured(study: optuna.Study) -> dict[str, float]:
    """Each config that ran, by name, with its measurement."""
    return {_config_name(t): t.value for t in study.get_trials() if t.state == TrialState.COMPLETE and t.value is not None}


def _best(measured: dict[str, float], *, sizes_only: bool = False) -> str:
    """The config measured best; with ``sizes_only``, of the sizes you listed at the default knobs."""
    names = [n for n in measured if not sizes_only or re.fullmatch(r"z1_gas\d+_tmbspg\d+", n)]
    return max(names, key=measured.__getitem__)


def _single_process_runs(tmp_path: Path) -> dict[str, float]:
    (tmp_path / "single").mkdir()
    ws = Workspace(tmp_path / "single")
    ws.config(CONFIG)
    p = ws.tune(surface={**SURFACE, "duration": 0.0})
    assert p.returncode == 0, p.stderr
    return _measured(optuna.load_study(study_name="optuna-ds-z1", storage=ws.storage))


def _output(p: subprocess.Popen[str]) -> str:
    return p.log.read_text()[-2000:]  # type: ignore[attr-defined]


def _wait(procs: list[subprocess.Popen[str]]) -> None:
    """Until each of ``procs`` exits 0 (the deadline only stops a hang)."""
    deadline = time.monotonic() + 600
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("the tuning did not finish")
        assert p.returncode == 0, (p.args, _output(p))


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_tune_and_two_workers_share_the_studies_and_the_gpus(ws: Workspace, tmp_path: Path, kind: str) -> None:
    ws.config(CONFIG)
    cluster = Cluster(ws, _storage(kind, ws), f"par-{uuid.uuid4().hex[:8]}")
    # The workers take part whatever the load: tune's profile run ends once both wait for it, so
    # all three start the search together, and tune leases two of the four GPUs, the workers
    # all four (under load workers started beside tune came up, or got a GPU, when tune had run
    # the whole search).
    gate = ws.root / "profile-gate"
    cluster.env["FAKE_DS_SURFACE"] = json.dumps({**SURFACE, "profile_gate": str(gate)})
    (ws.root / "two-gpus").write_text("localhost slots=2\n")  # GPUs 0 and 1
    workers = [cluster.worker(), cluster.worker()]
    tune = cluster.tune("--hostfile", "two-gpus", "--num_gpus", "1")
    _wait_until(lambda: all("for the profile run" in w.log.read_text() for w in workers), tune, *workers)  # type: ignore[attr-defined]
    gate.touch()
    _wait([tune, *workers])

    launches = _experiments(ws)
    counts = collections.Counter(l["name"] for l in launches)
    assert counts and max(counts.values()) == 1, [n for n, c in counts.items() if c > 1]
    # Four slots shared by three processes: no GPU and no rendezvous port used by two launches
    # at once. How many ran at once is the load's (two, once, on a loaded machine).
    assert _assert_no_gpu_shared(launches) <= 4
    _assert_no_port_shared(launches)

    trials = cluster.study().get_trials()
    # A worker's experiments may all have failed (out of memory, once: the largest sizes), yet it ran them.
    owners = {t.user_attrs["worker"]["pid"] for t in trials if "experiment_process" in t.user_attrs}
    assert len(owners) >= 2, "the workers ran nothing"
    # Each launch ended its trial: run to its end, or ended early by the pruner.
    assert sum(1 for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL) or was_pruned(t)) == len(launches)
    # The search one process makes, on more slots: every size you listed measured, so the same
    # best size. Whether the knob setting pays at it is a close call (on one GPU the planner
    # expects little of a knob: 0.5% from its prior, against 0.2% to launch), made on what ran,
    # and three processes run what one does not (an offload variant, a re-measurement, on slots
    # free while others run): with an offload run out of memory and the best size measured again,
    # the planner expects the setting to pay 0.4% less and ends without it (reproduced in-process
    # in test_planner_knobs). So the shared optimum is the single one where its config ran here.
    shared, single = _measured(cluster.study()), _single_process_runs(tmp_path)
    assert {n: v for n, v in shared.items() if n in single} == {n: v for n, v in single.items() if n in shared}
    assert _best(shared, sizes_only=True) == _best(single, sizes_only=True)
    assert _best(shared) == (_best(single) if _best(single) in shared else _best(shared, sizes_only=True))
    # The tune's optimal file is the final choice, the best of what ran: its finals waited for
    # the workers' last knob runs.
    choice = optuna.load_study(study_name=cluster.name, storage=cluster.storage).user_attrs["choice"]
    chosen = next(t for t in trials if t.number == choice["trial"])
    assert _config_name(chosen) == _best(shared)
    assert json.loads((ws.results / "ds_config_optimal.json").read_text())["zero_optimization"] == \
        chosen.user_attrs["ds_config"]["zero_optimization"]
    # A worker that joins a finished tuning runs nothing and exits 0.
    late = cluster.worker()
    _wait([late])
    assert len(_experiments(ws)) == len(launches)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_sigkilled_worker_loses_nothing(ws: Workspace, kind: str) -> None:
    ws.config(CONFIG)
    cluster = Cluster(ws, _storage(kind, ws), f"kill-{uuid.uuid4().hex[:8]}")
    # The victim runs experiments whatever the load: two GPUs that tune does not use, and tune's
    # profile run ends once the victim waits for it (on a loaded machine a worker started beside
    # tune came up after tune had run the whole search: "the worker never ran an experiment").
    # Its experiments last until the kill, so the kill lands while one runs.
    gate = ws.root / "profile-gate"
    cluster.env["FAKE_DS_SURFACE"] = json.dumps({**SURFACE, "profile_gate": str(gate)})
    (ws.root / "two-gpus").write_text("localhost slots=2\n")  # GPUs 0 and 1
    victim = cluster.worker(env={**cluster.env, "FAKE_DS_SURFACE": json.dumps({**SURFACE, "duration": 600})})
    tune = cluster.tune("--hostfile", "two-gpus", "--num_gpus", "1")
    _wait_until(lambda: "for the profile run" in victim.log.read_text(), tune, victim)  # type: ignore[attr-defined]
    gate.touch()
    victim_trial = None
    # Not a size over the surface's memory: it fails at once.
    fits = SURFACE["oom_above"]["1"]

    def victim_runs() -> bool:
        nonlocal victim_trial
        try:
            trials = cluster.study().get_trials()
        except Exception:  # the storage or the study does not exist yet
            return False
        running = [t for t in trials if t.state == TrialState.RUNNING and "experiment_process" in t.user_attrs
                   and t.user_attrs["worker"]["pid"] == victim.pid and t.user_attrs.get("micro_batch_size", fits + 1) <= fits]
        victim_trial = running[0] if running else None
        return victim_trial is not None

    _wait_until(victim_runs, victim, tune)
    finished_before = {t.number: t.value for t in cluster.study().get_trials() if t.state == TrialState.COMPLETE}
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    _wait([tune])

    trials = {t.number: t for t in cluster.study().get_trials()}
    # The victim's experiment, orphaned, either was ended before it measured (its trial lost, the
    # experiment run again) or finished first (its result kept, never run again).
    lost = [t for t in trials.values() if t.state == TrialState.FAIL and t.user_attrs.get("lost")]
    recovered = [t for t in trials.values() if t.state == TrialState.COMPLETE and t.user_attrs.get("recovered")]
    assert victim_trial.number in {t.number for t in lost + recovered}
    assert all(t.user_attrs["worker"]["pid"] == victim.pid for t in lost + recovered)
    assert all(t.user_attrs["reason"] == "interrupted" for t in lost)
    # A trial the victim had taken but not yet claimed an experiment for (the kill landed between
    # the two; test_interrupts reproduces it on purpose) is lost with no experiment: it launched
    # nothing, and nothing runs again for it.
    unclaimed = [t for t in lost if "exp_name" not in t.user_attrs]
    assert all("experiment_process" not in t.user_attrs and t.user_attrs["detail"] == "its process died before it claimed an experiment"
               for t in unclaimed)
    names = {t.user_attrs["exp_name"] for t in lost if "exp_name" in t.user_attrs}
    # A lost first run of a size you listed runs again; a lost knob setting or re-measurement
    # (``_r<k>``) measured nothing, and the planner decides afresh whether one still pays.
    reruns = {name: [t for t in trials.values() if t.user_attrs.get("exp_name") == name and not t.user_attrs.get("lost")
                     and t.state in (TrialState.COMPLETE, TrialState.FAIL)] for name in names}
    for name in names:
        listed = re.fullmatch(r"z1_gas\d+_tmbspg\d+", name) is not None
        assert len(reruns[name]) == 1 if listed else len(reruns[name]) <= 1, f"the lost experiment {name} ran {len(reruns[name])} times again"
    for number, value in finished_before.items():
        assert trials[number].state == TrialState.COMPLETE and trials[number].value == value
    launches = _experiments(ws)
    counts = collections.Counter(l["name"] for l in launches)
    # Only a lost experiment ran twice, and none more. Each launch of a lost experiment is its
    # lost run or a rerun: a claim lost before its launch (the kill landed between the two, or
    # before the launcher logged) shows no launch of its own, and one the planner no longer
    # wants (a knob setting) none at all (test_record reproduces it).
    assert {n for n, c in counts.items() if c > 1} <= names and max(counts.values()) <= 2
    assert all(counts[n] - len(reruns[n]) in (0, 1) for n in names), {n: (counts[n], len(reruns[n])) for n in names}
    assert all(counts[t.user_attrs["exp_name"]] == 1 for t in recovered)
    _assert_no_gpu_shared(launches)  # the orphans kept their GPUs until they were ended


def test_worker_errors_are_one_line(ws: Workspace) -> None:
    ws.config({**CONFIG, "autotuning": {"enabled": True}})
    assert ws.tune().returncode == 0
    args = ["worker", "--storage", ws.storage]
    env = ws.env(LOCAL_SIZE="2")
    p = ws.cli(*args, "--num_gpus", "2", env=env)
    assert_one_line_error(p, "runs experiments on 1 GPU(s)", "--num_gpus")
    ws.script.unlink()
    p = ws.cli(*args, env=env)
    assert_one_line_error(p, "train.py does not exist on this node")
    p = ws.cli("worker", "--storage", "postgresql+psycopg://u:secret@127.0.0.1:1/db", env=env)
    assert_one_line_error(p, "127.0.0.1:1")
    assert "secret" not in p.stderr


def _knob_study(runs: list[tuple[dict, int, float]]) -> tuple[Any, Any]:
    """A stage-1 study of micro-batch 8 holding ``runs`` (knobs, repeat, value), and its knob space."""
    from optuna_ds.domain import Config
    from optuna_ds.domain import ExperimentRecord
    from optuna_ds.domain import Phase
    from optuna_ds.space import KnobSpace

    space = KnobSpace(stage=1, tuned={"overlap_comm": [True, False], "reduce_bucket_size": [5e7, 5e8]}, fixed={})
    study = optuna.create_study(study_name="t-z1", direction="maximize")
    for knobs, repeat, value in runs:
        trial = study.ask()
        ExperimentRecord(phase=Phase.KNOBS if knobs else Phase.MICRO_BATCH, config=Config(stage=1, micro_batch=8, knobs=knobs),
                         repeat=repeat or None, exp_name=f"z1_gas1_tmbspg8_{len(study.trials)}").write(trial.set_user_attr)
        study.tell(trial, value)
    return study, space


def _knob_coordinator(study: Any, space: Any, *, early_stopping: int, num_trials: int) -> Any:
    """A process's coordinator of ``study``, in-process: no pool, no launch."""
    import threading
    from types import SimpleNamespace

    from optuna_ds.config import Metric
    from optuna_ds.planner import Arm
    from optuna_ds.planner import Problem
    from optuna_ds.space import knob_defaults
    from optuna_ds.studies import _coordinator
    from optuna_ds.studies._knob_search import KnobCandidates

    ctx = SimpleNamespace(pool=None, stop=threading.Event(), metric=Metric.named("throughput"), fast=False, early_stopping=early_stopping,
                          num_trials=num_trials, tuner_type="gridsearch", memory_limit=None, timeout=None,
                          observer=SimpleNamespace(log=lambda *a: None, plan=lambda *a, **k: None))
    arm = Arm(stage=1, free=60e9, cap=64, buffers=1e9, knobs=tuple((k, tuple(v)) for k, v in sorted(space.tuned.items())),
              knob_defaults=tuple(sorted(knob_defaults(space).items())))
    knobs = KnobCandidates(ctx=ctx, spaces={1: space}, buffers=lambda stage, offload, knobs: 1e9)  # type: ignore[arg-type]
    return _coordinator.Coordinator(problem=Problem(arms=(arm,), device_memory=80e9, sizes=(8,), gpus=1), knobs=knobs,
                                    stages={1: SimpleNamespace(study=study)}, ctx=ctx, root=study)  # type: ignore[arg-type]


def _handed_knob_settings(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The knob settings each coordinator's decision hands the planner, in order."""
    from optuna_ds.planner import Decision
    from optuna_ds.planner import plan as real_plan
    from optuna_ds.studies import _coordinator

    handed: list[dict] = []

    def plan(*args: Any, knob_candidates: dict, **kwargs: Any) -> Decision:
        handed.append(knob_candidates)
        return real_plan(*args, knob_candidates=knob_candidates, **kwargs)

    monkeypatch.setattr(_coordinator, "plan", plan)
    return handed


def test_two_processes_given_one_storage_hand_the_planner_the_same_knob_settings(monkeypatch) -> None:
    """In-process, two processes' coordinators on one stage study. The knob search's early
    stopping counts a gain within one run's noise as none; each process took that noise from
    its own last decision, so one that had decided before (the noise measured, 1.4%) saw the
    search over while a fresh one (no noise yet) did not, and the two planned from the same
    trials with different knob settings. The noise is the storage's."""
    study, space = _knob_study([({}, 0, 100.0), ({}, 1, 102.0),  # the default knobs, and again: the noise
                                ({"overlap_comm": True, "reduce_bucket_size": 5e8}, 0, 103.0),  # 1% better: within the noise, or not
                                ({"overlap_comm": False, "reduce_bucket_size": 5e7}, 0, 102.5)])
    handed = _handed_knob_settings(monkeypatch)
    earlier, fresh = (_knob_coordinator(study, space, early_stopping=2, num_trials=50) for _ in range(2))
    earlier._decide()  # its decision before: the noise measured
    handed.clear()
    decisions = [earlier._decide(), fresh._decide()]
    assert handed[0] == handed[1] and handed[0] == {}, handed  # the search is over for both: 1% is within the noise
    assert decisions[0] == decisions[1]


def test_knob_settings_handed_to_slots_count_against_tuner_num_trials(monkeypatch) -> None:
    """In-process: a decider that queued knob settings not yet claimed (no slot took them yet)
    stops offering knob settings once those and the stored trials reach ``tuner_num_trials``;
    four slots asking at once would otherwise start three trials beyond it."""
    from optuna_ds.domain import Config
    from optuna_ds.planner import Proposal
    from optuna_ds.studies._handout import hand_out

    study, space = _knob_study([({}, 0, 100.0), ({"overlap_comm": True, "reduce_bucket_size": 5e8}, 0, 110.0)])
    coordinator = _knob_coordinator(study, space, early_stopping=100, num_trials=2)
    handed = _handed_knob_settings(monkeypatch)
    coordinator._decide()
    assert handed[-1], "one knob trial of two: the search goes on"
    # A size at the default knobs queued for a slot is no knob trial; a knob setting is the second.
    hand_out(study, Proposal(config=Config(stage=1, micro_batch=16)), order=1, by={})
    coordinator._decide()
    assert handed[-1]
    hand_out(study, Proposal(config=Config(stage=1, micro_batch=8, knobs={"overlap_comm": False, "reduce_bucket_size": 5e7})),
             order=2, by={})
    coordinator._decide()
    assert handed[-1] == {}


def test_a_worker_names_tunes_choice_never_its_own(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that ends before tune has chosen (tune still measuring its choice alike) saw
    other results than tune's last: it names tune's choice, stored on the root study, or none."""
    import dataclasses

    from optuna_ds.studies import Tuning

    ws.config({**CONFIG, "autotuning": {"enabled": True}})
    assert ws.tune(surface=SURFACE).returncode == 0
    root = optuna.load_study(study_name="optuna-ds", storage=ws.storage)
    chosen = next(s.user_attrs["optimum"] for s in optuna.get_all_study_summaries(ws.storage) if "optimum" in s.user_attrs)
    run = Tuning.run

    def its_own_view(self: Tuning) -> Any:
        result = run(self)
        return dataclasses.replace(result, best=dataclasses.replace(result.best, name="z1_its_own_optimum", runs=(1e9,)))

    monkeypatch.setattr(Tuning, "run", its_own_view)
    args = ("worker", "--storage", ws.storage, LAUNCHER_OPTION, FAKE_LAUNCHER)
    done = ws.cli(*args, surface=SURFACE)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last == f"tuning 'optuna-ds' is done: optimum {chosen['exp_name']} {chosen['figure']} (tune's choice)", last
    from optuna_ds.domain import RootRecord

    RootRecord.reopen_choice(root.set_user_attr)  # tune's search open again, its choice not yet made
    done = ws.cli(*args, surface=SURFACE)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last == f"tuning 'optuna-ds' is done; tune chooses its optimum and writes it to {ws.results}", last
