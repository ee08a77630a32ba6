"""The live pruner (issue 49, item 4): a run's steps reported as they are logged, and the run
ended early where it is clearly below the incumbent; never during its warm-up, never the user's
config, never a re-measurement (docs/steps.md, "Pruned runs")."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import optuna
import pytest

from optuna_ds.config import Metric
from optuna_ds.domain import Config
from optuna_ds.domain import Experiment
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import FailureReason
from optuna_ds.domain import Phase
from optuna_ds.launcher import CommandBuilder
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import Resources
from optuna_ds.studies._incumbent import IncumbentPruner
from optuna_ds.studies._pruning import LiveReport
from optuna_ds.studies._pruning import live_judge

import product

FAKE_LAUNCHER = str(Path(__file__).resolve().parent.parent / "benchmarks" / "fake_deepspeed.py")
THROUGHPUT = Metric.named("throughput")
BATCH = 8


def _experiment(tmp_path: Path, mbs: int, *, window: tuple[int, int] = (3, 5)) -> Experiment:
    result_dir = str(tmp_path / "results" / f"z1_gas1_tmbspg{mbs}")
    config = {"train_micro_batch_size_per_gpu": mbs, "gradient_accumulation_steps": 1, "train_batch_size": mbs,
              "zero_optimization": {"stage": 1},
              "autotuning": {"enabled": True, "metric_path": f"{result_dir}/metrics.json", "start_profile_step": window[0],
                             "end_profile_step": window[1]}}
    return Experiment(name=f"z1_gas1_tmbspg{mbs}", phase=Phase.MICRO_BATCH, config=Config(stage=1, micro_batch=mbs),
                      ds_config=config, result_dir=result_dir)


def _line(samples_per_s: float) -> dict[str, float]:
    """A logged step of ``BATCH`` samples at ``samples_per_s`` (its timers summing to its time)."""
    ms = BATCH * 1000.0 / samples_per_s
    return {"fwd": ms / 4, "bwd": ms / 2, "step": ms / 4}


def _study_with_incumbent(tmp_path: Path, figure: float = 1000.0, *, repeated: bool = False) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    study.pruner = IncumbentPruner()
    for k in range(2 if repeated else 1):
        trial = study.ask()
        ExperimentRecord.claim(_experiment(tmp_path, 16), slot="localhost:0", repeat=k).write(trial.set_user_attr)
        study.tell(trial, figure * (1 + 0.01 * k))
    return study


def _running(study: optuna.Study, experiment: Experiment, *, repeat: int = 0) -> optuna.Trial:
    trial = study.ask()
    ExperimentRecord.claim(experiment, slot="localhost:0", repeat=repeat).write(trial.set_user_attr)
    return trial


def test_a_run_clearly_below_the_incumbent_is_pruned_once_two_profiled_steps_are_logged(tmp_path: Path) -> None:
    study = _study_with_incumbent(tmp_path)
    experiment = _experiment(tmp_path, BATCH)  # one rank, no accumulation: its batch is BATCH
    trial = _running(study, experiment)
    report = LiveReport()
    judge = live_judge(trial, experiment, metric=THROUGHPUT, report=report, protected=False)
    assert judge is not None
    slow = [_line(300.0)] * 5
    # Steps 1-2 are before the window (the warm-up DeepSpeed's window skips): not reported, not judged.
    assert judge(slow[:2]) is None and report.figures == {}
    # One profiled step judges nothing; two do.
    assert judge(slow[:3]) is None and report.figures == {3: pytest.approx(300.0)}
    why = judge(slow[:4])
    assert why is not None and "pruned after 2 profiled step(s)" in why
    assert report.verdict is not None and report.verdict.figure == pytest.approx(300.0) and report.verdict.incumbent == pytest.approx(1000.0)
    assert study.trials[-1].intermediate_values == {3: pytest.approx(300.0), 4: pytest.approx(300.0)}


@pytest.mark.parametrize("case", ["slow by the noise", "warming up", "protected", "replicate", "no incumbent"])
def test_a_run_is_not_pruned(case: str, tmp_path: Path) -> None:
    study = optuna.create_study(direction="maximize") if case == "no incumbent" else _study_with_incumbent(tmp_path)
    study.pruner = IncumbentPruner()
    experiment = _experiment(tmp_path, BATCH)
    trial = _running(study, experiment, repeat=1 if case == "replicate" else 0)
    report = LiveReport()
    judge = live_judge(trial, experiment, metric=THROUGHPUT, report=report, protected=case == "protected")
    assert judge is not None
    # Its first profiled steps 2x slower than its last: still warming up, whatever it reads.
    steps = {"slow by the noise": [800.0] * 5, "warming up": [1.0, 1.0, 150.0, 200.0, 300.0]}.get(case, [300.0] * 5)
    for n in range(1, len(steps) + 1):
        assert judge([_line(s) for s in steps[:n]]) is None
    assert report.verdict is None and sorted(report.figures) == [3, 4, 5]


def test_the_runner_ends_a_run_its_judge_prunes_by_its_process_group(tmp_path: Path, monkeypatch) -> None:
    # The fake launcher logs a step every 2 s (12 s over its 5 steps and the exit step): the judge
    # sees them as they are written, and ends the run at its second.
    monkeypatch.setenv("FAKE_DS_SURFACE", json.dumps({"duration": 12.0}))
    script = tmp_path / "train.py"
    script.write_text("")
    commands = CommandBuilder(deepspeed_bin=(sys.executable, FAKE_LAUNCHER), script=str(script),
                              script_args=("--deepspeed_config", "orig.json", "--bs", "1"),
                              arg_mappings={"train_micro_batch_size_per_gpu": "--bs"})
    runner = ExperimentRunner(commands=commands, master_port=29760, metric_key="throughput", exps_dir=str(tmp_path / "exps"))
    slot = Resources(hosts={"localhost": [0]}, gpus_per_node=1, nodes_per_experiment=1, device_memory=1e9, hostfile=None,
                     multi_node=False).slots()[0]
    seen: list[int] = []
    pids: list[int] = []

    def judge(steps):
        seen.append(len(steps))
        return "clearly below" if len(steps) >= 2 else None

    experiment = _experiment(tmp_path, 2)
    result = runner.run(experiment, slot=slot, timeout=120, judge=judge, on_start=pids.append)
    assert result.reason is FailureReason.PRUNED and result.detail == "clearly below"
    assert seen[-1] == 2 and len(result.logged_steps) < 5  # ended before its window: no later step logged
    assert not (Path(experiment.result_dir) / "metrics.json").exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(pids[0], 0)


def test_a_tuning_prunes_a_clearly_slow_run_and_reads_it_as_a_measurement_of_fewer_steps(tmp_path: Path) -> None:
    # The user's micro-batch 16 (1,329 samples/s) runs first; the planner then tries 171, at 396
    # samples/s: before, it ran its whole window (10 s); now it ends after two profiled steps.
    job = product.FixedJob(name="slow", surface={"duration": 10.0},
                           config={"train_micro_batch_size_per_gpu": 16, "zero_optimization": {"stage": 1},
                                   "autotuning": {"enabled": True, "model_info": {"num_params": 1000}}})
    run = product.simulate(job, costs=product.Costs(decision_s=0.1, launch_s=0.2), keep=tmp_path)
    assert run.optimal is not None and run.optimal["train_micro_batch_size_per_gpu"] == 16
    (pruned,) = [e for e in run.launches if "saved_s" in e]
    assert pruned["name"] == "z1_gas1_tmbspg171" and pruned["saved_s"] > 0
    assert run.duplicates == 0  # the planner did not launch it again: it read the partial figure
    storage = f"sqlite:///{tmp_path / job.name / 'autotuning_results' / 'optuna-ds.db'}"
    trials = {t.user_attrs["exp_name"]: t for t in optuna.load_study(study_name=f"{product.STUDY}-z1", storage=storage).get_trials()}
    t = trials["z1_gas1_tmbspg171"]
    assert t.state.name == "PRUNED" and t.user_attrs["reason"] == "pruned" and t.user_attrs["pruned"]["steps"] == 2
    assert t.user_attrs["pruned"]["figure"] == pytest.approx(120 * 171 / (1 + (171 / 24) ** 2), rel=1e-3)
    assert sorted(t.intermediate_values) == [3, 4]  # reported as they were logged, its window cut short
    assert trials["z1_gas1_tmbspg16"].state.name == "COMPLETE"  # the user's config: never pruned
    assert re.search(r"Pruned: 1 run\(s\) ended early.*z1_gas1_tmbspg171", run.summary), run.summary
    assert "Spent: 2 experiment(s)" in run.summary
    # The report: its row says pruned (not hidden as a claim that launched nothing), and the
    # figure has it at the figure of the steps it ran, a mark of its own.
    from optuna_ds.config import parse_user_config
    from optuna_ds.reporting import load_report
    from optuna_ds.storage import create_storage
    from optuna_ds.storage import load_plan
    from optuna_ds.studies import load_result

    store = create_storage(storage, create=False)
    plan = load_plan(store, product.STUDY)
    assert plan is not None
    result = load_result(store, plan, parse_user_config(plan.user_config, path=plan.config_path, script_args=plan.script_args))
    data = load_report(store, product.STUDY, result=result)
    assert [r.status for r in data.rows if r.name == "z1_gas1_tmbspg171"] == ["pruned"]
    (mark,) = [tr for tr in data.figures["metric_vs_mbs"].data if tr.name == "z1 pruned"]
    assert list(mark.x) == [171] and mark.y[0] == pytest.approx(t.user_attrs["pruned"]["figure"])


def test_the_simulated_launch_writes_its_steps_as_its_clock_reaches_them(monkeypatch) -> None:
    # Not all at once: the runner sees a run's lines one step at a time, as the engine logs them.
    import optuna_ds.studies._experiments as experiments

    job = product.FixedJob(name="paced", surface={"duration": 10.0},
                           config={"train_micro_batch_size_per_gpu": 16, "zero_optimization": {"stage": 1},
                                   "autotuning": {"enabled": True, "model_info": {"num_params": 1000}}})
    seen: list[int] = []
    real = experiments.live_judge

    def spy(trial, experiment, **kwargs):
        judge = real(trial, experiment, **kwargs)

        def watch(steps):
            seen.append(len(steps))
            return judge(steps) if judge is not None else None

        return watch

    monkeypatch.setattr(experiments, "live_judge", spy)
    product.simulate(job, costs=product.Costs(decision_s=0.1, launch_s=0.2))
    assert seen[:5] == [1, 2, 3, 4, 5]


def test_a_database_that_fails_while_a_run_is_judged_lets_the_run_go_on(tmp_path: Path) -> None:
    # A step reported to a database that is away: the run is not ended for it (a timeout or
    # an interrupt would be), and another error is raised on.
    class Away:
        study = optuna.create_study(direction="maximize")

        def __init__(self, error: Exception) -> None:
            self.error = error

        def report(self, value: float, step: int) -> None:
            raise self.error

    gone = optuna.exceptions.StorageInternalError("An exception is raised during the commit")
    judge = live_judge(Away(gone), _experiment(tmp_path, BATCH), metric=THROUGHPUT, report=LiveReport(),  # type: ignore[arg-type]
                       protected=False)
    assert judge is not None and judge([_line(300.0)] * 4) is None
    broken = live_judge(Away(ValueError("a bug")), _experiment(tmp_path, BATCH), metric=THROUGHPUT,  # type: ignore[arg-type]
                        report=LiveReport(), protected=False)
    assert broken is not None
    with pytest.raises(ValueError):
        broken([_line(300.0)] * 4)
