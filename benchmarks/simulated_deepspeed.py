#!/usr/bin/env python3
"""A simulated ``deepspeed`` launcher for `make bench`: it speaks the launcher's command line
(``--include``, ``--hostfile``, ``--master_port``, ... then the script and its arguments), reads
the experiment's config (a path, or base64 JSON as DeepSpeed's autotuner passes it), and answers
as the engine would on the surface (or replay of real runs) named by ``SIM_SURFACE``: ``model_info.json`` for a profile
run, the metrics file for an experiment, or a CUDA out-of-memory / NCCL error on stderr.

It does not sleep: each launch is appended to ``SIM_LEDGER`` (JSON lines) with the simulated
seconds it would have taken, and the benchmark adds them up as GPU-hours.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import surfaces  # noqa: E402

VALUE_OPTIONS = {"--include", "--exclude", "--hostfile", "--master_port", "--master_addr", "--num_gpus", "--num_nodes",
                 "--launcher", "--launcher_args", "--enable_each_rank_log", "--bind_core_list", "--ssh_port",
                 "--venv_script", "--log_level"}


def _split(argv: list[str]) -> tuple[dict[str, str], str, list[str]]:
    launcher: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        key = argv[i].split("=", 1)[0]
        if "=" in argv[i]:
            launcher[key], i = argv[i].split("=", 1)[1], i + 1
        elif key in VALUE_OPTIONS:
            launcher[key], i = argv[i + 1], i + 2
        else:
            launcher[key], i = "1", i + 1
    return launcher, argv[i], argv[i + 1 :]


def _config(args: list[str]) -> dict:
    for flag in ("--deepspeed_config", "--deepspeed"):
        if flag in args:
            value = args[args.index(flag) + 1]
            if os.path.isfile(value):
                with open(value) as f:
                    return json.load(f)
            return json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    sys.exit("simulated deepspeed: no --deepspeed_config/--deepspeed in the script arguments")


def _device_memory() -> float:
    import psutil  # what DeepSpeed's CPU accelerator reports as the memory of a device

    return float(psutil.virtual_memory().total)


def _ledger(entry: dict) -> None:
    path = os.environ.get("SIM_LEDGER")
    if not path:
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(entry) + "\n")


def _gpus(launcher: dict[str, str]) -> int:
    include = launcher.get("--include")
    if include:
        return sum(len(part.split(":", 1)[1].split(",")) if ":" in part else 1 for part in include.split("@"))
    return int(launcher.get("--num_gpus", "1")) * int(launcher.get("--num_nodes", "1"))


def _write(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f)


def main() -> int:
    launcher, script, args = _split(sys.argv[1:])
    ds = _config(args)
    surface = surfaces.by_name(os.environ["SIM_SURFACE"])
    gpus = _gpus(launcher)
    autotuning = ds.get("autotuning") or {}
    if autotuning.get("model_info_path"):
        # The profile run: stage 3, micro-batch 1, stopped after the first forward pass.
        _write(autotuning["model_info_path"], {**surfaces.model_info(surface, _device_memory()), "rank": 0})
        _ledger({"profile": True, "outcome": "ok", "seconds": surface.startup_s + 10.0, "gpus": gpus})
        return 0
    if not autotuning.get("metric_path"):
        print("simulated training run: nothing to measure")
        return 0
    config = surfaces.Config.from_ds_config(ds, keys=surfaces.spaces_of(surface)[1])
    outcome = surface.evaluate(config)
    entry = {"stage": config.stage, "mbs": config.mbs, "gas": config.gas, "knobs": dict(config.knobs),
             "offload": [config.offload_optimizer, config.offload_param], "outcome": outcome.kind,
             "seconds": outcome.seconds, "gpus": gpus}
    if outcome.kind == "oom":
        _ledger(entry)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
              "of 79.11 GiB of which 1.02 GiB is free.", file=sys.stderr)
        return 1
    if outcome.kind == "crash":
        _ledger(entry)
        print("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error", file=sys.stderr)
        return 1
    ledger = os.environ.get("SIM_LEDGER")
    before = [json.loads(line) for line in open(ledger)] if ledger and os.path.exists(ledger) else []
    if hasattr(surface, "measure_nth"):
        # A replay of recorded runs (benchmarks/replays.py): the k-th launch of a config draws its k-th run.
        same = ("stage", "mbs", "gas", "knobs", "offload")
        throughput = surface.measure_nth(config, sum(all(e.get(k) == entry[k] for k in same) for e in before))
    else:
        throughput = surface.measure(config, len(before))
    train_batch = config.mbs * config.gas * gpus
    latency = train_batch / throughput
    _write(autotuning["metric_path"], {"throughput": throughput, "latency": latency * 1000.0,
                                       "FLOPS_per_gpu": throughput * 1e11 / gpus})
    _ledger({**entry, "measured": throughput, "true": outcome.throughput})
    return 0


if __name__ == "__main__":
    sys.exit(main())
