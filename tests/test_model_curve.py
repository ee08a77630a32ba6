"""The report's model curve (issue 49, item 5): the planner's model over micro-batch sizes drawn
as a dashed line of its own beside the measured points, never as if measured."""
from __future__ import annotations

from pathlib import Path

import pytest

from optuna_ds.config import parse_user_config
from optuna_ds.reporting import load_report
from optuna_ds.storage import create_storage
from optuna_ds.storage import load_plan
from optuna_ds.studies import load_result

import product


def test_the_model_is_a_dashed_line_of_its_own_and_a_size_never_run_is_only_on_it(tmp_path: Path) -> None:
    job = product.FixedJob(name="curve", surface={},
                           config={"train_micro_batch_size_per_gpu": 16, "zero_optimization": {"stage": 1},
                                   "autotuning": {"enabled": True, "model_info": {"num_params": 1000}}})
    product.simulate(job, costs=product.Costs(decision_s=0.1, launch_s=0.2), keep=tmp_path)
    url = f"sqlite:///{tmp_path / job.name / 'autotuning_results' / 'optuna-ds.db'}"
    storage = create_storage(url, create=False)
    plan = load_plan(storage, product.STUDY)
    assert plan is not None
    result = load_result(storage, plan, parse_user_config(plan.user_config, path=plan.config_path, script_args=plan.script_args))
    figure = load_report(storage, product.STUDY, result=result).figures["metric_vs_mbs"]
    measured = [t for t in figure.data if t.name == "z1"]
    (model,) = [t for t in figure.data if t.name == "z1 model estimate"]
    assert measured and all(t.mode == "markers" for t in measured)  # each run a point, no line
    assert model.mode == "lines" and model.line.dash == "dash"
    ran = {x for t in measured for x in t.x}
    never = [m for m in model.x if m not in ran]
    assert never, model.x
    # A size that never ran is on the model's traces alone (its line and band), no other mark.
    assert all("model" in (t.name or "") for t in figure.data if t.x is not None and never[0] in t.x)
    # The planner's model, as it chose: its curve at the choice is the choice's estimate.
    assert result.best is not None and result.best.estimate is not None
    at = list(model.x).index(result.best.config.micro_batch)
    assert model.y[at] == pytest.approx(result.best.estimate, rel=1e-6)
