"""`make bench-launch`: the launcher's own overhead per experiment, DeepSpeed's runner against ours.

One single-node experiment of examples/train.py (a tiny MLP, real DeepSpeed on this machine's
accelerator; CPU without a GPU) is run through optuna-ds's ExperimentRunner in three ways:

- ``deepspeed runner``: ``deepspeed --include localhost:0 --master_port P train.py ...``, as
  DeepSpeed's autotuner and optuna-ds before launched every experiment: the runner's
  interpreter imports torch and DeepSpeed, then spawns ``python -m deepspeed.launcher.launch``,
  which imports them again and spawns the script;
- ``launch.py direct``: ``python -m deepspeed.launcher.launch`` with the runner's world info
  (``OPTUNA_DS_LAUNCH_SERVER=0``): one interpreter and one import less;
- ``optuna-ds``: the default, DeepSpeed's ``launch.main()`` forked from a process that has
  already imported it: no interpreter and no import before the script's own.

For each it prints the median over the repetitions of the time from the call to the script's
first line (the launcher's own overhead), to the engine's metrics file, and to the end of the
experiment (the launcher noticing its ranks ended), and the share of the runner's overhead
that is gone.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from optuna_ds.domain import Config
from optuna_ds.domain import Experiment
from optuna_ds.domain import Phase
from optuna_ds.launcher import CommandBuilder
from optuna_ds.launcher import ExperimentFiles
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import Slot

ROOT = Path(__file__).resolve().parent.parent
FIRST_LINE = """import os, sys, time
with open(os.environ["BENCH_FIRST_LINE"], "w") as f:
    f.write(repr(time.time()))
import runpy
sys.argv = [{train!r}] + sys.argv[1:]
runpy.run_path({train!r}, run_name="__main__")
"""
MODES = {"deepspeed runner": (False, "1"), "launch.py direct": (True, "0"), "optuna-ds": (True, "1")}


def _deepspeed() -> str:
    found = shutil.which("deepspeed") or os.path.join(os.path.dirname(sys.executable), "deepspeed")
    if not os.access(found, os.X_OK):
        sys.exit("bench-launch: no deepspeed executable found")
    return found


def measure(mode: str, work: Path, index: int, port: int) -> dict[str, float]:
    local_start, server = MODES[mode]
    os.environ["OPTUNA_DS_LAUNCH_SERVER"] = server
    first_line = work / f"first-line-{index}"
    os.environ["BENCH_FIRST_LINE"] = str(first_line)
    name = f"{mode.replace(' ', '-').replace('.', '')}-{index}"
    result_dir = str(work / "results" / name)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "SGD", "params": {"lr": 0.001}},  # no JIT-built op to wait for
              "autotuning": {"enabled": True, "metric_path": f"{result_dir}/metrics.json", "start_profile_step": 2, "end_profile_step": 3}}
    commands = CommandBuilder(deepspeed_bin=(_deepspeed(),), script=str(work / "train.py"),
                              script_args=("--deepspeed_config", "ds.json", "--hidden", "64", "--layers", "1", "--steps", "4"),
                              arg_mappings={})
    runner = ExperimentRunner(commands=commands, master_port=port, metric_key="throughput", exps_dir=str(work / "exps"),
                              local_start=local_start)
    experiment = Experiment(name=name, phase=Phase.MICRO_BATCH, config=Config(stage=0, micro_batch=4), ds_config=config, result_dir=result_dir)
    start = time.time()
    result = runner.run(experiment, slot=Slot({"localhost": [0]}), timeout=600)
    end = time.time()
    if not result.ok:
        sys.exit(f"bench-launch: {mode} failed: {result.detail}\n{result.stderr_tail}")
    return {"first line": float(first_line.read_text()) - start,
            "metrics file": os.stat(ExperimentFiles(experiment.result_dir).metrics).st_mtime - start,
            "end": end - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    figures: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        work = Path(tmp)
        (work / "train.py").write_text(FIRST_LINE.format(train=str(ROOT / "examples" / "train.py")))
        os.chdir(work)
        # One warm-up of each (DeepSpeed's JIT-built CPU ops, the OS page cache), then interleaved.
        for index in range(args.repeat + 1):
            for k, mode in enumerate(MODES):
                sample = measure(mode, work, index, 29800 + k)
                if index:
                    figures[mode].append(sample)
    medians = {mode: {key: statistics.median(s[key] for s in samples) for key in samples[0]} for mode, samples in figures.items()}
    baseline = medians["deepspeed runner"]["first line"]
    print(f"launch overhead per single-node experiment, median of {args.repeat} (seconds from the call)")
    print(f"{'launcher':<18} {'first line':>10} {'metrics file':>12} {'end':>8} {'overhead gone':>14}")
    for mode, m in medians.items():
        gone = 1 - m["first line"] / baseline
        print(f"{mode:<18} {m['first line']:>10.2f} {m['metrics file']:>12.2f} {m['end']:>8.2f} {gone:>13.0%}")
    if args.json:
        Path(args.json).write_text(json.dumps({"medians": medians, "samples": figures}, indent=2))


if __name__ == "__main__":
    main()
