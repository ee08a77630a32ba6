"""Blind third job generator: DeepSpeed ZeRO jobs drawn from physical ranges, a held-out test set.

Written without reading the planner, its knob space, or the other two generators, and frozen once
committed: a search that is tuned against it stops being judged by it. Imports nothing from the
project but the benchmarks' shared `Config` and `Outcome` (benchmarks/surfaces.py: the fields it
was written with); the benchmark reads it by duck typing (`blind_job(seed)`, `by_name(name)`).

A job is a cluster, a model and a workload drawn from the ranges below. Every launch of a config is
priced by one closed-form model, written with numpy broadcasting so that the exhaustive optima
(`arm_optima`) and a single launch (`evaluate`) read the same equations:

* step time = micro-steps x (forward + backward + exposed per-micro-step communication) + exposed
  per-step communication + optimizer (GPU Adam, or CPU Adam and PCIe copies when offloaded), times a
  slowdown near the memory edge (allocator cache flushes and retries);
* peak memory = CUDA context and NCCL buffers + model states of the stage (ZeRO paper: 2+2+12 bytes
  per parameter, partitioned by stage) + activations (Korthikanti et al. 2022 per-layer formula) +
  the knobs' buffers, the larger of the backward phase and the optimizer phase, plus fragmentation
  that depends on the exact shapes (so the out-of-memory edge is not monotone in the micro-batch);
* knobs act through both: bucket sizes set message efficiency, launch count, the un-overlapped last
  bucket and buffer memory; `overlap_comm` hides reduction behind backward for 4.5x the buckets'
  memory; `contiguous_gradients` trades a buffer for fragmentation; `reduce_scatter` changes little
  in stages 1-2 (DeepSpeed all-reduces each bucket either way; off, it costs a copy) but halves
  stage 3's gradient traffic; stage 3's prefetch bucket, persistence threshold and live-parameter
  cap set how much all-gather hides behind compute, how many fetches its hooks pay, and what stays
  resident; a knob the stage does not read changes nothing;
* per-stage costs: stage 0 all-reduces once per step; stage 1 all-reduces at the step and
  all-gathers the updated parameters; stage 2 reduces every micro-step through per-tensor hooks;
  stage 3 all-gathers parameters twice per micro-step, module by module, with hooks per tensor
  (so it loses on small models and slow-hook hosts and wins where only it fits);
* failures: out of memory (in the first forward, at the lazily allocated Adam states of the first
  optimizer step, or steps later as fragmentation creeps), host RAM exhausted by per-rank model
  loading or offload buffers (at start-up), BatchNorm at micro-batch 1, int32 indexing overflow of a
  logits tensor past 2^31 elements (half the language-model jobs), and for 30% of jobs a DeepSpeed
  or NCCL bug that takes down some knob settings (never DeepSpeed's defaults);
* measurements: the engine's profiled window (steps 3-5 of 5) with non-Gaussian noise: Laplace launch
  noise, straggler ranks, drift over launches, occasional bad nodes on shared clusters, a slow first
  launch, and per-step spikes; normalised so that the long-run mean of `measure` is `throughput`.
  Drift and bad nodes follow the nonce alone (a time index shared by all configs); the rest follows
  (config, nonce). `noise` is the standard deviation of the generator itself (4096 launches).

Interface notes: `DEFAULTS` holds DeepSpeedZeroConfig's values, but `overlap_comm` defaults to on in
stage 3 as DeepSpeed's validator sets it, and `knobs=()` means exactly that. Arms are (stage,
offload_optimizer, offload_param): the optimizer offloaded from stage 1, parameters too in stage 3.
`arm_optima` searches micro-batches 1..max_mbs at `gas` (default 1) exhaustively; it skips only sizes
whose memory floor overflows or whose compute-only speed cannot beat the defaults' best, which no
knob setting can change.

Ranges (per job, drawn by seed) and where they come from:

* GPUs: V100 16/32 GB (125 TFLOP/s fp16 tensor, 0.9 TB/s), A100 40/80 GB (312 TFLOP/s, 1.6/2.0 TB/s),
  H100 SXM 80 GB (989 TFLOP/s dense, 3.35 TB/s), L4 and A10 24 GB (121/125 TFLOP/s, 0.3/0.6 TB/s,
  PCIe only) -- NVIDIA data sheets. Intra-node all-reduce bus bandwidth as nccl-tests reports it:
  ~130 GB/s V100 NVLink2, ~230 A100 NVLink3, ~370 H100 NVLink4, 10-16 over PCIe; inter-node per node:
  25-100 Gb/s Ethernet (cloud L4/A10/V100), 400 Gb/s EFA, 8x200 Gb/s HDR and 8x400 Gb/s NDR
  InfiniBand (DGX A100/H100), at 60-90% efficiency. 1-8 GPUs a node, 1-8 nodes, at most 64 GPUs.
* Achievable model FLOPs utilisation 0.30-0.55 for transformers (Megatron/DeepSpeed reports, ZeRO-
  Offload's 40 TFLOP/s on a V100), 0.08-0.25 for convolutional nets (MLPerf ResNet-50 ~2,500-3,000
  img/s on an A100 with DALI, typical PyTorch AMP about half), falling at small micro-batches and, for
  some jobs, slightly past a sweet spot.
* Models: BERT-base/large, RoBERTa-large, DeBERTa-xl encoders (seq 128-512); GPT-2 small..XL and
  1.3B-30B decoders (seq 512-4096; flash attention on Ampere/Hopper for most); T5-like encoder-
  decoders; ResNet-50/152 (BatchNorm) at 160-288 px and a Stable-Diffusion-sized UNet (GroupNorm) --
  fp16 or bf16 (not on V100), activation checkpointing on for 15-45% of them.
* Activations per sample: s*h*(15+4f) + 5*a*s^2 (no flash attention) bytes per layer, 2*s*h per layer
  with checkpointing plus one layer recomputed; logits s*V*10 bytes; ResNet-50 ~50 MB per 224 px image
  with AMP (bs 256 on a 16 GB V100 in NVIDIA's examples). The profile reports them off by 0.5-2x.
* Buffers: DeepSpeed's `stage_1_and_2.py` / `stage3.py` (an ipg bucket of reduce_bucket_size elements,
  a second one with overlap_comm); Hugging Face's DeepSpeed docs (overlap_comm: 4.5x the buckets).
* CPU Adam 2-8 G params/s per node (ZeRO-Offload's CPU-Adam), PCIe 11/22/45 GB/s (gen 3/4/5) shared by
  two GPUs per switch on some nodes, host RAM 384-2048 GB per node.
* Start-up 12-40 s of launcher and imports (+ rendezvous per node), 3-12 s per billion parameters of
  initialisation, pinned-memory allocation for offload; the first steps 1.5-4x slower (cuDNN autotune,
  NCCL connections). An H100 GPT-2-medium experiment took 44-50 s, a third of it start-up.
* Run-to-run noise: 0.8-3% on dedicated nodes, 2.5-6% on cloud instances, 5-12% on shared clusters.
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from surfaces import Config  # the benchmarks' shared types, re-exported
from surfaces import Outcome

SPACES: dict[int, dict[str, list[Any]]] = {
    0: {},
    1: {
        "reduce_bucket_size": [5e7, 5e8, 1e9],
        "allgather_bucket_size": [5e7, 5e8, 1e9],
    },
    2: {
        "overlap_comm": [True, False],
        "reduce_scatter": [False, True],
        "reduce_bucket_size": [5e7, 5e8, 1e9],
        "allgather_bucket_size": [5e7, 5e8, 1e9],
        "contiguous_gradients": [False, True],
    },
    # DeepSpeed's stage-3 space also lists allgather_partitions and allgather_bucket_size, which
    # stage 3 never reads; stage 3's own prefetch, persistence and live-parameter keys replace them.
    3: {
        "overlap_comm": [True, False],
        "reduce_scatter": [False, True],
        "reduce_bucket_size": [5e7, 5e8, 1e9],
        "contiguous_gradients": [False, True],
        "stage3_prefetch_bucket_size": [5e7, 5e8],
        "stage3_param_persistence_threshold": [1e4, 1e5, 1e6],
        "stage3_max_live_parameters": [1e8, 1e9],
    },
}

# DeepSpeedZeroConfig's defaults; overlap_comm's default is dynamic: on for stage 3 only.
DEFAULTS: dict[str, object] = {
    "overlap_comm": False,
    "reduce_scatter": True,
    "reduce_bucket_size": 5e8,
    "allgather_bucket_size": 5e8,
    "allgather_partitions": True,
    "contiguous_gradients": True,
    "stage3_prefetch_bucket_size": 5e7,
    "stage3_param_persistence_threshold": 1e5,
    "stage3_max_live_parameters": 1e9,
}

END_STEP = 5  # DeepSpeed autotuning's end_profile_step: the steps one launch runs
PROFILED = 3  # steps start_profile_step (3) .. end_profile_step (5): the engine's profiled window

_GB = 1e9
_F16 = 2  # bytes of an fp16/bf16 element


@dataclass(frozen=True)
class _Gpu:
    name: str
    gb: float
    tflops: float  # dense 16-bit tensor peak
    hbm: float  # GB/s
    intra: float  # all-reduce bus bandwidth inside a node, GB/s
    pcie: float  # host link per GPU, GB/s
    bf16: bool
    mfu: tuple[float, float]  # achievable utilisation of a large transformer
    nics: tuple[tuple[str, float], ...]  # inter-node fabric per node, GB/s
    host_gb: tuple[float, float]  # host RAM per node
    weight: float


_GPUS = (
    _Gpu("V100-16GB", 16, 125, 900, 130, 11, False, (0.30, 0.45), (("25GbE", 3.1), ("100GbE", 12.5), ("4x EDR IB", 50)), (384, 768), 0.06),
    _Gpu("V100-32GB", 32, 125, 900, 130, 11, False, (0.30, 0.45), (("100GbE", 12.5), ("4x EDR IB", 50)), (512, 1536), 0.08),
    _Gpu("A100-40GB", 40, 312, 1555, 230, 22, True, (0.35, 0.55), (("400Gb EFA", 50), ("8x HDR IB", 200)), (1024, 1152), 0.20),
    _Gpu("A100-80GB", 80, 312, 2039, 230, 22, True, (0.35, 0.55), (("400Gb EFA", 50), ("8x HDR IB", 200)), (1024, 2048), 0.22),
    _Gpu("H100-80GB", 80, 989, 3350, 370, 45, True, (0.30, 0.45), (("3200Gb EFA", 400), ("8x NDR IB", 400), ("400Gb RoCE", 50)), (2048, 2048), 0.24),
    _Gpu("L4-24GB", 24, 121, 300, 12, 22, True, (0.30, 0.45), (("50GbE", 6.2), ("100GbE", 12.5)), (384, 768), 0.10),
    _Gpu("A10-24GB", 24, 125, 600, 14, 22, True, (0.30, 0.45), (("100GbE", 12.5),), (384, 768), 0.10),
)


@dataclass(frozen=True)
class _Arch:
    name: str
    kind: str  # "encoder" | "decoder" | "encdec" | "conv" | "unet"
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    vocab: int = 0
    ffn: float = 4.0
    seqs: tuple[int, ...] = ()  # sequence lengths, or image sides for conv/unet
    # conv/unet: parameters, forward GFLOPs and activation GB per sample at seqs[0] side
    params: float = 0.0
    gflops: float = 0.0
    act_gb: float = 0.0
    tensors: int = 0
    weight: float = 1.0


_ARCHS = (
    _Arch("bert-base", "encoder", 12, 768, 12, 30522, seqs=(128, 256, 512), weight=1.0),
    _Arch("bert-large", "encoder", 24, 1024, 16, 30522, seqs=(128, 256, 512), weight=1.0),
    _Arch("roberta-large", "encoder", 24, 1024, 16, 50265, seqs=(256, 512), weight=0.6),
    _Arch("deberta-xl", "encoder", 24, 1536, 24, 128100, seqs=(256, 512), weight=0.5),
    _Arch("gpt2", "decoder", 12, 768, 12, 50257, seqs=(512, 1024), weight=0.8),
    _Arch("gpt2-medium", "decoder", 24, 1024, 16, 50257, seqs=(512, 1024), weight=1.0),
    _Arch("gpt2-large", "decoder", 36, 1280, 20, 50257, seqs=(1024,), weight=1.0),
    _Arch("gpt2-xl", "decoder", 48, 1600, 25, 50257, seqs=(1024,), weight=1.0),
    _Arch("decoder-1.3B", "decoder", 24, 2048, 32, 50272, seqs=(1024, 2048), weight=1.2),
    _Arch("decoder-2.7B", "decoder", 32, 2560, 32, 50272, seqs=(1024, 2048), weight=1.0),
    _Arch("decoder-6.7B", "decoder", 32, 4096, 32, 32000, seqs=(2048, 4096), weight=1.0),
    _Arch("decoder-13B", "decoder", 40, 5120, 40, 32000, seqs=(2048, 4096), weight=0.8),
    _Arch("decoder-30B", "decoder", 48, 7168, 56, 32000, seqs=(2048,), weight=0.4),
    _Arch("t5-base", "encdec", 12, 768, 12, 32128, seqs=(512,), weight=0.5),
    _Arch("t5-large", "encdec", 24, 1024, 16, 32128, seqs=(512,), weight=0.5),
    _Arch("t5-xl-like", "encdec", 24, 2048, 32, 32128, ffn=2.5, seqs=(512,), weight=0.4),
    _Arch("resnet50", "conv", seqs=(224, 160, 288), params=25.6e6, gflops=8.2, act_gb=0.05, tensors=161, weight=0.8),
    _Arch("resnet152", "conv", seqs=(224, 288), params=60.2e6, gflops=23.0, act_gb=0.11, tensors=467, weight=0.5),
    _Arch("unet-860M", "unet", seqs=(512, 256), params=860e6, gflops=800.0, act_gb=2.2, tensors=686, weight=0.5),
)


def _pick(rng: np.random.Generator, items: tuple[Any, ...] | list[Any], weights: list[float] | None = None) -> Any:
    w = np.asarray(weights if weights is not None else [getattr(x, "weight", 1.0) for x in items], dtype=float)
    return items[int(rng.choice(len(items), p=w / w.sum()))]


# Counter-based hashing: every draw after construction is a pure function of (job, config, nonce),
# vectorised over arrays of configs and nonces.
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def _hash(*parts: Any) -> np.ndarray:
    with np.errstate(over="ignore"):
        h = np.atleast_1d(np.uint64(0x243F6A8885A308D3))
        for p in parts:
            x = h ^ (np.atleast_1d(np.asarray(p)).astype(np.int64).astype(np.uint64) + _GOLD)
            x = (x ^ (x >> np.uint64(30))) * _M1
            x = (x ^ (x >> np.uint64(27))) * _M2
            h = x ^ (x >> np.uint64(31))
        return h


def _uniform(*parts: Any) -> np.ndarray:
    return ((_hash(*parts) >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def _normal(*parts: Any) -> np.ndarray:
    u1, u2 = _uniform(*parts, 1), _uniform(*parts, 2)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def _laplace(*parts: Any) -> np.ndarray:
    u = _uniform(*parts) - 0.5
    return -np.sign(u) * np.log1p(-2.0 * np.abs(u)) / math.sqrt(2.0)  # unit variance


def _attr(config: Any, name: str, default: Any) -> Any:
    value = getattr(config, name, default)
    return default if value is None else value


_KNOB_ORDER = tuple(DEFAULTS)


def _effective(stage: int, knobs: dict[str, object]) -> dict[str, float]:
    """The value of every knob the stage reads; a knob it ignores keeps its default, so that
    setting it cannot change the truth."""
    out = {k: float(v) for k, v in DEFAULTS.items()}  # type: ignore[arg-type]
    out["overlap_comm"] = 1.0 if stage == 3 else 0.0
    reads = {0: (), 1: ("reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients", "allgather_partitions"),
             2: ("reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients", "allgather_partitions", "reduce_scatter"),
             3: ("reduce_bucket_size", "overlap_comm", "contiguous_gradients", "reduce_scatter", "stage3_prefetch_bucket_size",
                 "stage3_param_persistence_threshold", "stage3_max_live_parameters")}[stage]
    for name, value in knobs.items():
        if name in reads:
            out[name] = float(value)  # type: ignore[arg-type]
    return out


class BlindJob:
    """One job: a cluster, a model, a workload and its noise, all drawn from `seed`."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._cache: dict[tuple[Any, ...], tuple[dict[str, float], np.ndarray]] = {}
        self.name = f"blind-{self.seed}"
        rng = np.random.default_rng([0xB11D, self.seed])
        gpu: _Gpu = _pick(rng, _GPUS)
        self._gpu = gpu
        per_node = int(_pick(rng, [1, 2, 4, 8], [0.2, 0.15, 0.2, 0.45]))
        nodes = int(_pick(rng, [1, 2, 4, 8], [0.5, 0.2, 0.2, 0.1])) if per_node == 8 else int(_pick(rng, [1, 2], [0.85, 0.15]))
        self._per_node, self._nodes = per_node, nodes
        self.num_gpus = per_node * nodes
        self.device_gb = float(gpu.gb)
        nic_name, nic = _pick(rng, list(gpu.nics), [1.0] * len(gpu.nics))
        self._nic_name = nic_name
        intra = gpu.intra * rng.uniform(0.85, 1.0)
        if per_node <= 2 and gpu.intra > 50:
            intra *= 0.5  # a pair of GPUs shares fewer NVLink lanes than an 8-GPU switch
        inter = nic * rng.uniform(0.6, 0.9)
        self._busbw = (intra if nodes == 1 else min(intra, inter)) * _GB
        self._alpha = rng.uniform(30e-6, 80e-6) + (self.num_gpus - 1) * (2e-6 if nodes == 1 else rng.uniform(6e-6, 12e-6))
        self._mhalf = (rng.uniform(1, 3) if nodes == 1 else rng.uniform(8, 20)) * 1e6 * max(1.0, self.num_gpus / 16)
        self._pcie = gpu.pcie * _GB * (0.5 if rng.random() < 0.4 else 1.0) * rng.uniform(0.75, 0.9)
        self._host = rng.uniform(*gpu.host_gb) * _GB
        self._cpu_adam = rng.uniform(2e9, 8e9)  # parameters per second per node
        env = _pick(rng, ["dedicated", "cloud", "shared"], [0.55, 0.3, 0.15])
        self._env = env

        self._draw_behaviour(rng)
        self._i32 = False
        for _ in range(100):
            self._draw_model(rng, gpu)
            if self._fits_somewhere():
                break
        self._i32 = self._logits > 0 and rng.random() < 0.5  # torch kernels that index logits with int32
        self._warm = rng.uniform(1.5, 4.0) + (rng.uniform(2, 8) if self._arch.kind == "conv" else 0.0)
        self.act_gb = self._act * self._profile_error / _GB
        self._draw_noise(rng, env)
        self.params_b = self._psi / 1e9
        self.startup_s = self._startup(1, False, False)
        self.description = (
            f"{self.num_gpus}x {gpu.name} ({nodes} node{'s' if nodes > 1 else ''}"
            f"{', ' + nic_name if nodes > 1 else ''}), {self._arch.name} "
            f"{'seq' if self._arch.kind not in ('conv', 'unet') else 'px'} {self._seq}, {self._precision}"
            f"{', flash-attn' if self._flash else ''}{', checkpointing' if self._ckpt else ''}; {env}, noise {self.noise:.1%}"
        )

    # -- drawing ---------------------------------------------------------------------------------

    def _draw_model(self, rng: np.random.Generator, gpu: _Gpu) -> None:
        arch: _Arch = _pick(rng, _ARCHS)
        self._arch = arch
        seq = int(_pick(rng, list(arch.seqs), [1.0] * len(arch.seqs)))
        self._seq = seq
        self._precision = "bf16" if gpu.bf16 and rng.random() < 0.7 else "fp16"
        transformer = arch.kind in ("encoder", "decoder", "encdec")
        self._flash = transformer and gpu.name[0] in "AHL" and rng.random() < (0.75 if arch.kind == "decoder" else 0.35)
        big = transformer and arch.layers * arch.hidden**2 * 12 > 1e9
        self._ckpt = arch.kind != "conv" and rng.random() < (0.45 if big else 0.15)
        self._bn = arch.kind == "conv"
        if transformer:
            self._transformer(arch, seq)
        else:
            scale = (seq / arch.seqs[0]) ** 2
            self._psi = arch.params
            self._flops = arch.gflops * 1e9 * scale
            act = arch.act_gb * _GB * scale
            self._act = act * (0.3 if self._ckpt else 1.0)
            self._logits = 0.0
            self._layer = arch.params / max(8, arch.tensors // 10)
            sizes = np.exp(rng.normal(0.0, 2.0, arch.tensors))
            self._sizes = np.sort(np.maximum(64.0, sizes / sizes.sum() * arch.params))
            self._units = 1.0  # work per sample in units of the efficiency curve
        self._mfu = rng.uniform(*gpu.mfu) * (rng.uniform(0.25, 0.55) if not transformer else 1.0)
        self._u_half = (1024.0 * 1024.0 / max(self._arch.hidden, 256) * rng.uniform(0.5, 2.0)) if transformer else rng.uniform(4, 24)
        self._u_peak = self._u_half * rng.uniform(16, 96)
        self._decline = rng.uniform(0.0, 0.025) if rng.random() < 0.5 else 0.0

    def _transformer(self, arch: _Arch, seq: int) -> None:
        h, L, V, f = arch.hidden, arch.layers, arch.vocab, arch.ffn
        layer = [h * h] * 4 + [f * h * h] * 2 + [h] * 9 + [f * h]  # q k v o, mlp in/out, biases and norms
        if arch.kind == "encdec":
            cross = layer + [h * h] * 4 + [h] * 6
            tensors = layer * L + cross * L
            layers = 2 * L
        else:
            tensors = layer * L
            layers = L
        tensors += [V * h]
        if arch.kind != "decoder" or h < 2048:
            tensors += [min(seq, 4096) * h]  # learned positions
        self._sizes = np.sort(np.asarray(tensors, dtype=float))
        self._psi = float(self._sizes.sum())
        self._layer = float(sum(layer))
        a, s = arch.heads, seq
        per_layer = s * h * (15 + 4 * f) + (0 if self._flash else 5 * a * s * s)
        if arch.kind == "encdec":
            per_layer *= 1.25
        self._logits = float(s * V)
        logits_bytes = s * V * 10.0 * (0.3 if arch.kind == "encoder" else 1.0)
        if self._ckpt:
            self._act = layers * 2 * s * h + per_layer + logits_bytes
        else:
            self._act = layers * per_layer + logits_bytes
        dense = self._psi - V * h
        self._flops = 2 * dense * s + 4 * layers * s * s * h + 2 * s * h * V
        self._units = float(s)

    def _draw_behaviour(self, rng: np.random.Generator) -> None:
        self._act_frag = rng.uniform(0.03, 0.12)
        self._cg_frag = rng.uniform(0.03, 0.10)
        self._spike_p = rng.uniform(0.01, 0.06)
        self._creep = rng.uniform(0.01, 0.04)
        self._pressure = rng.uniform(0.0, 0.3)
        self._context = rng.uniform(0.45, 0.95) * _GB + (rng.uniform(0.2, 0.5) * _GB if self.num_gpus > 1 else 0.0) + (0.25 * _GB if self._nodes > 1 else 0.0)
        self._o_micro = rng.uniform(2e-3, 9e-3)
        self._o_step = rng.uniform(2e-3, 20e-3)
        self._c_hook = rng.uniform(40e-6, 120e-6)  # stage 3's fetch and release hooks, per parameter tensor and pass
        self._c_hook2 = rng.uniform(20e-6, 120e-6)  # stage 2's gradient hooks and bucket copies, per tensor
        self._rs_off = rng.uniform(0.95, 1.12)
        self._ovf = rng.uniform(0.6, 0.95)
        self._contention = rng.uniform(0.04, 0.15)
        self._profile_error = float(np.clip(math.exp(rng.normal(0.0, 0.28)), 0.5, 2.0))
        self._bug = _pick(rng, ["none", "overlap-without-contiguous", "stage3-no-reduce-scatter", "multinode-big-allgather"], [0.7, 0.1, 0.1, 0.1])
        self._base_start = rng.uniform(12, 40) + (rng.uniform(4, 10) * math.log2(self._nodes) if self._nodes > 1 else 0.0)
        self._init_per_b = rng.uniform(3, 12)

    def _draw_noise(self, rng: np.random.Generator, env: str) -> None:
        lo, hi = {"dedicated": (0.008, 0.03), "cloud": (0.025, 0.06), "shared": (0.05, 0.12)}[env]
        target = rng.uniform(lo, hi)
        core, strag, drift, step = rng.dirichlet([3.0, 1.0, 1.0, 1.5]) * target**2
        self._laplace_b = math.sqrt(core)
        self._strag_p = rng.uniform(0.03, 0.08) * (1 + 0.5 * math.log2(self._nodes))
        self._strag_d = min(0.4, math.sqrt(strag / (self._strag_p * 13 / 12 - self._strag_p**2)))
        self._drift_a = math.sqrt(2 * drift)
        self._drift_period = rng.uniform(8, 40)
        self._drift_phase = rng.uniform(0, 2 * math.pi)
        # the mean of PROFILED steps carries a PROFILED-th of a step's variance; spikes take a share
        per_step = PROFILED * step
        share = rng.uniform(0.2, 0.6)
        self._step_spike_p = rng.uniform(0.01, 0.05)
        self._step_spike = min(1.0, math.sqrt(share * per_step / (self._step_spike_p * 13 / 12)))
        self._step_sigma = math.sqrt((1 - share) * per_step)
        self._bad_p = 0.05 if env == "shared" and self._nodes > 1 else 0.0
        self._bad_d = rng.uniform(0.2, 0.4)
        self._cold = rng.uniform(0.03, 0.10) if rng.random() < 0.3 else 0.0
        x = self._launch(np.arange(4096), np.uint64(0))[0]
        self._x_mean = float(x.mean())
        self.noise = float(x.std() / x.mean())

    # -- the model -------------------------------------------------------------------------------

    def _fits_somewhere(self) -> bool:
        first = 2 if self._bn else 1
        g = self._grid(3, True, True, np.asarray([[first]]), 1, {k: np.asarray([[v]]) for k, v in _effective(3, {}).items()})
        return bool(g["ok"].all())

    def _coll(self, nbytes: Any, bucket: Any) -> Any:
        """Seconds of a ring reduce-scatter (or all-gather) of `nbytes` per rank sent in buckets."""
        if self.num_gpus == 1:
            return np.zeros_like(np.asarray(nbytes, dtype=float) + np.asarray(bucket, dtype=float))
        n = self.num_gpus
        bucket = np.maximum(np.minimum(bucket, nbytes), 1.0)
        eff = bucket / (bucket + self._mhalf)
        return nbytes * (n - 1) / n / (self._busbw * eff) + np.ceil(nbytes / bucket) * self._alpha

    def _overlapped(self, comm: Any, window: Any, tail: Any) -> Any:
        return np.maximum(0.0, comm - self._ovf * window) + np.minimum(tail, comm) + self._contention * np.minimum(comm, window)

    def _startup(self, stage: int, oo: bool, op: bool) -> float:
        own = self._psi / self.num_gpus if stage >= 1 else self._psi
        s = self._base_start + self._init_per_b * self._psi / 1e9 * (0.5 if stage == 3 and self.num_gpus > 1 else 1.0)
        if oo:
            s += 3.0 + 16 * own * min(self._per_node, self.num_gpus) / 2.5e9
        if op:
            s += 2 * own * min(self._per_node, self.num_gpus) / 2.5e9
        if stage == 3:
            s += 1.0 + 0.002 * len(self._sizes)
        return float(s)

    def _grid(self, stage: int, oo: bool, op: bool, mbs: np.ndarray, gas: int, kn: dict[str, np.ndarray]) -> dict[str, Any]:
        """Every quantity of a launch, broadcast over knob settings (rows) and micro-batches (columns)."""
        n, psi = self.num_gpus, self._psi
        oo = oo and stage >= 1
        op = op and stage == 3
        own = psi / n if stage >= 1 else psi
        rbs = np.minimum(kn["reduce_bucket_size"], psi)
        agbs = np.minimum(kn["allgather_bucket_size"], psi)
        ov, cg, rs, agp = kn["overlap_comm"] > 0.5, kn["contiguous_gradients"] > 0.5, kn["reduce_scatter"] > 0.5, kn["allgather_partitions"] > 0.5
        mbs = np.asarray(mbs, dtype=float)

        # compute: utilisation rises with the work per micro-step, and for some jobs falls past a sweet spot
        u = mbs * self._units
        eff = self._mfu * u / (u + self._u_half) * (1.0 - self._decline * np.log2(np.maximum(1.0, u / self._u_peak)))
        t = self._flops * mbs / (self._gpu.tflops * 1e12 * eff)
        fwd = t + self._o_micro / 2
        bwd = (3.0 if self._ckpt else 2.0) * t + self._o_micro / 2

        shape = np.broadcast(rbs, mbs).shape
        zero: Any = 0.0
        micro_comm, step_comm, hooks, micro_off, step_off = zero, zero, zero, zero, zero
        persist = np.zeros_like(rbs)
        live = np.zeros_like(rbs)
        if stage == 0:
            step_comm = 2 * self._coll(_F16 * psi, _F16 * min(5e8, psi))
        elif stage in (1, 2):
            gather = self._coll(_F16 * psi, _F16 * agbs) * np.where(agp, 1.0, 1.4)
            if stage == 1:
                reduce = 2 * self._coll(_F16 * psi, _F16 * rbs)
                tail = 2 * self._coll(_F16 * rbs, _F16 * rbs)
                step_comm = np.where(ov, self._overlapped(reduce, bwd, tail), reduce) + gather
            else:
                # stage_1_and_2.average_tensor all-reduces each bucket (use_multi_rank_bucket_allreduce)
                # and keeps its partition; reduce_scatter=False all-reduces whole and copies out
                reduce = 2 * self._coll(_F16 * psi, _F16 * rbs) * np.where(rs, 1.0, self._rs_off)
                tail = 2 * self._coll(_F16 * rbs, _F16 * rbs)
                micro_comm = np.where(ov, self._overlapped(reduce, bwd, tail), reduce)
                hooks = len(self._sizes) * self._c_hook2
                step_comm = gather
        else:
            idx = np.searchsorted(self._sizes, kn["stage3_param_persistence_threshold"], side="left")
            csum = np.concatenate([[0.0], np.cumsum(self._sizes)])
            persist = csum[idx]
            fetched = len(self._sizes) - idx
            gathered = psi - persist
            layer = self._layer
            pf = np.minimum(kn["stage3_prefetch_bucket_size"], np.maximum(0.0, kn["stage3_max_live_parameters"] - layer))
            live = np.minimum(2 * layer + pf, psi)
            # each module's parameters are one all-gather; a larger prefetch bucket keeps more in flight
            msg = np.minimum(layer / 4, np.maximum(gathered, 1.0))
            gather = 2 * self._coll(_F16 * gathered, _F16 * msg)
            hidden = self._ovf * pf / (pf + 2 * layer)
            exposed_gather = np.maximum(0.0, gather - hidden * (fwd + bwd)) + 2 * self._contention * np.minimum(gather, fwd + bwd)
            reduce = self._coll(_F16 * gathered, _F16 * rbs) * np.where(rs, 1.0, 1.7) + 2 * self._coll(_F16 * persist, _F16 * np.maximum(persist, 1.0))
            tail = self._coll(_F16 * rbs, _F16 * rbs)
            micro_comm = exposed_gather + np.where(ov, self._overlapped(reduce, bwd, tail), reduce)
            hooks = 2 * fetched * self._c_hook + 2 * np.ceil(gathered / msg) * 20e-6
            if op:
                micro_off = 2 * _F16 * gathered / n / self._pcie * 0.8 + hooks * 0.5

        ranks = min(self._per_node, n)
        if oo:
            step_off = own * ranks / self._cpu_adam + _F16 * own / self._pcie
            if stage == 2:
                micro_off = micro_off + 0.5 * _F16 * own / self._pcie
            else:
                step_off = step_off + _F16 * own / self._pcie
            opt = 0.0
        else:
            opt = own * 36 / (self._gpu.hbm * _GB * 0.8) + 3e-3

        # memory, bytes
        lazy = 0.0 if oo else 12 * own
        if stage == 0:
            states = 16 * psi
        elif stage == 1:
            states = 4 * psi + lazy
        elif stage == 2:
            states = 2 * psi + 2 * own + lazy
        else:
            states = 0.0 if op else 4 * own + lazy
        act = mbs * self._act * (1 + self._act_frag)
        buf_reduce = _F16 * rbs * (np.where(ov, 4.5, 1.0) + np.where(rs | (stage != 2), 0.0, 1.0)) if stage >= 1 else zero
        frag_cg = np.where(cg, 0.0, self._cg_frag * (act + _F16 * psi)) if stage >= 2 else zero
        bwd_mem = states + act + buf_reduce + frag_cg + 4 * persist + _F16 * live
        if stage == 0:
            step_mem = states + 4 * psi
        elif stage in (1, 2):
            step_mem = states + (0.0 if oo else 4 * own) + _F16 * agbs * np.where(ov, 4.5, 1.0) + (2 * _F16 * rbs if stage == 1 else 0.0)
        else:
            step_mem = states + (0.0 if oo else 4 * own) + 4 * persist
        code = _hash(stage, int(oo), int(op), *(np.round(kn[k] / 1e3) for k in _KNOB_ORDER))
        # a uniform per (setting, micro-batch) as the sum mod 1 of one per setting and one per micro-batch
        u1 = np.mod(_uniform(self.seed, 11, code) + _uniform(self.seed, 11, mbs), 1.0)
        u2 = np.mod(_uniform(self.seed, 12, code) + _uniform(self.seed, 12, mbs), 1.0)
        jitter = act * (0.03 * (u1 - 0.5) + 0.045 * (u2 < self._spike_p))
        need = self._context + np.maximum(bwd_mem, step_mem) + jitter
        device = self.device_gb * _GB
        oom = need > device
        first_fits = need - lazy <= device  # the first forward/backward runs; Adam's states allocate at the step

        step = gas * (fwd + bwd + micro_comm + hooks + micro_off) + step_comm + opt + step_off + self._o_step
        frac = need / device
        step = step * (1.0 + self._pressure * np.clip((frac - 0.92) / 0.08, 0.0, 1.0) ** 2)

        host = ranks * (4 * psi if stage < 3 else 4 * psi / n) + (ranks * 16 * own * 1.1 if oo else 0.0) + (ranks * 2 * own if op else 0.0)
        host_crash = np.broadcast_to(host > 0.9 * self._host, shape)
        crash = (mbs == 1) & self._bn
        if self._i32:
            crash = crash | (mbs * self._logits >= 2.0**31)
        if self._bug == "overlap-without-contiguous" and stage >= 2:
            crash = crash | (ov & ~cg)
        elif self._bug == "stage3-no-reduce-scatter" and stage == 3:
            crash = crash | ~rs
        elif self._bug == "multinode-big-allgather" and stage in (1, 2) and self._nodes > 1:
            crash = crash | (kn["allgather_bucket_size"] >= 1e9)
        crash = np.broadcast_to(crash, shape)
        ok = ~oom & ~crash & ~host_crash
        return {
            "ok": ok, "oom": oom & ~host_crash, "crash": host_crash | (crash & ~oom), "host_crash": host_crash,
            "first_fits": first_fits, "need": need, "step": step, "fwd": np.broadcast_to(gas * fwd, shape), "bwd": np.broadcast_to(gas * (bwd + hooks), shape),
            "comm": np.broadcast_to(gas * micro_comm + step_comm, shape), "opt": np.broadcast_to(opt + step_off + gas * micro_off, shape),
            "throughput": np.where(ok, mbs * gas * n / step, 0.0),
            "floor": np.broadcast_to(self._context + states + 0.985 * act, shape),  # no knob setting needs less
            "bound": np.broadcast_to(mbs * gas * n / (gas * (fwd + bwd) + opt + step_off + self._o_step), shape),  # nor runs faster
        }

    def _one(self, config: Any) -> tuple[dict[str, float], tuple[int, bool, bool], np.ndarray]:
        """A launch's quantities (cached), its arm, and the code that seeds its noise."""
        stage = int(_attr(config, "stage", 0))
        mbs = int(_attr(config, "mbs", 1))
        gas = int(_attr(config, "gas", 1))
        oo = bool(_attr(config, "offload_optimizer", False)) and stage >= 1
        op = bool(_attr(config, "offload_param", False)) and stage == 3
        kn = _effective(stage, dict(_attr(config, "knobs", ())))
        key = (stage, oo, op, mbs, gas, *(kn[k] for k in _KNOB_ORDER))
        if key not in self._cache:
            g = self._grid(stage, oo, op, np.asarray([[mbs]]), gas, {k: np.asarray([[v]]) for k, v in kn.items()})
            code = _hash(stage, int(oo), int(op), mbs, gas, *(round(kn[k] / 1e3) for k in _KNOB_ORDER))
            self._cache[key] = ({k: float(np.asarray(v).ravel()[0]) for k, v in g.items()}, code)
        values, code = self._cache[key]
        return values, (stage, oo, op), code

    # -- the interface ---------------------------------------------------------------------------

    def evaluate(self, config: Any) -> Outcome:
        g, (stage, oo, op), _ = self._one(config)
        start = self._startup(stage, oo, op)
        step = g["step"]
        if g["host_crash"]:
            return Outcome("crash", 0.0, 0.8 * start)
        if g["oom"]:
            margin = g["need"] / (self.device_gb * _GB) - 1.0
            if g["first_fits"]:
                return Outcome("oom", 0.0, start + step * (1 + self._warm))  # at the first optimizer step
            if margin < self._creep:
                late = 2 + int((1.0 - margin / self._creep) * (END_STEP - 2))
                return Outcome("oom", 0.0, start + step * (late - 1 + self._warm))
            return Outcome("oom", 0.0, start + 0.3 * step * self._warm)
        if g["crash"]:
            return Outcome("crash", 0.0, start + 0.5 * step * (1 + self._warm))
        return Outcome("ok", g["throughput"], start + step * (END_STEP + self._warm))

    def memory_gb(self, config: Any) -> float:
        return self._one(config)[0]["need"] / _GB

    def peak_memory_gb(self, config: Any, nonce: int) -> float:
        g, _, code = self._one(config)
        u = float(_uniform(self.seed, 21, code, nonce)[0])
        if g["oom"]:
            return self.device_gb * (0.985 + 0.015 * u)
        reported = g["need"] / _GB * (1.0 + 0.02 * u)  # the caching allocator's reserve above the need
        if g["crash"]:
            reported *= 0.6 + 0.4 * u
        return min(self.device_gb, reported)

    def _launch(self, nonce: Any, code: Any) -> tuple[np.ndarray, np.ndarray]:
        """Per nonce: the launch's speed factor over the true mean (unnormalised), and its profiled
        steps' times relative to the launch's typical step."""
        nonce = np.atleast_1d(np.asarray(nonce))
        x = np.exp(np.clip(self._laplace_b * _laplace(self.seed, 31, code, nonce), -0.5, 0.5))
        x = x * np.where(_uniform(self.seed, 32, code, nonce) < self._strag_p, 1.0 - self._strag_d * (0.5 + _uniform(self.seed, 33, code, nonce)), 1.0)
        x = x * (1.0 + self._drift_a * np.sin(2 * np.pi * nonce / self._drift_period + self._drift_phase))
        x = x * np.where(_uniform(self.seed, 34, nonce) < self._bad_p, 1.0 - self._bad_d, 1.0)
        x = x * np.where(nonce == 0, 1.0 - self._cold, 1.0)
        steps = self._step_noise(nonce, code)
        return x / steps.mean(axis=1), steps

    def _step_noise(self, nonce: np.ndarray, code: Any) -> np.ndarray:
        """Each profiled step's time relative to the launch's typical step: jitter and rare spikes
        (garbage collection, a data-loader stall)."""
        i = np.arange(PROFILED)[None, :]
        nonce = nonce[:, None]
        e = 1.0 + self._step_sigma * _normal(self.seed, 41, code, nonce, i)
        spike = _uniform(self.seed, 42, code, nonce, i) < self._step_spike_p
        e = e + np.where(spike, self._step_spike * (0.5 + _uniform(self.seed, 43, code, nonce, i)), 0.0)
        return np.maximum(e, 0.3)

    def step_times(self, config: Any, nonce: int) -> list[float]:
        g, _, code = self._one(config)
        if not g["ok"]:
            return []
        x, steps = self._launch(nonce, code)
        # the launch's factor scales the mean step; the steps keep their own spread around it
        return [float(v) for v in g["step"] * steps[0] / steps[0].mean() * self._x_mean / x[0]]

    def measure(self, config: Any, nonce: int) -> float:
        steps = self.step_times(config, nonce)
        if not steps:
            return 0.0
        return float(int(_attr(config, "mbs", 1)) * int(_attr(config, "gas", 1)) * self.num_gpus / np.mean(steps))

    def timers(self, config: Any, nonce: int) -> dict[str, float]:
        g, _, code = self._one(config)
        if not g["ok"]:
            return {}
        scale = 1e3 * self._x_mean / float(self._launch(nonce, code)[0][0])
        return {"fwd": g["fwd"] * scale, "bwd": g["bwd"] * scale, "bwd_allreduce": g["comm"] * scale, "step": g["opt"] * scale}

    def _arms(self, stages: Any, offload: bool) -> list[tuple[int, bool, bool]]:
        arms = []
        for stage in stages:
            arms.append((stage, False, False))
            if offload and stage >= 1:
                arms.append((stage, True, False))
            if offload and stage == 3:
                arms.append((stage, True, True))
        return arms

    def arm_optima(self, *, fast: bool, offload: bool = True, stages: Any = (0, 1, 2, 3), max_mbs: int = 1024,
                   gas: int = 1) -> dict[tuple[int, bool, bool], tuple[Config, float]]:
        """The true best config of each arm by exhaustive search over micro-batch sizes (and, unless
        `fast`, every knob combination of the stage's space)."""
        out: dict[tuple[int, bool, bool], tuple[Config, float]] = {}
        for stage, oo, op in self._arms(stages, offload):
            default = {k: np.asarray([[v]]) for k, v in _effective(stage, {}).items()}
            mbs = np.arange(1, max_mbs + 1)[None, :]
            g = self._grid(stage, oo, op, mbs, gas, default)
            names = [] if fast else list(SPACES[stage])
            combos = list(itertools.product(*(SPACES[stage][k] for k in names)))
            tput = g["throughput"]
            if not fast:
                # only micro-batches that some setting might run faster than the defaults' best
                keep = (g["floor"][0] <= self.device_gb * _GB) & (g["bound"][0] >= tput.max())
                if not keep.any():
                    continue
                mbs = mbs[:, keep]
                eff = [_effective(stage, dict(zip(names, c))) for c in combos]
                kn = {k: np.asarray([[e[k]] for e in eff]) for k in DEFAULTS}
                tput = self._grid(stage, oo, op, mbs, gas, kn)["throughput"]
            if tput.max() <= 0:
                continue
            k, m = np.unravel_index(int(np.argmax(tput)), tput.shape)
            config = Config(stage=stage, mbs=int(mbs[0, m]), gas=gas, knobs=tuple(zip(names, combos[k])), offload_optimizer=oo, offload_param=op)
            out[(stage, oo, op)] = (config, float(tput[k, m]))
        return out

    def optimum(self, **kw: Any) -> tuple[Config | None, float]:
        arms = self.arm_optima(**kw)
        if not arms:
            return None, 0.0
        return max(arms.values(), key=lambda ct: ct[1])

    def oom_edge(self, stage: int, *, offload_optimizer: bool = False, offload_param: bool = False, max_mbs: int = 1024) -> tuple[int, int]:
        """At default knobs: the largest micro-batch that fits, and the smallest that does not
        (max_mbs + 1 if none); the first above the second is a non-monotone edge."""
        kn = {k: np.asarray([[v]]) for k, v in _effective(stage, {}).items()}
        g = self._grid(stage, offload_optimizer, offload_param, np.arange(1, max_mbs + 1)[None, :], 1, kn)
        fits = ~g["oom"][0] & ~g["host_crash"][0]
        largest = int(np.nonzero(fits)[0].max()) + 1 if fits.any() else 0
        first_oom = int(np.nonzero(~fits)[0].min()) + 1 if (~fits).any() else max_mbs + 1
        return largest, first_oom


def blind_job(seed: int) -> BlindJob:
    return BlindJob(seed)


def by_name(name: str) -> BlindJob:
    prefix = "blind-"
    if not name.startswith(prefix) or not name[len(prefix):].isdigit():
        raise KeyError(name)
    return BlindJob(int(name[len(prefix):]))


def _summary(count: int, start: int, full: bool) -> None:
    names = {(0, False, False): "z0", (1, False, False): "z1", (1, True, False): "z1+oo", (2, False, False): "z2", (2, True, False): "z2+oo",
             (3, False, False): "z3", (3, True, False): "z3+oo", (3, True, True): "z3+oop"}
    for seed in range(start, start + count):
        job = blind_job(seed)
        print(f"{job.name}: {job.description}")
        print(f"  params {job.params_b:.3g}B, act/sample {job.act_gb:.3g} GB as profiled ({job._act / _GB:.3g} true), "
              f"startup {job.startup_s:.0f}s, noise {job.noise:.2%}, bug: {job._bug}")
        arms = job.arm_optima(fast=True)
        arms_full = job.arm_optima(fast=False) if full else {}
        for arm, label in names.items():
            stage, oo, op = arm
            largest, first_oom = job.oom_edge(stage, offload_optimizer=oo, offload_param=op)
            edge = f"fits <= {largest}" + (f", OOM from {first_oom}" if first_oom <= 1024 else "") + (" (non-monotone)" if first_oom < largest else "")
            if arm in arms:
                config, tput = arms[arm]
                line = f"    {label:7s} mbs {config.mbs:5d} {tput:10.1f}/s  [{edge}]"
                if arm in arms_full:
                    line += f"  knobs {arms_full[arm][1] / tput - 1:+.1%} at mbs {arms_full[arm][0].mbs}"
            else:
                line = f"    {label:7s} no config runs  [{edge}]"
            print(line)
        best, tput = job.optimum(fast=True)
        seconds = job.evaluate(best).seconds if best is not None else 0.0
        print(f"  optimum: {best} {tput:.1f}/s, its launch {seconds:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--summary", type=int, metavar="N", required=True, help="print N jobs: arms' optima, noise, OOM edges")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--full", action="store_true", help="also the knob search's gain over default knobs per arm")
    args = parser.parse_args(argv)
    if args.summary < 0:
        print("--summary: N must be non-negative", file=sys.stderr)
        return 2
    _summary(args.summary, args.start, args.full)
    return 0


if __name__ == "__main__":
    sys.exit(main())
