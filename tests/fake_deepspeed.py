#!/usr/bin/env python3
"""A stand-in for the ``deepspeed`` launcher, for fast orchestration tests.

It parses the launcher's command line as ``deepspeed`` does, reads the experiment's config,
and writes what DeepSpeed's engine would: ``model_info.json`` for a profile run, the metrics
file for an experiment. The performance surface and the faults come from the JSON in
``FAKE_DS_SURFACE``:

    base        {stage: throughput scale}            default {"0": 100, "1": 120, "2": 110, "3": 80}
    peak        micro-batch size of peak throughput   default 24
    oom_above   {stage: largest mbs that fits}        default none
    stderr_text a line printed after the OOM error
    error_at    micro-batch sizes that crash          (exit 1, a non-OOM traceback)
    rank_log_text  written to the rank log under --enable_each_rank_log, as a rank would
    hang_at     micro-batch sizes that never finish   (with a child process, to test group kill)
    no_metrics_at  sizes that exit 0 without metrics
    profile_fail   the profile run crashes
    profile_gate   a path: the profile run waits until it exists
    script_error   printed to stderr by every run but training, which exits 2 (the script's argparse refusing its arguments)
    num_params, activation_mem_per_gpu               the model info written by the profile run
    knob_gain   {knob: {value: factor}}              multiplies throughput
    knob_gain_at {stage: {knob: {value: factor}}}    ...at one stage only, on top
    knob_room   {knob: {value: sizes}}               raises oom_above: a smaller buffer leaves room
    duration, duration_at {mbs: seconds}             how long an experiment takes
    knob_duration {knob: {value: seconds}}           ...with that knob set so (say, to interrupt one knob experiment)
    noise       relative sd of a measurement          default 0; drawn per experiment name (repeats differ)
    offload_factor  throughput with the optimizer offloaded, as a share   default 0.5 (a real offload is never faster)

A config without an ``autotuning`` section is a training run: it prints and exits with
``FAKE_DS_TRAIN_EXIT`` (default 0). Every launch is appended to ``FAKE_DS_LOG`` (JSON lines) with its start and end times
and the ``FAKE_DS_NODE`` label (one machine posing as several nodes: their GPU ids repeat).
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

LAUNCHER_VALUE_OPTIONS = {"--include", "--exclude", "--hostfile", "--master_port", "--master_addr", "--num_gpus", "--num_nodes",
                          "--launcher", "--launcher_args", "--enable_each_rank_log", "--bind_core_list", "--ssh_port",
                          "--venv_script", "--log_level"}


def parse(argv):
    launcher, i = {}, 0
    while i < len(argv) and argv[i].startswith("--"):
        key = argv[i].split("=", 1)[0]
        if "=" in argv[i]:
            launcher[key] = argv[i].split("=", 1)[1]
            i += 1
        elif key in LAUNCHER_VALUE_OPTIONS:
            launcher[key] = argv[i + 1]
            i += 2
        else:
            launcher[key] = True
            i += 1
    return launcher, argv[i], argv[i + 1 :]


def config_path(args):
    for flag in ("--deepspeed_config", "--deepspeed"):
        for j, a in enumerate(args):
            if a == flag and j + 1 < len(args) and args[j + 1].endswith(".json"):
                return args[j + 1]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
    sys.exit("fake deepspeed: no config in the script arguments")


def _key(value):
    """A knob value as a table key: 5e8 and 500000000 are one size."""
    return json.dumps(float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value)


def log(entry):
    path = os.environ.get("FAKE_DS_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def main():
    # Ended by its process group (a timeout, an interrupt, an orphan): still log the launch.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    surface = json.loads(os.environ.get("FAKE_DS_SURFACE") or "{}")
    launcher, script, args = parse(sys.argv[1:])
    if not os.path.isfile(script):
        sys.exit(f"fake deepspeed: script {script} not found")
    with open(config_path(args)) as f:
        config = json.load(f)
    auto = config.get("autotuning", {})
    zero = config.get("zero_optimization", {})
    stage = int(zero.get("stage", 0))
    mbs = int(config.get("train_micro_batch_size_per_gpu", 1))
    gas = int(config.get("gradient_accumulation_steps", 1))
    start = time.time()
    entry = {"start": start, "include": launcher.get("--include"), "master_port": launcher.get("--master_port"),
             "stage": stage, "mbs": mbs, "gas": gas, "args": args, "pid": os.getpid(), "launcher": launcher,
             "argv": sys.argv[1:], "node": os.environ.get("FAKE_DS_NODE")}
    print(f"[INFO] fake deepspeed launching {script} pid {os.getpid()}", flush=True)
    # A harmless warning that mentions "Error": it must not fail the run.
    print("UserWarning: torch.distributed ErrorHandler is deprecated", file=sys.stderr, flush=True)
    rank_dir = launcher.get("--enable_each_rank_log")
    if rank_dir and surface.get("rank_log_text"):
        os.makedirs(rank_dir, exist_ok=True)
        with open(os.path.join(rank_dir, time.strftime("%Y%m%d%H%M%S") + "_rank0.log"), "w") as f:
            f.write(surface["rank_log_text"] + "\n")
    try:
        if not auto:
            entry["training"] = True
            print(f"training with micro-batch {mbs}", flush=True)
            return int(os.environ.get("FAKE_DS_TRAIN_EXIT", "0"))
        if surface.get("script_error"):
            print(surface["script_error"], file=sys.stderr)
            print(f"[ERROR] [launch.py:325:sigkill_handler] ['python', '-u', '{script}'] exits with return code = 2", file=sys.stderr)
            return 2
        if auto.get("model_info", {}).get("profile"):
            entry["profile"] = True
            if surface.get("profile_fail"):
                print("Traceback (most recent call last):\nValueError: model has no parameters", file=sys.stderr)
                return 1
            while surface.get("profile_gate") and not os.path.exists(surface["profile_gate"]):
                time.sleep(0.01)
            info = {"num_params": surface.get("num_params", 1_000_000), "trainable_num_params": surface.get("num_params", 1_000_000),
                    "activation_mem_per_gpu": surface.get("activation_mem_per_gpu", 1_000_000), "rank": 0}
            with open(auto["model_info_path"], "w") as f:
                json.dump(info, f)
            return 0
        if mbs in surface.get("hang_at", []):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
            print(f"child pid {child.pid}", flush=True)
            time.sleep(3600)
        oom_above = surface.get("oom_above", {}).get(str(stage))
        for knob, rooms in surface.get("knob_room", {}).items():
            if oom_above is not None:
                oom_above += int({_key(json.loads(v)): n for v, n in rooms.items()}.get(_key(zero.get(knob)), 0))
        if oom_above is not None and mbs > oom_above:
            print("Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr)
            if "stderr_text" in surface:
                print(surface["stderr_text"], file=sys.stderr)
            return 1
        if mbs in surface.get("error_at", []):
            print("Traceback (most recent call last):\nRuntimeError: NCCL communicator was aborted", file=sys.stderr)
            return 1
        if mbs in surface.get("no_metrics_at", []):
            return 0
        base = float(surface.get("base", {"0": 100, "1": 120, "2": 110, "3": 80}).get(str(stage), 100))
        peak = float(surface.get("peak", 24))
        throughput = base * mbs / (1 + (mbs / peak) ** 2)
        tables = [*surface.get("knob_gain", {}).items(), *surface.get("knob_gain_at", {}).get(str(stage), {}).items()]
        for knob, gains in tables:
            gains = {_key(json.loads(value)): factor for value, factor in gains.items()}
            throughput *= float(gains.get(_key(zero.get(knob)), 1.0))
        if isinstance(zero.get("offload_optimizer"), dict) and zero["offload_optimizer"].get("device", "none") != "none":
            throughput *= float(surface.get("offload_factor", 0.5))
        if surface.get("noise"):
            throughput *= 1.0 + float(surface["noise"]) * random.Random(os.path.basename(os.path.dirname(auto["metric_path"]))).gauss(0.0, 1.0)
        latency = mbs * gas * 1e6 / throughput
        metrics = {"throughput": throughput, "latency": latency, "FLOPS_per_gpu": throughput * 1e9, "rank": 0}
        seconds = float(surface.get("duration_at", {}).get(str(mbs), surface.get("duration", 0.0)))
        for knob, table in surface.get("knob_duration", {}).items():
            seconds = float({_key(json.loads(value)): t for value, t in table.items()}.get(_key(zero.get(knob)), seconds))
        time.sleep(seconds)
        with open(auto["metric_path"], "w") as f:
            json.dump(metrics, f)
        return 0
    finally:
        entry["end"] = time.time()
        log(entry)


if __name__ == "__main__":
    sys.exit(main())
