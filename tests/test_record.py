"""The record of an experiment on its trial, and the metric every comparison goes through."""

from __future__ import annotations

import dataclasses
import subprocess
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from optuna_ds.config import Metric
from optuna_ds.config import parse_autotuning_config
from optuna_ds.domain import ChoiceRecord
from optuna_ds.domain import Config
from optuna_ds.domain import Offload
from optuna_ds.domain import Experiment
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import ExperimentResult
from optuna_ds.domain import FailureReason
from optuna_ds.domain import Phase
from optuna_ds.domain import RecordedResources
from optuna_ds.domain import RootRecord
from optuna_ds.domain import StageRecord
from optuna_ds.domain import given_up
from optuna_ds.planner import Status
from optuna_ds.pruners import TunerEarlyStopping
from optuna_ds.reporting._rows import experiment_rows
from optuna_ds.studies import observation_of
from optuna_ds.studies._owner import fail_orphaned_trials
from optuna_ds.studies._owner import process_identity
from optuna_ds.studies._owner import this_process
from optuna_ds.studies._results import stage_result
from optuna_ds.studies._spend import tuning_spend

_EXPERIMENT = Experiment(
    name="z1_gas2_tmbspg4", phase=Phase.MICRO_BATCH, config=Config(stage=1, micro_batch=4, accumulation=2),
    ds_config={"train_batch_size": 8, "zero_optimization": {"stage": 1}}, result_dir="/results/z1_gas2_tmbspg4",
)
_OWNER = {"host": "node1", "pid": 42, "started": "1234"}


@pytest.fixture
def study(tmp_path: Any) -> optuna.Study:
    return optuna.create_study(storage=f"sqlite:///{tmp_path}/record.db", study_name="s", direction="maximize")


def _written(record: ExperimentRecord) -> list[tuple[str, Any]]:
    writes: list[tuple[str, Any]] = []
    record.write(lambda key, value: writes.append((key, value)))
    return writes


def test_claim_writes_the_stored_keys_with_exp_name_last() -> None:
    writes = _written(ExperimentRecord.claim(_EXPERIMENT, slot="localhost:0"))
    # The keys stored tunings, the report and optuna-dashboard read: they never change.
    assert writes == [
        ("phase", "micro_batch"), ("stage", 1), ("micro_batch_size", 4), ("gradient_accumulation_steps", 2), ("train_batch_size", 8),
        ("ds_config", _EXPERIMENT.ds_config), ("result_dir", "/results/z1_gas2_tmbspg4"), ("slot", "localhost:0"),
        ("exp_name", "z1_gas2_tmbspg4"),
    ]
    # Whatever else a record holds, exp_name (the claim other processes read) comes last.
    everything = dataclasses.replace(ExperimentRecord.claim(_EXPERIMENT, slot="localhost:0"), worker=_OWNER, lost=True,
                                     recovered="why", duplicate_of=3)
    assert _written(everything)[-1][0] == "exp_name"


def test_a_successful_trial_round_trips_through_sqlite(study: optuna.Study) -> None:
    trial = study.ask()
    ExperimentRecord(worker=_OWNER).write(trial.set_user_attr)
    ExperimentRecord.claim(_EXPERIMENT, slot="localhost:0").write(trial.set_user_attr)
    ExperimentRecord(experiment_process={**_OWNER, "pid": 43}).write(trial.set_user_attr)
    result = ExperimentResult(name=_EXPERIMENT.name, returncode=0, duration=12.34567, cmd=["deepspeed", "train.py"],
                              metrics={"throughput": 50.0, "latency": 20.0}, peak_memory=2**30)
    ExperimentRecord.outcome(result).write(trial.set_user_attr)
    study.tell(trial, 50.0)

    frozen = study.get_trials()[0]
    record = ExperimentRecord.from_trial(frozen)
    assert record == ExperimentRecord(
        phase=Phase.MICRO_BATCH, config=_EXPERIMENT.config, train_batch_size=8,
        ds_config=_EXPERIMENT.ds_config, result_dir=_EXPERIMENT.result_dir, slot="localhost:0", worker=_OWNER,
        experiment_process={**_OWNER, "pid": 43}, metrics={"throughput": 50.0, "latency": 20.0},
        cmd=["deepspeed", "train.py"], duration=12.346, returncode=0, peak_gpu_memory=2**30, exp_name=_EXPERIMENT.name,
    )
    assert record.claimed and record.launched and record.reason is None
    # The planner's view of it: the score and the peak memory that places every stage's edge.
    seen = observation_of(frozen, metric=Metric.named("throughput"), dead={})
    assert seen is not None and (seen.status, seen.score, seen.config, seen.memory) == (Status.OK, 50.0, _EXPERIMENT.config, 2**30)
    # A success stores no failure fields, and nothing it does not know.
    assert set(frozen.user_attrs) == {
        "worker", "phase", "stage", "micro_batch_size", "gradient_accumulation_steps", "train_batch_size", "ds_config", "result_dir",
        "slot", "exp_name", "experiment_process", "metrics", "cmd", "duration", "returncode", "peak_gpu_memory",
    }


def test_a_running_experiment_is_seen_with_how_long_it_has_run(study: optuna.Study) -> None:
    """The planner starts no extra experiment late in a round: it needs each running one's age."""
    trial = study.ask()
    trial.suggest_int("train_micro_batch_size_per_gpu", 4, 4)
    ExperimentRecord.claim(_EXPERIMENT, slot="localhost:0").write(trial.set_user_attr)
    seen = observation_of(study.get_trials()[0], metric=Metric.named("throughput"), dead={})
    assert seen is not None and seen.status is Status.RUNNING
    assert seen.seconds is not None and 0.0 <= seen.seconds < 60.0


def test_a_failed_trial_keeps_its_reason_and_stderr(study: optuna.Study) -> None:
    trial = study.ask()
    ExperimentRecord.claim(_EXPERIMENT, slot="localhost:1").write(trial.set_user_attr)
    result = ExperimentResult(name=_EXPERIMENT.name, returncode=1, duration=3.0, cmd=["deepspeed"], reason=FailureReason.OOM,
                              detail="CUDA out of memory", stderr_tail="...\ntorch.OutOfMemoryError: CUDA out of memory")
    ExperimentRecord.outcome(result).write(trial.set_user_attr)
    study.tell(trial, state=TrialState.FAIL)

    frozen = study.get_trials()[0]
    assert (frozen.user_attrs["reason"], frozen.user_attrs["metrics"]) == ("oom", {})  # stored as plain JSON
    record = ExperimentRecord.from_trial(frozen)
    assert record.reason is FailureReason.OOM
    assert (record.detail, record.stderr_tail) == ("CUDA out of memory", "...\ntorch.OutOfMemoryError: CUDA out of memory")
    assert "peak_gpu_memory" not in frozen.user_attrs and record.peak_gpu_memory is None
    assert not record.launched and not record.lost


def test_a_trial_stored_with_literal_keys_reads_back(study: optuna.Study) -> None:
    """A trial's user attrs under their literal keys (what stored tunings and optuna-dashboard
    hold) read back as the record."""
    trial = study.ask()
    for key, value in {"phase": "knobs", "stage": 2, "micro_batch_size": 2, "gradient_accumulation_steps": 1, "offload": "offload-opt",
                       "knobs": {"overlap_comm": True}, "exp_name": "z2_gas1_tmbspg2_ocT_offload-opt",
                       "reason": "interrupted", "detail": "its process died", "lost": True, "duplicate_of": 0}.items():
        trial.set_user_attr(key, value)
    study.tell(trial, state=TrialState.FAIL)
    frozen = study.get_trials()[0]
    record = ExperimentRecord.from_trial(frozen)
    expected = Config(stage=2, micro_batch=2, offload="offload-opt", knobs={"overlap_comm": True})
    assert (record.phase, record.config, record.exp_name) == (Phase.KNOBS, expected, "z2_gas1_tmbspg2_ocT_offload-opt")
    assert (record.reason, record.lost, record.duplicate_of) == (FailureReason.INTERRUPTED, True, 0)
    study.ask()
    assert ExperimentRecord.from_trial(study.get_trials()[1]) == ExperimentRecord()  # nothing claimed yet


def _dead_process() -> dict[str, Any]:
    """The identity of a process of this host that has exited."""
    p = subprocess.Popen(["sleep", "60"])
    identity = process_identity(p.pid)
    p.kill()
    p.wait()
    return identity


def test_a_trial_killed_before_its_claim_is_lost_with_no_experiment(study: optuna.Study) -> None:
    """A worker SIGKILLed between taking a trial and claiming its experiment (issue #28) leaves a
    running trial with its ``worker`` and no ``exp_name``: reaped as lost at once, it is no
    experiment to anyone (it launched nothing): not to run again, not in the report or the counts."""
    dead = _dead_process()
    metric = Metric.named("throughput")
    done = study.ask()  # a finished experiment, so that the stage has a best
    ExperimentRecord.claim(_EXPERIMENT, slot="localhost:0").write(done.set_user_attr)
    ExperimentRecord.outcome(ExperimentResult(name=_EXPERIMENT.name, returncode=0, duration=2.0, cmd=["deepspeed"],
                                              metrics={"throughput": 50.0})).write(done.set_user_attr)
    study.tell(done, 50.0)
    other = dataclasses.replace(_EXPERIMENT, name="z1_gas1_tmbspg8", config=Config(stage=1, micro_batch=8))
    unclaimed = []
    for claimed_fields in (0, 3):  # killed before any of its claim, and (field by field) before its exp_name
        trial = study.ask()
        ExperimentRecord(worker=dead).write(trial.set_user_attr)
        trial.suggest_int("train_micro_batch_size_per_gpu", 1, 64)
        for key, value in list(ExperimentRecord.claim(other, slot="localhost:1").attrs().items())[:claimed_fields]:
            trial.set_user_attr(key, value)
        unclaimed.append(trial.number)
    claimed = study.ask()  # killed after its claim, before it launched: its experiment runs again
    ExperimentRecord(worker=dead).write(claimed.set_user_attr)
    ExperimentRecord.claim(other, slot="localhost:1").write(claimed.set_user_attr)
    alive = study.ask()  # this process's own, running
    ExperimentRecord(worker=this_process()).write(alive.set_user_attr)

    assert fail_orphaned_trials(study, metric=metric) == ([], [claimed.number], unclaimed)
    trials = study.get_trials()
    for number in unclaimed:
        t = trials[number]
        record = ExperimentRecord.from_trial(t)
        assert t.state == TrialState.FAIL and record.lost and record.reason is FailureReason.INTERRUPTED
        assert record.detail == "its process died before it claimed an experiment"
        assert not record.claimed and not record.launched and "exp_name" not in t.user_attrs
        assert observation_of(t, metric=metric, dead={}) is None
        assert not TunerEarlyStopping(1, max_trials=1)._counts(t)  # no trial of the knob search
    assert ExperimentRecord.from_trial(trials[claimed.number]).detail == "its process died before it launched its experiment"
    assert trials[alive.number].state == TrialState.RUNNING
    assert fail_orphaned_trials(study, metric=metric) == ([], [], [])  # settled once
    # Two losses before a claim are not an experiment that killed its worker twice.
    assert given_up(trials) == {}
    # What the summary, the headline, the report and `optuna-ds report` read: claimed trials only.
    result = stage_result(study, 1, metric=metric)
    # Done, and the claimed one that was lost: interrupted, so no failure of its config (it runs again).
    assert (result.num_experiments, result.num_failed) == (2, 0)
    assert result.best is not None and result.best.name == _EXPERIMENT.name
    assert result.last_failure == ""
    assert tuning_spend(trials, profile_seconds=None, gpus_per_experiment=1).experiments == 1
    rows = experiment_rows({1: study})
    assert [(r.number, r.name) for r in rows] == [(done.number, _EXPERIMENT.name), (claimed.number, "z1_gas1_tmbspg8")]


def test_a_claim_lost_before_its_launch_ran_nothing_and_is_never_given_up(study: optuna.Study) -> None:
    """A worker SIGKILLed between its claim and its launch (test_parallel's killed worker, once):
    legal, and nothing ran. Its trial is lost with the claim, the planner sees the experiment as
    not run (it decides afresh whether it runs: a knob setting it no longer wants never runs),
    and two such losses are no experiment that killed its worker twice: it is not given up, as
    one lost twice after its launch is."""
    metric = Metric.named("throughput")
    knob = dataclasses.replace(_EXPERIMENT, name="z1_gas2_tmbspg4_abs1e9", phase=Phase.KNOBS,
                               config=Config(stage=1, micro_batch=4, accumulation=2, knobs={"allgather_bucket_size": 1e9}))
    launched = dataclasses.replace(_EXPERIMENT, name="z1_gas1_tmbspg8", config=Config(stage=1, micro_batch=8))
    for experiment, started in ((knob, False), (knob, False), (launched, True), (launched, True)):
        trial = study.ask()
        ExperimentRecord(worker=_dead_process()).write(trial.set_user_attr)
        ExperimentRecord.claim(experiment, slot="localhost:0").write(trial.set_user_attr)
        if started:
            ExperimentRecord(experiment_process=_dead_process()).write(trial.set_user_attr)
        assert fail_orphaned_trials(study, metric=metric) == ([], [trial.number], [])
    trials = study.get_trials()
    before_launch = [ExperimentRecord.from_trial(t) for t in trials[:2]]
    assert all(r.lost and r.claimed and not r.launched and r.detail == "its process died before it launched its experiment"
               for r in before_launch)
    assert ExperimentRecord.from_trial(trials[2]).detail == "its process died"
    dead = given_up(trials)
    assert list(dead) == [launched.name]
    assert [observation_of(t, metric=metric, dead=dead) for t in trials[:2]] == [None, None]  # not run: the planner decides
    assert observation_of(trials[3], metric=metric, dead=dead).status is Status.FAILED


@pytest.mark.parametrize(
    ("name", "key", "maximize", "better", "worse"),
    [("throughput", "throughput", True, 20.0, 10.0), ("latency", "latency", False, 10.0, 20.0),
     ("flops", "FLOPS_per_gpu", True, 2e12, 1e12)],
)
def test_metric_compares_in_its_direction(name: str, key: str, maximize: bool, better: float, worse: float) -> None:
    metric = parse_autotuning_config({"metric": name.upper() if name == "flops" else name}).tuned_metric
    assert metric == Metric.named(name)
    assert (metric.name, metric.key, metric.maximize) == (name, key, maximize)
    assert metric.direction == ("maximize" if maximize else "minimize")
    assert metric.better(better, worse) and not metric.better(worse, better) and not metric.better(better, better)
    assert metric.oriented(better) > metric.oriented(worse)
    assert metric.best([worse, better, worse], key=float) == better
    assert metric.best([], key=float) is None
    assert metric.label.startswith(f"{name} (") and metric.unit in metric.with_unit(better)


def test_metric_best_keeps_the_first_of_equals_and_refuses_an_unknown_direction() -> None:
    metric = Metric.named("latency")
    assert metric.best([("a", 1.0), ("b", 1.0), ("c", 2.0)], key=lambda item: item[1]) == ("a", 1.0)
    with pytest.raises(ValueError, match="direction"):
        Metric(name="speed", key="speed", direction="up")


def test_the_root_record_reads_and_writes_the_keys_stored_tunings_hold(study: optuna.Study) -> None:
    """The root study's keys, as tunings store them: read back typed, and written under the
    same keys."""
    stored = {
        "resources": {"gpus_per_experiment": 2, "device_memory": 8e10, "gpu_memory": "measured by NVML", "device": "GPU"},
        "model_info": {"num_params": 1_000_000}, "profile_duration": 12.5, "profile_end": "2025-01-01T10:00:00",
        "elapsed": 300.0, "stage:z0": {"status": "skipped", "reason": "no gain", "memory": {"stage": 0}},
        "stage:z1": {"status": "tuned", "reason": "", "memory": {"stage": 1}, "max_runnable_micro_batch_size": 16, "offload": []},
        "choice": {"stage": 1, "trial": 3, "estimate": 1500.0, "config": {"stage": 1, "micro_batch_size": 16, "gradient_accumulation_steps": 1}},
        "optuna_ds:plan": "0123456789abcdef",  # the plan's mark: the storage's, not this record's
    }
    for key, value in stored.items():
        study.set_user_attr(key, value)
    root = RootRecord.from_attrs(study.user_attrs)
    assert root.resources == RecordedResources(gpus_per_experiment=2, device_memory=8e10, gpu_memory="measured by NVML", device="GPU")
    assert (root.model_info, root.profile_duration, root.profile_end, root.elapsed) == ({"num_params": 1_000_000}, 12.5,
                                                                                       "2025-01-01T10:00:00", 300.0)
    assert root.stages == {0: StageRecord(status="skipped", reason="no gain", memory={"stage": 0}),
                           1: StageRecord(status="tuned", memory={"stage": 1}, max_runnable_micro_batch_size=16, offload=())}
    assert root.choice == ChoiceRecord(stage=1, trial=3, estimate=1500.0, config=Config(stage=1, micro_batch=16))
    assert root.attrs() == {k: v for k, v in stored.items() if k != "optuna_ds:plan"}
    offloads = RootRecord.from_attrs({"stage:z3": {"status": "tuned", "offload": ["offload-opt", "offload-opt-param"]}})
    assert offloads.stages[3].offload == (Offload.OPTIMIZER, Offload.OPTIMIZER_AND_PARAMS)
    assert offloads.attrs()["stage:z3"]["offload"] == ["offload-opt", "offload-opt-param"]
    assert RootRecord.from_attrs({}) == RootRecord() and RootRecord().attrs() == {}
    assert RootRecord.from_attrs({"choice": {}}).choice is None  # a resumed tuning's, before it chooses
    # The choice holds its config: the report finds it by value, not by scanning trials for a number.
    config = Config(stage=2, micro_batch=16, offload="offload-opt", knobs={"reduce_bucket_size": 5e8})
    choice = RootRecord(choice=ChoiceRecord(stage=2, trial=7, estimate=900.0, config=config))
    study.set_user_attr("choice", choice.attrs()["choice"])
    assert RootRecord.from_attrs(study.user_attrs).choice == choice.choice


def test_a_timeout_is_final_only_under_a_timeout_no_longer_than_its_own() -> None:
    """Issue 50 row 4: a run killed at a 10 s timeout has no result under a longer one."""
    from optuna_ds.domain import is_finished_experiment
    from optuna_ds.domain import timed_out_sooner

    def timed_out(**record: object) -> optuna.trial.FrozenTrial:
        attrs = ExperimentRecord(reason=FailureReason.TIMEOUT, exp_name="z1_gas1_tmbspg4", **record).attrs()  # type: ignore[arg-type]
        return optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs=attrs)

    trial = timed_out(timeout=10.0, duration=10.2)
    assert is_finished_experiment(trial) and is_finished_experiment(trial, timeout=10.0)
    assert not timed_out_sooner(trial, timeout=10.0) and not timed_out_sooner(trial, timeout=None)
    assert timed_out_sooner(trial, timeout=30.0) and not is_finished_experiment(trial, timeout=30.0)
