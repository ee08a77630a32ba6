"""The per-process coordinator in-process, with stand-in stages: one decider for every slot of
every process, the experiments handed out through the storage, and what it does with the
planner's proposals when an experiment does not launch."""
from __future__ import annotations

import collections
import socket
import subprocess
import sys
import threading
from types import SimpleNamespace
from typing import Any

import optuna
import pytest

from optuna_ds.config import Metric
from optuna_ds.domain import Config
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import Phase
from optuna_ds.planner import Arm
from optuna_ds.planner import Problem
from optuna_ds.studies._coordinator import Coordinator
from optuna_ds.studies._coordinator import PlannerLoop
from optuna_ds.studies._decider import Peers
from optuna_ds.studies._owner import this_process


class _Pool:
    size = 1

    def try_acquire(self) -> object | None:
        return object()

    def acquire(self, stop: threading.Event, **_: Any) -> object | None:
        return None if stop.is_set() else object()

    def release(self, lease: object) -> None:
        pass


class _Stage:
    """A stage whose every experiment stands down: its trial is pruned, nothing measured."""

    def __init__(self) -> None:
        self.study = optuna.create_study(direction="maximize")
        self.asked: list[Config] = []

    def reap(self) -> None:
        pass

    def run(self, config: Config, lease: object, *, trial: optuna.Trial, **_: Any) -> bool:
        self.asked.append(config)
        self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return False


def test_a_proposal_that_never_launches_ends_the_tuning_in_one_line_at_its_second_ask() -> None:
    """The planner is a pure function of the storage: a proposal that launched nothing and left
    the storage as it was comes back for ever (the knob search's bracket, pruned each time, did)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stage = _Stage()
    lines: list[str] = []
    observer = SimpleNamespace(log=lines.append, detail=lines.append, plan=lambda *a, **k: None)
    ctx = SimpleNamespace(pool=_Pool(), stop=threading.Event(), observer=observer, ending_tune=lambda: None,
                          metric=Metric(name="throughput", key="throughput", direction="maximize"), timeout=None,
                          memory_limit=None)
    problem = Problem(arms=(Arm(stage=1, free=60e9, cap=64),), device_memory=80e9)
    coordinator = Coordinator(problem=problem, stages={1: stage}, ctx=ctx, root=None)  # type: ignore[arg-type]
    with pytest.raises(PlannerLoop) as raised:
        coordinator.run()
    assert len(stage.asked) == 1
    message = str(raised.value)
    assert "\n" not in message and stage.asked[0].name in message and "twice" in message
    assert PlannerLoop.exit_code != 0


_METRIC = Metric(name="throughput", key="throughput", direction="maximize")


def _speed(config: Config) -> float:
    """A stage whose throughput grows with the micro-batch size up to 24, then falls."""
    m = config.micro_batch
    return 100.0 * m / (m + 4.0) * (1.0 if m <= 24 else 24.0 / m)


class _MeasuringStage:
    """A stage study whose experiments run at once, each on the trial its slot took from the
    queue, claimed and measured as a real one is (``ran``: by this process)."""

    def __init__(self, study: optuna.Study | None = None, *, before: threading.Event | None = None,
                 ran_one: threading.Event | None = None) -> None:
        self.study = study or optuna.create_study(direction="maximize")
        self.ran: list[Config] = []
        self._before, self._ran_one = before, ran_one  # waited for before a run; set after one

    def reap(self) -> None:
        pass

    def run(self, config: Config, lease: object, *, trial: optuna.Trial, repeat: int = 0, **_: Any) -> bool:
        self.ran.append(config)
        ExperimentRecord(worker=this_process(), phase=Phase.MICRO_BATCH, config=config, repeat=repeat or None,
                         exp_name=config.run_name(repeat)).write(trial.set_user_attr)
        if self._before is not None:
            assert self._before.wait(30)
        self.study.tell(trial, _speed(config))
        if self._ran_one is not None:
            self._ran_one.set()
        return True


class _Slots(_Pool):
    def __init__(self, size: int) -> None:
        self.size = size


def _coordinator(stage: _MeasuringStage, lines: list[str], ending: dict[str, Any] | None = None, *, slots: int = 1,
                 peers: Peers | None = None) -> Coordinator:
    observer = SimpleNamespace(log=lines.append, detail=lines.append, plan=lambda *a, **k: None)
    ctx = SimpleNamespace(pool=_Slots(slots), stop=threading.Event(), observer=observer, metric=_METRIC,
                          ending_tune=lambda: ending, memory_limit=None, timeout=None)
    problem = Problem(arms=(Arm(stage=1, free=60e9, cap=64),), device_memory=80e9)
    return Coordinator(problem=problem, stages={1: stage}, ctx=ctx, root=None, peers=peers)  # type: ignore[arg-type]


def _spy_plan(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(free slots, proposals) of every decision."""
    from optuna_ds.studies import _coordinator

    calls: list[tuple[int, int]] = []
    real = _coordinator.plan

    def plan(*args: Any, free_slots: int = 1, **kwargs: Any) -> Any:
        decision = real(*args, free_slots=free_slots, **kwargs)
        calls.append((free_slots, len(decision.proposals)))
        return decision

    monkeypatch.setattr(_coordinator, "plan", plan)
    return calls


def test_one_decision_fills_every_free_slot_and_no_experiment_runs_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    calls = _spy_plan(monkeypatch)
    stage, lines = _MeasuringStage(), []
    coordinator = _coordinator(stage, lines, slots=4)
    coordinator.run()
    assert calls[0][0] == 4 and calls[0][1] >= 2  # the first decision is for all four slots
    runs = [(c, n) for c, n in collections.Counter(stage.ran).items() if n > 1]
    trials = stage.study.get_trials()
    repeats = {(ExperimentRecord.from_trial(t).config, ExperimentRecord.from_trial(t).repeat) for t in trials}
    assert len(repeats) == len(trials) == len(stage.ran)  # each (config, run) once
    assert all(n <= 1 + len([t for t in trials if ExperimentRecord.from_trial(t).repeat]) for _, n in runs)
    assert coordinator.decision is not None and coordinator.decision.done
    assert not [t for t in trials if t.state != optuna.trial.TrialState.COMPLETE]


def _peers(study: optuna.Study, *, host: str, slots: int, lead: bool) -> Peers:
    return Peers(study, slots=slots, lead=lead, me={"host": host, "pid": 1, "started": "1"})


def test_a_follower_runs_what_the_decider_queued_and_the_decider_counts_its_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """tune (2 slots) and a worker (2 slots) on one storage: the worker never decides, its
    slots run queued experiments, and tune's decisions are for the four slots of both."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    calls = _spy_plan(monkeypatch)
    storage = optuna.storages.InMemoryStorage()
    root = optuna.create_study(storage=storage, study_name="root")
    shared = optuna.create_study(storage=storage, study_name="z1", direction="maximize")
    follower_peers = _peers(root, host="node-b", slots=2, lead=False)
    follower_peers.beat()  # the worker is there before tune decides
    lines: list[str] = []
    worker_ran = threading.Event()  # tune's slots hold their first experiments until the worker ran one
    tune = _coordinator(_MeasuringStage(shared, before=worker_ran), lines, slots=2,
                        peers=_peers(root, host="node-a", slots=2, lead=True))
    worker_stage = _MeasuringStage(optuna.load_study(storage=storage, study_name="z1"), ran_one=worker_ran)
    worker = _coordinator(worker_stage, lines, slots=2, peers=follower_peers)
    thread = threading.Thread(target=worker.run)
    thread.start()
    tune.run()
    thread.join()
    assert worker.decision is None and worker_stage.ran  # it decided nothing, and ran what it was handed
    assert calls[0][0] == 4
    trials = shared.get_trials()
    names = [ExperimentRecord.from_trial(t).config.run_name(ExperimentRecord.from_trial(t).repeat or 0) for t in trials]
    assert len(set(names)) == len(names) and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)


def test_a_worker_takes_the_decision_only_from_a_decider_that_is_gone() -> None:
    storage = optuna.storages.InMemoryStorage()
    root = optuna.create_study(storage=storage, study_name="root")
    tune = _peers(root, host="node-a", slots=2, lead=True)
    assert tune.look().deciding
    tune.beat()
    worker = _peers(root, host="node-b", slots=2, lead=False)
    first = worker.look()
    assert not first.deciding and first.slots == 4 and first.holder is not None and first.holder["host"] == "node-a"
    tune.leave()  # tune ended (interrupted): its decision passes at once, its slots count no more
    taken = worker.look()
    assert taken.deciding and taken.slots == 2
    assert not tune.look().deciding  # a tune that comes back follows the worker


def test_a_dead_decider_of_this_host_is_replaced_at_once() -> None:
    storage = optuna.storages.InMemoryStorage()
    root = optuna.create_study(storage=storage, study_name="root")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead_tune = Peers(root, slots=1, lead=True, me={"host": socket.gethostname(), "pid": gone.pid, "started": "1"})
    assert dead_tune.look().deciding
    worker = _peers(root, host="node-b", slots=1, lead=False)
    assert worker.look().deciding


def test_a_workers_search_ends_once_tune_is_ending_the_tuning() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.InMemoryStorage()
    root = optuna.create_study(storage=storage, study_name="root")
    _peers(root, host="node-a", slots=1, lead=True).look()  # tune holds the decision
    stage, lines = _MeasuringStage(), []
    _coordinator(stage, lines, ending={"host": "node-a", "pid": 4242, "started": "1"},
                 peers=_peers(root, host="node-b", slots=1, lead=False)).run()
    assert stage.ran == []
    assert any("tune (process 4242 on node-a) is ending the tuning: this worker launches nothing more" in line for line in lines)
    stage, lines = _MeasuringStage(), []
    _coordinator(stage, lines).run()
    assert stage.ran  # the same search without the end runs


def test_a_workers_claim_once_tune_is_ending_the_tuning_stands_down_unlaunched(tmp_path: Any) -> None:
    """The other order of the race: the worker decided before tune published its end, and
    claims after. The claim is checked once published, so it stands down: nothing launches,
    and its trial is a pruned one that says who ended the tuning."""
    from optuna_ds.space import build_knob_space
    from optuna_ds.studies._experiments import StageExperiments
    from optuna_ds.studies._experiments import stage_distributions

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tune = {"host": "node-a", "pid": 4242, "started": "1"}
    config = Config(stage=1, micro_batch=8)
    experiment = SimpleNamespace(name=config.run_name(0), phase=Phase.MICRO_BATCH, config=config, ds_config={"train_batch_size": 8},
                                 result_dir=str(tmp_path / config.run_name(0)))

    class _Runner:
        def run(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("a claim made once tune is ending the tuning launched")

    lines: list[str] = []
    observer = SimpleNamespace(log=lines.append, detail=lines.append, decided=lambda **k: None, started=lambda **k: None)
    ctx = SimpleNamespace(storage=optuna.storages.InMemoryStorage(), metric=_METRIC, observer=observer, stop=threading.Event(),
                          builder=SimpleNamespace(build=lambda *a, **k: experiment), runner=_Runner(), timeout=None,
                          ending_tune=lambda: tune)
    space = build_knob_space(1, {}, fast=True)
    stage = StageExperiments(ctx=ctx, tuning="t", stage=1, space=space,  # type: ignore[arg-type]
                             distributions=stage_distributions(mbs_high=64, gas_high=1, offloads=[""], space=space))
    lease = SimpleNamespace(slot=SimpleNamespace(include="localhost:0"), index=0, fds=())
    assert stage.run(config, lease, free_since=0.0) is False  # type: ignore[arg-type]
    (trial,) = stage.study.get_trials()
    assert trial.state == optuna.trial.TrialState.PRUNED
    record = ExperimentRecord.from_trial(trial)
    assert record.ended_by == tune and record.claimed and not record.launched


def test_a_worker_waits_for_a_live_tune_to_take_the_decision() -> None:
    """Started first, a worker does not decide while tune, registered, has not reached its
    search: two deciders at once would hand out one experiment twice."""
    storage = optuna.storages.InMemoryStorage()
    root = optuna.create_study(storage=storage, study_name="root")
    tune = _peers(root, host="node-a", slots=2, lead=True)
    tune.beat()  # registered as the tuning opened; the profile run under way
    worker = _peers(root, host="node-b", slots=2, lead=False)
    worker._started -= 3600  # long past the grace a missing decider gets
    assert not worker.look().deciding
    tune.leave()  # tune gone before its search: the worker decides
    assert worker.look().deciding


def _first_run_claimed(monkeypatch: pytest.MonkeyPatch) -> tuple[list[list[Any]], _MeasuringStage, Config, Any]:
    """A stage whose planner records what it sees (``seen``), and the trial of its config's
    first run, asked: the setting of the queued re-measurement tests."""
    from optuna_ds.studies import _coordinator as module

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seen: list[list[Any]] = []
    real = module.plan
    monkeypatch.setattr(module, "plan", lambda problem, observations, **k: (
        seen.append(list(observations)), real(problem, observations, **k))[1])
    stage = _MeasuringStage()
    return seen, stage, Config(stage=1, micro_batch=8), stage.study.ask()


def test_a_queued_re_measurement_counts_as_under_way_beside_its_running_first_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A config's first run claimed and running, its second queued: the planner sees both under
    way (it proposed the second again, and the decider stopped on a false planner loop)."""
    from optuna_ds.planner import Proposal
    from optuna_ds.studies._handout import hand_out

    seen, stage, config, first = _first_run_claimed(monkeypatch)
    ExperimentRecord(worker=this_process(), phase=Phase.MICRO_BATCH, config=config,
                     exp_name=config.run_name(0)).write(first.set_user_attr)
    hand_out(stage.study, Proposal(config=config, repeat=1, why="measure again"), order=1, by={})
    _coordinator(stage, [])._decide(1)
    under_way = sorted(o.repeat for o in seen[0] if o.config == config)
    assert under_way == [0, 1]


def test_processes_sharing_a_machines_gpus_count_them_once() -> None:
    """Two tunings' processes on one machine, two GPUs each and the same two: the decider plans
    for two experiments at once, not four (it widened the batch with runs nothing needed); a
    process of another host adds its own."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    root = optuna.create_study()
    gpus = ("localhost:0", "localhost:1")
    me = Peers(root, slots=2, lead=True, me={"host": "a", "pid": 1, "started": "1"}, gpus=gpus)
    same = Peers(root, slots=2, lead=False, me={"host": "a", "pid": 2, "started": "1"}, gpus=gpus)
    same.beat()
    assert me.look().slots == 2
    Peers(root, slots=2, lead=False, me={"host": "b", "pid": 1, "started": "1"}, gpus=gpus).beat()
    assert me.look().slots == 4


def test_a_workers_free_slots_get_experiments_though_the_deciders_are_free_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decider's slots hear of a queued trial first and free first (here at once): they
    took every experiment, and a worker's free slots ran nothing under load. Each proposal goes
    to a process's free slot, the one free longest first, and only that process takes it."""
    from optuna_ds.studies._handout import HANDED

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.InMemoryStorage()
    root = optuna.create_study(storage=storage, study_name="root")
    shared = optuna.create_study(storage=storage, study_name="z1", direction="maximize")
    worker_peers = _peers(root, host="node-b", slots=2, lead=False)
    worker_peers.beat()  # the worker is there before tune decides
    tune_peers = _peers(root, host="node-a", slots=2, lead=True)
    tune_stage, worker_stage = _MeasuringStage(shared), _MeasuringStage(optuna.load_study(storage=storage, study_name="z1"))
    tune = _coordinator(tune_stage, [], slots=2, peers=tune_peers)
    worker = _coordinator(worker_stage, [], slots=2, peers=worker_peers)
    thread = threading.Thread(target=worker.run)
    thread.start()
    tune.run()
    thread.join()
    trials = shared.get_trials()
    to = {t.number: t.user_attrs[HANDED]["to"] for t in trials}
    assert set(to.values()) <= {tune_peers.key, worker_peers.key}
    # The first decision (four free slots, two proposals at least): the slots freed together,
    # another process's first, the worker's two.
    first = sorted(trials, key=lambda t: t.number)[:2]
    assert [to[t.number] for t in first] == [worker_peers.key] * 2
    # Each process ran what was handed to it, and only that.
    for_worker = [t for t in trials if to[t.number] == worker_peers.key]
    assert sorted(c.run_name(0) for c in worker_stage.ran) == sorted(
        ExperimentRecord.from_trial(t).config.run_name(0) for t in for_worker)
    assert len(worker_stage.ran) == len(for_worker) >= 1 and len(tune_stage.ran) == len(trials) - len(for_worker)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)


def test_a_queued_re_measurement_claimed_while_the_decider_reads_is_never_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot claims a queued run between the decider's reads of the storage: read first for
    the claimed trials (not claimed yet), then for the queued ones (claimed by then), the run
    was in neither, and the planner proposed it again ("proposed z1_gas1_tmbspg8_r1 twice")."""
    from optuna_ds.planner import Proposal
    from optuna_ds.studies._handout import hand_out

    seen, stage, config, first = _first_run_claimed(monkeypatch)
    ExperimentRecord(worker=this_process(), phase=Phase.MICRO_BATCH, config=config, exp_name=config.run_name(0)).write(first.set_user_attr)
    stage.study.tell(first, _speed(config))
    hand_out(stage.study, Proposal(config=config, repeat=1, why="measure again"), order=1, by={})
    queued = stage.study.get_trials()[-1]
    reads = stage.study.get_trials

    def read_then_claim(*args: Any, **kwargs: Any) -> Any:
        trials = reads(*args, **kwargs)
        if queued.number in {t.number for t in trials if t.state == optuna.trial.TrialState.WAITING}:
            # A slot of another process takes and claims it right after this read.
            stage.study._storage.set_trial_state_values(queued._trial_id, state=optuna.trial.TrialState.RUNNING)
            ExperimentRecord(worker=this_process(), phase=Phase.MICRO_BATCH, config=config, repeat=1,
                             exp_name=config.run_name(1)).write(
                lambda k, v: stage.study._storage.set_trial_user_attr(queued._trial_id, k, v))
        return trials

    monkeypatch.setattr(stage.study, "get_trials", read_then_claim)
    _coordinator(stage, [])._decide(1)
    assert sorted(o.repeat for o in seen[0] if o.config == config) == [0, 1]


def test_what_was_handed_to_a_process_that_left_is_anyones() -> None:
    from optuna_ds.planner import Proposal
    from optuna_ds.studies._handout import hand_out

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.InMemoryStorage()
    root = optuna.create_study(storage=storage, study_name="root")
    stage = _MeasuringStage(optuna.create_study(storage=storage, study_name="z1", direction="maximize"))
    left = _peers(root, host="node-b", slots=1, lead=False)
    left.beat()
    config = Config(stage=1, micro_batch=12)
    hand_out(stage.study, Proposal(config=config, why="handed to node-b"), order=1, by={}, to=left.key)
    left.leave()  # ended before it took it
    _coordinator(stage, [], peers=_peers(root, host="node-a", slots=1, lead=True)).run()
    assert config in stage.ran
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in stage.study.get_trials())
