"""Record a GPU job for the replay benchmark (``benchmarks/replays/<job>.json``).

Every arm (ZeRO stage, and optimizer offload where asked) over a grid of micro-batch sizes up to
the first out-of-memory size, each config run ``--reps`` times, the repetitions interleaved (pass
after pass, each walking every arm in a rotated order). A launch costs start-up that a lent
GPU's minutes cannot pay a hundred times, so:

- ``--launches N`` first starts N real ``deepspeed`` launches of this script (``--single``, one
  config each), timed from the launcher's start to the script's first line, to its engine, and
  to the launcher's exit: the start-up a launch pays before and after the engine;
- every other run happens in this process: one engine per arm and pass, fed each size in turn
  (the engine never checks the batch it is given, and sizes ascend, so the first out-of-memory
  size ends the arm's walk; the allocator's cache is emptied between sizes), and ``launch_s`` is
  the measured start-up plus the engine's initialisation plus five steps (the product's profile
  runs steps 1-5 and exits).

An offloaded arm's walk (DeepSpeedCPUAdam, ZeRO-2) leaves 4-9 GiB of device memory behind that
``engine.destroy()`` does not free, and every later walk in the process paid it (peaks up, the
out-of-memory size down, throughput 5-10% lower; seen on the H100): the GPU arms walk in one
process, each offloaded walk in a process of its own (``--walks 1 --resume``; device.sh).

Each run records what the product reads or will read: the samples per second of the measured
steps, each step's time, DeepSpeed's ``wall_clock_breakdown`` timers per step (ms), and the peak
device memory as NVML would report it (memory outside torch's allocator plus the allocator's
peak reservation).
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import itertools
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

T0 = time.time()  # before the imports: a launch's start-up includes them

import deepspeed  # noqa: E402
import torch  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402

from gpt import GPT  # noqa: E402
from gpt import batch  # noqa: E402
from gpt import param_count  # noqa: E402

TIMERS = ("fwd", "bwd", "bwd_allreduce", "step")
PROFILE_STEPS = 5  # what one of the product's runs executes: end_profile_step 5, then exit


def _arm(text: str) -> tuple[int, str]:
    """``2`` or ``2+optimizer`` or ``3+optimizer+param``: a stage and its offload."""
    stage, _, offload = text.partition("+")
    return int(stage), offload


def ds_config(stage: int, offload: str, micro_batch: int, accumulation: int, *, cpu_adam: bool) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage}
    if "optimizer" in offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if "param" in offload:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": accumulation,
        "bf16": {"enabled": get_accelerator().is_bf16_supported()},
        # torch's Adam on the GPU: no CUDA op to build on a bare machine; offloaded, DeepSpeed's
        # CPU Adam where its op was built beforehand (--cpu-adam), else torch's Adam on the CPU
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": not (cpu_adam and "optimizer" in offload)}},
        "zero_optimization": zero,
        "wall_clock_breakdown": True,
        "steps_per_print": 10**9,
    }


def _device_memory_outside_torch() -> int:
    """Bytes the device has in use beyond torch's reservation (context, NCCL, cuBLAS), per NVML."""
    if get_accelerator().device_name() != "cuda":
        return 0
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def _sync() -> None:
    get_accelerator().synchronize()


class Job:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def model(self) -> GPT:
        a = self.args
        torch.manual_seed(0)
        with torch.device(get_accelerator().current_device_name()):
            return GPT(vocab=a.vocab, hidden=a.hidden, layers=a.layers, heads=a.heads, seq=a.seq)

    def walk(self, stage: int, offload: str, sizes: list[int], *, startup: float, deadline: float) -> list[dict[str, Any]]:
        """One engine at this arm, fed each size in turn until the first out-of-memory one."""
        a = self.args
        runs: list[dict[str, Any]] = []
        engine = None
        t = time.perf_counter()
        try:
            model = self.model()
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                              config=ds_config(stage, offload, sizes[0], a.accumulation, cpu_adam=a.cpu_adam))
            del model
            _sync()
        except Exception as e:  # noqa: BLE001 - an arm that cannot start: its first size's failure
            init_s = time.perf_counter() - t
            runs.append(self._failed(stage, offload, sizes[0], e, startup + init_s))
            e.__traceback__ = None
            return runs
        init_s = time.perf_counter() - t
        for size in sizes:
            if time.time() > deadline:
                break
            run = self._measure(engine, stage, offload, size, startup=startup, init_s=init_s)
            runs.append(run)
            if run["outcome"] != "ok":
                break
        try:
            engine.destroy()
        except Exception as e:  # noqa: BLE001 - an engine an out-of-memory step left half-way
            print(f"z{stage} {offload}: destroy failed: {type(e).__name__}: {e}", file=sys.stderr)
        return runs

    def _measure(self, engine: Any, stage: int, offload: str, size: int, *, startup: float, init_s: float) -> dict[str, Any]:
        a = self.args
        gc.collect()
        get_accelerator().empty_cache()
        get_accelerator().reset_peak_memory_stats()
        times: list[float] = []
        timers = dict.fromkeys(TIMERS, 0.0)
        t = time.perf_counter()
        try:
            for step in range(a.warmup + a.steps):
                _sync()
                s = time.perf_counter()
                for _ in range(a.accumulation):
                    loss = engine(batch(engine, size, vocab=a.vocab, seq=a.seq))
                    engine.backward(loss)
                    engine.step()
                    if step >= a.warmup:  # the engine resets its timers after each step: read them first
                        for name, ms in engine.get_wall_clock_timers().items():
                            if name in timers:
                                timers[name] += ms
                _sync()
                times.append(time.perf_counter() - s)
        except Exception as e:  # noqa: BLE001 - out of memory, or a crash: recorded as such
            run = self._failed(stage, offload, size, e, startup + init_s + time.perf_counter() - t)
            e.__traceback__ = None
            loss = None
            return run
        measured = times[a.warmup:]
        steps_for_launch = times[0] + (PROFILE_STEPS - 1) * sum(measured) / len(measured)
        return {
            **self._run(stage, offload, size),
            "outcome": "ok",
            "reason": "",
            "samples_per_s": round(size * a.accumulation * len(measured) / sum(measured), 4),
            "step_times_s": [round(x, 6) for x in measured],
            "timers_ms": {name: round(ms / len(measured), 4) for name, ms in timers.items()},
            "peak_memory_bytes": _device_memory_outside_torch() + get_accelerator().max_memory_reserved(),
            "launch_s": round(startup + init_s + steps_for_launch, 3),
            "load1": round(os.getloadavg()[0], 2),
        }

    def _run(self, stage: int, offload: str, size: int) -> dict[str, Any]:
        return {"stage": stage, "offload": offload, "micro_batch": size, "accumulation": self.args.accumulation, "knobs": {}}

    def _failed(self, stage: int, offload: str, size: int, e: BaseException, launch_s: float) -> dict[str, Any]:
        oom = _is_oom(e)
        reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        return {
            **self._run(stage, offload, size),
            "outcome": "oom" if oom else "crash",
            "reason": reason,
            "samples_per_s": None,
            "step_times_s": [],
            "timers_ms": {},
            "peak_memory_bytes": None,
            "launch_s": round(launch_s, 3),
            "load1": round(os.getloadavg()[0], 2),
        }


def single(args: argparse.Namespace) -> None:
    """One config under the real launcher: its run and its start-up marks, to ``--single-out``."""
    marks = {"imported": T0_IMPORTED}
    deepspeed.init_distributed()
    marks["distributed"] = time.time()
    stage, offload = _arm(args.single_arm)
    job = Job(args)
    runs = job.walk(stage, offload, [args.single_size], startup=0.0, deadline=float("inf"))
    marks["measured"] = time.time()
    Path(args.single_out).write_text(json.dumps({"run": runs[0], "start": T0, "marks": marks}))


def launches(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Real ``deepspeed`` launches of ``--single`` runs, timed from outside: their timings, their runs."""
    timings, runs = [], []
    for i in range(args.launches):
        arm = args.arms[i % len(args.arms)]
        result = Path(args.out).with_suffix(f".launch{i}.json")
        cmd = [args.deepspeed, "--num_gpus", "1", "--master_port", str(args.master_port + i), __file__,
               "--single-arm", arm, "--single-size", str(args.launch_size), "--single-out", str(result),
               *_model_args(args)]
        begun = time.time()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ended = time.time()
        if proc.returncode != 0 or not result.exists():
            print(proc.stdout[-3000:], file=sys.stderr)
            print(f"launch {i}: exit {proc.returncode}", file=sys.stderr)
            continue
        got = json.loads(result.read_text())
        result.unlink()
        marks = got["marks"]
        timing = {
            "arm": arm,
            "to_first_line_s": round(got["start"] - begun, 3),  # the launcher and the interpreter
            "imports_s": round(marks["imported"] - got["start"], 3),
            "init_distributed_s": round(marks["distributed"] - marks["imported"], 3),
            "engine_and_steps_s": round(marks["measured"] - marks["distributed"], 3),
            "exit_s": round(ended - marks["measured"], 3),  # the script's end, the launcher noticing
            "total_s": round(ended - begun, 3),
        }
        timing["startup_s"] = round(timing["total_s"] - timing["engine_and_steps_s"], 3)
        run = got["run"]
        if run["outcome"] == "ok":
            run["launch_s"] = round(timing["total_s"], 3)  # measured whole, not composed
        timings.append(timing)
        runs.append(run)
        print(json.dumps(timing), flush=True)
    return timings, runs


def _model_args(args: argparse.Namespace) -> list[str]:
    flags = [f"--{k}={getattr(args, k)}" for k in ("hidden", "layers", "heads", "seq", "vocab", "accumulation", "warmup", "steps")]
    return flags + (["--cpu-adam"] if args.cpu_adam else [])


def record(args: argparse.Namespace) -> None:
    """Walk every arm, pass after pass, until each size up to its edge ran ``--reps`` times; with
    ``--resume``, the runs of an earlier recording count (a device call that ran out of time)."""
    deadline = T0 + args.budget_s
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if args.resume:
        prior = json.loads(Path(args.resume).read_text())
        timings, runs = prior["launches"], prior["runs"]
    else:
        timings, runs = launches(args) if args.launches else ([], [])
    startup = (sum(t["startup_s"] for t in timings) / len(timings)) if timings else args.startup_s
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.master_port + 100))
    for var, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(var, value)
    deepspeed.init_distributed()
    job = Job(args)
    probe = GPT(vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads, seq=args.seq)
    params = param_count(probe)
    del probe
    arms = [_arm(a) for a in args.arms]
    done = Counter((r["stage"], r["offload"], r["micro_batch"]) for r in runs)
    ooms: dict[tuple[int, str], int] = {}
    for r in runs:
        if r["outcome"] == "oom":
            ooms[(r["stage"], r["offload"])] = min(r["micro_batch"], ooms.get((r["stage"], r["offload"]), r["micro_batch"]))
    walks = 0
    for rep in itertools.count():
        walked_any = False
        for stage, offload in arms[rep % len(arms):] + arms[:rep % len(arms)]:
            if time.time() > deadline:
                break
            edge = ooms.get((stage, offload))
            sizes = [s for s in (args.offload_sizes if offload else args.sizes)
                     if (edge is None or s <= edge) and done[(stage, offload, s)] < args.reps]
            if not sizes:
                continue
            if walks == args.walks > 0:
                break
            walked = job.walk(stage, offload, sizes, startup=startup, deadline=deadline)
            walks += 1
            walked_any = True
            for run in walked:
                done[(stage, offload, run["micro_batch"])] += 1
                if run["outcome"] == "oom":
                    ooms[(stage, offload)] = min(run["micro_batch"], ooms.get((stage, offload), run["micro_batch"]))
            runs += walked
            gc.collect()
            get_accelerator().empty_cache()
            print(f"pass {rep} z{stage}{'+' + offload if offload else ''}: " + ", ".join(
                f"{r['micro_batch']}:{r['samples_per_s'] if r['outcome'] == 'ok' else r['outcome']}" for r in walked), flush=True)
            write(args, params=params, runs=runs, timings=timings, startup=startup)
        if not walked_any or time.time() > deadline or walks == args.walks > 0:
            break
    write(args, params=params, runs=runs, timings=timings, startup=startup)
    short = [(stage, offload, s) for stage, offload in arms for s in (args.offload_sizes if offload else args.sizes)
             if s <= ooms.get((stage, offload), s) and done[(stage, offload, s)] < args.reps]
    print(f"configs with fewer than {args.reps} runs: {short or 'none'}", flush=True)


def _activation_per_sample(runs: list[dict[str, Any]]) -> int | None:
    """The least-squares slope of peak memory over micro-batch size at stage 0, from its runs
    below three quarters of its smallest out-of-memory size (nearer the edge the allocator flushes
    its cache and the peak reservation falls)."""
    zero = [r for r in runs if r["stage"] == 0 and not r["offload"]]
    edge = min((r["micro_batch"] for r in zero if r["outcome"] == "oom"), default=float("inf"))
    points = [(r["micro_batch"], r["peak_memory_bytes"]) for r in zero
              if r["outcome"] == "ok" and r["peak_memory_bytes"] and r["micro_batch"] <= 0.75 * edge]
    if len({m for m, _ in points}) < 2:
        return None
    mean_m = sum(m for m, _ in points) / len(points)
    mean_p = sum(p for _, p in points) / len(points)
    return int(sum((m - mean_m) * (p - mean_p) for m, p in points) / sum((m - mean_m) ** 2 for m, _ in points))


def write(args: argparse.Namespace, *, params: int, runs: list[dict[str, Any]], timings: list[dict[str, Any]], startup: float) -> None:
    acc = get_accelerator()
    gpu = torch.cuda.get_device_name() if acc.device_name() == "cuda" else platform.processor() or "cpu"
    doc = {
        "job": args.job,
        "script": "benchmarks/gpu/record.py " + " ".join(_model_args(args)),
        "hardware": {"accelerator": acc.device_name(), "gpu": gpu, "ranks": 1},
        "model": {"params": params, "activation_per_sample_bytes": _activation_per_sample(runs)},
        "max_train_batch_size": args.max_train_batch_size,
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "notes": [
            f"torch {torch.__version__}, DeepSpeed {deepspeed.__version__}, bf16, AdamW: torch's on the GPU (torch_adam), "
            + ("DeepSpeedCPUAdam offloaded" if args.cpu_adam else "torch's on the CPU offloaded (not DeepSpeedCPUAdam: slower than a user's offload)"),
            f"the first {len(timings)} runs are real `deepspeed` launches, launch_s measured whole; every other run was recorded in one process, "
            f"one engine per arm and repetition fed each size in turn, and its launch_s = the mean measured start-up of the real launches "
            f"({startup:.2f} s: launcher, interpreter, imports, init_distributed, exit) + the engine's initialisation + its first step at that size + "
            f"{PROFILE_STEPS - 1} x the mean measured step",
            f"per run: {args.warmup} warm-up step(s), then {args.steps} measured; samples_per_s over the measured steps; timers_ms: DeepSpeed's "
            "wall_clock_breakdown timers, mean per step; peak_memory_bytes: device memory outside torch's allocator + its peak reservation (what NVML reads)",
            "sizes beyond an arm's smallest out-of-memory size were not run; that size was tried again in each pass; "
            "the walks ran in more than one process, each resuming the file the one before wrote" if args.resume else
            "sizes beyond an arm's smallest out-of-memory size were not run; that size was tried again in each pass",
        ],
        "launches": timings,
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


def main() -> None:
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)  # wall_clock_breakdown logs every step
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--out", default="benchmarks/replays/gpt270m-h100.json")
    p.add_argument("--job", default="gpt270m-h100")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--accumulation", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--arms", nargs="+", default=["0", "1", "2", "3", "2+optimizer"])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 48, 64, 72, 80, 96, 128])
    p.add_argument("--offload-sizes", type=int, nargs="+", default=[8, 32, 64, 80, 96, 128])
    p.add_argument("--max-train-batch-size", type=int, default=128)
    p.add_argument("--cpu-adam", action="store_true", help="offloaded arms step with DeepSpeedCPUAdam (its op built)")
    p.add_argument("--launches", type=int, default=2, help="real deepspeed launches measuring start-up")
    p.add_argument("--launch-size", type=int, default=8)
    p.add_argument("--startup-s", type=float, default=0.0, help="start-up per launch without --launches")
    p.add_argument("--deepspeed", default="deepspeed")
    p.add_argument("--master-port", type=int, default=29610)
    p.add_argument("--budget-s", type=float, default=170.0, help="start no walk or size after this long")
    p.add_argument("--walks", type=int, default=0,
                   help="walk at most this many arms, then write and exit (0: no limit); an offloaded arm's walk leaves "
                        "device memory behind that every later walk in the process pays, so each runs in a process of its own")
    p.add_argument("--resume", help="a recording to complete: its runs count, its start-up measures are kept")
    p.add_argument("--single-arm")
    p.add_argument("--single-size", type=int)
    p.add_argument("--single-out")
    args = p.parse_args()
    if args.single_arm:
        single(args)
    else:
        record(args)


T0_IMPORTED = time.time()

if __name__ == "__main__":
    main()
