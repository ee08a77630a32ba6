#!/usr/bin/env python3
"""A simulated ``deepspeed`` launcher for `make bench`: the fake launcher of the tests
(benchmarks/fake_deepspeed.py: DeepSpeed's command line and engine output) answering on the surface
(or replay of real runs) named by ``SIM_SURFACE``: ``model_info.json`` for a profile run, the
step timers and metrics file for an experiment, or a CUDA out-of-memory / NCCL error on stderr.
A generated job's run reports its generator's measurement with, in 5-15% of runs, a slow outlier
5-25% below it (``surfaces.slow_outlier``); a replay reports its recorded runs as they are.

It does not sleep: each launch is appended to ``SIM_LEDGER`` (JSON lines) with the simulated
seconds it would have taken, and the benchmark adds them up as GPU-hours.
"""
from __future__ import annotations

import json
import os
import sys

import catalog
import fake_deepspeed
import surfaces


def _device_memory() -> float:
    import psutil  # what DeepSpeed's CPU accelerator reports as the memory of a device

    return float(psutil.virtual_memory().total)


def main() -> int:
    return answer(sys.argv[1:], surface=catalog.by_name(os.environ["SIM_SURFACE"]), ledger=os.environ.get("SIM_LEDGER"))[0]


def answer(argv: list[str], *, surface: surfaces.Surface, ledger: str | None) -> tuple[int, float]:
    """The launch of ``argv`` (DeepSpeed's command line) on ``surface``: its files written, its
    output printed (to ``sys.stdout``/``sys.stderr``), the launch appended to ``ledger``; returns
    its exit status and the simulated seconds it took. benchmarks/product.py calls it in-process."""
    launch = fake_deepspeed.parse(argv)
    gpus = launch.gpus
    if launch.profile:
        # The profile run: stage 3, micro-batch 1, stopped after the first forward pass.
        fake_deepspeed.write_json(launch.autotuning["model_info_path"], {**surfaces.model_info(surface, _device_memory()), "rank": 0})
        seconds = surface.startup_s + 10.0
        fake_deepspeed.append_line(ledger, {"profile": True, "outcome": "ok", "seconds": seconds, "gpus": gpus})
        return 0, seconds
    if launch.training:
        print("simulated training run: nothing to measure")
        return 0, 0.0
    config = surfaces.Config.from_ds_config(launch.config, keys=surfaces.spaces_of(surface)[1])
    outcome = surface.evaluate(config)
    entry = {"stage": config.stage, "mbs": config.mbs, "gas": config.gas, "knobs": dict(config.knobs),
             "offload": [config.offload_optimizer, config.offload_param], "outcome": outcome.kind,
             "seconds": outcome.seconds, "gpus": gpus}
    if outcome.kind == "oom":
        fake_deepspeed.append_line(ledger, entry)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
              "of 79.11 GiB of which 1.02 GiB is free.", file=sys.stderr)
        return 1, outcome.seconds
    if outcome.kind == "crash":
        fake_deepspeed.append_line(ledger, entry)
        print("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error", file=sys.stderr)
        return 1, outcome.seconds
    before = [json.loads(line) for line in open(ledger)] if ledger and os.path.exists(ledger) else []
    if hasattr(surface, "measure_nth"):
        # A replay of recorded runs (benchmarks/replays.py): the k-th launch of a config draws its k-th run.
        same = ("stage", "mbs", "gas", "knobs", "offload")
        throughput = surface.measure_nth(config, sum(all(e.get(k) == entry[k] for k in same) for e in before))
    else:
        # The generator's own scatter, then the one-sided slow outliers every generated job has.
        throughput = surface.measure(config, len(before)) * surfaces.slow_outlier(surface.name, config, len(before))
    # Around this run's draw, as in the tests' fake: the run's noise is shared by its steps.
    steps = fake_deepspeed.jittered(throughput, surface.noise / 2, count=int(launch.autotuning.get("end_profile_step", 5)),
                                    seed=f"{launch.name}/{len(before)}")
    fake_deepspeed.report(launch, throughput=throughput, steps=steps, flops_per_gpu=throughput * 1e11 / gpus)
    fake_deepspeed.append_line(ledger, {**entry, "measured": throughput, "true": outcome.throughput})
    return 0, outcome.seconds


if __name__ == "__main__":
    sys.exit(main())
