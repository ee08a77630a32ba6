"""Issue 37's GPU check: do DeepCompile and activation checkpointing act on a job, and how would a
tool tell from what a run logs and measures?

Run on one GPU (``python benchmarks/gpu/gpu_check.py``; no launcher: one process, one engine per
case). What DeepSpeed 0.19.8's source says, which the cases check:

- ``"compile": {"deepcompile": true}`` alone changes nothing: the engine's forward logs once
  "DeepCompile is enabled but engine.compile() has not been called" and runs eagerly. Only the
  script's ``engine.compile()`` installs DeepCompile's backend (ZeRO 1-3 on CUDA; ZeRO-0 falls
  back to plain ``torch.compile``), and then the engine logs "Compiling mode=... deepcompile=True".
  DeepCompile's passes change at step 5 (``WARMUP`` in ``deepspeed/compile/init_z*.py``), so the
  warm-up here is longer than that.
- The ``activation_checkpointing`` section is never read by the engine: it configures
  ``deepspeed.checkpointing`` only when the script calls ``deepspeed.checkpointing.configure(mpu,
  deepspeed_config=...)``, and only blocks the model wraps in ``deepspeed.checkpointing.checkpoint``
  are recomputed, with or without the section. Whether checkpointing happens is the script's
  choice (a flag, as ``--gradient_checkpointing`` is for Hugging Face scripts); the section tunes
  how (partitioned, on the CPU). With ``"profile": true`` a configured run logs a forward and a
  backward time per checkpointed call: none means the model checkpoints nothing.

Each case prints throughput (samples/s over the measured steps), peak memory (torch's allocator),
and the evidence a tool has: the log lines above, the memory against the case's baseline, and
DeepSpeed's own timers (``wall_clock_breakdown``): a recomputing backward holds the forward again,
so ``bwd_inner / fwd`` grows by about one against the baseline; optuna-ds judges a checkpointing
run that grew by less than a quarter of a forward (``Priors.recompute_growth``) one the script ignored.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator

from gpt import GPT
from gpt import batch

NOT_COMPILED = "DeepCompile is enabled but engine.compile() has not been called"
COMPILING = ("Compiling mode=", "deepcompile=True")  # engine.compile()'s line; the config dump also says deepcompile=True
CHECKPOINT_TIME = re.compile(r"time \(ms\) \| (fwd|backward): [0-9.]+\s*$")  # printed, not logged


@dataclass
class Case:
    name: str
    stage: int
    sections: dict[str, Any] = field(default_factory=dict)
    compile: bool = False  # the script calls engine.compile()
    checkpoint: bool = False  # the model wraps each block in deepspeed.checkpointing.checkpoint
    configure: bool = False  # the script calls deepspeed.checkpointing.configure(None, deepspeed_config=...)
    baseline: str = ""  # the case it is compared with


# Cheap cases first, the compiled ones last (each compiles for tens of seconds).
CASES = [
    Case("z3 eager", 3),
    Case("z3 deepcompile, no compile()", 3, {"compile": {"deepcompile": True}}, baseline="z3 eager"),
    Case("z1 eager", 1),
    Case("plain model", 0),
    Case("plain model, section + configure()", 0, {"activation_checkpointing": {"profile": True}}, configure=True, baseline="plain model"),
    Case("checkpointing model, no section", 0, checkpoint=True, baseline="plain model"),
    Case("checkpointing model, section + configure()", 0, {"activation_checkpointing": {"profile": True}},
         checkpoint=True, configure=True, baseline="plain model"),
    Case("checkpointing model, cpu_checkpointing", 0,
         {"activation_checkpointing": {"cpu_checkpointing": True, "profile": True}},
         checkpoint=True, configure=True, baseline="plain model"),
    Case("checkpointing model, partition + cpu", 0,
         {"activation_checkpointing": {"partition_activations": True, "cpu_checkpointing": True, "profile": True}},
         checkpoint=True, configure=True, baseline="plain model"),
    Case("z3 deepcompile + compile()", 3, {"compile": {"deepcompile": True}}, compile=True, baseline="z3 eager"),
    Case("z1 deepcompile + compile()", 1, {"compile": {"deepcompile": True}}, compile=True, baseline="z1 eager"),
    Case("z1 compile() (torch.compile)", 1, compile=True, baseline="z1 eager"),
    Case("z3 compile() (torch.compile)", 3, compile=True, baseline="z3 eager"),
]


class Captured(logging.Handler):
    """DeepSpeed's log records of one case, at every level (its own handler prints warnings only:
    DeepSpeed 0.19.8 logs at WARNING by default, so both lines above are silent unless a run asks
    for INFO)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def has(self, *texts: str) -> bool:
        return any(all(text in line for text in texts) for line in self.lines)


def _unconfigure() -> None:
    """``deepspeed.checkpointing``'s settings as imported: a case's configure() outlives it (module globals)."""
    ckpt = deepspeed.checkpointing
    ckpt.reset()
    ckpt.PARTITION_ACTIVATIONS = ckpt.CPU_CHECKPOINT = ckpt.CONTIGUOUS_CHECKPOINTING = False
    ckpt.SYNCHRONIZE = ckpt.PROFILE_TIME = False
    ckpt.num_layers = ckpt.mpu = ckpt.timers = None


def run_case(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_optimization": {"stage": case.stage},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": True,  # the engine's fwd/bwd timers, as optuna-ds reads them
        **case.sections,
    }
    logs = Captured()
    ds_logger = logging.getLogger("DeepSpeed")
    ds_logger.addHandler(logs)
    printed = io.StringIO()  # what the case prints: DeepSpeed prints its checkpointing timers
    out: dict[str, Any] = {"case": case.name}
    engine = None
    try:
        with contextlib.redirect_stdout(printed):
            _unconfigure()
            if case.configure:
                deepspeed.checkpointing.configure(None, deepspeed_config=config)
            torch.manual_seed(0)
            with torch.device(get_accelerator().current_device_name()):
                model = GPT(vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.hidden // 64, seq=args.seq,
                            checkpoint=deepspeed.checkpointing.checkpoint if case.checkpoint else None)
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
            del model
            if case.compile:
                engine.compile()
            out.update(_measure(engine, args))
    except Exception as e:  # noqa: BLE001 - a case that fails says why, the others still run
        out["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
        e.__traceback__ = None
    finally:
        ds_logger.removeHandler(logs)
        if engine is not None:
            engine.destroy()
        del engine
        torch._dynamo.reset()
        gc.collect()
        get_accelerator().empty_cache()
    out["log_not_compiled"] = logs.has(NOT_COMPILED)
    out["log_compiling_deepcompile"] = logs.has(*COMPILING)
    out["log_checkpoint_times"] = sum(1 for line in printed.getvalue().splitlines() if CHECKPOINT_TIME.search(line))
    return out


def _measure(engine: Any, args: argparse.Namespace) -> dict[str, Any]:
    get_accelerator().synchronize()
    get_accelerator().reset_peak_memory_stats()
    times, ratios = [], []
    for step in range(args.warmup + args.steps):
        s = time.perf_counter()
        loss = engine(batch(engine, args.micro_batch, vocab=args.vocab, seq=args.seq))
        engine.backward(loss)
        engine.step()
        get_accelerator().synchronize()
        times.append(time.perf_counter() - s)
        timers = engine.get_wall_clock_timers()
        if step >= args.warmup and timers.get("fwd"):
            ratios.append(timers.get("bwd_inner", timers.get("bwd", 0.0)) / timers["fwd"])
    measured = times[args.warmup:]
    return {
        "bwd_over_fwd": sorted(ratios)[len(ratios) // 2] if ratios else None,
        "samples_per_s": args.micro_batch * len(measured) / sum(measured),
        "peak_gib": get_accelerator().max_memory_allocated() / 2**30,
        "warmup_s": sum(times[:args.warmup]),
        "deepcompile_active": bool(engine.is_deepcompile_active()),
    }


def verdict(case: Case, row: dict[str, Any], base: dict[str, Any] | None) -> str:
    """Whether the setting took effect, from what a tool sees: the logs and the measures."""
    if "error" in row:
        return "failed"
    memory = "" if base is None or "peak_gib" not in base else f"memory {row['peak_gib'] / base['peak_gib']:.2f}x"
    speed = "" if base is None or "samples_per_s" not in base else f"speed {row['samples_per_s'] / base['samples_per_s']:.2f}x"
    if "compile" in case.sections:
        said = "log: not compiled" if row["log_not_compiled"] else ("log: deepcompile=True" if row["log_compiling_deepcompile"] else "log: nothing")
        took = "yes" if row["deepcompile_active"] else "no"
        return f"deepcompile {took} ({said}; {speed}, {memory})"
    if case.checkpoint or "activation_checkpointing" in case.sections:
        ratio, plain = row.get("bwd_over_fwd"), (base or {}).get("bwd_over_fwd")
        growth = (f"; bwd/fwd {ratio:.2f} against {plain:.2f}: {'recomputes' if ratio - plain >= 0.25 else 'no recompute seen'}"
                  if ratio and plain else "")
        return f"{row['log_checkpoint_times']} checkpoint timer lines; {speed}, {memory}{growth}"
    return "baseline" if not case.compile else f"{speed}, {memory}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4, help="few: each compiled case compiles every layer")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8192, help="small: the blocks' activations, not the logits, dominate")
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--warmup", type=int, default=8, help="DeepCompile changes its passes at step 5")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--cases", nargs="*", help="names of the cases to run (default: all)")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()

    for var, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29690")):
        os.environ.setdefault(var, value)
    deepspeed.init_distributed()
    logging.getLogger("DeepSpeed").setLevel(logging.INFO)  # for Captured; DeepSpeed's handler still prints warnings only
    device = torch.cuda.get_device_name() if get_accelerator().device_name() == "cuda" else get_accelerator().device_name()
    print(f"{device}, torch {torch.__version__}, DeepSpeed {deepspeed.__version__}; GPT {args.layers}x{args.hidden}, seq {args.seq}, "
          f"micro-batch {args.micro_batch}, {args.warmup} warm-up + {args.steps} measured steps", flush=True)
    rows: dict[str, dict[str, Any]] = {}
    # The process's first engine runs slower (on the H100, z3 eager 242 samples/s first, 389 second): discarded.
    print(json.dumps({"warm-up, discarded": run_case(CASES[0], args)}), flush=True)
    try:
        for case in CASES:
            if args.cases and case.name not in args.cases:
                continue
            rows[case.name] = run_case(case, args)
            print(json.dumps(rows[case.name]), flush=True)
    except KeyboardInterrupt:  # out of time: the table of the cases that ran
        print("interrupted", flush=True)
    table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(list(rows.values()), indent=1) + "\n")


def table(rows: dict[str, dict[str, Any]]) -> None:
    print()
    print(f"{'case':44} {'samples/s':>10} {'peak GiB':>9} {'warm-up s':>9}  took effect?")
    for case in CASES:
        row = rows.get(case.name)
        if row is None:
            continue
        cells = (f"{row['samples_per_s']:10.1f} {row['peak_gib']:9.2f} {row['warmup_s']:9.1f}" if "error" not in row
                 else f"{'-':>10} {'-':>9} {'-':>9}")
        print(f"{case.name:44} {cells}  {verdict(case, row, rows.get(case.baseline))}")
        if "error" in row:
            print(f"{'':44} {row['error']}")


if __name__ == "__main__":
    main()
