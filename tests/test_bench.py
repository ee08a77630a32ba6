"""`make bench` runs: the simulated launcher speaks both tools' command lines, and the runner
counts launches and scores the chosen configs (no performance threshold here: the figures are
the benchmark's to report)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import catalog
import surfaces

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


def test_surfaces_have_the_features_they_claim() -> None:
    cliff = catalog.by_name("cliff-crash")
    assert cliff.memory_gb(surfaces.Config(stage=0, mbs=24)) - cliff.memory_gb(surfaces.Config(stage=0, mbs=23)) > 20
    crash = surfaces.Config(stage=2, mbs=4, knobs=(("reduce_scatter", False),))
    assert cliff.evaluate(crash).kind == "crash"
    large = catalog.by_name("gpt2-large")
    best, value = large.optimum(fast=True)
    edge = max(c.mbs for c in large.configs(fast=True, stages=(best.stage,)))
    assert best.mbs < edge, "the sweet spot lies below the largest runnable size"
    assert large.optimum(fast=False)[1] > value, "knobs pay in full mode"
    assert catalog.by_name("offload-only").optimum(fast=True, offload=False)[0] is None
    assert catalog.by_name("offload-only").optimum(fast=True, offload=True)[0].offload_optimizer


def test_the_simulated_launcher_answers_like_deepspeed(tmp_path: Path) -> None:
    import base64

    ledger = tmp_path / "ledger.jsonl"
    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 0},
              "autotuning": {"enabled": True, "metric_path": str(tmp_path / "m" / "metrics.json")}}
    encoded = base64.urlsafe_b64encode(json.dumps(config).encode()).decode()  # as DeepSpeed's autotuner passes it
    env = {"SIM_SURFACE": "gpt2-large", "SIM_LEDGER": str(ledger), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, str(BENCH / "simulated_deepspeed.py"), "--hostfile", "/job/hostfile", "--include",
                        "localhost:0,1", "--master_port", "29500", "train.py", "--deepspeed_config", encoded],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "m" / "metrics.json").read_text())["throughput"] > 0
    config["train_micro_batch_size_per_gpu"] = 500
    path = tmp_path / "big.json"
    path.write_text(json.dumps(config))
    p = subprocess.run([sys.executable, str(BENCH / "simulated_deepspeed.py"), "--include", "localhost:0", "train.py",
                        "--deepspeed", str(path)], env=env, capture_output=True, text=True)
    assert p.returncode == 1 and "CUDA out of memory" in p.stderr
    entries = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [e["outcome"] for e in entries] == ["ok", "oom"] and entries[0]["gpus"] == 2


def test_generated_jobs_are_deterministic_and_varied() -> None:
    import jobs

    assert repr(jobs.random_job(7)) == repr(catalog.by_name("random-7")) == repr(jobs.random_job(7))
    generated = [jobs.random_job(seed) for seed in range(100)]
    assert len({repr(j) for j in generated}) == 100
    assert {j.num_gpus for j in generated} >= {1, 2, 4, 8, 16} and len({j.device_gb for j in generated}) >= 4
    assert sum(j.cliff_mbs > 0 for j in generated) >= 10 and sum(j.crash is not None for j in generated) >= 5
    assert sum(j.pressure_loss > 0 for j in generated) >= 40 and min(j.noise for j in generated) < 0.01 < 0.03 < max(j.noise for j in generated)
    best_stages = {j.optimum(fast=True, offload=True)[0].stage for j in generated if j.optimum(fast=True, offload=True)[0]}
    assert best_stages == {0, 1, 2, 3}, "the optimum lies at every stage on some job"


def test_the_benchmark_runs_both_tools_and_prints_their_figures(tmp_path: Path) -> None:
    cache = tmp_path / "ds.json"
    p = subprocess.run([sys.executable, str(BENCH / "search.py"), "--surfaces", "small-plateau", "--modes", "fast",
                        "--deepspeed-cache", str(cache)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rows = {}
    for line in p.stdout.splitlines():
        m = re.match(r"\| small-plateau \| fast \| (deepspeed|optuna-ds) \| (\d+) \| (\d+) \| ([\d.]+) \| (.+?) \| ([\d.]+) \|", line)
        if m:
            rows[m.group(1)] = (int(m.group(2)), int(m.group(3)), float(m.group(4)), m.group(5), float(m.group(6)))
    assert set(rows) == {"deepspeed", "optuna-ds"}, p.stdout
    for launches, oom, gpu_hours, chosen, share in rows.values():
        assert launches > 1 and 0 <= oom < launches and gpu_hours > 0
        assert chosen.startswith("z") and 0.5 < share <= 1.0
    assert "| fast | optuna-ds |" in p.stdout and "GPU-h vs DeepSpeed" in p.stdout
    assert len(json.loads(cache.read_text())) == 1, "DeepSpeed's figures are cached per job and mode"


def test_deepspeeds_autotuner_tunes_a_job_of_more_gpus_than_it_takes_on_one_node(tmp_path: Path) -> None:
    import search

    assert [search._deepspeed_layout(n) for n in (8, 64, 100, 128, 120)] == [(1, 8), (1, 64), (1, 100), (16, 8), (15, 8)]
    job = catalog.by_name("blind4-4")  # 128 GPUs: on one node of 128 slots DeepSpeed 0.19.8 asserts before any launch
    assert job.num_gpus == 128
    figures = search.run_tool("deepspeed", job, fast=True, tuner_type="gridsearch", keep=tmp_path)
    assert figures["rc"] == 0 and figures["launches"] > 1 and figures["chosen"] is not None, figures
    (run,) = tmp_path.iterdir()
    launches = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    assert len(launches) == figures["launches"] and {l["gpus"] for l in launches} == {128}, "every launch spans the 16 nodes"


def test_the_planner_benchmark_prints_each_figure_with_its_interval_and_both_launch_ratios(monkeypatch, capsys) -> None:
    import planner

    monkeypatch.setattr(sys, "argv", ["planner.py", "--random", "0", "--blind", "2", "--seed", "7"])
    planner.main()
    out = capsys.readouterr().out
    assert re.search(r"^jobs: blind-0\.\.1, 6 named; bootstrap seed 7; fast mode", out, re.M), out
    assert re.search(r"^hand-made jobs 6 slots 1: mean", out, re.M) and "random jobs" not in out, out
    blind = out[out.index("blind jobs"):]
    num = r"[01]\.\d{4} \[[01]\.\d{4}, [01]\.\d{4}\]"
    pct = r"\d+\.\d% \[\d+\.\d%, \d+\.\d%\]"
    assert re.match(rf"blind jobs 2 slots 1: mean {num} p5 {num} worst [01]\.\d+ within 1% {pct}; launches \d+\.\d/job", blind), blind
    assert re.search(r"^  beside DeepSpeed: launches \d+\.\d\d \[\d+\.\d\d, \d+\.\d\d\]x of its over the 2 jobs it has figures for "
                     r"\(\d where it chose nothing\)", blind, re.M), blind
    assert re.search(r"^  noise reported within 0\.5x-2x of the job's: \d+\.\d% of jobs", blind, re.M), blind
    assert "ceiling" not in out and "genie" not in out


def test_the_planner_benchmark_tunes_through_the_product_as_the_cli_does(capsys) -> None:
    """--agree: the CLI as a process and the product in-process choose alike, launch for launch."""
    out = subprocess.run([sys.executable, str(BENCH / "planner.py"), "--jobs", "phys-3", "--agree", "1"],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    assert re.search(r"^agreement: 1 of 1 jobs chose the same config; launches (\d+) vs \1 \(CLI vs in-process\)$", out, re.M), out


def test_the_planner_audit_counts_every_launch_of_a_job_once() -> None:
    """Each launch of a tuning has one kind, so a job's launches by kind add up to its launches
    (the profile run aside)."""
    import planner

    r = planner.tune(catalog.by_name("blind-1"), slots=1)
    kinds = [kind for kind, _ in r["kinds"]]
    assert len(kinds) == r["launches"] - 1 and set(kinds) <= set(planner.KINDS), kinds
    assert kinds[0] == "first run" and sum(s == "oom" for _, s in r["kinds"]) == r["oom"]


def test_the_planner_curve_prices_a_budget_of_deepspeeds_launches_and_the_audit_splits_search_from_choice(
        monkeypatch, capsys) -> None:
    """``--curve`` prints, per generator, the share of the optimum reached within each budget of
    DeepSpeed's launches of the job (its cached figures); ``--audit`` whether a config within 1%
    ran and whether it was the one chosen."""
    import planner

    monkeypatch.setattr(sys, "argv", ["planner.py", "--random", "0", "--physical", "2", "--curve", "--audit",
                                      "--jobs", "random-0", "random-1", "phys-0", "phys-1"])
    planner.main()
    out = capsys.readouterr().out
    for group in ("random", "physical"):
        for f in planner.BUDGETS:
            assert re.search(rf"^{group} at {f:g}x DeepSpeed's launches \(2 jobs\): mean [01]\.\d{{4}} p5 [01]\.\d{{4}} within 1% "
                             r"\d+\.\d%$", out, re.M), out
    assert re.search(r"^  within 1%: a config that ran on \d+\.\d% of jobs, the one chosen on \d+\.\d%$", out, re.M), out
    r = planner.tune(catalog.by_name("random-0"), slots=1)
    assert r["best_ran"] >= r["true"] > 0 and len(r["configs"]) == r["launches"] - 1


def test_the_full_mode_audit_splits_the_regret_between_the_arm_and_its_knobs(monkeypatch, capsys) -> None:
    """``--full --audit`` says how much of the regret is the arm chosen and how much the knobs
    and size within it, and what became of the arm that wins only with its knobs."""
    import planner

    monkeypatch.setattr(sys, "argv", ["planner.py", "--random", "0", "--full", "--audit", "--jobs", "random-2", "random-6"])
    planner.main()
    out = capsys.readouterr().out
    m = re.search(r"^random full-mode regret (\d\.\d{4}): the arm (\d\.\d{4}), within the arm \(knobs, size\) (-?\d\.\d{4}); "
                  r"jobs on one GPU \d\.\d{4}; knob launches [\d.]+ of [\d.]+$", out, re.M)
    assert m, out
    assert abs(float(m[1]) - float(m[2]) - float(m[3])) < 2e-4


def test_blind_jobs_bring_their_own_knob_space(tmp_path: Path) -> None:
    import blind_jobs

    assert surfaces.spaces_of(catalog.by_name("phys-3")) == (surfaces.SPACES, surfaces.DEFAULTS)
    job = catalog.by_name("blind-2")
    assert isinstance(job, blind_jobs.BlindJob) and surfaces.spaces_of(job) == (blind_jobs.SPACES, blind_jobs.DEFAULTS)
    # The simulated launcher hands stage 3's own keys to the job: at 6 samples a prefetch bucket
    # of 5e8 runs out of memory where the default runs.
    ledger = tmp_path / "ledger.jsonl"
    env = {"SIM_SURFACE": job.name, "SIM_LEDGER": str(ledger), "PATH": "/usr/bin:/bin"}
    for prefetch in (5e7, 5e8):
        config = {"train_micro_batch_size_per_gpu": 6, "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": prefetch},
                  "autotuning": {"enabled": True, "metric_path": str(tmp_path / "metrics.json")}}
        (tmp_path / "ds.json").write_text(json.dumps(config))
        subprocess.run([sys.executable, str(BENCH / "simulated_deepspeed.py"), "--num_gpus", str(job.num_gpus), "train.py",
                        "--deepspeed", str(tmp_path / "ds.json")], env=env, capture_output=True, text=True)
    assert [e["outcome"] for e in map(json.loads, ledger.read_text().splitlines())] == ["ok", "oom"]


def test_the_planner_benchmark_compares_two_runs_job_by_job(tmp_path: Path, monkeypatch, capsys) -> None:
    """--paired: a change's difference per generator with its bootstrap interval, better only beyond it."""
    import planner

    before = {f"random-{i}": {"share": 0.95 + 0.001 * i, "launches": 10, "wall_s": 60.0} for i in range(20)}
    after = {**{n: {**r, "share": r["share"] + 0.02, "launches": 12} for n, r in before.items()},
             "phys-0": {"share": 1.0, "launches": 5, "wall_s": 1.0}}
    (tmp_path / "a.json").write_text(json.dumps(before))
    (tmp_path / "b.json").write_text(json.dumps(after))
    monkeypatch.setattr(sys, "argv", ["planner.py", "--paired", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--seed", "3"])
    planner.main()
    out = capsys.readouterr().out
    assert "20 jobs both tuned; bootstrap seed 3" in out, out
    assert re.search(r"^  random \(20 jobs\): share 0\.0200 \[0\.0200, 0\.0200\] \(better\); within 1% \+\d+\.\d% .*; "
                     r"launches 2\.00 \[2\.00, 2\.00\]$", out, re.M), out
    assert "phys" not in out


def test_every_generated_job_has_reproducible_one_sided_slow_outliers(tmp_path: Path, monkeypatch, capsys) -> None:
    """Issue 46 item 5: 5-15% of a job's runs are 5-25% slow, never fast, drawn from the job,
    the config and the launch; the simulated launcher reports them."""
    import simulated_deepspeed

    config = surfaces.Config(stage=1, mbs=4)
    for name in ("gpt2-large", "random-3", "phys-3", "blind-2", "blind4-1"):
        factors = [surfaces.slow_outlier(name, config, nonce) for nonce in range(2000)]
        assert factors == [surfaces.slow_outlier(name, config, nonce) for nonce in range(2000)]
        slow = [f for f in factors if f < 1.0]
        assert all(f == 1.0 for f in factors if f >= 1.0)
        assert 0.03 < len(slow) / len(factors) < 0.17, name
        assert 0.75 <= min(slow) and max(slow) <= 0.95
    assert len({surfaces.slow_share(f"random-{seed}") for seed in range(20)}) == 20
    # Through the launcher: its figure is the job's measurement times the outlier's factor.
    job = catalog.by_name("gpt2-large")
    slow_nonce = next(n for n in range(200) if surfaces.slow_outlier(job.name, config, n) < 1.0)
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("".join(json.dumps({"profile": True}) + "\n" for _ in range(slow_nonce)))
    ds = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1},
          "autotuning": {"enabled": True, "metric_path": str(tmp_path / "metrics.json")}}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    code, _ = simulated_deepspeed.answer(["--num_gpus", "8", "train.py", "--deepspeed", str(tmp_path / "ds.json")],
                                         surface=job, ledger=str(ledger))
    entry = json.loads(ledger.read_text().splitlines()[-1])
    assert code == 0 and entry["measured"] == pytest.approx(
        job.measure(config, slow_nonce) * surfaces.slow_outlier(job.name, config, slow_nonce))
    assert entry["measured"] < 0.96 * entry["true"]
