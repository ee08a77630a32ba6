"""`make bench-real`: optuna-ds beside DeepSpeed's autotuner on a real DeepSpeed job on this machine.

The job (``--job``) is the README's example (examples/train.py) or our own plain DeepSpeed script
(benchmarks/replay_jobs/tiny_transformer.py, a tiny transformer language model that knows nothing
of tuning), real DeepSpeed on this machine's accelerator (CPU without a GPU), every ZeRO stage, the global batch capped at ``--max-train-batch-size``. First
DeepSpeed's autotuner (``deepspeed --autotuning tune``, unmodified but for a no-op ``pdsh`` on
PATH: it ends each experiment with ``pdsh … pkill -f`` by name), then ``optuna-ds tune``, each in
a folder of its own, both fast mode. Per tool: the wall time, the experiments it launched (its
folders under ``autotuning_results``; the profile run included where it made one), and its
``ds_config_optimal.json``. Then the two optima are measured alike — alternately,
``--finals`` runs each, every run the same way (optuna-ds's runner) — so their throughputs
compare on equal terms, whatever each tool measured while it searched; one config chosen by
both is measured once, for its figure.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from optuna_ds.config import Metric
from optuna_ds.domain import Config
from optuna_ds.domain import Experiment
from optuna_ds.domain import Phase
from optuna_ds.launcher import CommandBuilder
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import Slot
from optuna_ds.launcher import measure_steps
from optuna_ds.launcher import profiled_steps

ROOT = Path(__file__).resolve().parent.parent
# Per job: its script and arguments; its steps last, so the finals can run fewer.
JOBS = {"example": (ROOT / "examples" / "train.py", ["--hidden", "512", "--layers", "4", "--steps", "1000"]),
        "transformer": (ROOT / "benchmarks" / "replay_jobs" / "tiny_transformer.py", ["--steps", "1000"])}


def _user_config(cap: int) -> dict:
    return {"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
            "autotuning": {"enabled": True, "fast": True, "max_train_batch_size": cap, "start_profile_step": 3, "end_profile_step": 6}}


def _tool(name: str, work: Path, job: str, cap: int, env: dict[str, str]) -> dict:
    folder = work / name
    folder.mkdir()
    path, script_args = JOBS[job]
    shutil.copy(path, folder / path.name)
    (folder / "ds_config.json").write_text(json.dumps(_user_config(cap)))
    script = [path.name, "--deepspeed_config", "ds_config.json", *script_args]
    bin_dir = os.path.dirname(sys.executable)
    cmd = ([os.path.join(bin_dir, "deepspeed"), "--autotuning", "tune", "--num_gpus", "1", *script] if name == "deepspeed"
           else [sys.executable, "-m", "optuna_ds", "tune", "--num_gpus", "1", *script])
    start = time.monotonic()
    p = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    results = folder / "autotuning_results"
    optimal = results / "ds_config_optimal.json"
    if not optimal.exists():
        sys.exit(f"bench-real: {name} wrote no ds_config_optimal.json (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    launched = [d for d in results.iterdir() if d.is_dir() and (d / "ds_config.json").exists()]
    config = json.loads(optimal.read_text())
    return {"wall": wall, "experiments": len(launched), "config": config, "rc": p.returncode}


def _describe(config: dict) -> str:
    zero = config.get("zero_optimization", {})
    offload = "+offload" if zero.get("offload_optimizer") else ""
    return f"z{zero.get('stage', 0)}{offload} mbs {config['train_micro_batch_size_per_gpu']} gas {config.get('gradient_accumulation_steps', 1)}"


def _finals(work: Path, job: str, optima: dict[str, dict], repeat: int) -> dict[str, list[float]]:
    metric = Metric.named("throughput")
    path, script_args = JOBS[job]
    commands = CommandBuilder(deepspeed_bin=(os.path.join(os.path.dirname(sys.executable), "deepspeed"),),
                              script=str(path), script_args=("--deepspeed_config", "ds.json", *script_args[:-1], "12"), arg_mappings={})
    runner = ExperimentRunner(commands=commands, master_port=29870, metric_key=metric.key, exps_dir=str(work / "finals-exps"))
    runs: dict[str, list[float]] = {name: [] for name in optima}
    for index in range(repeat):
        for name, optimal in optima.items():
            result_dir = str(work / "finals" / f"{name}-{index}")
            ds_config = {**optimal, "autotuning": {"enabled": True, "metric_path": f"{result_dir}/metrics.json",
                                                   "start_profile_step": 3, "end_profile_step": 6}}
            zero = optimal.get("zero_optimization", {})
            experiment = Experiment(name=f"{name}-{index}", phase=Phase.MICRO_BATCH,
                                    config=Config(stage=int(zero.get("stage", 0)), micro_batch=int(optimal["train_micro_batch_size_per_gpu"])),
                                    ds_config=ds_config, result_dir=result_dir)
            result = runner.run(experiment, slot=Slot({"localhost": [0]}), timeout=600)
            if not result.ok:
                sys.exit(f"bench-real: {name}'s optimum failed: {result.detail}\n{result.stderr_tail}")
            runs[name].append(measure_steps(metric=metric, metrics=result.metrics, logged=result.logged_steps,
                                            profiled=profiled_steps(ds_config)).value)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=sorted(JOBS), default="example")
    parser.add_argument("--max-train-batch-size", type=int, default=256)
    parser.add_argument("--finals", type=int, default=4, help="runs of each optimum, measured alike")
    parser.add_argument("--keep", type=Path, help="copy both tools' folders here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        work = Path(tmp)
        bin_dir = work / "bin"
        bin_dir.mkdir()
        (bin_dir / "pdsh").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "pdsh").chmod(0o755)
        env = dict(os.environ, DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu"),
                   PATH=os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ["PATH"]]),
                   OPTUNA_DS_LOCK_DIR=str(work / "locks"))
        loads = [os.getloadavg()[0]]
        tools = {name: _tool(name, work, args.job, args.max_train_batch_size, env) for name in ("deepspeed", "optuna-ds")}
        loads.append(os.getloadavg()[0])
        # One config chosen by both: its runs would only measure the noise between them.
        same = tools["deepspeed"]["config"] == tools["optuna-ds"]["config"]
        runs = _finals(work, args.job, {name: t["config"] for name, t in tools.items()} if not same else {"both": tools["deepspeed"]["config"]},
                       args.finals)
        if same:
            runs = {name: runs["both"] for name in tools}
        loads.append(os.getloadavg()[0])
        if args.keep:
            shutil.copytree(work, args.keep, dirs_exist_ok=True, ignore=shutil.ignore_patterns("bin", "locks"))
    print(f"job {args.job} ({JOBS[args.job][0].name}), every ZeRO stage, max_train_batch_size {args.max_train_batch_size}, fast mode, {os.cpu_count()} cores "
          f"(load average {min(loads):.1f}-{max(loads):.1f}); optima measured alike, {args.finals} runs each")
    print(f"{'tool':<10} {'wall s':>7} {'experiments':>11}  {'optimum':<22} {'samples/s (mean ± sd)':>22}")
    for name, t in tools.items():
        r = runs[name]
        print(f"{name:<10} {t['wall']:>7.0f} {t['experiments']:>11}  {_describe(t['config']):<22} "
              f"{statistics.fmean(r):>13,.0f} ± {statistics.stdev(r) if len(r) > 1 else 0:,.0f}")
    ds, ours = tools["deepspeed"], tools["optuna-ds"]
    share = "1 (the same config)" if same else f"{statistics.fmean(runs['optuna-ds']) / statistics.fmean(runs['deepspeed']):.3f}x"
    print(f"optuna-ds / DeepSpeed: wall {ours['wall'] / ds['wall']:.2f}x, experiments {ours['experiments'] / ds['experiments']:.2f}x, "
          f"optimum's throughput {share}")


if __name__ == "__main__":
    main()
