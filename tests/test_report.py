"""The HTML report and optuna-dashboard, on tunings run against the fake launcher."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import optuna
import pytest

from browser import measure
from browser import screenshot
from conftest import Workspace

CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": [1, 2], "overlap_comm": [True, False], "reduce_bucket_size": [5e7, 5e8],
                          "allgather_bucket_size": 5e8, "reduce_scatter": True, "contiguous_gradients": True},
    "autotuning": {"enabled": True, "fast": False, "max_train_micro_batch_size_per_gpu": 64, "tuner_type": "gridsearch",
                   "num_tuning_micro_batch_sizes": 2, "tuner_early_stopping": 50},
}
SURFACE = {"oom_above": {"1": 40, "2": 48},
           "stderr_text": "<b>bold</b> & <script>alert(1)</script> in /opt/conda/lib/python3.11/site-packages/torch/"
                          "nn/modules/module.py:1736 while allocating activations for the attention block of layer 23",
           "knob_gain": {"overlap_comm": {"true": 1.2}}}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Workspace:
    ws = Workspace(tmp_path_factory.mktemp("report"))
    ws.config(CONFIG)
    p = ws.tune(surface=SURFACE)
    assert p.returncode == 0, p.stderr
    return ws


def test_tune_writes_a_self_contained_escaped_report(tuned: Workspace) -> None:
    page = (tuned.results / "report.html").read_text()
    # The knob search (and so the importance of its knobs) is at the chosen stage.
    chosen = json.loads((tuned.results / "ds_config_optimal.json").read_text())["zero_optimization"]["stage"]
    for fig in ("metric_vs_mbs", "best_per_stage", "history", "timeline", f"importance_z{chosen}"):
        assert f'id="{fig}"' in page, fig
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
    assert "reduce_bucket_size=5e8" in page and "reduce_bucket_size=5e7" in page and "500000000.0" not in page
    assert '<tr class="duplicate">' not in page
    assert '<a href="z1_gas1_tmbspg2/stderr.log">stderr</a>' in page  # each experiment's logs, relative to the page
    assert "your config</span>" in page
    assert "Peak GPU memory per experiment: not reported: DS_ACCELERATOR=cpu" in page
    assert "GPU slots: " in page and "GPU-hours" in page and '"name":"profile run"' in page


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
    assert p.returncode == 2 and "holds no tuning named 'nope'" in p.stderr


def test_studies_carry_what_the_dashboard_shows(tuned: Workspace) -> None:
    import optuna_dashboard

    study = optuna.load_study(study_name="optuna-ds-z1", storage=tuned.storage)
    assert study.metric_names == ["throughput"]
    note = optuna_dashboard.get_note(study)
    assert "| global " in note and "```" not in note and note.startswith("**Your config")
    root = optuna_dashboard.get_note(optuna.load_study(study_name="optuna-ds", storage=tuned.storage))
    assert root.startswith("This study holds the tuning's plan") and "`optuna-ds-z1`, `optuna-ds-z2`" in root
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects

    plots = get_plotly_graph_objects(tuned_storage(tuned).get_study_system_attrs(study._study_id))
    assert {"metric_vs_mbs", "importance_z1"} <= set(plots)
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
        # Bound to localhost only.
        other = [a for a in socket.gethostbyname_ex(socket.gethostname())[2] if not a.startswith("127.")]
        for addr in other:
            with pytest.raises(OSError):
                urllib.request.urlopen(f"http://{addr}:{port}/api/studies", timeout=2)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    # It says where to land: the stage study with the best experiment, not the root's plan.
    assert f"best experiments: http://127.0.0.1:{port}/dashboard/studies/{names['optuna-ds-z1']} (optuna-ds-z1)" in proc.stdout.read()


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
