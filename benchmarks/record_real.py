"""Record real DeepSpeed runs for the planner benchmark's replays (benchmarks/replays.py).

Each job is a plain DeepSpeed script of benchmarks/replay_jobs/ with a ``max_train_batch_size``
cap; every config of its grid -- a ZeRO stage with an offload variant, a micro-batch size, the
accumulation that cap gives it (as optuna-ds gives it: ``cap // (size * ranks)``) -- is
launched ``--runs`` times through DeepSpeed's own ``deepspeed`` launcher, one launch at a time,
in rounds of every config in a fresh random order (drift and load spread over all configs, not
over the five runs of one). Each launch holds ``/tmp/optuna-ds-e2e.lock`` (the real-DeepSpeed
tests' lock: they share ports) and uses master ports from 29900. The engine measures the run
as it does for optuna-ds and DeepSpeed's autotuner (``autotuning.metric_path``: the metrics
file optuna-ds reads), with ``wall_clock_breakdown`` on. The machine is shared and loaded:
that is the noise recorded, with each launch's load average.

``benchmarks/replays/<job>.json``, written after every launch (a cut recording keeps what ran
and a second one adds what is missing)::

    {"job": "mlp-1m", "script": "benchmarks/replay_jobs/mlp.py", "args": [...],
     "hardware": {"accelerator": "cpu", "ranks": 1, "cores": 2, "device_memory_bytes": ...},
     "model": {"params": ..., "activation_per_sample_bytes": ...},  # the engine's profile run
     "max_train_batch_size": 256, "profile_steps": [3, 5], "profile_launch_s": ...,
     "recorded": "2026-11-26", "deepspeed": "0.19.8",
     "runs": [{"stage": 0, "offload": "" | "optimizer" | "optimizer+param", "micro_batch": 16,
               "accumulation": 16, "knobs": {}, "outcome": "ok" | "oom" | "crash",
               "reason": null | "one line",
               "samples_per_s": ...,       # the metrics file's throughput (DeepSpeed's metric)
               "step_times_s": [...],      # fwd + bwd + step of each step the engine logged
                                           # from profile_steps[0] on (the last step exits
                                           # before it logs: it is the metric's)
               "timers_ms": {"fwd": ..., "bwd": ..., "bwd_inner": ..., "bwd_allreduce": ...,
                             "step": ...},  # wall_clock_breakdown's, mean of those steps
               "peak_memory_bytes": ...,   # the largest RSS peak of the launch's processes
                                           # (a rank's: the launchers' are smaller)
               "launch_s": ...,            # the launch's wall time, start-up included
               "load1": ...}]}             # 1-minute load average as it started

The GPU job (branch gpu) uses the same format with ``"accelerator": "cuda"``.

    python benchmarks/record_real.py --minutes 80          # every job, 5 runs of each config
    python benchmarks/record_real.py --jobs mlp-1m --runs 1
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import fcntl
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "replays"
VENV_BIN = Path("/work/main/.venv/bin")
LOCK = "/tmp/optuna-ds-e2e.lock"
FIRST_PORT = 29900
PROFILE_STEPS = (3, 5)  # optuna-ds's and DeepSpeed's defaults
TIMEOUT_S = 900.0
OFFLOADS = {"": {}, "optimizer": {"offload_optimizer": {"device": "cpu"}},
            "optimizer+param": {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}}


@dataclasses.dataclass(frozen=True)
class Job:
    script: str
    args: tuple[str, ...]
    ranks: int
    cap: int  # max_train_batch_size
    # The micro-batch sizes of each arm (stage, offload) recorded. A launch takes 45-70 s on
    # this loaded machine (three interpreters import torch and DeepSpeed: the runner, launch.py,
    # the script), so 16 configs fill the recording's budget (five runs of each, about 80
    # minutes): stage 0 at the cap and a smaller size, every other arm at the cap.
    arms: tuple[tuple[int, str, tuple[int, ...]], ...]


JOBS = {
    "mlp-1m": Job(script="mlp.py", args=(), ranks=1, cap=256, arms=(
        (0, "", (32, 256)), (1, "", (256,)), (2, "", (256,)), (3, "", (256,)))),
    "transformer-4m": Job(script="tiny_transformer.py", args=(), ranks=1, cap=64, arms=(
        (0, "", (8, 64)), (1, "", (64,)), (2, "", (64,)), (3, "", (64,)))),
    "mlp-2m-2ranks": Job(script="mlp.py", args=("--hidden", "768"), ranks=2, cap=128, arms=(
        (0, "", (8, 64)), (1, "", (64,)), (2, "", (64,)), (3, "", (64,)), (2, "optimizer", (64,)))),
}


def grid(job: Job) -> list[tuple[int, str, int]]:
    """(stage, offload, micro-batch) of every config the job records."""
    return [(stage, offload, mbs) for stage, offload, sizes in job.arms for mbs in sizes]


def accumulation(job: Job, mbs: int) -> int:
    return max(1, job.cap // (mbs * job.ranks))


def ds_config(job: Job, *, stage: int, offload: str, mbs: int, metric_path: str) -> dict[str, Any]:
    gas = accumulation(job, mbs)
    return {
        "train_micro_batch_size_per_gpu": mbs, "gradient_accumulation_steps": gas, "train_batch_size": mbs * gas * job.ranks,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "wall_clock_breakdown": True,
        "zero_optimization": {"stage": stage, **OFFLOADS[offload]},
        "autotuning": {"enabled": True, "metric_path": metric_path, "start_profile_step": PROFILE_STEPS[0],
                       "end_profile_step": PROFILE_STEPS[1]},
    }


def environment() -> dict[str, str]:
    # A private copy of the venv's built CPU ops: processes with other compiler flags rebuild the
    # shared one in turn (minutes a launch on this machine), which is no start-up of a real job.
    extensions = os.environ.get("REPLAY_TORCH_EXTENSIONS_DIR", "/tmp/optuna-ds-replay-extensions")
    return {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
            "TORCH_EXTENSIONS_DIR": extensions}


_TIMERS = re.compile(r"time \(ms\) \| fwd: .*")


def parse_timers(output: str) -> list[dict[str, float]]:
    """The global timers the engine logs once a step (``time (ms) | fwd: ... | step: ...``)."""
    steps = []
    for line in _TIMERS.findall(output):
        fields = (part.split(":") for part in line.split("|")[1:])
        steps.append({k.strip(): float(v) for k, v in fields})
    return steps


def _reason(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line):
            return line[:300]
    return (lines[-1] if lines else "no output")[:300]


def classify(rc: int | None, output: str, metrics: dict | None) -> tuple[str, str | None]:
    if metrics is not None:
        return "ok", None
    if rc is None:
        return "crash", f"timed out after {TIMEOUT_S:.0f} s"
    if re.search(r"out of memory|OutOfMemoryError|Cannot allocate memory", output, re.IGNORECASE):
        return "oom", _reason(output)
    return "crash", _reason(output)


def launch(job: Job, ds: dict[str, Any], work: Path, port: int) -> tuple[int | None, str, float, int, float]:
    """One launch holding the real-DeepSpeed lock: exit status (None: timed out), output, wall
    seconds from the lock on, the largest RSS peak of its processes, the load as it began."""
    (work / "ds_config.json").write_text(json.dumps(ds))
    cmd = [str(VENV_BIN / "deepspeed"), "--num_gpus", str(job.ranks), "--master_port", str(port),
           str(HERE / "replay_jobs" / job.script), "--deepspeed_config", "ds_config.json", *job.args]
    with open(LOCK, "a") as lock, open(work / "output.txt", "w+") as out:
        fcntl.flock(lock, fcntl.LOCK_EX)
        load1 = os.getloadavg()[0]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=work, env=environment(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        rc: int | None = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                rc = os.waitstatus_to_exitcode(status)
                proc.returncode = rc
                break
            if time.monotonic() - start > TIMEOUT_S:
                os.killpg(proc.pid, 9)  # the launch's own process group
                _, _, usage = os.wait4(proc.pid, 0)
                proc.returncode = -9
                break
            time.sleep(0.05)
        wall = time.monotonic() - start
        out.seek(0)
        return rc, out.read(), wall, usage.ru_maxrss * 1024, load1


def run_once(job: Job, *, stage: int, offload: str, mbs: int, port: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="optuna-ds-replay-") as tmp:
        work = Path(tmp)
        metric_path = str(work / "metrics.json")
        rc, output, wall, peak, load1 = launch(job, ds_config(job, stage=stage, offload=offload, mbs=mbs, metric_path=metric_path),
                                               work, port)
        metrics = json.loads(Path(metric_path).read_text()) if os.path.exists(metric_path) else None
    outcome, reason = classify(rc, output, metrics)
    steps = parse_timers(output)
    window = steps[PROFILE_STEPS[0]:]
    return {
        "stage": stage, "offload": offload, "micro_batch": mbs, "accumulation": accumulation(job, mbs), "knobs": {},
        "outcome": outcome, "reason": reason,
        "samples_per_s": round(metrics["throughput"], 3) if metrics else None,
        "step_times_s": [round((s["fwd"] + s["bwd"] + s["step"]) / 1000.0, 5) for s in window],
        "timers_ms": {k: round(sum(s[k] for s in window) / len(window), 3) for k in window[0]} if window else {},
        "peak_memory_bytes": peak, "launch_s": round(wall, 2), "load1": round(load1, 2),
    }


def profile(job: Job, port: int) -> tuple[dict[str, Any], float]:
    """The engine's profile run, as optuna-ds launches it: stage 3, micro-batch 1."""
    with tempfile.TemporaryDirectory(prefix="optuna-ds-replay-") as tmp:
        work = Path(tmp)
        info_path = str(work / "model_info.json")
        ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": job.ranks,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 3},
              "autotuning": {"enabled": True, "model_info_path": info_path, "model_info": {"profile": True}}}
        rc, output, wall, _, _ = launch(job, ds, work, port)
        if not os.path.exists(info_path):
            sys.exit(f"record_real: the profile run of {job.script} failed (rc {rc}): {_reason(output)}")
        info = json.loads(Path(info_path).read_text())
    return {"params": info["num_params"], "activation_per_sample_bytes": info["activation_mem_per_gpu"]}, round(wall, 2)


def _device_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def load(name: str) -> dict[str, Any] | None:
    path = OUT / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def save(data: dict[str, Any]) -> None:
    """One run a line: the file stays readable in a diff and small."""
    runs = ",\n  ".join(json.dumps(r, separators=(",", ":")) for r in data["runs"])
    head = json.dumps({k: v for k, v in data.items() if k != "runs"}, indent=1)[:-2]
    path = OUT / f"{data['job']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f'{head},\n "runs": [\n  {runs}\n ]\n}}\n')
    tmp.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--runs", type=int, default=5, help="runs of each config")
    parser.add_argument("--minutes", type=float, default=80.0, help="launch nothing new after this long")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    import deepspeed

    started = time.monotonic()
    data: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(args.jobs):
        job = JOBS[name]
        data[name] = load(name) or {}
        if not data[name]:
            model, profile_s = profile(job, FIRST_PORT + i)
            data[name] = {"job": name, "script": f"benchmarks/replay_jobs/{job.script}", "args": list(job.args),
                          "hardware": {"accelerator": "cpu", "ranks": job.ranks, "cores": os.cpu_count(),
                                       "device_memory_bytes": _device_memory()},
                          "model": model, "max_train_batch_size": job.cap, "profile_steps": list(PROFILE_STEPS),
                          "profile_launch_s": profile_s, "recorded": datetime.date.today().isoformat(),
                          "deepspeed": deepspeed.__version__, "runs": []}
            save(data[name])
            print(f"{name}: profile {model} in {profile_s} s", flush=True)
    rng = random.Random(args.seed)
    launches = 0
    for round_ in range(args.runs):
        todo = [(name, config) for name in args.jobs for config in grid(JOBS[name])
                if sum((r["stage"], r["offload"], r["micro_batch"]) == config for r in data[name]["runs"]) <= round_]
        rng.shuffle(todo)
        for name, (stage, offload, mbs) in todo:
            if time.monotonic() - started > args.minutes * 60:
                print(f"stopped after {args.minutes:g} minutes ({launches} launches)")
                return
            run = run_once(JOBS[name], stage=stage, offload=offload, mbs=mbs, port=FIRST_PORT + launches % 50)
            launches += 1
            data[name]["runs"].append(run)
            save(data[name])
            print(f"[{time.monotonic() - started:6.0f}s] {name} z{stage}{'+' + offload if offload else ''} mbs {mbs} gas "
                  f"{run['accumulation']}: {run['outcome']} {run['samples_per_s']} samples/s, launch {run['launch_s']} s, "
                  f"load {run['load1']}{', ' + run['reason'] if run['reason'] else ''}", flush=True)


if __name__ == "__main__":
    main()
