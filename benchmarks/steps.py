"""`make bench-steps`: whether the median of a run's profiled steps scatters less between runs
than DeepSpeed's figure, which is one step.

DeepSpeed's engine writes metrics.json from the timers of one step (``end_profile_step + 1``):
it logs and resets them at every step in autotuning mode. The steps it logged before (kept on
each trial, launcher/_steps.py) could make a figure of their own: their median with that step.
This runs the example (examples/train.py, real DeepSpeed on this machine's accelerator) through
optuna-ds's ExperimentRunner ``--repeat`` times at each ``--sizes`` micro-batch size,
interleaved, and prints per size the run-to-run scatter (coefficient of variation) of each
figure, the ratio of their means, and the machine's load while it ran. (It did not scatter less
here, nor on the recorded H100 runs: a launch's noise is shared by its steps. So the figure
stays DeepSpeed's.)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
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

def _cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument("--start", type=int, default=3, help="start_profile_step (the example's)")
    parser.add_argument("--end", type=int, default=6, help="end_profile_step (the example's)")
    parser.add_argument("--json", help="also write every run's figures here")
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    deepspeed = shutil.which("deepspeed") or os.path.join(os.path.dirname(sys.executable), "deepspeed")
    metric = Metric.named("throughput")
    runs: dict[int, list[tuple[float, float]]] = {m: [] for m in args.sizes}
    loads = []
    with tempfile.TemporaryDirectory(prefix="bench-steps-") as tmp:
        work = Path(tmp)
        commands = CommandBuilder(deepspeed_bin=(deepspeed,), script=str(ROOT / "examples" / "train.py"),
                                  script_args=("--deepspeed_config", "ds.json", "--steps", str(args.end + 2)), arg_mappings={})
        runner = ExperimentRunner(commands=commands, master_port=29850, metric_key=metric.key, exps_dir=str(work / "exps"))
        for index in range(args.repeat):
            for m in args.sizes:
                name = f"m{m}-{index}"
                result_dir = str(work / "results" / name)
                ds_config = {"train_micro_batch_size_per_gpu": m, "gradient_accumulation_steps": 1,
                             "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
                             "autotuning": {"enabled": True, "metric_path": f"{result_dir}/metrics.json",
                                            "start_profile_step": args.start, "end_profile_step": args.end}}
                experiment = Experiment(name=name, phase=Phase.MICRO_BATCH, config=Config(stage=0, micro_batch=m),
                                        ds_config=ds_config, result_dir=result_dir)
                result = runner.run(experiment, slot=Slot({"localhost": [0]}), timeout=600)
                if not result.ok:
                    sys.exit(f"bench-steps: {name} failed: {result.detail}\n{result.stderr_tail}")
                measured = measure_steps(metric=metric, metrics=result.metrics, logged=result.logged_steps,
                                         profiled=profiled_steps(ds_config))
                if not measured.step_times_ms:
                    sys.exit("bench-steps: the engine logged no step timers: nothing to compare")
                exit_ms = measured.step_times_ms[-1]
                runs[m].append((measured.value, measured.value * exit_ms / statistics.median(measured.step_times_ms)))
                loads.append(os.getloadavg()[0])
    print(f"run-to-run scatter of one launch's {metric.label}, {args.repeat} launches per size, steps {args.start}-{args.end} "
          f"profiled (load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores)")
    print(f"{'micro-batch':>11} {'DeepSpeed one step':>19} {'median of steps':>16} {'means ratio':>12}")
    for m, pairs in runs.items():
        one, window = [p[0] for p in pairs], [p[1] for p in pairs]
        print(f"{m:>11} {_cv(one):>18.1%} {_cv(window):>16.1%} {statistics.fmean(window) / statistics.fmean(one):>12.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": {str(m): p for m, p in runs.items()}, "load": loads}, indent=2))


if __name__ == "__main__":
    main()
