#!/usr/bin/env python3
"""The fake ``deepspeed`` launcher of the tests and the benchmarks.

It reads the command line with DeepSpeed's own launcher parser, reads the experiment's config (a
path, or base64 JSON as DeepSpeed's autotuner passes it), and answers as DeepSpeed's engine does
in autotuning mode: ``model_info.json`` for a profile run; for an experiment, one timer line per
optimizer step on rank 0's stdout, then the metrics file. What a config measures comes from a
surface: run as a script, the tests' surface below (``FAKE_DS_SURFACE``);
benchmarks/simulated_deepspeed.py answers from the benchmarks' physics and
tests/adversarial/hostile_deepspeed.py from a table of misbehaviours, both through this module.

The tests' surface is the JSON in ``FAKE_DS_SURFACE``:

    base        {stage: throughput scale}            default {"0": 100, "1": 120, "2": 110, "3": 80}
    peak        micro-batch size of peak throughput   default 24
    oom_above   {stage: largest mbs that fits}        default none
    stderr_text a line printed after the OOM error
    error_at    micro-batch sizes that crash          (exit 1, a non-OOM traceback)
    stderr_fail {stage: text}                         its runs print text to stderr and exit 1 (say, the disk full as they write)
    rank_log_text  written to the rank log under --enable_each_rank_log, as a rank would
    hang_at     micro-batch sizes that never finish   (with a child process, to test group kill)
    build_lock  an op name: a hanging run holds torch's build lock of that op, as a rank loading it does
    no_metrics_at  sizes that exit 0 without metrics
    profile_fail   the profile run crashes
    profile_gate   a path: the profile run waits until it exists
    script_error   printed to stderr by every run but training, which exits 2 (the script's argparse refusing its arguments)
    fixed_batch the micro-batch size the script trains whatever its config says (its own batch flag, not mapped):
                its steps take that size's time, and the engine counts the config's samples
    exit_step   {"factor": f, "at": sizes}          the exit step (DeepSpeed's figure) f times the steps' throughput: one
                step of a loaded machine
    fwd_stall   ms added to the forward timer (so to the step) of every logged step but the last: a loaded machine's
                waits for the CPU, which only lengthen a step (the exit step, DeepSpeed's figure, has none)
    script_steps  the steps the script trains, then exits 0: a window ending later never writes its metrics
    warmup      {"steps": k, "slow": f, "at": sizes}  the first k steps are slower (step i by 1 + f (1 - (i-1)/k)),
                at every micro-batch size or those listed: a warm-up that outlasts a short profiled window
    num_params, activation_mem_per_gpu               the model info written by the profile run
    knob_gain   {knob: {value: factor}}              multiplies throughput
    knob_gain_at {stage: {knob: {value: factor}}}    ...at one stage only, on top
    knob_room   {knob: {value: sizes}}               raises oom_above: a smaller buffer leaves room
    duration, duration_at {mbs: seconds}             how long an experiment takes
    knob_duration {knob: {value: seconds}}           ...with that knob set so (say, to interrupt one knob experiment)
    noise       relative sd of a measurement          default 0; drawn per experiment name (repeats differ), and per step timed
    offload_factor  throughput with the optimizer offloaded, as a share   default 0.5 (a real offload is never faster)
    checkpointing   activation checkpointing's physics: {"flag": the script's switch (on: the bare flag among its
                arguments), "kept": the share of a sample's activations it keeps (oom_above grows by 1/kept),
                "ignored": the script takes the flag and never checkpoints, "unsupported": the model refuses it (the
                Trainer's ValueError), "configures": the script calls deepspeed.checkpointing.configure with the
                config (its log lines; cpu_checkpointing true keeps "section_kept" more)}. On, the backward
                recomputes the forward: the step takes a forward longer, as the timers show it.
    autotp      AutoTP's physics, for a config whose tensor_parallel.autotp_size t > 1: {"factor": its throughput at a
                size both run, as a share (default 0.9), "kept": the share of a sample's memory a rank keeps
                (oom_above grows by 1/kept; default 1/t), "fails": the script cannot run it (its data differ
                within a group: DeepSpeed's assertion)}. The metrics file counts each sample once per rank of its
                group, as DeepSpeed 0.19.8's engine does (its train_batch_size counts every rank): t times the samples.

A config without autotuning enabled is a training run: it prints and exits with
``FAKE_DS_TRAIN_EXIT`` (default 0). Every launch is appended to ``FAKE_DS_LOG`` (JSON lines) with its start and end times
and the ``FAKE_DS_NODE`` label (one machine posing as several nodes: their GPU ids repeat).
"""
from __future__ import annotations

import argparse
import ast
import base64
import dataclasses
import fcntl
import functools
import importlib.machinery
import json
import os
import random
import signal
import subprocess
import sys
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class _Built(argparse.ArgumentParser):
    """An argument parser whose ``parse_args`` hands back the parser itself, unparsed."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        return self


@functools.cache
def deepspeed_parser(module: str = "runner") -> argparse.ArgumentParser:
    """The parser of DeepSpeed's ``deepspeed`` launcher (``deepspeed.launcher.runner``) or of its
    per-node launcher (``deepspeed.launcher.launch``), compiled from DeepSpeed's source without
    importing DeepSpeed (torch's import would cost each launch seconds): the flags, and which
    of them take a value, are DeepSpeed's own, never a copy of its table."""
    spec = importlib.machinery.PathFinder.find_spec("deepspeed")  # on disk, whatever stands in for it in sys.modules
    assert spec is not None and spec.origin, "the fake launcher reads DeepSpeed's launcher parsers: install deepspeed"
    root = Path(spec.origin).parent
    shim = types.ModuleType("argparse")
    shim.__dict__.update(vars(argparse))
    shim.ArgumentParser = _Built  # type: ignore[attr-defined]
    namespace: dict[str, Any] = {"argparse": shim, "ArgumentParser": _Built, "REMAINDER": argparse.REMAINDER, "os": os}
    for constants in (root / "constants.py", root / "launcher" / "constants.py"):  # plain assignments, no imports of DeepSpeed's
        exec(compile(constants.read_text(), str(constants), "exec"), namespace)
    source = root / "launcher" / f"{module}.py"
    tree = ast.parse(source.read_text())
    parse_args = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "parse_args")
    used = {node.id for node in ast.walk(parse_args) if isinstance(node, ast.Name)}
    # The module's constants that the parser reads (its default hostfile path, say).
    wanted = [node for node in tree.body if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in used for t in node.targets)]
    exec(compile(ast.Module(body=[*wanted, parse_args], type_ignores=[]), str(source), "exec"), namespace)
    parser = namespace["parse_args"]()
    assert isinstance(parser, _Built)
    return parser


@dataclasses.dataclass(frozen=True)
class Launch:
    """One launch as DeepSpeed's launcher and engine see it."""

    argv: list[str]
    options: argparse.Namespace  # the launcher's, DeepSpeed's defaults filled in
    script: str
    args: list[str]
    config: dict[str, Any]
    config_path: str | None  # None where the config came as base64

    @property
    def include(self) -> str | None:
        return getattr(self.options, "include", None) or None

    @property
    def gpus(self) -> int:
        """The ranks: the per-node launcher's world, the slots ``--include`` names, else
        ``--num_gpus`` x ``--num_nodes`` (one each where unset)."""
        world = getattr(self.options, "world_info", "None")
        if world != "None":
            return sum(len(slots) for slots in json.loads(base64.urlsafe_b64decode(world)).values())
        if self.include:
            return sum(len(part.split(":", 1)[1].split(",")) if ":" in part else 1 for part in self.include.split("@"))
        return max(self.options.num_gpus, 1) * max(self.options.num_nodes, 1)

    @property
    def autotuning(self) -> dict[str, Any]:
        return self.config.get("autotuning") or {}

    @property
    def training(self) -> bool:
        """Autotuning off: the engine trains as asked."""
        return not self.autotuning.get("enabled")

    @property
    def profile(self) -> bool:
        """The model-info profile run: stopped after the first forward pass."""
        return not self.training and bool((self.autotuning.get("model_info") or {}).get("profile"))

    @property
    def zero(self) -> dict[str, Any]:
        return self.config.get("zero_optimization") or {}

    @property
    def stage(self) -> int:
        return int(self.zero.get("stage", 0))

    @property
    def mbs(self) -> int:
        return int(self.config.get("train_micro_batch_size_per_gpu", 1))

    @property
    def gas(self) -> int:
        return int(self.config.get("gradient_accumulation_steps", 1))

    @property
    def train_batch_size(self) -> int:
        return self.mbs * self.gas * self.gpus

    @property
    def metric_path(self) -> str:
        return self.autotuning.get("metric_path") or os.path.join(os.getcwd(), "autotuning_metric.json")  # the engine's default

    @property
    def name(self) -> str:
        """The experiment's name: its result folder, where the tuner puts its metrics."""
        return os.path.basename(os.path.dirname(os.path.abspath(self.metric_path)))

    @property
    def rank_log_dir(self) -> str | None:
        return None if self.options.enable_each_rank_log == "None" else self.options.enable_each_rank_log


def parse(argv: Sequence[str], *, launcher: str = "runner") -> Launch:
    """The launch ``deepspeed ARGV`` asks for (``python -m deepspeed.launcher.launch ARGV`` with
    ``launcher="launch"``); a flag DeepSpeed's launcher refuses is refused as it does (its usage
    and exit status 2), an ambiguous abbreviation among the script's arguments included."""
    options = argparse.ArgumentParser.parse_args(deepspeed_parser(launcher), list(argv))
    script, args = (options.user_script, options.user_args) if launcher == "runner" else (options.training_script, options.training_script_args)
    config, path = _config(args)
    return Launch(argv=list(argv), options=options, script=script, args=args, config=config, config_path=path)


def _config(args: list[str]) -> tuple[dict[str, Any], str | None]:
    for flag in ("--deepspeed_config", "--deepspeed"):
        for j, a in enumerate(args):
            value = a.split("=", 1)[1] if a.startswith(flag + "=") else args[j + 1] if a == flag and j + 1 < len(args) else None
            if value is None or value.startswith("--"):
                continue
            if os.path.isfile(value):
                with open(value) as f:
                    return json.load(f), value
            return json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))), None
    sys.exit("fake deepspeed: no --deepspeed_config/--deepspeed in the script arguments")


# Shares of an optimizer step's time, as a small model's timers show them: the backward pass
# holds the gradients' allreduce.
_FWD, _BWD_INNER, _BWD_ALLREDUCE, _STEP = 0.3, 0.45, 0.15, 0.1


def _timers(seconds: float, *, recompute: bool = False) -> dict[str, float]:
    """One optimizer step's timers, in milliseconds; with ``recompute`` (activation
    checkpointing) the backward holds the forward again, within the same step time."""
    ms = seconds * 1e3 / (1.0 + _FWD if recompute else 1.0)
    inner = _BWD_INNER + (_FWD if recompute else 0.0)
    return {"fwd": _FWD * ms, "bwd": (inner + _BWD_ALLREDUCE) * ms, "bwd_inner": inner * ms, "bwd_allreduce": _BWD_ALLREDUCE * ms,
            "step": _STEP * ms}


def checkpointing(surface: dict[str, Any], launch: Launch) -> tuple[bool, float]:
    """Whether the launch checkpoints its activations by the surface's physics (its switch on
    and not ignored), and the share of a sample's activations it keeps."""
    physics = surface.get("checkpointing") or {}
    section = launch.config.get("activation_checkpointing") or {}
    on = bool(physics.get("flag")) and physics["flag"] in launch.args and not physics.get("ignored")
    kept = float(physics.get("kept", 0.2)) if on else 1.0
    if physics.get("configures") and section.get("cpu_checkpointing") is True:
        kept *= float(physics.get("section_kept", 0.5))
    return on, kept


def autotp_size(launch: Launch) -> int:
    """The AutoTP size of the launch's config (1: off)."""
    section = launch.config.get("tensor_parallel") or {}
    size = section.get("autotp_size") if isinstance(section, dict) else None
    return size if isinstance(size, int) and size > 1 else 1


def report(launch: Launch, *, throughput: float, steps: Sequence[float] = (), flops_per_gpu: float, seconds: float = 0.0,
           recompute: bool = False, stall_ms: float = 0.0) -> None:
    """What DeepSpeed's engine does in autotuning mode once the model runs: it logs its global
    timers on rank 0 at every optimizer step, ``[Rank 0] time (ms) | fwd: ...``, for global
    steps 1..end_profile_step (``steps``: each one's throughput, samples/s; where fewer are given,
    the rest at ``throughput``), then at step end_profile_step + 1 writes the metrics file from
    that step's timers alone and exits. ``throughput`` is that last step's. The metrics file
    holds ``fwd``, ``bwd``, ``step`` (each micro-step's mean) and ``latency`` (the optimizer
    step) in microseconds, though DeepSpeed calls them milliseconds, and throughput =
    train_batch_size * 1e6 / latency. ``seconds``: how long it all takes, spread over the steps;
    ``stall_ms``: added to the forward timer of every logged step but the last."""
    end = int(launch.autotuning.get("end_profile_step", 5))
    for k in range(end):
        time.sleep(seconds / (end + 1))
        timers = _timers(launch.train_batch_size / (steps[k] if k < len(steps) else throughput), recompute=recompute)
        timers["fwd"] += stall_ms if k < end - 1 else 0.0
        print("[Rank 0] time (ms) | " + " | ".join(f"{name}: {value:.2f}" for name, value in timers.items()), flush=True)
    time.sleep(seconds / (end + 1))
    latency = launch.train_batch_size * 1e6 / throughput
    last = {name: value * 1e3 / launch.gas for name, value in _timers(latency / 1e6, recompute=recompute).items() if name in ("fwd", "bwd", "step")}
    write_json(launch.metric_path, {**last, "latency": latency, "FLOPS_per_gpu": flops_per_gpu, "throughput": throughput, "rank": 0})


def jittered(throughput: float, noise: float, *, count: int, seed: str) -> list[float]:
    """``count`` steps' throughputs around ``throughput``, each off by a relative sd of ``noise``."""
    rng = random.Random(seed)
    return [throughput * (1.0 + noise * rng.gauss(0.0, 1.0)) for _ in range(count)] if noise else []


def write_json(path: str, data: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f)


def append_line(path: str | None, entry: dict[str, Any]) -> None:
    """``entry`` as a JSON line of ``path`` (launches at once append whole lines)."""
    if path:
        with open(path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(json.dumps(entry) + "\n")


def _key(value: Any) -> str:
    """A knob value as a table key: 5e8 and 500000000 are one size."""
    return json.dumps(float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value)


def surface_throughput(surface: dict[str, Any], launch: Launch) -> float:
    """The tests' one throughput surface, noise-free: a curve in the micro-batch size peaking at
    ``peak``, scaled per stage, by the knobs' gains and by an offloaded optimizer."""
    base = float(surface.get("base", {"0": 100, "1": 120, "2": 110, "3": 80}).get(str(launch.stage), 100))
    peak = float(surface.get("peak", 24))
    throughput = base * launch.mbs / (1 + (launch.mbs / peak) ** 2)
    tables = [*surface.get("knob_gain", {}).items(), *surface.get("knob_gain_at", {}).get(str(launch.stage), {}).items()]
    for knob, gains in tables:
        gains = {_key(json.loads(value)): factor for value, factor in gains.items()}
        throughput *= float(gains.get(_key(launch.zero.get(knob)), 1.0))
    offload = launch.zero.get("offload_optimizer")
    if isinstance(offload, dict) and offload.get("device", "none") != "none":
        throughput *= float(surface.get("offload_factor", 0.5))
    return throughput


def warmup(surface: dict[str, Any], launch: Launch) -> Any:
    """By how much the surface's warm-up slows global step ``i`` (1-based) of the launch: a
    function of the step, 1 from step ``steps + 1`` on."""
    physics = surface.get("warmup") or {}
    k, f = int(physics.get("steps", 0)), float(physics.get("slow", 0.0))
    if not k or ("at" in physics and launch.mbs not in physics["at"]):
        return lambda i: 1.0
    return lambda i: 1.0 + f * max(0.0, 1.0 - (i - 1) / k)


def answer(surface: dict[str, Any], launch: Launch) -> int:
    """What the engine does with ``launch`` on ``surface``: its files written, its output
    printed, its ``duration`` slept; returns its exit status. benchmarks/product.py calls it
    in-process, the duration zero and waited on its virtual clock."""
    if surface.get("script_error"):
        print(surface["script_error"], file=sys.stderr)
        print(f"[ERROR] [launch.py:325:sigkill_handler] ['python', '-u', '{launch.script}'] exits with return code = 2", file=sys.stderr)
        return 2
    if launch.profile:
        if surface.get("profile_fail"):
            print("Traceback (most recent call last):\nValueError: model has no parameters", file=sys.stderr)
            return 1
        while surface.get("profile_gate") and not os.path.exists(surface["profile_gate"]):
            time.sleep(0.01)
        params = surface.get("num_params", 1_000_000)
        write_json(launch.autotuning["model_info_path"], {"num_params": params, "trainable_num_params": params,
                                                          "activation_mem_per_gpu": surface.get("activation_mem_per_gpu", 1_000_000), "rank": 0})
        return 0
    mbs, zero = launch.mbs, launch.zero
    if mbs in surface.get("hang_at", []):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        print(f"child pid {child.pid}", flush=True)
        if surface.get("build_lock"):
            # torch's FileBaton: created exclusively, held open, removed in a finally SIGTERM skips.
            folder = os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], surface["build_lock"])
            os.makedirs(folder, exist_ok=True)
            os.open(os.path.join(folder, "lock"), os.O_CREAT | os.O_EXCL)
            print("holding the build lock", flush=True)
        time.sleep(3600)
    physics = surface.get("checkpointing") or {}
    recompute, kept = checkpointing(surface, launch)
    if physics.get("configures"):
        section = {"partition_activations": False, "cpu_checkpointing": False, "contiguous_memory_optimization": False,
                   "number_checkpoints": None, **(launch.config.get("activation_checkpointing") or {})}
        print("[INFO] [checkpointing.py:1248:configure] Activation Checkpointing Information", flush=True)
        print(f"[INFO] [checkpointing.py:1249:configure] ----Partition Activations {section['partition_activations']}, "
              f"CPU CHECKPOINTING {section['cpu_checkpointing']}", flush=True)
        print(f"[INFO] [checkpointing.py:1250:configure] ----contiguous Memory Checkpointing "
              f"{section['contiguous_memory_optimization']} with {section['number_checkpoints']} total layers", flush=True)
    if recompute and physics.get("unsupported"):
        print("Traceback (most recent call last):\nValueError: GPT2LMHeadModel does not support gradient checkpointing.", file=sys.stderr)
        return 1
    tp, split = autotp_size(launch), surface.get("autotp") or {}
    if tp > 1 and split.get("fails"):
        print('Traceback (most recent call last):\n  File "/site-packages/deepspeed/runtime/engine.py", line 991, in '
              'check_dataloader_inputs_same_across_ranks\nAssertionError: Data inconsistency within the TP group. Please check '
              'the Dataloader implementation to ensure consistency.', file=sys.stderr)
        return 1
    oom_above = surface.get("oom_above", {}).get(str(launch.stage))
    for knob, rooms in surface.get("knob_room", {}).items():
        if oom_above is not None:
            oom_above += int({_key(json.loads(v)): n for v, n in rooms.items()}.get(_key(zero.get(knob)), 0))
    if oom_above is not None and kept < 1.0:
        oom_above = int(oom_above / kept)
    if oom_above is not None and tp > 1:
        oom_above = int(oom_above / float(split.get("kept", 1.0 / tp)))
    if oom_above is not None and mbs > oom_above:
        print("Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr)
        if "stderr_text" in surface:
            print(surface["stderr_text"], file=sys.stderr)
        return 1
    if str(launch.stage) in surface.get("stderr_fail", {}):
        print(surface["stderr_fail"][str(launch.stage)], file=sys.stderr)
        return 1
    if mbs in surface.get("error_at", []):
        print("Traceback (most recent call last):\nRuntimeError: NCCL communicator was aborted", file=sys.stderr)
        return 1
    if mbs in surface.get("no_metrics_at", []) or int(launch.autotuning.get("end_profile_step", 5)) >= surface.get("script_steps", 1 << 30):
        return 0
    true = surface_throughput(surface, launch) / (1.0 + _FWD if recompute else 1.0) * (float(split.get("factor", 0.9)) if tp > 1 else 1.0)
    if surface.get("fixed_batch"):
        # The steps train the script's own size; the engine divides the config's samples by their time.
        fixed = int(surface["fixed_batch"])
        true = surface_throughput(surface, dataclasses.replace(launch, config={**launch.config, "train_micro_batch_size_per_gpu": fixed}))
        true *= launch.mbs / fixed
    noise = float(surface.get("noise", 0.0))
    # The measured step: one draw per experiment name, so that repeats differ.
    measured = true * (1.0 + noise * random.Random(launch.name).gauss(0.0, 1.0)) if noise else true
    seconds = float(surface.get("duration_at", {}).get(str(mbs), surface.get("duration", 0.0)))
    for knob, table in surface.get("knob_duration", {}).items():
        seconds = float({_key(json.loads(value)): t for value, t in table.items()}.get(_key(zero.get(knob)), seconds))
    # The other steps jitter around this run's draw: the run-to-run noise is the run's (its
    # placement, its neighbours), shared by its steps; a step adds half as much of its own.
    steps = jittered(measured, noise / 2, count=int(launch.autotuning.get("end_profile_step", 5)), seed=f"{launch.name}/steps")
    end = int(launch.autotuning.get("end_profile_step", 5))
    slow = warmup(surface, launch)
    steps = [(steps[k] if k < len(steps) else measured) / slow(k + 1) for k in range(end)]
    measured /= slow(end + 1)
    blip = surface.get("exit_step") or {}
    if blip and ("at" not in blip or launch.mbs in blip["at"]):
        measured *= float(blip["factor"])
    # DeepSpeed's count: each sample once per rank of its AutoTP group.
    report(launch, throughput=measured * tp, steps=[x * tp for x in steps], flops_per_gpu=measured * 1e9, seconds=seconds,
           recompute=recompute, stall_ms=float(surface.get("fwd_stall", 0.0)))
    return 0


def main() -> int:
    # Ended by its process group (a timeout, an interrupt, an orphan): still log the launch.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    surface = json.loads(os.environ.get("FAKE_DS_SURFACE") or "{}")
    launch = parse(sys.argv[1:])
    if not os.path.isfile(launch.script):
        sys.exit(f"fake deepspeed: script {launch.script} not found")
    entry: dict[str, Any] = {
        "start": time.time(), "include": launch.include, "master_port": launch.options.master_port, "stage": launch.stage,
        "mbs": launch.mbs, "gas": launch.gas, "args": launch.args, "pid": os.getpid(), "argv": launch.argv, "node": os.environ.get("FAKE_DS_NODE"),
        "autotp": autotp_size(launch) if not launch.profile else 1, "train_batch_size": launch.config.get("train_batch_size"),
    }
    print(f"[INFO] fake deepspeed launching {launch.script} pid {os.getpid()}", flush=True)
    # A harmless warning that mentions "Error": it must not fail the run.
    print("UserWarning: torch.distributed ErrorHandler is deprecated", file=sys.stderr, flush=True)
    if launch.rank_log_dir and surface.get("rank_log_text"):
        os.makedirs(launch.rank_log_dir, exist_ok=True)
        with open(os.path.join(launch.rank_log_dir, time.strftime("%Y%m%d%H%M%S") + "_rank0.log"), "w") as f:
            f.write(surface["rank_log_text"] + "\n")
    try:
        if launch.training:
            entry["training"] = True
            print(f"training with micro-batch {launch.mbs}", flush=True)
            return int(os.environ.get("FAKE_DS_TRAIN_EXIT", "0"))
        entry["profile"] = launch.profile or None
        return answer(surface, launch)
    finally:
        entry["end"] = time.time()
        append_line(os.environ.get("FAKE_DS_LOG"), {k: v for k, v in entry.items() if v is not None or k in ("include", "master_port", "node")})


if __name__ == "__main__":
    sys.exit(main())
