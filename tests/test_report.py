"""The HTML report and optuna-dashboard: in-process on a storage built record by record, and on
tunings run against the fake launcher."""
from __future__ import annotations

import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import markupsafe
import optuna
import pytest

from browser import measure
from browser import screenshot
from conftest import Workspace
from conftest import assert_one_line_error
from optuna_ds.config import format_number
from optuna_ds.config import parse_user_config
from optuna_ds.domain import MBS_KEY
from optuna_ds.domain import Config
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import FailureReason
from optuna_ds.domain import Phase
from optuna_ds.reporting import best_stage_study
from optuna_ds.reporting import headline
from optuna_ds.reporting import load_report
from optuna_ds.reporting import optimal_config
from optuna_ds.reporting import register_with_dashboard
from optuna_ds.reporting import render_report
from optuna_ds.reporting import summary_markdown
from optuna_ds.reporting import summary_text
from optuna_ds.storage import TuningPlan
from optuna_ds.storage import create_storage
from optuna_ds.storage import open_root_study
from optuna_ds.storage import open_stage_study
from optuna_ds.storage import set_verdict
from optuna_ds.studies import TuningResult
from optuna_ds.studies import load_result

_T0 = datetime.datetime(2025, 1, 1, 12, 0, 0)
# (stage, mbs, value or failure, seconds): trial numbers follow the order within each stage.
RUNS: list[tuple[int, int, Any]] = [
    (1, 2, 1_000.0),        # z1 trial 0: the user's config
    (1, 16, 15_973.2),      # z1 trial 1: the choice's first run
    (1, 32, 16_300.0),      # z1 trial 2: one lucky run, Optuna's best trial
    (1, 64, "error"),       # z1 trial 3
    (1, 16, 15_100.0),      # z1 trial 4: the choice again
    (1, 16, 15_500.0),      # z1 trial 5
    (2, 8, 12_000.0),       # z2 trial 0
    (2, 8, 12_400.0),       # z2 trial 1
]


def _store(root: Path, runs: list[tuple[int, int, Any]] = RUNS, *, choice: tuple[int, int] | None = (1, 1),
           device: str = "CPU", equivalent: tuple[tuple[int, int], ...] = ((1, 32),),
           noise: float = 0.027) -> tuple[optuna.storages.BaseStorage, TuningPlan]:
    """A tuning as the storage holds it once run, written record by record as the tuning writes
    them: the plan, each stage's trials, the root's attrs and the planner's choice, with its
    verdict: the configs (stage, size) a run cannot tell from it, at ``noise`` a run."""
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": [1, 2]},
              "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 64}}
    (root / "train.py").write_text("")
    plan = TuningPlan(study_name="optuna-ds", script=str(root / "train.py"), script_args=["--deepspeed_config", "ds.json"],
                      cwd=str(root), config_path=str(root / "ds.json"), user_config=config, deepspeed_bin=["deepspeed"],
                      launcher_options={}, results_dir=str(root / "results"), exps_dir=str(root / "exps"), trial_timeout=None)
    storage = create_storage(f"sqlite:///{root / 'tuning.db'}")
    study = open_root_study(storage, plan, direction="maximize")
    study.set_user_attr("resources", {"gpus_per_experiment": 1, "device_memory": 2.5e10, "device": device,
                                      "gpu_memory": "not reported: DS_ACCELERATOR=cpu: NVML reports NVIDIA GPUs only"})
    study.set_user_attr("elapsed", 120.0)
    stages: dict[int, optuna.Study] = {}
    for i, (stage, mbs, outcome) in enumerate(runs):
        if stage not in stages:
            stages[stage] = open_stage_study(storage, tuning="optuna-ds", stage=stage, direction="maximize")
            study.set_user_attr(f"stage:z{stage}", {"status": "tuned", "reason": ""})
        n = sum(1 for s, m, _ in runs[:i] if (s, m) == (stage, mbs))
        name = f"z{stage}_gas1_tmbspg{mbs}" + (f"_r{n}" if n else "")
        failed = isinstance(outcome, str)
        record = ExperimentRecord(
            phase=Phase.MICRO_BATCH, config=Config(stage=stage, micro_batch=mbs), train_batch_size=mbs, slot="localhost:0",
            ds_config={"train_micro_batch_size_per_gpu": mbs, "gradient_accumulation_steps": 1, "train_batch_size": mbs,
                       "zero_optimization": {"stage": stage}, "autotuning": {"metric_path": f"/r/{name}/metrics.json"}},
            result_dir=str(root / "results" / name), duration=10.0,
            reason=FailureReason.ERROR if failed else None,
            detail="exit status 1: ValueError: the batch is too large" if failed else None,
            stderr_tail="Traceback (most recent call last):\nValueError: the batch is too large\n" if failed else None,
            exp_name=name)
        trial = optuna.trial.create_trial(
            state=optuna.trial.TrialState.FAIL if failed else optuna.trial.TrialState.COMPLETE, value=None if failed else outcome,
            params={MBS_KEY: mbs}, distributions={MBS_KEY: optuna.distributions.IntDistribution(1, 64)}, user_attrs=record.attrs())
        trial.datetime_start = _T0 + datetime.timedelta(seconds=20 * i)
        trial.datetime_complete = trial.datetime_start + datetime.timedelta(seconds=10)
        stages[stage].add_trial(trial)
    if choice is not None:
        chosen = Config(stage=choice[0], micro_batch=[m for s, m, _ in runs if s == choice[0]][choice[1]])
        study.set_user_attr("choice", {"stage": choice[0], "trial": choice[1], "estimate": 15_400.0, "config": chosen.to_attrs()})
        set_verdict(study, equivalent=[Config(stage=s, micro_batch=m).name for s, m in equivalent], noise=noise)
    return storage, plan


def _result(storage: optuna.storages.BaseStorage, plan: TuningPlan) -> TuningResult:
    return load_result(storage, plan, parse_user_config(plan.user_config, path=plan.config_path, script_args=plan.script_args))


def _text(page: str) -> str:
    """What the page says outside its scripts (plotly.js is minified code)."""
    return re.sub(r"<script.*?</script>", "", page, flags=re.S)


def test_the_optimum_is_shown_by_the_level_the_planner_chose_it_by(tmp_path: Path) -> None:
    """A choice recorded with its robust level (the planner's figure for it under one-sided
    noise) is shown by that level, and the summary names it; DeepSpeed's table and ours keep
    their own figures (the best run, the mean)."""
    storage, plan = _store(tmp_path)
    study = optuna.load_study(study_name="optuna-ds", storage=storage)
    study.set_user_attr("choice", {**study.user_attrs["choice"], "level": 15_700.0})
    result = _result(storage, plan)
    best = result.best
    assert best is not None and best.chosen and best.level == 15_700.0
    assert best.value == 15_700.0 and best.mean == pytest.approx((15_973.2 + 15_100.0 + 15_500.0) / 3)
    assert best.figure(result.metric) == "15,700 samples/s (robust level of 3 runs, ±2.8%; planner's estimate 15,400 samples/s)"
    lines = summary_text(result, advice=None).splitlines()
    assert "15,700 samples/s (robust level of 3 runs" in lines[1]
    assert "| global         |                 8 |             15,520 |      3 | z1_gas1_tmbspg16 |" in lines


def test_one_optimum_shown_the_same_way_everywhere(tmp_path: Path) -> None:
    storage, plan = _store(tmp_path)
    result = _result(storage, plan)
    best = result.best
    assert best is not None and best.chosen and best.name == "z1_gas1_tmbspg16" and best.trials == (1, 4, 5)
    assert best.value == pytest.approx((15_973.2 + 15_100.0 + 15_500.0) / 3) and best.estimate == 15_400.0
    figure = best.figure(result.metric)
    assert figure == "15,520 samples/s (mean of 3 runs, ±2.8%; planner's estimate 15,400 samples/s)"
    # One best: each stage's by the same rule (the chosen stage's is the choice, not its highest run).
    assert [s.best.name for s in result.stages if s.best] == ["z1_gas1_tmbspg16", "z2_gas1_tmbspg8"]
    assert result.stages[1].best.value == 12_200.0 and len(result.stages[1].best.runs) == 2
    summary = summary_text(result, advice=None)
    lines = summary.splitlines()
    # Your config ran once: no speed-up factor, and the line says why.
    assert lines[1] == ("Optimum (z1_gas1_tmbspg16: z1, micro-batch 16, gradient accumulation 1): " + figure
                        + "; no speed-up factor: your config ran once and the optimum 3 times; a factor needs 2 runs of each "
                        "at least, measured alike; run-to-run noise " + f"{result.noise.value:.1%}, measured from 2 repeated "
                        "configs, 5 runs.")
    assert lines[2] == "Spent: 8 experiment(s), 0.0222 device-hours (CPU)."
    assert "| z1             |                 6 |             15,520 |      3 | z1_gas1_tmbspg16 |" in lines
    assert "| global         |                 8 |             15,520 |      3 | z1_gas1_tmbspg16 |" in lines
    # Optuna's own best trial is the lucky single run: said, and why it is not the optimum.
    assert result.optuna_best is not None and result.optuna_best.number == 2
    assert "Optuna's best trial in the z1 study (what `optuna best-trial` and optuna-dashboard show) is trial 2, z1_gas1_tmbspg32" in summary
    # The failure's reason once, not its stderr line again.
    assert "last: z1_gas1_tmbspg64: error: exit status 1: ValueError: the batch is too large\n" in summary
    # Numbers for people; no GPU claims from a CPU.
    assert "e+0" not in summary and "GPU" not in summary and "Warning" not in summary
    note = summary_markdown(result, advice=None)
    assert f"\n\n{lines[1]}\n\n" in note and "e+0" not in note and "GPU" not in note

    data = load_report(storage, "optuna-ds", result=result)
    page = render_report(data, base_dir=str(tmp_path / "results"))
    text = _text(page)
    assert str(markupsafe.escape(lines[1])) in text and str(markupsafe.escape(figure)) in text
    # The experiments table: the optimum's runs first, its named run leading with the figure.
    body = text.split('<table class="experiments sortable">', 1)[1]
    rows = re.findall(r'<tr class="([^"]*)">\s*<td class="stage">z(\d)</td><td class="trial num">(\d+)</td>', body)
    assert [(c, int(s), int(n)) for c, s, n in rows[:3]] == [("complete chosen", 1, 1), ("complete chosen", 1, 4), ("complete chosen", 1, 5)]
    assert "chosen" not in "".join(c for c, _, _ in rows[3:])
    first_row = body.split("<tbody>", 1)[1].split("</tr>", 1)[0]
    assert f'<span class="chosen-badge">chosen: {markupsafe.escape(figure)}</span>' in first_row
    assert "<pre>" not in page and '<table class="summary sortable">' in page and "<script src=" not in page
    assert "e+0" not in text and "GPU" not in text and ">exit status 1: ValueError: the batch is too large<" in text
    # Every figure marks the optimum with the same figure.
    assert set(data.figures) == {"metric_vs_mbs", "best_per_stage", "history", "timeline"}
    for fig_id, fig in data.figures.items():
        traces = [t for t in fig.data if t.name == "chosen"]
        assert traces, fig_id
        assert str(markupsafe.escape(figure)) in traces[0].hovertemplate, fig_id
        assert "GPU" not in fig.to_json() and "e+0" not in json.dumps(fig.layout.to_plotly_json()), fig_id
        assert fig.layout.title.pad.t > 0 and fig.layout.margin.t >= 80, fig_id  # below the modebar
    assert '"displayModeBar": "hover"' in page
    chosen = data.figures["metric_vs_mbs"].data[-1]
    assert (chosen.x[0], chosen.y[0]) == (16, best.value)
    assert data.figures["best_per_stage"].data[0].y[0] == best.value  # z1's bar is the choice's mean, not trial 2's run
    # The optimal config is the choice's.
    assert optimal_config(result)["train_micro_batch_size_per_gpu"] == 16

    register_with_dashboard(data, storage, note=note)
    import optuna_dashboard

    z1 = optuna.load_study(study_name="optuna-ds-z1", storage=storage)
    assert optuna_dashboard.get_note(z1) == note and z1.best_trial.number == 2
    assert z1.user_attrs["optimum"] == {"study": "optuna-ds-z1", "trial": 1, "exp_name": "z1_gas1_tmbspg16", "runs": [1, 4, 5],
                                        "figure": figure, "final": True}
    assert best_stage_study(storage) == (z1._study_id, "optuna-ds-z1")


def test_summary_txt_is_deepspeeds_table_alone(tmp_path: Path) -> None:
    """Issue 49: summary.txt opened with our headline and had a ``runs`` column, and its
    best_metric_val was a mean: a parser of DeepSpeed's summary broke. It is DeepSpeed's table
    alone, as DeepSpeed's autotuner writes it (tabulate's pipe format), each best_metric_val the
    best run of the config its row names; what we add is in a file of our own."""
    tabulate = pytest.importorskip("tabulate")
    from optuna_ds.reporting import write_summary

    storage, plan = _store(tmp_path)
    result = _result(storage, plan)
    shown = write_summary(result, results_dir=str(tmp_path / "results"), advice=None)
    text = (tmp_path / "results" / "summary.txt").read_text()
    table = tabulate.tabulate([["z1", 6, 15_973.2, "z1_gas1_tmbspg16"], ["z2", 2, 12_400.0, "z2_gas1_tmbspg8_r1"],
                               ["global", 8, 15_973.2, "z1_gas1_tmbspg16"]],
                              headers=["tuning_space", "num_experiments", "best_metric_val", "best_exp_name"], tablefmt="pipe")
    assert text == table + "\n\nTuning completed in 0:02:00. Total number of experiments: 8."
    # Ours, beside it and on the terminal: the headline, each config's mean and runs, the notes.
    assert (tmp_path / "results" / "optuna_ds_summary.txt").read_text() == shown
    assert shown.startswith("Your config (z1, micro-batch 2") and "best_config_mean" in shown and "Why z1_gas1_tmbspg16" in shown


def test_before_the_planner_chose_the_best_mean_is_shown_as_such(tmp_path: Path) -> None:
    storage, plan = _store(tmp_path, choice=None, device="GPU")
    result = _result(storage, plan)
    best = result.best
    # The config with the best mean of runs (here one run: why the planner's choice weighs more).
    assert best is not None and not best.chosen and best.name == "z1_gas1_tmbspg32" and best.estimate is None
    lines = headline(result)
    assert lines[1].startswith("Best so far (the planner has not chosen yet) (z1_gas1_tmbspg32: ")
    assert "16,300 samples/s (one run); run-to-run noise" in lines[1] and "faster" not in lines[1]  # no factor of one run
    assert lines[2].endswith(" GPU-hours.")


def test_a_config_whose_runs_scatter_more_than_the_noise_is_flagged(tmp_path: Path) -> None:
    runs = [(1, 2, 1_000.0), (1, 4, 2_000.0), (1, 4, 2_010.0), (1, 8, 3_000.0), (1, 8, 3_020.0), (1, 16, 5_000.0), (1, 16, 3_400.0)]
    storage, plan = _store(tmp_path, runs, choice=(1, 5))
    result = _result(storage, plan)
    assert result.best is not None and result.best.spread > 0.2
    warning = next(line for line in headline(result) if line.startswith("Warning"))
    assert warning.startswith("Warning: the 2 runs of z1_gas1_tmbspg16 scatter by 26.9%, more than 2x the 0.9% run-to-run noise: its throughput is uncertain.")
    page = render_report(load_report(storage, "optuna-ds", result=result))
    assert f'<p class="warning">{markupsafe.escape(warning)}</p>' in page


def test_your_config_is_drawn_at_the_mean_the_headline_gives(tmp_path: Path) -> None:
    # Your config ran twice (measured alike with the optimum): every figure shows the mean the
    # headline divides, each of its runs is starred in time, and no label lies on a bar or
    # past the plot's right edge (issue 35: a newcomer read 132.6 on the figure, 112.2 above it).
    storage, plan = _store(tmp_path, [*RUNS, (1, 2, 600.0)])
    result = _result(storage, plan)
    assert result.baseline is not None and result.baseline.value == 800.0 and result.baseline.runs == 2
    assert "Your config (z1, micro-batch 2, the first stage explored of [1, 2]): 800 samples/s (mean of 2 runs)." in headline(result)
    figures = load_report(storage, "optuna-ds", result=result).figures
    star = next(t for t in figures["metric_vs_mbs"].data if t.name == "your config")
    assert (star.x[0], star.y[0]) == (2, 800.0) and "mean of 2 runs" in star.hovertemplate
    chosen = next(t for t in figures["metric_vs_mbs"].data if t.name == "chosen")
    assert chosen.textposition == "bottom right"  # 16 is not the largest size drawn (64 failed)
    bars = figures["best_per_stage"]
    assert bars.layout.shapes[0].y0 == 800.0 and not bars.layout.annotations  # the line, named in the legend only
    assert [t.name for t in bars.data if t.showlegend is not False] == ["your config 800 (mean of 2 runs)"]
    history = next(t for t in figures["history"].data if t.name == "your config")
    assert not figures["history"].layout.annotations  # no label on a line, over its runs
    assert any(t.name == "chosen: mean 15,520 samples/s" for t in figures["history"].data)
    assert list(history.y) == [1_000.0, 600.0] and list(history.text) == ["your config", ""]
    timeline = figures["timeline"]
    assert timeline.layout.xaxis.title.text == "time on Jan 01, 2025" and timeline.layout.xaxis.tickformat == "%H:%M:%S"
    outlined = [w for t in timeline.data if t.name == "z1" for w in t.marker.line.width]
    assert outlined.count(3) == 2  # both runs of yours


def test_a_label_at_the_rightmost_size_sits_to_its_left(tmp_path: Path) -> None:
    storage, plan = _store(tmp_path, [(1, 2, 1_000.0), (1, 16, 15_000.0), (1, 16, 15_200.0), (2, 8, 12_000.0)])
    figure = load_report(storage, "optuna-ds", result=_result(storage, plan)).figures["metric_vs_mbs"]
    chosen = next(t for t in figure.data if t.name == "chosen")
    assert chosen.textposition == "bottom left" and chosen.cliponaxis is False


def test_the_dashboard_note_says_first_that_an_interrupted_trial_is_no_failure(tmp_path: Path) -> None:
    # Ctrl-C during a run, then a resume that ran it again: optuna-dashboard's timeline draws the
    # cut-short trial as a red "Fail", which the summary and the report never call a failure.
    storage, plan = _store(tmp_path)
    z1 = optuna.load_study(study_name="optuna-ds-z1", storage=storage)
    record = ExperimentRecord(phase=Phase.MICRO_BATCH, config=Config(stage=1, micro_batch=16), exp_name="z1_gas1_tmbspg16_r3",
                              reason=FailureReason.INTERRUPTED, detail="interrupted by SIGINT")
    cut = optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, params={MBS_KEY: 16},
                                    distributions={MBS_KEY: optuna.distributions.IntDistribution(1, 64)}, user_attrs=record.attrs())
    cut.datetime_start = _T0 + datetime.timedelta(seconds=200)
    cut.datetime_complete = cut.datetime_start + datetime.timedelta(seconds=4)
    z1.add_trial(cut)
    # A claim lost before its launch (its process died between the two) ran nothing: not named, not drawn.
    unclaimed = optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL,
                                          user_attrs={"reason": "interrupted", "lost": True, "worker": "w"})
    unclaimed.datetime_start, unclaimed.datetime_complete = _T0 + datetime.timedelta(seconds=210), _T0 + datetime.timedelta(seconds=211)
    z1.add_trial(unclaimed)
    result = _result(storage, plan)
    assert result.interrupted == ((1, 6, "z1_gas1_tmbspg16_r3"),)
    note = summary_markdown(result, advice=None)
    assert ("**Read first:** z1 trial 6 (z1_gas1_tmbspg16_r3): shown as Fail, but interrupted (a signal, or a worker lost), "
            "which is no failure: an interrupted experiment runs again when the tuning resumes.") in note.split("**Your config")[0]
    assert "z1_gas1_tmbspg16_r3" not in summary_text(result, advice=None)
    # The slots draw its device time (the title counts it), apart from the failures' hatching.
    timeline = load_report(storage, "optuna-ds", result=result).figures["timeline"]
    interrupted = next(t for t in timeline.data if t.name == "interrupted")
    assert list(interrupted.text) == ["z1_gas1_tmbspg16_r3: interrupted, no failure"] and list(interrupted.x) == [4000.0]  # not the unclaimed one
    assert not any("z1_gas1_tmbspg16_r3" in str(t.text) for t in timeline.data if t.name != "interrupted")


def test_numbers_read_as_people_write_them() -> None:
    cases = {15_973.2: "15,970", 1.597e4: "15,970", 2_089.4: "2,089", 123.456: "123.5", 2.0: "2", 0.01234: "0.01234",
             9_999.6: "10,000", 1_234_567: "1.23M", 2.5e6: "2.5M", 312.5e12: "312T", 0.000012345: "0.00001234", 0: "0"}
    assert {v: format_number(v) for v in cases} == cases


def test_report_table_sorts_by_clicking_a_header(tmp_path: Path) -> None:
    """In Chromium: a click on the metric's header orders the rows by it, numerically."""
    from browser import _chromium

    storage, plan = _store(tmp_path)
    page = tmp_path / "report.html"
    page.write_text(render_report(load_report(storage, "optuna-ds", result=_result(storage, plan))).replace("</body>", """<script>
    window.addEventListener("load", () => { const th = [...document.querySelectorAll("table.experiments th")].find(h => h.textContent.startsWith("throughput"));
      th.click(); th.click();
      document.title = "sorted:" + [...document.querySelectorAll("table.experiments tbody tr")].map(tr => tr.children[4].textContent).join("|"); });
    </script></body>"""))
    dom = _chromium(page.as_uri(), "--dump-dom", width=1280, height=800)
    assert "sorted:16,300|15,970|15,500|15,100|12,400|12,000|1,000|" in dom

CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": [1, 2], "overlap_comm": [True, False], "reduce_bucket_size": [5e7, 5e8],
                          "allgather_bucket_size": 5e8, "reduce_scatter": True, "contiguous_gradients": True},
    "autotuning": {"enabled": True, "fast": False, "max_train_micro_batch_size_per_gpu": 64, "tuner_type": "gridsearch",
                   "num_tuning_micro_batch_sizes": 2, "tuner_early_stopping": 50},
}
SURFACE = {"oom_above": {"1": 40, "2": 48},
           # An error line after the OOM's: the reason the report shows, so hostile text reaches it.
           "stderr_text": "RuntimeError: <b>bold</b> & <script>alert(1)</script> in /opt/conda/lib/python3.11/site-packages/torch/"
                          "nn/modules/module.py:1736 while allocating activations for the attention block of layer 23",
           "knob_gain": {"overlap_comm": {"true": 1.2}}}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Workspace:
    ws = Workspace(tmp_path_factory.mktemp("report"))
    ws.config(CONFIG)
    p = ws.tune(surface=SURFACE)
    assert p.returncode == 0, p.stderr
    return ws


def _importance_shown(ws: Workspace, stage: int) -> bool:
    """Whether the stage's knob trials can carry an importance plot: 4 or more that completed,
    with a param (a knob, the micro-batch size, the offload variant) that took two values among
    them. Each param has one distribution for the whole study, so PED-ANOVA reads them all."""
    knob = [t for t in optuna.load_study(study_name=f"optuna-ds-z{stage}", storage=ws.storage).get_trials()
            if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs.get("phase") == "knobs"]
    params = {k for t in knob for k in t.params} - {"gradient_accumulation_steps"}
    return len(knob) >= 4 and any(len({str(t.params.get(k)) for t in knob}) > 1 for k in params)


def test_tune_writes_a_self_contained_escaped_report(tuned: Workspace) -> None:
    page = (tuned.results / "report.html").read_text()
    for fig in ("metric_vs_mbs", "best_per_stage", "history", "timeline"):
        assert f'id="{fig}"' in page, fig
    # A knob importance plot for each stage whose knob trials can carry one, none for the others.
    for stage in (1, 2):
        assert (f'id="importance_z{stage}"' in page) == _importance_shown(tuned, stage), stage
    assert "<script src=" not in page and "Plotly.newPlot" in page  # plotly.js is inlined, nothing loaded from outside
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    assert page.count('<tr class="oom">') >= 1 and page.count('<tr class="complete">') >= 4
    assert "localhost:0" in page  # the GPU slot of each experiment


def test_report_shows_what_a_person_looks_for(tuned: Workspace) -> None:
    page = (tuned.results / "report.html").read_text()
    assert "<h1>train.py: the fastest DeepSpeed config</h1>" in page
    assert '<div class="headline"><p>Your config (z1, micro-batch 2, the first stage explored of [1, 2]): ' in page
    assert "throughput (samples/s)" in page  # axis units from the metric
    assert "reduce_bucket_size=5e" in page and "500000000.0" not in page and "50000000.0" not in page
    assert '<tr class="duplicate">' not in page
    assert '<a href="z1_gas1_tmbspg2/stderr.log">stderr</a>' in page  # each experiment's logs, relative to the page
    assert "your config</span>" in page
    assert "Peak memory per experiment: not measured on this accelerator (CPU device)." in page
    assert "CPU device slots: " in page and "device-hours (CPU)" in page and '"name":"profile run"' in page
    assert '"name":"busy slots"' in page  # the slot plot shows width over time
    # The optimum the summary names is the optimal config, marked in the table and the figures.
    optimal = json.loads((tuned.results / "ds_config_optimal.json").read_text())
    name = (tuned.results / "optuna_ds_summary.txt").read_text().splitlines()[1].split("(", 1)[1].split(":", 1)[0]
    assert json.loads((tuned.results / name / "ds_config.json").read_text())["train_micro_batch_size_per_gpu"] == \
        optimal["train_micro_batch_size_per_gpu"]
    assert '<span class="chosen-badge">chosen: ' in page and page.count('"name":"chosen"') >= 4


@pytest.mark.parametrize("width", [1280, 1920])
def test_report_reads_without_sideways_scrolling(tuned: Workspace, width: int) -> None:
    """Laid out by Chromium as a person's window: nothing wider than the window, every figure
    inside it, the failure reasons readable; and the screenshot shows the plots and the
    baseline's star."""
    from PIL import Image

    page = str(tuned.results / "report.html")
    laid_out = measure(page, width=width)
    assert laid_out["scrollWidth"] <= laid_out["clientWidth"], laid_out
    assert laid_out["figures"] and max(laid_out["figures"]) <= laid_out["clientWidth"], laid_out
    assert laid_out["reasonWidth"] >= 150, laid_out
    png = tuned.root / f"report-{width}.png"
    screenshot((tuned.results / "report.html").as_uri(), str(png), width=width, height=2200)
    pixels = list(Image.open(png).convert("RGB").getdata())
    assert sum(1 for p in pixels if p == (229, 236, 246)) > 100_000, "no plot area drawn"
    star = sum(1 for p in pixels if abs(p[0] - 255) < 8 and abs(p[1] - 214) < 8 and p[2] < 40)
    assert star > 100, "the baseline is not marked"


def test_report_command_rebuilds_from_the_storage(tuned: Workspace) -> None:
    out = tuned.root / "again.html"
    p = tuned.cli("report", "--storage", tuned.storage, "--study-name", "optuna-ds", "-o", str(out))
    assert p.returncode == 0, p.stderr
    again = tuned.root / "from-env.html"
    p = tuned.cli("report", "-o", str(again), env=tuned.env(OPTUNA_STORAGE=tuned.storage))
    assert p.returncode == 0, p.stderr
    assert again.exists()
    assert "| global " in p.stdout and out.exists()
    assert 'id="metric_vs_mbs"' in out.read_text()
    p = tuned.cli("report", "--storage", tuned.storage, "--study-name", "nope")
    assert_one_line_error(p, "holds no tuning named 'nope'")


def test_studies_carry_what_the_dashboard_shows(tuned: Workspace) -> None:
    import optuna_dashboard

    study = optuna.load_study(study_name="optuna-ds-z1", storage=tuned.storage)
    assert study.metric_names == ["throughput"]
    note = optuna_dashboard.get_note(study)
    assert "| global " in note and "```" not in note and "\n**Your config" in note
    # What the dashboard's own figures get wrong comes first.
    assert note.startswith("**Read first:** ") and "gradient_accumulation_steps was 1 in every experiment" in note.split("**Your config")[0]
    root = optuna_dashboard.get_note(optuna.load_study(study_name="optuna-ds", storage=tuned.storage))
    # The study a person opens first names the optimum first.
    name = json.loads((tuned.results / "ds_config_optimal.json").read_text())
    assert root.startswith("**Optimum: z") and "`optuna-ds-z1`, `optuna-ds-z2`" in root
    assert root.split("\n")[0].endswith(f"of study `optuna-ds-z{name['zero_optimization']['stage']}`.")
    assert "\n\nThis study holds the tuning's plan" in root
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects

    plots = get_plotly_graph_objects(tuned_storage(tuned).get_study_system_attrs(study._study_id))
    assert "metric_vs_mbs" in plots and ("importance_z1" in plots) == _importance_shown(tuned, 1)
    assert json.loads(plots["metric_vs_mbs"])["layout"]["title"]["text"].startswith("throughput (samples/s) against micro-batch")


def tuned_storage(ws: Workspace) -> optuna.storages.BaseStorage:
    return optuna.storages.RDBStorage(ws.storage)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dashboard_serves_the_stage_studies_on_localhost(tuned: Workspace) -> None:
    port = _free_port()
    # The storage as optuna-dashboard takes it: the argument.
    proc = subprocess.Popen([sys.executable, "-m", "optuna_ds", "dashboard", tuned.storage, "--port", str(port)],
                            cwd=tuned.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        studies = None
        deadline = time.monotonic() + 60
        while studies is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2) as r:
                    studies = json.load(r)["study_summaries"]
            except OSError:
                time.sleep(0.3)
        assert studies is not None, "the dashboard never answered"
        names = {s["study_name"]: s["study_id"] for s in studies}
        assert {"optuna-ds", "optuna-ds-z1", "optuna-ds-z2"} <= set(names)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{names['optuna-ds-z1']}", timeout=5) as r:
            detail = json.load(r)
        trials = detail["trials"]
        assert len(trials) == len(optuna.load_study(study_name="optuna-ds-z1", storage=tuned.storage).trials)
        assert any(a["key"] == "exp_name" for a in trials[0]["user_attrs"])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
            landed = r.geturl()  # the first page a person opens
        # Bound to localhost only.
        other = [a for a in socket.gethostbyname_ex(socket.gethostname())[2] if not a.startswith("127.")]
        for addr in other:
            with pytest.raises(OSError):
                urllib.request.urlopen(f"http://{addr}:{port}/api/studies", timeout=2)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    # It says where to land: the stage study with the optimum, not the root's plan.
    stage = json.loads((tuned.results / "ds_config_optimal.json").read_text())["zero_optimization"]["stage"]
    chosen = f"optuna-ds-z{stage}"
    assert f"best experiments: http://127.0.0.1:{port}/dashboard/studies/{names[chosen]} ({chosen})" in proc.stdout.read()
    assert landed == f"http://127.0.0.1:{port}/dashboard/studies/{names[chosen]}"


def test_dashboard_without_a_storage_is_one_line_and_status_2(tuned: Workspace) -> None:
    env = {k: v for k, v in tuned.env().items() if k != "OPTUNA_STORAGE"}
    p = tuned.cli("dashboard", env=env)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "optuna-ds: error (optuna-ds dashboard): give the storage: optuna-ds dashboard STORAGE, --storage URL or OPTUNA_STORAGE"]


def test_optuna_studies_stays_readable_after_a_tuning(tuned: Workspace) -> None:
    """`optuna studies` prints every user attr of a study on its line: the tuning's plan (the
    user's whole config, the script's arguments, the launcher's options) is kept out of them,
    and read from the storage alone."""
    from test_optuna_contract import optuna_studies

    from optuna_ds.storage import load_plan

    lines = optuna_studies(tuned.storage).splitlines()
    assert any("optuna-ds-z1" in line for line in lines)
    assert "train.py" not in "".join(lines) and "launcher_options" not in "".join(lines)
    assert max(map(len, lines)) < 1500, max(map(len, lines))
    plan = load_plan(optuna.storages.RDBStorage(tuned.storage), "optuna-ds")
    assert plan is not None and plan.script == str(tuned.script) and plan.user_config["autotuning"]["enabled"]


def test_a_listed_value_no_experiment_ran_is_named_with_its_reason(tmp_path: Path) -> None:
    """Issue 49: ``zero_quantized_weights: [false, true]`` and ``zero_quantized_gradients:
    [false, true]`` on an 8-rank ZeRO-3 job on one node: ``true`` never ran, and qgZ (no
    dimension on one node) never appeared, and the summary said nothing of either."""
    import dataclasses

    from optuna_ds.reporting._notes import summary_notes

    runs = [(3, 2, 1_000.0), (3, 4, 1_900.0), (3, 4, 1_950.0)]
    storage, plan = _store(tmp_path, runs, choice=(3, 1))
    zero = {"stage": 3, "zero_quantized_weights": [False, True], "zero_quantized_gradients": [False, True],
            "offload_optimizer": {"device": "none", "pin_memory": [True, False]}}
    plan = dataclasses.replace(plan, user_config={**plan.user_config, "zero_optimization": zero,
                                                  "autotuning": {**plan.user_config["autotuning"], "fast": False}})
    # The z3 study's knob space, as the tuning records it: qwZ tuned; qgZ no dimension on one node.
    optuna.load_study(study_name="optuna-ds-z3", storage=storage).set_user_attr(
        "knob_space", {"stage": 3, "tuned": {"zero_quantized_weights": [False, True]}, "fixed": {}})
    result = _result(storage, plan)
    assert {(u.path, u.value) for u in result.unrun} == {("zero_optimization.zero_quantized_weights", True),
                                                         ("zero_optimization.zero_quantized_gradients", True),
                                                         ("zero_optimization.offload_optimizer.pin_memory", False)}
    notes = summary_notes(result, None)
    assert ("Listed but not run: zero_optimization.zero_quantized_weights true: the planner's search ended without it: it "
            "expected no gain from it over the settings that ran.") in notes
    assert ("Listed but not run: zero_optimization.zero_quantized_gradients true: qgZ acts only where the data-parallel ranks "
            "span nodes (on one node DeepSpeed reduces the gradients unquantized whatever the setting), and this job's ranks "
            "do not.") in notes
    assert any(n.startswith("Listed but not run: zero_optimization.offload_optimizer.pin_memory false: offload_optimizer "
                            "offloads nothing") for n in notes)
    # Fast mode tunes the micro-batch size alone: every other listed value is named, with why.
    fast = dataclasses.replace(plan, user_config={**plan.user_config, "autotuning": {**plan.user_config["autotuning"],
                                                                                     "fast": True}})
    assert any("zero_quantized_weights true: autotuning.fast is true" in n for n in summary_notes(_result(storage, fast), None))
    # A listed micro-batch size that never ran: named, with the out-of-memory run that bounds it.
    sizes = dataclasses.replace(plan, user_config={**plan.user_config, "train_micro_batch_size_per_gpu": [2, 4, 64, 128]})
    assert ("Listed but not run: train_micro_batch_size_per_gpu 64, 128: the planner's memory model says it cannot fit at any "
            "stage it explored.") in summary_notes(_result(storage, sizes), None)
    from optuna_ds.studies._listed import unrun_sizes

    oom = optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs=ExperimentRecord(
        config=Config(stage=1, micro_batch=32), exp_name="z1_gas1_tmbspg32", reason=FailureReason.OOM).attrs())
    assert [u.reason for u in unrun_sizes([32, 64], trials={1: [oom]})] == [
        "the planner's memory model says it cannot fit at any stage it explored (z1 ran out of memory at micro-batch 32)"]


def test_no_error_bar_spans_a_config_the_text_sets_apart(tmp_path: Path) -> None:
    """Issue 49: the chosen's error bar (its runs' range) spanned the rival's figure beside
    "Equivalent within the noise: none". One rule, the planner's verdict, which the text reads
    and the bars follow (one noise deviation of each mean); and each run a point, no line
    through sizes that never ran."""
    runs = [(1, 2, 1_000.0), (1, 16, 16_400.0), (1, 16, 14_600.0), (1, 16, 15_500.0), (1, 8, 14_900.0), (1, 8, 15_000.0),
            (2, 8, 15_200.0), (2, 8, 15_100.0)]
    # The planner judged none equivalent at 1% a run: the rivals are 3-4% below the choice, within its runs' range.
    storage, plan = _store(tmp_path, runs, choice=(1, 1), equivalent=(), noise=0.01)
    result = _result(storage, plan)
    best = result.best
    assert best is not None and best.value == 15_500.0 and result.equivalent == ()
    assert any(line.startswith("Equivalent within the noise (1.0% per run): none; the next best, z2_gas1_tmbspg8, is 2.3% slower")
               for line in summary_text(result, advice=None).splitlines())
    rivals = [m.value for m in result.measured if m.config != best.config and m.value > 10_000]
    assert min(best.runs) < min(rivals) and max(rivals) < max(best.runs)  # the runs' range spans them all
    figures = load_report(storage, "optuna-ds", result=result).figures
    chosen = next(t for t in figures["metric_vs_mbs"].data if t.name == "chosen")
    low, high = best.value - chosen.error_y.arrayminus[0], best.value + chosen.error_y.array[0]
    assert all(not low <= r <= high for r in rivals), (low, high, rivals)
    bars = figures["best_per_stage"].data[0]
    spans = [(y - m, y + p) for y, m, p in zip(bars.y, bars.error_y.arrayminus, bars.error_y.array)]
    assert spans[1][1] < best.value and not spans[0][0] <= bars.y[1] <= spans[0][1]  # z2's bar short of z1's mean, and back
    # Judged equivalent, the rival may lie within the bar; the text names it.
    (tmp_path / "b").mkdir()
    same = _result(*_store(tmp_path / "b", runs, choice=(1, 1), equivalent=((2, 8),), noise=0.05))
    assert "Equivalent within the noise (5.0% per run): z2_gas1_tmbspg8 (15,150 samples/s, 2 runs)" in summary_text(same, advice=None)
    assert all(t.mode == "markers" for t in figures["metric_vs_mbs"].data if t.name in ("z1", "z2"))


def test_busy_slots_step_at_each_start_and_end() -> None:
    import datetime

    from optuna_ds.reporting._figures import busy_steps

    t = [datetime.datetime(2026, 1, 1, 0, 0, s) for s in range(6)]
    # two runs overlap from 1 to 3; a third starts as the first ends
    assert busy_steps([(t[0], t[3]), (t[1], t[4]), (t[3], t[5])]) == [(t[0], 1), (t[1], 2), (t[3], 2), (t[4], 1), (t[5], 0)]
