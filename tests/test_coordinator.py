"""The per-process coordinator in-process, with stand-in stages: what it does with the planner's
proposals when an experiment does not launch."""
from __future__ import annotations

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
    """A stage whose every experiment stands down: nothing reaches its study."""

    def __init__(self) -> None:
        self.study = optuna.create_study(direction="maximize")
        self.asked: list[Config] = []

    def reap(self) -> None:
        pass

    def run(self, config: Config, lease: object, **_: Any) -> bool:
        self.asked.append(config)
        return False


def test_a_proposal_that_never_launches_ends_the_tuning_in_one_line_at_its_second_ask() -> None:
    """The planner is a pure function of the storage: a proposal that launched nothing and left
    the storage as it was comes back for ever (the knob search's bracket, pruned each time, did)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stage = _Stage()
    lines: list[str] = []
    observer = SimpleNamespace(log=lines.append, detail=lines.append, plan=lambda *a, **k: None)
    ctx = SimpleNamespace(pool=_Pool(), stop=threading.Event(), observer=observer, ending_tune=lambda: None,
                          metric=Metric(name="throughput", key="throughput", direction="maximize"), timeout=None)
    problem = Problem(arms=(Arm(stage=1, free=60e9, cap=64),), device_memory=80e9)
    coordinator = Coordinator(problem=problem, stages={1: stage}, ctx=ctx, root=None)  # type: ignore[arg-type]
    with pytest.raises(PlannerLoop) as raised:
        coordinator.run()
    assert len(stage.asked) == 2 and stage.asked[0] == stage.asked[1]
    message = str(raised.value)
    assert "\n" not in message and stage.asked[0].name in message and "twice" in message
    assert PlannerLoop.exit_code != 0


_METRIC = Metric(name="throughput", key="throughput", direction="maximize")


def _speed(config: Config) -> float:
    """A stage whose throughput grows with the micro-batch size up to 24, then falls."""
    m = config.micro_batch
    return 100.0 * m / (m + 4.0) * (1.0 if m <= 24 else 24.0 / m)


class _MeasuringStage:
    """A stage study whose experiments run at once, each a trial claimed and measured as a real
    one is, by this process (``ran``); another process's claim is :meth:`claim`."""

    def __init__(self) -> None:
        self.study = optuna.create_study(direction="maximize")
        self.ran: list[Config] = []

    def reap(self) -> None:
        pass

    def claim(self, config: Config, *, repeat: int = 0) -> optuna.Trial:
        trial = self.study.ask()
        ExperimentRecord(worker=this_process(), phase=Phase.MICRO_BATCH, config=config, repeat=repeat or None,
                         exp_name=config.run_name(repeat)).write(trial.set_user_attr)
        return trial

    def run(self, config: Config, lease: object, *, repeat: int = 0, **_: Any) -> bool:
        self.ran.append(config)
        self.study.tell(self.claim(config, repeat=repeat), _speed(config))
        return True


def _coordinator(stage: _MeasuringStage, lines: list[str], ending: dict[str, Any] | None = None) -> Coordinator:
    observer = SimpleNamespace(log=lines.append, detail=lines.append, plan=lambda *a, **k: None)
    ctx = SimpleNamespace(pool=_Pool(), stop=threading.Event(), observer=observer, metric=_METRIC, ending_tune=lambda: ending,
                          memory_limit=None, timeout=None)
    problem = Problem(arms=(Arm(stage=1, free=60e9, cap=64),), device_memory=80e9)
    return Coordinator(problem=problem, stages={1: stage}, ctx=ctx, root=None)  # type: ignore[arg-type]


def test_tune_ending_the_tuning_waits_for_a_workers_experiment_claimed_after_its_planner_was_done() -> None:
    """The race of issue 38, in order: a worker, which decided on the storage a moment earlier,
    claims an experiment just as tune's planner says it is done; tune then ends the tuning.
    Tune's choice (its files) must count that experiment: it was claimed before the end was
    published, so tune waits for it (it once wrote no choice, or one without it)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stage, lines = _MeasuringStage(), []
    late = Config(stage=1, micro_batch=61)  # a size this search does not run; measured best
    claimed: list[optuna.Trial] = []
    tune = _coordinator(stage, lines)

    def log(line: str) -> None:
        lines.append(line)
        if line.startswith("the planner stopped") and not claimed:
            claimed.append(stage.claim(late))  # the worker's claim lands as tune's planner stops

    tune._log = log
    tune.run()
    assert claimed and late not in stage.ran
    assert tune.decision is not None and tune.decision.done  # the decision that ended the search
    before = tune.decision.choice
    assert before is not None and before.config != late
    published = threading.Event()

    def worker_finishes() -> None:
        published.wait()  # measured after tune's end is published: tune must not have decided yet
        stage.study.tell(claimed[0], 1000.0)

    finishing = threading.Thread(target=worker_finishes)
    finishing.start()
    tune.end(published.set)
    finishing.join()
    assert tune.decision is not None and tune.decision.done
    assert tune.decision.choice is not None and tune.decision.choice.config == late


def test_a_workers_search_ends_once_tune_is_ending_the_tuning() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stage, lines = _MeasuringStage(), []
    _coordinator(stage, lines, ending={"host": "node-a", "pid": 4242, "started": "1"}).run()
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
