"""`make bench`: search quality of optuna-ds beside DeepSpeed's autotuner on simulated jobs.

Both tools tune the same config on the same simulated surfaces (benchmarks/surfaces.py), with
the simulated launcher (benchmarks/simulated_deepspeed.py) first on PATH as ``deepspeed`` and a
no-op ``pdsh`` (DeepSpeed's autotuner ends each experiment with ``pdsh ... pkill``). Every
launch is counted from the launcher's ledger: launches, out-of-memory launches, simulated
GPU-hours; the config each tool writes to ``ds_config_optimal.json`` is scored by its true
(noise-free) throughput as a share of the surface's exhaustive optimum.

DeepSpeed's autotuner is run as ``python -m deepspeed.launcher.runner --autotuning tune``; its
scheduler's 5-second polling sleep is shortened to keep the benchmark short (it changes no
decision and no simulated time).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import surfaces  # noqa: E402

ROOT = HERE.parent
SIMULATOR = HERE / "simulated_deepspeed.py"
NUM_GPUS = 8
_DS_RUNNER = (
    "import sys, runpy, deepspeed.autotuning.scheduler as s; s.TIMEOUT = 0.02; "
    "sys.argv = ['deepspeed'] + sys.argv[1:]; runpy.run_module('deepspeed.launcher.runner', run_name='__main__')"
)


def user_config(*, fast: bool, tuner_type: str) -> dict:
    return {
        "fp16": {"enabled": True},
        "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": "all"},
        "autotuning": {"enabled": True, "fast": fast, "tuner_type": tuner_type, "max_train_micro_batch_size_per_gpu": 1024},
    }


def _environment(work: Path, surface: surfaces.Surface) -> tuple[dict[str, str], Path]:
    bin_dir = work / "bin"
    bin_dir.mkdir()
    (bin_dir / "deepspeed").write_text(f"#!/bin/sh\nexec {sys.executable} {SIMULATOR} \"$@\"\n")
    (bin_dir / "pdsh").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    ledger = work / "ledger.jsonl"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", DS_ACCELERATOR="cpu", LOCAL_SIZE=str(NUM_GPUS),
               SIM_SURFACE=surface.name, SIM_LEDGER=str(ledger), OPTUNA_DS_LOCK_DIR=str(work / "locks"),
               PYTHONPATH=str(ROOT))
    return env, ledger


def run_tool(tool: str, surface: surfaces.Surface, *, fast: bool, tuner_type: str, keep: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench-{surface.name}-") as tmp:
        work = Path(tmp)
        env, ledger = _environment(work, surface)
        (work / "train.py").write_text("print('a simulated training script')\n")
        (work / "ds_config.json").write_text(json.dumps(user_config(fast=fast, tuner_type=tuner_type)))
        script = ["train.py", "--deepspeed_config", "ds_config.json"]
        if tool == "optuna-ds":
            cmd = [sys.executable, "-m", "optuna_ds", "tune", "-q", "--deepspeed-bin", str(SIMULATOR), "--num_gpus", str(NUM_GPUS), *script]
        else:
            cmd = [sys.executable, "-c", _DS_RUNNER, "--autotuning", "tune", "--num_gpus", str(NUM_GPUS), *script]
        start = time.monotonic()
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        launches = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
        optimal = work / "autotuning_results" / "ds_config_optimal.json"
        chosen = None
        if optimal.exists():
            chosen = surfaces.Config.from_ds_config(json.loads(optimal.read_text()))
        if keep is not None:
            shutil.copytree(work, keep / f"{surface.name}-{'fast' if fast else 'full'}-{tool}-{tuner_type}", dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("bin", "locks"))
        if p.returncode != 0 and chosen is None and tool == "optuna-ds":
            print(f"  {tool} on {surface.name} failed (rc {p.returncode}):\n{p.stderr[-2000:]}", file=sys.stderr)
        return {
            "launches": len(launches),
            "oom": sum(1 for l in launches if l["outcome"] == "oom"),
            "gpu_hours": sum(l["seconds"] * l["gpus"] for l in launches) / 3600.0,
            "chosen": chosen,
            "true": surface.evaluate(chosen).throughput if chosen else 0.0,
            "wall": wall,
            "rc": p.returncode,
        }


def _describe(c: surfaces.Config | None) -> str:
    if c is None:
        return "none"
    text = f"z{c.stage} mbs {c.mbs}"
    if c.offload_optimizer or c.offload_param:
        text += " offload " + "+".join(k for k, on in (("opt", c.offload_optimizer), ("param", c.offload_param)) if on)
    knobs = {k: v for k, v in c.knobs}
    if knobs:
        text += " " + ",".join(f"{k.split('_')[0]}{'_' + k.split('_')[1][0] if '_' in k else ''}={v:g}" if isinstance(v, float)
                               else f"{k.split('_')[0]}={v}" for k, v in sorted(knobs.items()))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--surfaces", nargs="+", default=[s.name for s in surfaces.SURFACES])
    parser.add_argument("--modes", nargs="+", default=["fast", "full"], choices=["fast", "full"])
    parser.add_argument("--samplers", nargs="+", default=["model_based", "random", "gridsearch"])
    parser.add_argument("--no-deepspeed", action="store_true", help="skip DeepSpeed's autotuner")
    parser.add_argument("--keep", type=Path, help="copy each run's folder here")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    try:
        import deepspeed.autotuning  # noqa: F401
        with_ds = not args.no_deepspeed
    except ImportError:
        with_ds = False

    totals: dict[tuple[str, str], dict[str, float]] = {}
    comparable: dict[tuple[str, str], dict[str, float]] = {}
    print(f"simulated jobs on {NUM_GPUS} GPUs; GPU-hours are simulated experiment time x GPUs")
    print("| surface | mode | tool | launches | OOM | GPU-h | chosen | true throughput / optimum |")
    print("| :-- | :-- | :-- | --: | --: | --: | :-- | --: |")
    for name in args.surfaces:
        surface = surfaces.by_name(name)
        for mode in args.modes:
            fast = mode == "fast"
            runs: list[tuple[str, str]] = []
            if with_ds:
                runs.append(("deepspeed", "gridsearch"))
            runs += [("optuna-ds", s) for s in (args.samplers if not fast else args.samplers[:1])]
            best, optimum = surface.optimum(fast=fast, offload=True)
            ds_best, ds_optimum = surface.optimum(fast=fast, offload=False)
            results = []
            for tool, sampler in runs:
                r = run_tool(tool, surface, fast=fast, tuner_type=sampler, keep=args.keep)
                label = tool if tool == "deepspeed" else f"optuna-ds {sampler}" if not fast else "optuna-ds"
                share = r["true"] / optimum if optimum else 0.0
                results.append((tool, label, share, r))
                t = totals.setdefault((mode, label), {"launches": 0, "oom": 0, "gpu_hours": 0.0, "worst": 1.0, "runs": 0})
                t["launches"] += r["launches"]
                t["oom"] += r["oom"]
                t["gpu_hours"] += r["gpu_hours"]
                t["worst"] = min(t["worst"], share)
                t["runs"] += 1
                print(f"| {name} | {mode} | {label} | {r['launches']} | {r['oom']} | {r['gpu_hours']:.2f} | {_describe(r['chosen'])} "
                      f"| {share:.3f} |", flush=True)
            if any(tool == "deepspeed" and r["chosen"] is not None for tool, _, _, r in results):
                for _, label, share, r in results:
                    c = comparable.setdefault((mode, label), {"launches": 0, "gpu_hours": 0.0, "worst": 1.0})
                    c["launches"] += r["launches"]
                    c["gpu_hours"] += r["gpu_hours"]
                    c["worst"] = min(c["worst"], share)
            print(f"| {name} | {mode} | optimum | | | | {_describe(best)} | 1.000 |"
                  + ("" if ds_best == best else f" (without offload: {_describe(ds_best)}, {ds_optimum / optimum:.3f})"), flush=True)
    print()
    print("Totals; 'vs DeepSpeed' counts only the surfaces where DeepSpeed's autotuner found a config.")
    print("| mode | tool | surfaces | launches | OOM launches | GPU-h | worst share of optimum | worst on DeepSpeed's surfaces | launches vs DeepSpeed | GPU-h vs DeepSpeed |")
    print("| :-- | :-- | --: | --: | --: | --: | --: | --: | --: | --: |")
    for (mode, label), t in totals.items():
        mine = comparable.get((mode, label))
        theirs = comparable.get((mode, "deepspeed"))
        vs = f"{mine['worst']:.3f} | {mine['launches'] / theirs['launches']:.2f} | {mine['gpu_hours'] / theirs['gpu_hours']:.2f}" if mine and theirs and theirs["launches"] else "- | - | -"
        print(f"| {mode} | {label} | {t['runs']} | {t['launches']} | {t['oom']} | {t['gpu_hours']:.2f} | {t['worst']:.3f} | {vs} |")


if __name__ == "__main__":
    main()
