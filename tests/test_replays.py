"""The planner benchmark's jobs of recorded real runs (benchmarks/replays.py), the recorder's
parsing of what DeepSpeed prints (benchmarks/record_real.py), and the benchmark's refusal of
stale cached DeepSpeed figures."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

import record_real
import replays
from surfaces import Config

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _run(stage: int, mbs: int, value: float | None, *, offload: str = "", outcome: str = "ok") -> dict[str, Any]:
    return {"stage": stage, "offload": offload, "micro_batch": mbs, "accumulation": 64 // mbs, "knobs": {}, "outcome": outcome,
            "reason": None if outcome == "ok" else "RuntimeError: boom", "samples_per_s": value,
            "step_times_s": [0.5, 0.5] if value else [], "timers_ms": {"fwd": 1.0} if value else {},
            "peak_memory_bytes": 10**9 * mbs, "launch_s": 20.0 + mbs, "load1": 3.0}


def _recording(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"job": "tiny", "script": "benchmarks/replay_jobs/mlp.py", "args": [],
            "hardware": {"accelerator": "cpu", "ranks": 1, "cores": 2, "device_memory_bytes": 16 * 2**30},
            "model": {"params": 10**6, "activation_per_sample_bytes": 4096}, "max_train_batch_size": 64,
            "profile_steps": [3, 5], "profile_launch_s": 20.0, "recorded": "2026-11-26", "deepspeed": "0.19.8", "runs": runs}


# Stage 0 at 4 and 16 (means 100 and 200), stage 3 at 16 (mean 150); stage 1 crashes.
RUNS = ([_run(0, 4, v) for v in (90.0, 110.0)] + [_run(0, 16, v) for v in (190.0, 210.0, 200.0)]
        + [_run(3, 16, v) for v in (150.0, 150.0)] + [_run(1, 16, None, outcome="crash")])


def test_a_launch_is_answered_by_one_recorded_run_and_the_truth_is_their_mean() -> None:
    job = replays.Replay(_recording(RUNS))
    config = Config(stage=0, mbs=16)
    assert job.evaluate(config).throughput == pytest.approx(200.0)
    assert sorted(job.measure(config, nonce) for nonce in range(3)) == pytest.approx([190.0, 200.0, 210.0])
    assert job.measure(config, 0) != job.measure(config, 1), "the nonce picks another run"
    assert job.measure(config, 0) == job.measure(config, 0), "the same launch asked again"
    first = [job.measure_nth(config, k) for k in range(6)]
    assert sorted(first[:3]) == pytest.approx([190.0, 200.0, 210.0]) and first[3:] == first[:3], "each run once before any twice"
    assert job.step_times(config, 0) == [0.5, 0.5] and job.timers(config, 0) == {"fwd": 1.0}
    assert job.peak_memory_gb(config, 0) == pytest.approx(16.0)
    assert job.evaluate(Config(stage=1, mbs=16)).kind == "crash"
    assert job.evaluate(Config(stage=2, mbs=16)).kind == "crash", "an arm never recorded runs nowhere"
    # Noise: the relative sd of one run, pooled over the configs with two ok runs (variances
    # 0.02, 0.0025 and 0 with 1, 2 and 1 degrees of freedom).
    assert job.noise == pytest.approx(math.sqrt((0.02 + 2 * 0.0025) / 4))
    assert job.recorded_arms == {(0, False, False), (3, False, False), (1, False, False)}
    assert job.max_mbs == 64 and job.num_gpus == 1


def test_sizes_not_recorded_are_interpolated_or_follow_stage_0s_shape_with_the_nearest_runs_noise() -> None:
    job = replays.Replay(_recording(RUNS))
    between = Config(stage=0, mbs=8)  # halfway between 4 and 16 in log size
    assert job.evaluate(between).throughput == pytest.approx(150.0)
    nearest = Config(stage=0, mbs=4)  # a tie goes to the upper neighbour, 16
    ratios = sorted(job.measure(between, n) / 150.0 for n in range(3))
    assert ratios == pytest.approx([0.95, 1.0, 1.05])
    assert job.evaluate(Config(stage=0, mbs=64)).throughput == pytest.approx(200.0), "above the largest: the largest's"
    assert job.evaluate(Config(stage=0, mbs=1)).throughput == pytest.approx(job.evaluate(nearest).throughput)
    # Stage 3, recorded at 16 alone, follows stage 0's shape: half as fast at 4, three quarters at 8.
    assert job.evaluate(Config(stage=3, mbs=4)).throughput == pytest.approx(75.0)
    assert job.evaluate(Config(stage=3, mbs=8)).throughput == pytest.approx(112.5)
    assert job.measure(Config(stage=3, mbs=8), 0) == pytest.approx(112.5), "its one config's runs are alike"


def test_the_best_recorded_config_and_within_noise() -> None:
    job = replays.Replay(_recording(RUNS))
    best, value = job.optimum(offload=True)
    assert (best.stage, best.mbs, value) == (0, 64, pytest.approx(200.0)), "flat above 16: a tie goes to the larger size"
    assert {k: (c.mbs, v) for k, (c, v) in job.arm_optima(fast=True, offload=True).items()} == {
        (0, False, False): (64, pytest.approx(200.0)), (3, False, False): (64, pytest.approx(150.0))}
    assert job.within_noise(200.0 * (1.0 - job.noise) + 1e-9)
    assert not job.within_noise(200.0 * (1.0 - job.noise) - 1e-6)


def test_the_planner_tunes_a_replay_in_process(tmp_path: Path) -> None:
    import planner

    job = replays.Replay(_recording(RUNS))
    result = planner.tune(job, slots=1)  # optuna-ds's own tuning, the replay answering its launches
    assert result["launches"] >= 2 and result["true"] > 0.0
    assert result["chosen"].stage in (0, 3)
    # The recording's batch cap bounds every size the tuning tried.
    assert result["entries"] and all(e["mbs"] * e["gas"] <= 64 for e in result["entries"]), result["entries"]


def test_the_recorder_reads_the_engines_timers_and_failures() -> None:
    output = ("[Rank 0] time (ms) | fwd_microstep: 1.00 | bwd_microstep: 2.00 | step_microstep: 0.02\n"
              "[Rank 0] time (ms) | fwd: 10.00 | bwd: 20.50 | bwd_inner: 12.00 | bwd_allreduce: 8.50 | step: 3.00\n"
              "[Rank 0] time (ms) | optimizer_step: 2.00\n"
              "[Rank 0] time (ms) | fwd: 11.00 | bwd: 21.00 | bwd_inner: 12.00 | bwd_allreduce: 9.00 | step: 4.00\n")
    steps = record_real.parse_timers(output)
    assert steps == [{"fwd": 10.0, "bwd": 20.5, "bwd_inner": 12.0, "bwd_allreduce": 8.5, "step": 3.0},
                     {"fwd": 11.0, "bwd": 21.0, "bwd_inner": 12.0, "bwd_allreduce": 9.0, "step": 4.0}]
    assert record_real.classify(0, output, {"throughput": 1.0}) == ("ok", None)
    crash = "Traceback (most recent call last):\n  File x\nRuntimeError: shm comm failed\n[launch.py] exits with return code = 1\n"
    assert record_real.classify(1, crash, None) == ("crash", "RuntimeError: shm comm failed")
    assert record_real.classify(1, "torch.OutOfMemoryError: out of memory\n", None)[0] == "oom"
    assert record_real.classify(None, "", None)[0] == "crash"


def test_the_recorder_launches_each_config_with_the_cap_s_accumulation(tmp_path: Path) -> None:
    job = record_real.JOBS["mlp-2m-2ranks"]
    ds = record_real.ds_config(job, stage=3, offload="optimizer", mbs=8, metric_path=str(tmp_path / "m.json"))
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) == (8, 8, 128)
    assert ds["wall_clock_breakdown"] and ds["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    assert ds["autotuning"]["metric_path"] == str(tmp_path / "m.json")
    assert len(set(record_real.grid(job))) == len(record_real.grid(job))


def test_stale_deepspeed_figures_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import planner

    monkeypatch.setattr(planner.search, "fingerprint", lambda surface, *, fast: f"now-{surface.name}")
    cache = tmp_path / "figures.json"
    cache.write_text(json.dumps({"gpt2-large|fast|now-gpt2-large": {"launches": 10}, "small-plateau|fast|old": {"launches": 9},
                                 "noisy-flat|full|now-noisy-flat": {"launches": 8}}))
    figures = planner.deepspeed_figures(["gpt2-large", "small-plateau", "noisy-flat"], fast=True, path=cache)
    assert figures == {"gpt2-large": {"launches": 10}}
    assert "1 of 3 jobs cached; 1 stale entries refused" in capsys.readouterr().out


def test_the_simulated_launcher_answers_a_replay_with_another_recorded_run_each_launch(tmp_path: Path) -> None:
    import subprocess

    job = replays.replays()[0]
    run = next(r for r in job.data["runs"] if r["outcome"] == "ok")
    config = {"train_micro_batch_size_per_gpu": run["micro_batch"], "gradient_accumulation_steps": run["accumulation"],
              "zero_optimization": {"stage": run["stage"]}, "autotuning": {"enabled": True, "metric_path": str(tmp_path / "m.json")}}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    env = {"SIM_SURFACE": job.name, "SIM_LEDGER": str(tmp_path / "ledger.jsonl"), "PATH": "/usr/bin:/bin"}
    measured = []
    for _ in range(2):
        subprocess.run([sys.executable, str(BENCH / "simulated_deepspeed.py"), "--include", "localhost:0", "train.py",
                        "--deepspeed_config", str(tmp_path / "ds.json")], env=env, check=True, timeout=120)
        measured.append(json.loads((tmp_path / "m.json").read_text())["throughput"])
    recorded = [r["samples_per_s"] for r in job.data["runs"]
                if (r["stage"], r["offload"], r["micro_batch"], r["outcome"]) == (run["stage"], "", run["micro_batch"], "ok")]
    assert all(any(math.isclose(m, r) for r in recorded) for m in measured)
    assert measured[0] != measured[1] or len(set(recorded)) == 1, "the second launch draws another run"
