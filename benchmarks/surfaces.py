"""Performance surfaces of simulated training jobs, for `make bench`.

A surface says, for one DeepSpeed config (ZeRO stage, micro-batch size, ZeRO knobs, offload),
how much GPU memory the job needs, whether it crashes, its true throughput and how long an
experiment takes. Memory is written for an 80 GB GPU and scaled to the device memory the
tools see (on the CPU accelerator, the host's RAM), so both tools make the same decisions on any
machine. The profile run reports what DeepSpeed's engine reports: the parameter count and the
activation memory of one sample at stage 3 -- which, as on a real GPU, underestimates the real
peak (an H100 run of GPT-2 large: estimate 23, real OOM edge 20).
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import random
import sys
from collections.abc import Iterator
from typing import Any

GB = 1e9
DEVICE_GB = 80.0

# DeepSpeed's defaults for the knobs a config leaves out.
DEFAULTS = {
    "overlap_comm": False,
    "reduce_scatter": True,
    "reduce_bucket_size": 5e8,
    "allgather_bucket_size": 5e8,
    "allgather_partitions": True,
    "contiguous_gradients": True,
}
# DeepSpeed's DEFAULT_TUNING_SPACE_ZERO_<stage>: what full mode may try.
SPACES: dict[int, dict[str, list[Any]]] = {
    0: {},
    1: {"reduce_bucket_size": [5e7, 5e8, 1e9], "allgather_bucket_size": [5e7, 5e8, 1e9]},
    2: {"overlap_comm": [True, False], "reduce_scatter": [False, True], "reduce_bucket_size": [5e7, 5e8, 1e9],
        "allgather_bucket_size": [5e7, 5e8, 1e9], "contiguous_gradients": [False, True]},
    3: {"overlap_comm": [True, False], "reduce_bucket_size": [5e7, 5e8, 1e9], "contiguous_gradients": [False, True]},
}


@dataclasses.dataclass(frozen=True)
class Config:
    stage: int
    mbs: int
    gas: int = 1
    knobs: tuple[tuple[str, Any], ...] = ()
    offload_optimizer: bool = False
    offload_param: bool = False

    def knob(self, name: str) -> Any:
        value = dict(self.knobs).get(name, DEFAULTS.get(name))
        if self.stage == 3 and name == "overlap_comm" and name not in dict(self.knobs):
            return True  # stage 3 overlaps by default
        return value

    @classmethod
    def from_ds_config(cls, ds: dict[str, Any], *, keys: Any = DEFAULTS) -> Config:
        """The config of a DeepSpeed config, with the zero keys in ``keys`` as knobs (the job's
        generator's DEFAULTS: benchmarks/blind_jobs.py reads stage 3's own keys too)."""
        zero = dict(ds.get("zero_optimization") or {})
        stage = int(zero.pop("stage", 0))

        def offloaded(key: str) -> bool:
            section = zero.pop(key, None)
            return isinstance(section, dict) and section.get("device", "none") not in ("none", None)

        off_opt, off_param = offloaded("offload_optimizer"), offloaded("offload_param")
        knobs = tuple(sorted((k, v) for k, v in zero.items() if k in keys))
        return cls(stage=stage, mbs=int(ds["train_micro_batch_size_per_gpu"]), gas=int(ds.get("gradient_accumulation_steps") or 1),
                   knobs=knobs, offload_optimizer=off_opt, offload_param=off_param)


@dataclasses.dataclass(frozen=True)
class Outcome:
    kind: str  # "ok", "oom", "crash"
    throughput: float  # true samples/s of the whole job (0 when not ok)
    seconds: float  # wall time of the experiment


@dataclasses.dataclass(frozen=True)
class Surface:
    """One simulated job. Memory figures are GB on an 80 GB GPU."""

    name: str
    description: str
    params_b: float  # parameters, billions
    act_gb: float  # activation memory of one sample, as the profile reports it
    act_ratio: float = 1.15  # the real per-sample peak over the reported one
    context_gb: float = 2.0  # CUDA context, allocator slack, communication buffers
    peak: float = 100.0  # samples/s per GPU at full efficiency, stage 0
    half_mbs: float = 4.0  # micro-batch size at half efficiency
    stage_factor: tuple[float, float, float, float] = (1.0, 0.985, 0.96, 0.80)
    pressure_from: float = 0.90  # share of memory above which throughput suffers
    pressure_loss: float = 0.0  # throughput lost at 100% memory
    cliff_mbs: int = 0  # from this micro-batch size on, an extra workspace is needed
    cliff_gb: float = 0.0
    knob_gain: dict[str, dict[Any, float]] = dataclasses.field(default_factory=dict)
    crash: dict[str, Any] | None = None  # a non-OOM failure: the config keys that trigger it
    noise: float = 0.01
    startup_s: float = 60.0  # process start, model build, DeepSpeed init
    steps: int = 5  # end_profile_step
    num_gpus: int = 8
    device_gb: float = DEVICE_GB  # memory of one GPU

    # -- memory ---------------------------------------------------------------------------

    def instantiation_gb(self, config: Config) -> float:
        """Parameters, gradients and Adam states (fp16 mixed precision: 2 + 2 + 12 bytes per
        parameter), partitioned by the stage, offloaded ones left out."""
        p = self.params_b
        params, grads, optim = 2 * p, 2 * p, 12 * p
        n = self.num_gpus
        if config.stage >= 1:
            optim /= n
        if config.stage >= 2:
            grads /= n
        if config.stage >= 3:
            params /= n
        if config.offload_optimizer and config.stage >= 1:
            optim = 0.0
        if config.offload_param and config.stage == 3:
            params = 0.0
        return params + grads + optim

    def memory_gb(self, config: Config) -> float:
        buckets = 0.0
        if config.stage >= 1:
            buckets += 2 * float(config.knob("reduce_bucket_size")) / GB
        if config.stage in (1, 2):
            buckets += 2 * float(config.knob("allgather_bucket_size")) / GB
        if config.stage >= 2 and config.knob("contiguous_gradients"):
            buckets += 2 * self.params_b / self.num_gpus
        cliff = self.cliff_gb if self.cliff_mbs and config.mbs >= self.cliff_mbs else 0.0
        return self.context_gb + self.instantiation_gb(config) + buckets + cliff + config.mbs * self.act_gb * self.act_ratio

    # -- throughput -----------------------------------------------------------------------

    def _crashes(self, config: Config) -> bool:
        if not self.crash:
            return False
        for key, value in self.crash.items():
            actual = config.stage if key == "stage" else config.mbs if key == "mbs_at_least" else config.knob(key)
            if key == "mbs_at_least":
                if config.mbs < value:
                    return False
            elif actual != value:
                return False
        return True

    def evaluate(self, config: Config) -> Outcome:
        used = self.memory_gb(config)
        if used > self.device_gb:
            return Outcome("oom", 0.0, self.startup_s + 8.0)
        if self._crashes(config):
            return Outcome("crash", 0.0, self.startup_s + 15.0)
        efficiency = config.mbs / (config.mbs + self.half_mbs)
        share = used / self.device_gb
        pressure = 1.0
        if share > self.pressure_from:
            pressure -= self.pressure_loss * (share - self.pressure_from) / (1.0 - self.pressure_from)
        gain = self.stage_factor[config.stage]
        for name, table in self.knob_gain.items():
            if name in SPACES[config.stage]:  # a knob counts only where the stage reads it
                value = config.knob(name)
                gain *= table.get(float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value, 1.0)
        if config.offload_optimizer:
            gain *= 0.55
        if config.offload_param:
            gain *= 0.6
        throughput = self.peak * self.num_gpus * efficiency * pressure * gain
        step_s = config.mbs * config.gas * self.num_gpus / throughput
        return Outcome("ok", throughput, self.startup_s + self.steps * step_s)

    def measure(self, config: Config, nonce: int) -> float:
        """The throughput an experiment reports: the true one with measurement noise."""
        outcome = self.evaluate(config)
        seed = int.from_bytes(hashlib.sha256(f"{self.name}|{config}|{nonce}".encode()).digest()[:8], "big")
        return outcome.throughput * (1.0 + random.Random(seed).gauss(0.0, self.noise))

    # -- the exhaustive optimum -------------------------------------------------------------

    def configs(self, *, fast: bool, stages: tuple[int, ...] = (0, 1, 2, 3), max_mbs: int = 1024,
                offload: bool = False) -> Iterator[Config]:
        for stage in stages:
            space = {} if fast else SPACES[stage]
            names = sorted(space)
            offloads = [(False, False)]
            if offload and stage >= 1:
                offloads.append((True, False))
                if stage == 3:
                    offloads.append((True, True))
            for values in itertools.product(*(space[k] for k in names)):
                for off_opt, off_param in offloads:
                    for mbs in range(1, max_mbs + 1):
                        config = Config(stage=stage, mbs=mbs, knobs=tuple(zip(names, values)),
                                        offload_optimizer=off_opt, offload_param=off_param)
                        if self.memory_gb(config) > self.device_gb:
                            break
                        yield config

    def arm_optima(self, **kwargs: Any) -> dict[tuple[int, bool, bool], tuple[Config, float]]:
        """The best config of each arm (stage, offload_optimizer, offload_param) that has one
        running, and its true throughput; ``kwargs`` as :meth:`configs` takes them."""
        best: dict[tuple[int, bool, bool], tuple[Config, float]] = {}
        for config in self.configs(**kwargs):
            t = self.evaluate(config).throughput
            key = (config.stage, config.offload_optimizer, config.offload_param)
            if t > 0.0 and (key not in best or t > best[key][1]):
                best[key] = (config, t)
        return best

    def optimum(self, **kwargs: Any) -> tuple[Config | None, float]:
        return optimum_of(self.arm_optima(**kwargs))


# One-sided slow outliers (issue 46): beside each generator's own scatter, a share of a job's
# runs land on a slow node, a preempted step or a noisy neighbour and report 5-25% below what
# the config runs at, never above. The share is the job's own, 5-15%, drawn from its name (so
# from its seed); which runs are slow and by how much, from the job, the config and the launch.
SLOW_SHARE = (0.05, 0.15)
SLOW_BY = (0.05, 0.25)


def slow_share(job: str) -> float:
    """The share of ``job``'s runs that are slow outliers."""
    return random.Random(f"optuna-ds-slow|{job}").uniform(*SLOW_SHARE)


def slow_outlier(job: str, config: Config, nonce: int) -> float:
    """The factor the launch ``nonce`` of ``config`` on ``job`` reports its throughput at: 1.0,
    or, for a slow outlier, 0.75-0.95 (:data:`SLOW_BY`). Reproducible from its arguments."""
    draw = random.Random(f"optuna-ds-slow|{job}|{config}|{nonce}")
    return 1.0 - draw.uniform(*SLOW_BY) if draw.random() < slow_share(job) else 1.0


def optimum_of(arm_optima: dict[tuple[int, bool, bool], tuple[Config, float]]) -> tuple[Config | None, float]:
    return max(arm_optima.values(), key=lambda cv: cv[1], default=(None, 0.0))


def _gain(**tables: dict[Any, float]) -> dict[str, dict[Any, float]]:
    return {k: {(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v): g for v, g in t.items()}
            for k, t in tables.items()}


SURFACES = [
    Surface(
        name="gpt2-large",
        description="0.8B params: stage 0 fits 20 samples, its sweet spot is below the edge; "
                    "the profile underestimates memory by 15%; overlap_comm pays at stages 2-3",
        params_b=0.774, act_gb=2.9, peak=40.0, half_mbs=3.0, pressure_from=0.85, pressure_loss=0.25,
        knob_gain=_gain(overlap_comm={True: 1.05}, reduce_bucket_size={5e7: 0.96, 1e9: 0.99},
                        allgather_bucket_size={5e7: 0.97}),
        noise=0.01,
    ),
    Surface(
        name="small-plateau",
        description="0.1B params, activation-light: every stage fits hundreds of samples, throughput "
                    "plateaus after ~32; stage 0 best; bucket sizes matter",
        params_b=0.11, act_gb=0.35, peak=400.0, half_mbs=6.0, pressure_from=0.9, pressure_loss=0.2,
        stage_factor=(1.0, 0.99, 0.97, 0.85),
        knob_gain=_gain(reduce_bucket_size={5e7: 0.95, 1e9: 1.02}, allgather_bucket_size={1e9: 1.01}),
        noise=0.015, startup_s=30.0,
    ),
    Surface(
        name="zero3-needed",
        description="12B params: stage 0 does not fit, stage 1 fits 3 samples, stage 2 about 13, stage 3 about 20 and wins",
        params_b=12.0, act_gb=2.2, peak=9.0, half_mbs=4.0, pressure_from=0.9, pressure_loss=0.3,
        stage_factor=(1.0, 0.98, 0.95, 0.9),
        knob_gain=_gain(overlap_comm={True: 1.06}, contiguous_gradients={False: 0.97}),
        noise=0.01, startup_s=120.0,
    ),
    Surface(
        name="cliff-crash",
        description="1.5B params: a memory cliff at 24 samples (a workspace switch: the linear memory "
                    "estimate says 40 fit); stage 2 with reduce_scatter off crashes (NCCL error)",
        params_b=1.5, act_gb=1.3, peak=25.0, half_mbs=6.0, cliff_mbs=24, cliff_gb=20.0,
        pressure_from=0.9, pressure_loss=0.15, stage_factor=(1.0, 0.99, 0.975, 0.8),
        knob_gain=_gain(overlap_comm={True: 1.03}, reduce_bucket_size={1e9: 1.02}),
        crash={"stage": 2, "reduce_scatter": False}, noise=0.01, startup_s=75.0,
    ),
    Surface(
        name="noisy-flat",
        description="0.35B params, 3% measurement noise, a broad flat optimum: the search must not chase noise",
        params_b=0.35, act_gb=0.9, peak=120.0, half_mbs=2.0, pressure_from=0.92, pressure_loss=0.1,
        stage_factor=(1.0, 0.995, 0.98, 0.83),
        knob_gain=_gain(overlap_comm={True: 1.02}),
        noise=0.03, startup_s=45.0,
    ),
    Surface(
        name="offload-only",
        description="60B params on 8 GPUs: nothing fits without offload; stage 3 with the optimizer "
                    "offloaded to CPU runs. DeepSpeed's autotuner never tries offload",
        params_b=60.0, act_gb=1.0, peak=3.0, half_mbs=4.0, pressure_from=0.9, pressure_loss=0.2,
        noise=0.01, startup_s=180.0,
    ),
]


def spaces_of(surface: Surface) -> tuple[dict[int, dict[str, list[Any]]], dict[str, Any]]:
    """The knob spaces and knob defaults of the job's generator: its own where it has them
    (benchmarks/blind_jobs.py's stage 3 tunes keys of its own), else this module's."""
    if hasattr(surface, "defaults"):  # a job with a space of its own (physical_jobs.LeverJob's levers)
        return surface.spaces(), surface.defaults()  # type: ignore[attr-defined]
    module = sys.modules[type(surface).__module__]
    return getattr(module, "SPACES", SPACES), getattr(module, "DEFAULTS", DEFAULTS)


def scale(surface: Surface, device_memory: float) -> float:
    """The tools' device memory over the surface's GPU memory."""
    return device_memory / (surface.device_gb * GB)


def model_info(surface: Surface, device_memory: float) -> dict[str, Any]:
    """What the engine's profile run reports, scaled to ``device_memory``: the parameter count
    such that 16 bytes per parameter are the surface's instantiation memory, and the activation
    memory of one sample."""
    k = scale(surface, device_memory)
    num_params = int(surface.params_b * GB * k)
    return {"num_params": num_params, "trainable_num_params": num_params,
            "activation_mem_per_gpu": int(surface.act_gb * GB * k)}


def fits(surface: Surface, config: Config) -> bool:
    return math.isfinite(surface.memory_gb(config)) and surface.memory_gb(config) <= surface.device_gb
