"""A fourth, blind job generator: held-out DeepSpeed jobs for the planner (issue #33, item 6).

Written blind: its author read neither the tuner (optuna_ds/) nor the other generators' physics
(benchmarks/jobs.py, physical_jobs.py, surfaces.py's equations, replays.py) nor the body of
benchmarks/blind_jobs.py; from that module only the interface was copied (SPACES, DEFAULTS,
END_STEP, PROFILED, Config, Outcome, the job methods' signatures). Everything else comes from public
descriptions of DeepSpeed ZeRO and the hardware, listed below, and from judgement where no public
number exists (marked "judgement"). Frozen at the commit that added it ("bench: blind fourth
generator"): neither tune the planner on it nor tune it to the planner.

Run ``python benchmarks/blind4_jobs.py --count 200`` for the summary table.

What is modelled, and where each range comes from
-------------------------------------------------
Hardware (one card kind per job; total ranks = nodes x GPUs per node):

- H100 SXM 80 GB and H200 141 GB: 989 dense BF16 TFLOPS, 3.35 / 4.8 TB/s HBM (NVIDIA H100 and H200
  data sheets). B200: 180 GB each (DGX B200 data sheet: 1,440 GB for 8 GPUs), about 2,250 dense BF16
  TFLOPS (half of the 4.5 PFLOPS dense FP8), 8 TB/s. A100 80 GB: 312 TFLOPS, 2.0 TB/s. AMD MI300X:
  192 GB HBM3, 5.3 TB/s, 1,307 dense BF16 TFLOPS (AMD data sheet). L40S: 48 GB GDDR6, 864 GB/s,
  362 dense BF16 TFLOPS, PCIe Gen4, no NVLink (NVIDIA L40S data sheet). RTX 4090 24 GB: 165 BF16
  TFLOPS with FP32 accumulate, 1,008 GB/s; RTX 3090 24 GB: 71 TFLOPS, 936 GB/s (NVIDIA Ada and Ampere
  GA102 whitepapers).
- Achieved fraction of peak (MFU ceiling) per job: H100/H200 0.36-0.52, B200 0.28-0.45 (younger
  software), MI300X 0.20-0.38 (public training reports trail H100 per peak FLOP), A100 0.45-0.60,
  L40S 0.40-0.60, GeForce 0.45-0.70 of their FP32-accumulate peak (judgement, consistent with
  published Llama/GPT MFU of 35-55% on H100 and 50-60% on A100), scaled by (h/(h+384)) relative to
  h = 4096 (narrow models spend more of their time in elementwise kernels; GPT-2-small-sized models
  reach 20-35% MFU in public reports). Small token counts per micro-batch lose efficiency (half
  efficiency at about 300*(4096/h)^1.5 tokens, judgement: GEMMs with few rows do not fill the GPU),
  with wave quantisation over the card's SMs/CUs, and every layer costs a CPU launch time of
  0.25-0.6 ms (eager PyTorch), so small models at small micro-batches are launch-bound.
- NCCL bus bandwidth (nccl-tests' busbw; reference numbers: 8xH100 NVLink 460-480 GB/s, 8xA100
  230-250 GB/s, PCIe-only 35-45 GB/s): NVLink-4 nodes 470, NVLink-5 (B200) 720, MI300X Infinity
  Fabric 310 (RCCL, judgement below the 896 GB/s aggregate link rate), A100 240, L40S through PCIe
  host bridges 18, RTX 3090 with P2P 12, RTX 4090 without P2P (GeForce P2P is disabled; NCCL falls
  back to shared host memory) 7. Across nodes: rail-optimised 8x400G InfiniBand 360 GB/s, half the
  rails 180, a cloud RoCE fabric 45; A100 HDR 180/90/22; L40S 1-2x100 GbE 10-20; desktops 25/100 GbE
  2.5-11. A collective costs latency alpha (10-80 us, more across nodes and with log2 of the group)
  plus volume / (busbw * m / (m + m_half)): messages smaller than m_half (1-32 MB) do not reach the
  bus bandwidth (nccl-tests curves).
- Host: 64-256 GB RAM (at least 32 GB per GPU) and 60-250 GB/s memory bandwidth on desktops, 384-768
  GB on L40S servers,
  1-4 TB and 300-900 GB/s on HGX/OAM servers (2-socket DDR5 8-12 channels); pinned PCIe copies
  20-45 GB/s per GPU (Gen4/Gen5 x16), shared host memory bandwidth caps them.

Jobs draw a card (weights: H200 3, B200/MI300X/L40S 2.5, H100/RTX 4090 2, A100/RTX 3090 1,
judgement: a mix tilted to current and consumer hardware), a rank count (data centre 1-128 ranks in
8-GPU nodes, half of them one node; L40S up to 4 nodes of 4 or 8; desktops up to 2 boxes of 1-8)
and a workload family (desktops favour small models and ViT, large clusters Llama and MoE):

- Llama-style decoders with GQA: Qwen2-0.5B, Llama-3.2-1B/3B, Mistral-7B, Llama-3-8B, Llama-2-13B
  (no GQA), CodeLlama-34B, Llama-3-70B (their published configs: layers, hidden, heads, KV heads,
  FFN width, vocabulary 32k-152k, tied embeddings for the small ones), 2k-8k tokens.
- Long context: the 0.5-8B ones at 16k-32k tokens with flash attention, checkpointing in 85%.
- MoE: OLMoE-1B-7B, DeepSeekMoE-16B, Mixtral 8x7B and 8x22B at 2k-4k tokens.
- ViT-B/16, L/16, H/14, g/14, G/14 at 224-518 px (197-1,370 tokens), images decoded by CPU workers.
- Small models where start-up dominates: BERT-base and RoBERTa-large (eager attention, 128 or 512
  tokens), GPT-2 124M/355M (512 or 1,024 tokens).

A draw that fits no arm at micro-batch 1, or whose best step takes over 2 minutes, is redrawn.

Memory (per rank, bytes; Psi = parameters on this rank, N = data-parallel ranks):

- Model states, mixed-precision Adam, ZeRO paper (Rajbhandari et al. 2020, arXiv:1910.02054): stage
  0 16 Psi; stage 1 fp16 params and grads 4 Psi + optimizer 12 Psi/N; stage 2 2 Psi + 14 Psi/N; stage
  3 16 Psi/N. DeepSpeed also materialises the fp32 gradient partition (4 Psi/N) at the optimizer step:
  a separate step-phase peak, taken as max(forward/backward peak, step peak).
- Offload (ZeRO-Offload, Ren et al. 2021, arXiv:2101.06840; ZeRO-Infinity, arXiv:2104.07857):
  optimizer states and fp32 grads (16 Psi/N) move to pinned host memory; param offload also moves the
  fp16 partition; the host needs them times the GPUs per node, plus 3-6 GB per rank of process
  (8-14 GB for image loaders with workers). Without ZeRO-3's zero.Init, every rank first builds or
  loads a whole copy on the CPU (2 bytes/param from a bf16 checkpoint in 60% of jobs, 4 for a random
  fp32 init), while zero.Init loads one shard (at most 5 GB) at a time, so stages 0-2 of a big model
  can kill a host that stage 3 survives: a "crash", as is an offload that does not fit the host's
  RAM (92% usable).
- Buckets: the Hugging Face DeepSpeed guide: "overlap_comm uses 4.5x the allgather_bucket_size and
  reduce_bucket_size values ... 5e8 x 2Bytes x 2 x 4.5" (9 GB); without overlap, 1x; contiguous
  gradients add one reduce bucket. Stage 3: live parameters min(max_live, layer + prefetch) (at least
  one module) for params and grads, the prefetch bucket, reduce buckets (doubled with overlap), and
  persistent (unpartitioned) parameters below the persistence threshold, whole on every rank.
- Activations per sample (Korthikanti et al. 2022, arXiv:2205.05198: s*h*(34 + 5as/h) bytes per
  layer for GPT; flash attention drops the 5as/h term, Dao et al. 2022): counted per tensor saved
  for Llama-style SwiGLU blocks with GQA, GELU MLPs for ViT/BERT/GPT-2, and eager attention (the s^2
  scores) for the BERT-style encoders. Activation checkpointing keeps 2sh per layer plus one layer's
  recompute. The loss's logits (bf16 logits, fp32 upcast and grad: 10 bytes x s x vocab) are a real
  peak for 128k vocabularies, unless the job uses a fused or chunked cross-entropy (35% of text jobs:
  2 bytes). A job whose sample would take over 30% of the card without recomputation turns
  checkpointing on, as its author would. The caching allocator's fragmentation adds 1-5% of activations plus a
  0-12% part that jumps with the micro-batch size (doubled without contiguous gradients): out-of-
  memory edges are not monotone near the limit.
- The profile's activation estimate (``act_gb``) errs by a log-normal factor (bias +3%, spread 12%):
  a profile run at one micro-batch size cannot see fragmentation or the logits' exact peak.

Time per optimizer step (gas micro-steps):

- FLOPs per sample 6 * matmul params * tokens + 12 * layers * h * s^2 attention (halved when causal
  with flash attention), x4/3 with recomputation (Narayanan et al. 2021, arXiv:2104.04473).
- Stage 0: DeepSpeed's engine all-reduces the fp16 gradients after backward in 5e8-element buckets,
  not overlapped; the full optimizer step runs on every rank.
- Stages 1-2: gradients go out in reduce_bucket_size buckets; reduce_scatter=True is DeepSpeed's
  average_tensor, one dist.reduce per destination partition in each bucket (half an all-reduce's
  volume, more and smaller calls), reduce_scatter=False one all-reduce per bucket. Stage 1 reduces
  once per optimizer step after backward, stage 2 every micro-step inside backward, hidden behind it
  only with overlap_comm (the last bucket is never hidden; hidden traffic slows compute by 3-20%
  of itself, NCCL kernels take SMs). Updated fp16 parameters are all-gathered in
  allgather_bucket_size buckets. Stage 2 pays per-parameter hooks (4-15 us each) and gradient copies
  (more without contiguous gradients); with optimizer offload, stage 2 copies each gradient slice to
  its pinned buffer from the hooks with a synchronisation per bucket (0.3 ms), every micro-step, and
  accumulates on the CPU for gas > 1, where stage 1 copies once per step: ZeRO-1 + offload wins only
  with gradient accumulation. The ZeRO optimizer's own bookkeeping costs 2-8 ms plus 4-12 us per
  parameter tensor per step: stage 0 wins small models on one node.
- Stage 3 (3 Psi volume per the ZeRO paper): parameters all-gathered per module in forward and
  backward (again in the recompute if max_live cannot keep a layer), hidden by prefetch in
  proportion to sqrt(prefetch / layer size) and much less when max_live_parameters cannot hold a
  layer plus its prefetch; gradients reduce-scattered (reduce_scatter=False: all-reduced) per
  reduce_bucket_size; each fetched module costs 40-120 us of Python hooks.
- CPU Adam (offload): memory-bound on the host, 28 bytes per parameter at 50% of the host's
  bandwidth, shared by the node's ranks; gradients down (fp32) and parameters up (fp16) over PCIe.
  Param offload copies each partition up before its all-gather, every pass.
- MoE (DeepSpeed-MoE, Rajbhandari et al. 2022): expert parallel over min(experts, GPUs per node);
  expert gradients reduce in the expert-data-parallel group; four all-to-alls per MoE layer per
  micro-step (capacity factor 1.25). Models: Mixtral 8x7B (46.7B / 12.9B active), Mixtral 8x22B,
  OLMoE-1B-7B (64 experts, top-8), DeepSeekMoE-16B (64 routed top-6 + 2 shared).
- ViT (Dosovitskiy et al. 2020; ViT-g/G from Zhai et al. 2022) trains from JPEGs: 90-180 images/s per
  loader worker at 224 px (judgement, PIL decode + RandomResizedCrop), falling as (224/px)^1.5, or
  5x that with GPU decoding; a step cannot beat its loader, so fast GPUs hit a data wall.
- NCCL watchdog: on some fabrics (35% of multi-node jobs, fewer single-node) a step that issues more
  collectives than a per-job limit (300-5000, judgement) hangs; it fails after the process group's timeout
  (600 s or torch/DeepSpeed's default 1800 s): a crash at some knob settings only.

Start-up (``startup_s``, seconds before the first step): imports 8-18 s, NCCL set-up, loading
(checkpoint at 0.8-4 GB/s or random init on the CPU), ZeRO partitioning, zero.Init's per-module
hooks, CPU Adam's extension load and pinning host memory (judgement from DeepSpeed logs). Small
models spend far longer starting than running 5 steps.

Noise (all keyed by seed, config and launch nonce; the long-run mean of ``measure`` is
``evaluate``'s throughput, by normalising over 4096 launches):

- Bimodal nodes: each job draws from a pool of nodes (its own plus 0-3 spares per node); 0-30% of
  them are slow (compute 6-20% slower: power capping, a hot GPU; or the NIC 20-55% slower: a link
  trained down). Synchronous training runs at the slowest node a launch lands on.
- Heavy tails: the launch's compute speed jitters by a Student-t (3 degrees of freedom) of scale
  0.2-2.5%; the network by a log-normal 1-25% (weak fabrics widest) and, across nodes, a
  congestion event (0-15% of launches) slowing traffic 1.3-2.5x.
- Slow drift across launches (an AR(1) of 0-2% with correlation 0.7-0.97): the cluster's load.
- Thermal drift within a launch: each step 0-0.3% (liquid/forced-air data centre) to 0.5-2.5%
  (desktop cards) slower than the one before.
- Per-step jitter 0.2-1.5% and, in 60% of jobs, stalls (0-12% of steps, mean 5-150 ms,
  exponential: a data-loader hiccup, garbage collection), which weigh most on short steps. The
  host's CPU Adam varies 2-8%; the image loader 3-10%.
- ``noise`` is the standard deviation of measure / truth over the 4096 reference launches at the
  job's best default-knob config (``reference``).
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


_NREF = 4096  # launches the measurement noise is normalised over
_KNOBS = ("overlap_comm", "reduce_scatter", "reduce_bucket_size", "allgather_bucket_size", "contiguous_gradients",
          "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_max_live_parameters")


@dataclass(frozen=True)
class _Card:
    name: str
    gb: float  # device memory, GB
    tflops: float  # dense BF16
    hbm: float  # GB/s
    intra: float  # NCCL all-reduce busbw inside a node, GB/s
    intra_alpha: float  # s per collective
    intra_half: float  # bytes at which a collective reaches half its bandwidth
    per_node: tuple[int, ...]
    inter: tuple[float, ...]  # busbw across nodes per fabric option, GB/s
    inter_alpha: float
    max_nodes: int
    pcie: float  # pinned host<->device per GPU, GB/s
    ram: tuple[int, ...]  # GB per node
    host_bw: tuple[float, ...]  # GB/s per node
    cores: tuple[int, ...]
    mfu: tuple[float, float]
    thermal: tuple[float, float]  # per-step slowdown while a launch heats the card
    units: int  # SMs / CUs
    weight: float
    ranks: tuple[int, ...]
    desktop: bool = False


_DC_RANKS = (1, 2, 4, 8, 8, 8, 8, 16, 16, 32, 64, 128)
_CARDS = (
    _Card("H200-141GB", 141, 989, 4800, 470, 12e-6, 8e6, (8,), (360, 180, 45), 25e-6, 16, 40, (1024, 2048), (600, 900),
          (112, 128), (0.36, 0.52), (0.0, 0.002), 132, 3.0, _DC_RANKS),
    _Card("B200-180GB", 180, 2250, 8000, 720, 10e-6, 16e6, (8,), (360, 180), 25e-6, 16, 45, (2048, 4096), (600, 900),
          (112,), (0.28, 0.45), (0.0, 0.003), 148, 2.5, _DC_RANKS),
    _Card("MI300X-192GB", 192, 1307, 5300, 310, 18e-6, 12e6, (8,), (300, 150, 45), 35e-6, 16, 45, (1536, 3072), (700, 900),
          (96, 128), (0.20, 0.38), (0.0, 0.003), 304, 2.5, _DC_RANKS),
    _Card("H100-80GB", 80, 989, 3350, 470, 12e-6, 8e6, (8,), (360, 180, 45), 25e-6, 16, 40, (1024, 2048), (450, 600),
          (96, 112), (0.36, 0.52), (0.0, 0.002), 132, 1.5, _DC_RANKS),
    _Card("A100-80GB", 80, 312, 2039, 240, 15e-6, 8e6, (8,), (180, 90, 22), 30e-6, 16, 22, (1024, 2048), (300, 400),
          (64, 128), (0.45, 0.60), (0.0, 0.002), 108, 1.0, _DC_RANKS),
    _Card("L40S-48GB", 48, 362, 864, 18, 25e-6, 2e6, (4, 8), (10, 20), 60e-6, 4, 22, (384, 768), (300, 460),
          (64, 96), (0.40, 0.60), (0.002, 0.010), 142, 2.5, (1, 2, 4, 4, 8, 8, 16, 32)),
    _Card("RTX4090-24GB", 24, 165, 1008, 7, 35e-6, 1e6, (1, 2, 4, 8), (2.5, 11), 80e-6, 2, 20, (64, 128, 256), (70, 150, 250),
          (16, 32, 64), (0.45, 0.65), (0.005, 0.025), 128, 2.0, (1, 1, 1, 2, 4, 8, 16), desktop=True),
    _Card("RTX3090-24GB", 24, 71, 936, 12, 25e-6, 1e6, (1, 2, 4), (2.5,), 80e-6, 2, 20, (64, 128), (60, 120),
          (12, 24), (0.50, 0.70), (0.005, 0.020), 82, 1.0, (1, 1, 2, 4, 8), desktop=True),
)


@dataclass(frozen=True)
class _Arch:
    name: str
    family: str  # "llama" | "moe" | "vit" | "small"
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int  # dense MLP width, or one expert's width in MoE
    vocab: int  # text vocabulary, or classes for ViT
    gated: bool = True
    tied: bool = False
    bias: bool = False
    experts: int = 0
    topk: int = 0
    shared_ffn: int = 0
    causal: bool = True
    flash: bool = True
    patch: int = 0


_ARCHS = (
    _Arch("qwen-0.5b", "llama", 24, 896, 14, 2, 4864, 151936, tied=True),
    _Arch("llama-1b", "llama", 16, 2048, 32, 8, 8192, 128256, tied=True),
    _Arch("llama-3b", "llama", 28, 3072, 24, 8, 8192, 128256, tied=True),
    _Arch("mistral-7b", "llama", 32, 4096, 32, 8, 14336, 32000),
    _Arch("llama-8b", "llama", 32, 4096, 32, 8, 14336, 128256),
    _Arch("llama2-13b", "llama", 40, 5120, 40, 40, 13824, 32000),
    _Arch("codellama-34b", "llama", 48, 8192, 64, 8, 22016, 32000),
    _Arch("llama-70b", "llama", 80, 8192, 64, 8, 28672, 128256),
    _Arch("olmoe-1b-7b", "moe", 16, 2048, 16, 16, 1024, 50304, experts=64, topk=8),
    _Arch("deepseekmoe-16b", "moe", 28, 2048, 16, 16, 1408, 102400, experts=64, topk=6, shared_ffn=2816),
    _Arch("mixtral-8x7b", "moe", 32, 4096, 32, 8, 14336, 32000, experts=8, topk=2),
    _Arch("mixtral-8x22b", "moe", 56, 6144, 48, 8, 16384, 32768, experts=8, topk=2),
    _Arch("vit-b16", "vit", 12, 768, 12, 12, 3072, 1000, gated=False, bias=True, causal=False, patch=16),
    _Arch("vit-l16", "vit", 24, 1024, 16, 16, 4096, 1000, gated=False, bias=True, causal=False, patch=16),
    _Arch("vit-h14", "vit", 32, 1280, 16, 16, 5120, 1000, gated=False, bias=True, causal=False, patch=14),
    _Arch("vit-g14", "vit", 40, 1408, 16, 16, 6144, 1000, gated=False, bias=True, causal=False, patch=14),
    _Arch("vit-G14", "vit", 48, 1664, 16, 16, 8192, 1000, gated=False, bias=True, causal=False, patch=14),
    _Arch("bert-base", "small", 12, 768, 12, 12, 3072, 30522, gated=False, tied=True, bias=True, causal=False, flash=False),
    _Arch("roberta-large", "small", 24, 1024, 16, 16, 4096, 50265, gated=False, tied=True, bias=True, causal=False, flash=False),
    _Arch("gpt2-124m", "small", 12, 768, 12, 12, 3072, 50257, gated=False, tied=True, bias=True),
    _Arch("gpt2-355m", "small", 24, 1024, 16, 16, 4096, 50257, gated=False, tied=True, bias=True),
)
_LONG = ("llama-1b", "llama-3b", "mistral-7b", "llama-8b", "qwen-0.5b")


# -- deterministic hashing ------------------------------------------------------------------------

_GOLD = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _key(*parts: Any) -> np.ndarray:
    """A splitmix64 chain over the parts (integers or integer arrays, broadcast together)."""
    x = np.atleast_1d(np.uint64(0x6A09E667F3BCC909))
    with np.errstate(over="ignore"):
        for part in parts:
            a = np.atleast_1d(np.asarray(part))
            a = a.astype(np.int64).astype(np.uint64) if a.dtype.kind in "fb" else a.astype(np.uint64)
            x = x ^ a
            x = x + _GOLD
            x = (x ^ (x >> np.uint64(30))) * _M1
            x = (x ^ (x >> np.uint64(27))) * _M2
            x = x ^ (x >> np.uint64(31))
    return x


def _u01(*parts: Any) -> np.ndarray:
    return (_key(*parts) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def _box_muller(u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)


def _gauss(*parts: Any) -> np.ndarray:
    u = _u01(*(np.asarray(p)[..., None] for p in parts), np.arange(2))
    return _box_muller(u[..., 0], u[..., 1])


def _student3(z: np.ndarray) -> np.ndarray:
    """Student-t with 3 degrees of freedom from four standard normals (last axis), scaled to unit
    variance (its variance is 3)."""
    return z[..., 0] / np.sqrt((z[..., 1:4] ** 2).sum(axis=-1) / 3.0) / math.sqrt(3.0)


def _smax(a: Any, b: Any, p: float = 6.0) -> Any:
    """A soft maximum: two overlapped activities, the slower one dominating."""
    return (a ** p + b ** p) ** (1.0 / p)


def _attr(config: Any, name: str, default: Any) -> Any:
    value = getattr(config, name, default)
    return default if value is None else value


def _effective(stage: int, knobs: dict[str, object]) -> dict[str, float]:
    """The knob values a stage runs with: DeepSpeed's defaults (overlap_comm on for stage 3),
    overridden only by the keys that stage reads."""
    eff = {k: float(DEFAULTS[k]) for k in _KNOBS}  # type: ignore[arg-type]
    if stage == 3:
        eff["overlap_comm"] = 1.0
    for k, v in knobs.items():
        if k in SPACES.get(stage, {}):
            eff[k] = float(v)  # type: ignore[arg-type]
    return eff


def _pick(rng: np.random.Generator, items: Any, weights: Any = None) -> Any:
    items = list(items)
    if weights is None:
        return items[int(rng.integers(len(items)))]
    w = np.asarray(weights, dtype=float)
    return items[int(rng.choice(len(items), p=w / w.sum()))]


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


# -- the model's derived sizes ------------------------------------------------------------------


def _derive(a: _Arch, seq: int, ckpt: bool, ep: int, fused_ce: bool) -> dict[str, Any]:
    h, b = a.hidden, int(a.bias)
    kvw = h * a.kv_heads // a.heads
    s = (seq // a.patch) ** 2 + 1 if a.family == "vit" else seq
    attn = [h * h + b * h, h * kvw + b * kvw, h * kvw + b * kvw, h * h + b * h]
    norms = [h * (1 + b)] * 2
    if a.experts:
        dense_mlp = [h * a.experts] + ([h * a.shared_ffn] * 3 if a.shared_ffn else [])
        expert = [h * a.ffn] * (3 * a.experts)
        mlp_active = a.topk * 3 * h * a.ffn + 3 * h * a.shared_ffn + h * a.experts
        ffn_act = 1.25 * a.topk * a.ffn + a.shared_ffn
    elif a.gated:
        dense_mlp, expert = [h * a.ffn] * 3, []
        mlp_active, ffn_act = 3 * h * a.ffn, float(a.ffn)
    else:
        dense_mlp, expert = [h * a.ffn + b * a.ffn, a.ffn * h + b * h], []
        mlp_active, ffn_act = 2 * h * a.ffn, float(a.ffn)
    if a.family == "vit":
        embed, head = [3 * a.patch ** 2 * h + h, s * h], [a.vocab * h + a.vocab]
    else:
        embed, head = [a.vocab * h], ([] if a.tied else [a.vocab * h])
    dense_layer = sum(attn) + sum(norms) + sum(dense_mlp)
    expert_layer = sum(expert)
    pd = a.layers * dense_layer + sum(embed) + sum(head) + h
    pe = a.layers * expert_layer
    modules = np.sort(np.asarray(attn * a.layers + norms * a.layers + dense_mlp * a.layers + embed + head + [h], dtype=float))
    n_tensors = a.layers * (len(attn) + len(norms) + len(dense_mlp) + len(expert)) * (1 + b) + len(embed) + len(head) + 1
    matmul = a.layers * (h * h * 2 + 2 * h * kvw + mlp_active) + a.vocab * h
    flops = 6.0 * matmul * s + 12.0 * a.layers * h * s * s * (0.5 if (a.causal and a.flash) else 1.0)
    # bytes saved per token per layer (bf16): norms' inputs, q/k/v, attention output; the MLP's
    # inputs and intermediates; eager attention adds the scores, softmax and dropout mask
    per_tok = 2.0 * (5 * h + 2 * kvw) + (2.0 * (2 * h + 4 * ffn_act) if a.gated else 2.0 * (2 * h + 2 * ffn_act) + ffn_act + 2 * h)
    if a.experts:
        per_tok += 2.0 * 2 * 1.25 * a.topk * h
    if not a.flash:
        per_tok += 5.0 * a.heads * s
    full = a.layers * s * per_tok + 4.0 * s * h
    if ckpt:
        store, work = a.layers * s * 2.0 * h + 4.0 * s * h, 2.0 * s * per_tok
        flops *= 4.0 / 3.0
    else:
        store, work = full, 0.0
    logits = 0.0 if a.family == "vit" else (2.0 if fused_ce else 10.0) * s * a.vocab
    layer = dense_layer + expert_layer / ep
    return {
        "P": float(pd + pe), "Pd": float(pd), "Pe": float(pe), "Prep": float(pd + pe / ep), "ep": ep,
        "seq": s, "flops": flops, "store": store, "work": work, "logits": logits, "full": full,
        "fwd_share": 0.25 if ckpt else 1.0 / 3.0, "layer": float(layer),
        "max_module": float(max(modules.max(), a.ffn * h if a.experts else 0)),
        "modules": modules, "cum": np.concatenate([[0.0], np.cumsum(modules)]),
        "n_modules": int(len(modules) + a.layers * len(expert) // ep), "n_tensors": int(n_tensors),
        "tok_half": 300.0 * (4096.0 / h) ** 1.5, "wave_cols": max(h, a.ffn) / 128.0,
        "moe_layers": a.layers if a.experts else 0, "topk": a.topk, "hidden": h, "layers": a.layers,
    }


class Blind4Job:
    """One synthetic DeepSpeed job: a card, a cluster, a model and a noise structure, drawn from
    the seed; its physics in ``_grid`` (vectorised over micro-batch sizes and knob settings)."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self.name = f"blind4-{self.seed}"
        rng = np.random.default_rng([self.seed, 0xB1D4])
        self._draw_cluster(rng)
        self._draw_noise(rng)
        self._cache: dict[Any, Any] = {}
        for attempt in range(200):
            self._draw_workload(rng, fallback=attempt >= 150)
            if self._feasible():
                break
        self.params_b = self._m["P"] / 1e9
        true_act = (self._m["store"] + self._m["logits"] + self._m["work"]) * (1.0 + self._f0 + 0.5 * self._f1)
        self.act_gb = float(true_act / 1e9 * math.exp(rng.normal(0.03, 0.12)))
        self.startup_s = float(self._startup(0, False, False))
        self.description = self._describe()
        self._nonce_cache: dict[str, np.ndarray] = {}
        ref = self.optimum(fast=True)[0]
        self.reference = ref
        self.noise = float(self._noise_at(ref)) if ref is not None else 0.0

    # -- drawing -----------------------------------------------------------------------------------

    def _draw_cluster(self, rng: np.random.Generator) -> None:
        card = _pick(rng, _CARDS, [c.weight for c in _CARDS])
        self._card = card
        n = int(_pick(rng, card.ranks))
        g = min(n, int(_pick(rng, card.per_node)))
        if n // g > card.max_nodes:
            g = max(card.per_node)
            n = min(n, g * card.max_nodes)
        g = math.gcd(n, g)
        self.num_gpus, self._per_node, self._nodes = n, g, n // g
        self.device_gb = float(card.gb)
        self._tflops, self._hbm = card.tflops, card.hbm * 1e9
        self._fabric = float(_pick(rng, card.inter)) if self._nodes > 1 else 0.0
        self._ram = max(float(_pick(rng, card.ram)), 32.0 * g if card.desktop else 0.0) * 1e9
        self._host_bw = float(_pick(rng, card.host_bw)) * 1e9
        self._cores = int(_pick(rng, card.cores))
        self._pcie = min(card.pcie * 1e9, 0.6 * self._host_bw / g)
        self._mfu = float(rng.uniform(*card.mfu))
        self._theta = float(rng.uniform(*card.thermal))
        self._ctx = float(rng.uniform(0.4, 0.9))  # GB the CUDA context takes outside the allocator
        self._ws = float(rng.uniform(0.6, 1.4)) * 1e9  # cuBLAS / attention workspaces, NCCL buffers
        self._f0, self._f1 = float(rng.uniform(0.01, 0.05)), float(rng.uniform(0.0, 0.12))
        self._c_layer = float(rng.uniform(0.25e-3, 0.6e-3))
        self._c_hook2 = float(rng.uniform(4e-6, 15e-6))
        self._c_hook3 = float(rng.uniform(40e-6, 120e-6))
        self._c_zstep = float(rng.uniform(2e-3, 8e-3))
        self._c_tensor = float(rng.uniform(4e-6, 12e-6))
        self._c_step0 = float(rng.uniform(0.5e-3, 2e-3))
        self._rho = float(rng.uniform(0.03, 0.2))
        self._ag_cover = float(rng.uniform(0.6, 0.9))
        self._t_import = float(rng.uniform(8, 18))
        self._disk = float(rng.uniform(0.8, 4.0)) * 1e9
        fragile_p = 0.35 if self._nodes > 1 else (0.15 if card.desktop and n >= 4 else 0.05)
        self._fragile = bool(rng.uniform() < fragile_p)
        self._call_limit = _loguniform(rng, 300, 5000)
        self._nccl_timeout = float(_pick(rng, (600.0, 1800.0)))
        self._first_extra = float(rng.uniform(0.5, 2.0))

    def _draw_noise(self, rng: np.random.Generator) -> None:
        card, nodes = self._card, self._nodes
        extra = int(_pick(rng, (0, 1, 2, 3))) if nodes == 1 else int(_pick(rng, (0, 1, 2, nodes)))
        k = nodes + extra
        p_slow = 0.0 if rng.uniform() < 0.5 else float(rng.uniform(0.05, 0.3))
        slow = rng.uniform(size=k) < p_slow
        kind_net = rng.uniform(size=k) < (0.5 if nodes > 1 else 0.0)
        self._pool_c = np.where(slow & ~kind_net, 1.0 / rng.uniform(0.80, 0.94, size=k), 1.0)
        self._pool_n = np.where(slow & kind_net, 1.0 / rng.uniform(0.45, 0.8, size=k), 1.0)
        dc = not card.desktop and card.name[:4] != "L40S"
        self._sig_c = float(rng.uniform(0.002, 0.012) if dc else rng.uniform(0.006, 0.025))
        self._sig_d, self._rho_d = float(rng.uniform(0.0, 0.02)), float(rng.uniform(0.7, 0.97))
        if nodes == 1:
            self._sig_n, self._p_cong = float(rng.uniform(0.01, 0.04)), 0.0
        elif self._fabric < 50:
            self._sig_n, self._p_cong = float(rng.uniform(0.06, 0.25)), float(rng.uniform(0.0, 0.15))
        else:
            self._sig_n, self._p_cong = float(rng.uniform(0.02, 0.08)), float(rng.uniform(0.0, 0.06))
        self._cong = float(rng.uniform(1.3, 2.5))
        self._sig_h = float(rng.uniform(0.02, 0.08))
        self._sig_l = float(rng.uniform(0.03, 0.10))
        self._sig_s = float(rng.uniform(0.002, 0.015))
        self._p_stall = 0.0 if rng.uniform() < 0.4 else float(rng.uniform(0.0, 0.12))
        self._stall_s = float(rng.uniform(0.005, 0.15))

    def _draw_workload(self, rng: np.random.Generator, *, fallback: bool) -> None:
        card, n = self._card, self.num_gpus
        if fallback:
            fam = "small"
        elif card.desktop:
            fam = _pick(rng, ("small", "vit", "llama", "long", "moe"), (0.35, 0.25, 0.28, 0.06, 0.06))
        elif n <= 8:
            fam = _pick(rng, ("small", "vit", "llama", "long", "moe"), (0.22, 0.18, 0.30, 0.15, 0.15))
        else:
            fam = _pick(rng, ("small", "vit", "llama", "long", "moe"), (0.05, 0.15, 0.40, 0.20, 0.20))
        if fam == "long":
            long_name = _pick(rng, _LONG)
            arch = next(a for a in _ARCHS if a.name == long_name)
            seq, ckpt = int(_pick(rng, (16384, 32768))), bool(rng.uniform() < 0.85)
        else:
            arch = _pick(rng, [a for a in _ARCHS if a.family == fam])
            if fam == "vit":
                seq = int(_pick(rng, (224, 336, 448) if arch.patch == 16 else (224, 336, 448, 518)))
            elif fam == "small":
                seq = int(_pick(rng, (128, 512) if not arch.causal else (512, 1024)))
            elif fam == "moe":
                seq = int(_pick(rng, (2048, 4096)))
            else:
                seq = int(_pick(rng, (2048, 4096, 8192)))
            ckpt = bool(rng.uniform() < {"vit": 0.2, "small": 0.0, "moe": 0.5, "llama": 0.5}[fam])
        fused_ce = fam != "vit" and bool(rng.uniform() < 0.35)  # a chunked or fused cross-entropy (no fp32 logits)
        self._arch, self._family, self._ckpt, self._fused_ce = arch, fam, ckpt, fused_ce
        ep = 1
        if arch.experts:
            ep = min(arch.experts, self._per_node)
            while n % ep:
                ep //= 2
        self._m = _derive(arch, seq, ckpt, ep, fused_ce)
        if not ckpt and self._m["full"] + self._m["logits"] > 0.3 * self.device_gb * 1e9:
            self._ckpt = ckpt = True  # nobody runs a sample that takes a third of the card without recomputation
            self._m = _derive(arch, seq, ckpt, ep, fused_ce)
        self._groups = [(self._m["Pd"], n)] + ([(self._m["Pe"] / ep, n // ep)] if arch.experts else [])
        self._b_init = 2.0 if rng.uniform() < 0.6 else 4.0  # from a bf16 checkpoint, or a random fp32 init
        self._proc = float(rng.uniform(3, 6)) * 1e9 + (float(rng.uniform(5, 8)) * 1e9 if fam == "vit" else 0.0)
        self._load_rate = 0.0
        if fam == "vit":
            workers = min(float(_pick(rng, (4, 6, 8, 12))), self._cores / self._per_node)
            per = float(rng.uniform(90, 180)) * (224.0 / seq) ** 1.5 * (5.0 if rng.uniform() < 0.25 else 1.0)
            self._load_rate = workers * per
        self._cache = {}

    def _feasible(self) -> bool:
        arms = self.arm_optima(fast=True, max_mbs=64)
        if not arms:
            return False
        config, tput = max(arms.values(), key=lambda ct: ct[1])
        step = config.mbs * config.gas * self.num_gpus / tput
        return step < 120.0

    def _describe(self) -> str:
        a, m = self._arch, self._m
        net = f", {self._nodes} nodes at {self._fabric:g} GB/s" if self._nodes > 1 else ""
        shape = f"{a.experts}x{a.topk} experts, " if a.experts else (f"GQA {a.heads}/{a.kv_heads}, " if a.kv_heads != a.heads else "")
        seq = f"{a.patch and int(round((m['seq'] - 1) ** 0.5)) * a.patch}px" if a.family == "vit" else f"s={m['seq']}"
        return (f"{a.name} ({m['P'] / 1e9:.2f}B, {shape}{seq}{', ckpt' if self._ckpt else ''}{', fused CE' if self._fused_ce else ''}) on "
                f"{self.num_gpus}x {self._card.name}{net}, host {self._ram / 1e9:.0f} GB")

    # -- physics -----------------------------------------------------------------------------------

    def _group(self, n: int) -> tuple[float, float, float]:
        """Bandwidth (bytes/s), latency (s) and half-bandwidth message size of an n-rank group."""
        card = self._card
        if self._nodes == 1:
            return card.intra * 1e9, card.intra_alpha * (1 + 0.2 * math.log2(max(n, 2))), card.intra_half
        alpha = card.inter_alpha * (1 + 0.3 * math.log2(self._nodes)) + card.intra_alpha
        return min(card.intra, self._fabric) * 1e9, alpha, 32e6

    def _coll(self, vol: Any, msg: Any, calls: Any, n: int) -> Any:
        if n <= 1:
            return 0.0 * vol
        bw, alpha, half = self._group(n)
        return calls * alpha + vol / bw * (1.0 + half / np.maximum(msg, 1.0))

    def _grad_reduce(self, stage: int, rbs: Any, rs: Any) -> tuple[Any, Any, Any]:
        """Stages 0-2: (seconds, collectives, buckets) to reduce one set of gradients."""
        t, calls, buckets = 0.0, 0.0, 1.0
        for elems, n in self._groups:
            if n <= 1 or elems <= 0:
                continue
            size = 2.0 * elems
            if stage == 0:
                nb = math.ceil(elems / 5e8)
                t = t + self._coll(2.0 * (n - 1) / n * size, 2.0 * min(5e8, elems), nb, n)
                calls, buckets = calls + nb, max(buckets, nb)
                continue
            b = np.minimum(rbs, elems)
            nb = np.ceil(elems / b)
            k = np.minimum(n, np.ceil(b / (elems / n)) + 1.0)
            t_ar = self._coll(2.0 * (n - 1) / n * size, 2.0 * b, nb, n)
            t_rd = self._coll(size, 2.0 * b / k, nb * k, n)
            t = t + np.where(rs > 0.5, t_rd, t_ar)
            calls = calls + np.where(rs > 0.5, nb * k, nb)
            buckets = np.maximum(buckets, nb)
        return t, calls, buckets

    def _param_gather(self, agbs: Any) -> tuple[Any, Any]:
        t, calls = 0.0, 0.0
        for elems, n in self._groups:
            if n <= 1 or elems <= 0:
                continue
            b = np.minimum(agbs, elems)
            nb = np.ceil(elems / b)
            t = t + self._coll((n - 1) / n * 2.0 * elems, 2.0 * b, nb, n)
            calls = calls + nb
        return t, calls

    def _persistent(self, pt: Any) -> tuple[Any, Any]:
        """Stage 3: numel kept whole below the persistence threshold, and the modules still fetched."""
        mods = self._m["modules"]
        idx = np.searchsorted(mods, pt, side="left")
        return self._m["cum"][idx], self._m["n_modules"] - idx

    def _frag(self, stage: int, oo: bool, op: bool, mbs: np.ndarray) -> np.ndarray:
        """The allocator's fragmentation draw per micro-batch size, rows: contiguous_gradients off, on."""
        return np.stack([_u01(self.seed, 5, stage, oo, op, c, mbs[0]) for c in (0, 1)])

    def _grid(self, stage: int, oo: bool, op: bool, mbs: np.ndarray, gas: int, kn: dict[str, np.ndarray]) -> dict[str, Any]:
        """Everything about running (stage, offload, knobs) x micro-batch sizes: arrays of shape
        broadcast(knob rows, mbs columns)."""
        m, n, g = self._m, self.num_gpus, self._per_node
        op = bool(op) and stage == 3
        P, Prep = m["P"], m["Prep"]
        part = P / n
        ov, rs, rbs, agbs = kn["overlap_comm"], kn["reduce_scatter"], kn["reduce_bucket_size"], kn["allgather_bucket_size"]
        cg, pf, pt, ml = kn["contiguous_gradients"], kn["stage3_prefetch_bucket_size"], kn["stage3_param_persistence_threshold"], kn["stage3_max_live_parameters"]
        mb = mbs.astype(float)
        shape = np.broadcast_shapes(mb.shape, np.shape(rbs))
        zero = np.zeros(shape)

        # memory
        pers, n_fetch = (self._persistent(pt) if stage == 3 else (0.0, 0))
        if stage == 0:
            static, trans, buf = 16.0 * Prep + zero, 0.0, 2.0 * min(5e8, Prep)
        elif stage == 1:
            static = 4.0 * Prep + (0.0 if oo else 12.0 * part) + zero
            trans, buf = (0.0 if oo else 4.0 * part), 2.0 * (np.minimum(rbs, Prep) + np.minimum(agbs, Prep))
        elif stage == 2:
            static = 2.0 * Prep + (0.0 if oo else 14.0 * part) + zero
            trans = 0.0 if oo else 4.0 * part
            buf = 2.0 * (np.minimum(rbs, Prep) + np.minimum(agbs, Prep)) * (1.0 + 3.5 * ov) + 2.0 * np.minimum(rbs, Prep) * cg
        else:
            static = (0.0 if op else 2.0 * part) + (0.0 if oo else 14.0 * part) + 4.0 * pers + zero
            live = np.maximum(m["max_module"], np.minimum(ml, m["layer"] + pf))
            trans, buf = (0.0 if oo else 4.0 * part), 4.0 * live + 2.0 * pf + 2.0 * np.minimum(rbs, P) * (1.0 + ov)
        ws = self._ws + (0.3e9 if stage == 3 else 0.0) + (0.4e9 if m["moe_layers"] else 0.0)
        base = static + buf + ws
        act = mb * (m["store"] + m["logits"] + m["work"])
        u = self._frag(stage, oo, op, mb)
        frag_u = np.where(cg > 0.5, u[1][None, :], u[0][None, :]) if stage >= 2 else u[1][None, :]
        frag = mb * m["store"] * (self._f0 + self._f1 * frag_u) * np.where((cg < 0.5) & (stage >= 2), 2.0, 1.0)
        need = np.maximum(base + act + frag, base + trans)
        cap = (self.device_gb - self._ctx) * 1e9
        init_oom = base > cap
        oom = need > cap
        margin = need / cap - 1.0

        # host memory
        load = self._b_init * P if stage < 3 else 2.0 * part + min(5e9, 2.0 * P)  # zero.Init: one shard at a time
        host_init = g * (self._proc + load)
        host_run = g * (self._proc + ((16.0 * part + 4.0 * np.minimum(rbs, P)) if oo else 0.0) + (3.0 * part if op else 0.0))
        host_crash = (np.maximum(host_init, host_run) > 0.92 * self._ram) | (oo and stage == 0) | zero.astype(bool)
        host_load_crash = (host_init > 0.92 * self._ram) | zero.astype(bool)

        # compute
        tok = mb * m["seq"]
        waves = tok / 128.0 * m["wave_cols"] / self._card.units
        wave = 1.0 - 0.3 / (1.0 + waves / 4.0) * (1.0 - waves / np.ceil(waves))
        narrow = (m["hidden"] / (m["hidden"] + 384.0)) / (4096.0 / 4480.0)  # elementwise work weighs more when h is small
        eff = self._mfu * narrow * tok / (tok + m["tok_half"]) * wave * (1.0 if self._arch.flash else 0.85)
        t_gpu = mb * m["flops"] / (self._tflops * 1e12 * eff)
        t_cpu = m["layers"] * self._c_layer * (1.5 if self._ckpt else 1.0) * (1.4 if m["moe_layers"] else 1.0)
        t_comp = _smax(t_gpu, t_cpu, 4.0) + zero
        fwd = t_comp * m["fwd_share"]
        bwd = t_comp - fwd
        a2a = 0.0
        if m["moe_layers"] and m["ep"] > 1:
            bw, alpha, half = self._card.intra * 1e9 * 0.6, self._card.intra_alpha, self._card.intra_half
            vol = tok * m["topk"] * m["hidden"] * 2.0 * 1.25 * (m["ep"] - 1) / m["ep"]
            a2a = 4.0 * m["moe_layers"] * (alpha + vol / bw * (1.0 + half / np.maximum(vol, 1.0)))
        fwd, bwd = fwd + 0.5 * a2a, bwd + 0.5 * a2a

        # communication, optimizer
        net_f, net_b, net_bound = zero.copy(), zero.copy(), zero.copy()
        hooks, hidden, calls_micro, calls_bound = zero.copy(), zero.copy(), zero.copy(), zero.copy()
        host_micro, host_bound, gpu_bound, ag_bound = zero.copy(), zero.copy(), zero.copy(), zero.copy()
        g2c = 4.0 * part / self._pcie
        if stage in (0, 1):
            red, c_red, _ = self._grad_reduce(stage, rbs, rs)
            net_bound = net_bound + red
            calls_bound = calls_bound + c_red
            if stage == 1:
                hooks = hooks + 2.0 * 2.0 * Prep / self._hbm  # gradients copied into buckets
                if oo:
                    host_bound = host_bound + g2c
        elif stage == 2:
            red, c_red, nb = self._grad_reduce(stage, rbs, rs)
            exposed = np.where(ov > 0.5, np.maximum(red / nb, red - 0.85 * bwd), red)
            hidden = hidden + (red - exposed)
            net_b = net_b + exposed
            calls_micro = calls_micro + c_red
            hooks = hooks + m["n_tensors"] * self._c_hook2 + 4.0 * Prep / self._hbm * (1.0 + 0.5 * (1.0 - cg))
            if oo:
                # each gradient slice is copied to its pinned buffer from the hook, with a sync per bucket
                host_micro = host_micro + g2c * np.where(ov > 0.5, 0.35, 1.0) + m["n_tensors"] * 2.0 * self._c_hook2 + nb * 3e-4
        if stage in (1, 2):
            ag, c_ag = self._param_gather(agbs)
            ag_bound = ag_bound + ag
            calls_bound = calls_bound + c_ag
        if stage == 3:
            fetch_d = m["Pd"] - pers
            ag_pass = self._coll((n - 1) / n * 2.0 * fetch_d, 2.0 * fetch_d / np.maximum(n_fetch, 1), n_fetch, n)
            c_pass = n_fetch + zero
            if m["Pe"] > 0 and len(self._groups) > 1:
                ne = self._groups[1][1]
                ag_pass = ag_pass + self._coll((ne - 1) / ne * 2.0 * self._groups[1][0], 2.0 * m["hidden"] * self._arch.ffn * 3,
                                               m["moe_layers"] * 3 * self._arch.experts / m["ep"], ne)
            if op:
                ag_pass = ag_pass + 2.0 * part / self._pcie
            cover = self._ag_cover * np.sqrt(np.minimum(1.0, pf / m["layer"])) * np.where(ml < m["layer"] + pf, 0.45, 1.0)
            refetch = 1.0 + (self._ckpt * (ml < 2.0 * m["layer"]))
            exp_f = np.maximum((1.0 - cover) * ag_pass, ag_pass - 0.9 * fwd)
            exp_b = refetch * np.maximum((1.0 - cover) * ag_pass, ag_pass - 0.9 * bwd / refetch)
            rs_t = 0.0 * zero
            c_rs = zero.copy()
            for elems, grp in self._groups:
                if grp <= 1:
                    continue
                b = np.minimum(rbs, elems)
                nb = np.ceil(elems / b)
                rs_t = rs_t + np.where(rs > 0.5, self._coll((grp - 1) / grp * 2.0 * elems, 2.0 * b, nb, grp),
                                       self._coll(2.0 * (grp - 1) / grp * 2.0 * elems, 2.0 * b, nb, grp))
                c_rs = c_rs + nb
            nb_all = np.maximum(np.ceil(P / np.minimum(rbs, P)), 1.0)
            exp_rs = np.where(ov > 0.5, np.maximum(rs_t / nb_all, rs_t - 0.85 * np.maximum(bwd - exp_b, 0.0)), rs_t)
            if n <= 1 and not op:
                exp_f, exp_b, exp_rs, ag_pass, rs_t = zero, zero, zero, zero, zero
            net_f, net_b = net_f + exp_f, net_b + exp_b + exp_rs
            hidden = hidden + (ag_pass * (1.0 + refetch) - exp_f - exp_b) + (rs_t - exp_rs)
            hooks = hooks + m["n_modules"] * self._c_hook3 * (1.0 + refetch) + 2.0 * 2.0 * part / self._hbm * (1.0 + 0.5 * (1.0 - cg))
            calls_micro = calls_micro + c_pass * (1.0 + refetch) * (n > 1) + c_rs
            if oo:
                host_micro = host_micro + g2c * np.where(ov > 0.5, 0.35, 1.0)
        if oo and stage >= 1:
            host_bound = host_bound + g * part * 28.0 / (0.5 * self._host_bw) + 2.0 * part / self._pcie
            host_bound = host_bound + (gas - 1) * g * part * 12.0 / (0.5 * self._host_bw) * (stage >= 2)
            gpu_bound = gpu_bound + self._c_zstep + m["n_tensors"] * self._c_tensor
        elif stage == 0:
            gpu_bound = gpu_bound + Prep * 36.0 / (0.8 * self._hbm) + self._c_step0
        else:
            gpu_bound = gpu_bound + part * 36.0 / (0.8 * self._hbm) + self._c_zstep + m["n_tensors"] * self._c_tensor
        if n > 1:
            net_bound = net_bound + 2.0 * self._group(n)[1]  # the gradient norm and overflow check
        contention = self._rho * hidden

        micro_comp = fwd + bwd + hooks + contention
        comp = gas * micro_comp + gpu_bound
        net = gas * (net_f + net_b) + net_bound + ag_bound
        host = gas * host_micro + host_bound
        gpu_step = comp + net + host
        load = gas * mb / self._load_rate if self._load_rate > 0 else zero
        step = _smax(gpu_step, load) if self._load_rate > 0 else gpu_step
        calls = gas * calls_micro + calls_bound
        nccl = (self._fragile & (calls > self._call_limit)) | zero.astype(bool)
        ok = ~oom & ~host_crash & ~nccl
        tput = np.where(ok, mb * gas * n / step, 0.0)
        return {
            "throughput": tput, "ok": ok, "oom": oom, "init_oom": init_oom, "margin": margin,
            "host_crash": host_crash, "host_load_crash": host_load_crash, "nccl": nccl,
            "need": need, "step": step, "comp": comp, "net": net, "host": host, "load": load,
            "fwd": gas * (fwd + net_f + 0.4 * hooks), "bwd": gas * (bwd + net_b + 0.6 * hooks + contention + host_micro),
            "allreduce": net_bound, "opt": gpu_bound + host_bound + ag_bound, "trans_oom": (base + trans > cap),
        }

    # -- single configs ----------------------------------------------------------------------------

    def _parse(self, config: Any) -> tuple[int, int, int, bool, bool, dict[str, float]]:
        stage = int(_attr(config, "stage", 0))
        mbs = int(_attr(config, "mbs", 1))
        gas = max(1, int(_attr(config, "gas", 1)))
        oo = bool(_attr(config, "offload_optimizer", False))
        op = bool(_attr(config, "offload_param", False))
        raw = _attr(config, "knobs", ())
        knobs = dict(raw.items() if isinstance(raw, dict) else raw)
        return stage, mbs, gas, oo, op, _effective(stage, knobs)

    def _one(self, config: Any) -> tuple[dict[str, float], tuple[int, bool, bool], int, np.ndarray]:
        stage, mbs, gas, oo, op, eff = self._parse(config)
        op = op and stage == 3
        key = (stage, mbs, gas, oo, op, tuple(eff[k] for k in _KNOBS))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if stage not in SPACES or mbs < 1:
            g = {"bad": 1.0}
        else:
            kn = {k: np.asarray([[v]]) for k, v in eff.items()}
            g = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in self._grid(stage, oo, op, np.asarray([[mbs]]), gas, kn).items()}
        code = _key(self.seed, stage, mbs, gas, oo, op, *[int(eff[k]) for k in _KNOBS])
        out = (g, (stage, oo, op), gas, code)
        self._cache[key] = out
        return out

    def _startup(self, stage: int, oo: bool, op: bool) -> float:
        m, g, n = self._m, self._per_node, self.num_gpus
        part = m["P"] / n
        load = (2.0 * m["P"] / self._disk + g * 2.0 * m["P"] / 20e9) if self._b_init == 2.0 else m["P"] * 4.0 / 3e9
        t = self._t_import + 1.5 + 0.4 * math.log2(max(n, 1)) + (2.0 if self._nodes > 1 else 0.0) + load
        if stage >= 1:
            t += 1.0 + m["n_tensors"] * 2e-4 + 2.0 * m["Prep"] / self._hbm
        if stage == 3:
            t += m["n_modules"] * 1e-3 + 0.3 * load
        if oo and stage >= 1:
            t += 4.0 + g * 16.0 * part / 8e9
        if op and stage == 3:
            t += g * 2.0 * part / 8e9
        return t

    # -- noise -------------------------------------------------------------------------------------

    def _nonce_parts(self, nonce: np.ndarray) -> dict[str, np.ndarray]:
        """What a launch's time and place set, whatever it runs: the slowest node it lands on, the
        fabric's congestion, the cluster's slow drift."""
        k = len(self._pool_c)
        u = _u01(self.seed, 21, nonce[:, None], np.arange(k + 2)[None, :])
        chosen = np.argsort(u[:, :k], axis=1)[:, : self._nodes]
        fc, fn = self._pool_c[chosen].max(axis=1), self._pool_n[chosen].max(axis=1)
        cong = np.where(u[:, k] < self._p_cong, 1.0 + (self._cong - 1.0) * u[:, k + 1], 1.0)
        lag = np.arange(24)[None, :]
        drift = self._sig_d * math.sqrt(1 - self._rho_d ** 2) * (self._rho_d ** lag * _gauss(self.seed, 24, nonce[:, None] - lag)).sum(axis=1)
        return {"fc": fc * (1.0 + drift), "fn": fn * cong}

    def _nonce(self, nonce: np.ndarray) -> dict[str, np.ndarray]:
        if len(nonce) == _NREF and nonce[0] == 0 and nonce[-1] == _NREF - 1:
            if not self._nonce_cache:
                self._nonce_cache = self._nonce_parts(nonce)
            return self._nonce_cache
        return self._nonce_parts(nonce)

    def _raw_steps(self, g: dict[str, float], code: np.ndarray, nonce: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Each launch's profiled step times before normalisation, and its component factors."""
        c = int(code[0])
        fixed = self._nonce(nonce)
        # one block of uniforms per launch: 8 make the four normals of the compute draw, then the
        # network, host and loader normals, then per profiled step: jitter, loader, stall, stall size
        u = _u01(self.seed, 31, c, nonce[:, None], np.arange(14 + 6 * PROFILED)[None, :])
        z = _box_muller(u[:, 0:14:2], u[:, 1:14:2])
        fc = fixed["fc"] * np.exp(self._sig_c * np.clip(_student3(z[:, 0:4]), -8, 8))
        fn = fixed["fn"] * np.exp(self._sig_n * z[:, 4])
        fh = np.exp(self._sig_h * z[:, 5])
        per = u[:, 14:].reshape(len(nonce), PROFILED, 6)
        zs = _box_muller(per[..., 0:4:2], per[..., 1:4:2])
        i = np.arange(PROFILED)[None, :]
        therm = 1.0 + self._theta * (END_STEP - PROFILED + i)
        jit = 1.0 + self._sig_s * zs[..., 0]
        gpu = (g["comp"] * fc[:, None] * therm + g["net"] * fn[:, None] + g["host"] * fh[:, None]) * np.maximum(jit, 0.5)
        if g["load"] > 0:
            fl = np.exp(self._sig_l * z[:, 6])[:, None] * (1.0 + 0.5 * self._sig_l * zs[..., 1])
            gpu = _smax(gpu, g["load"] * np.maximum(fl, 0.3))
        stall = np.where(per[..., 4] < self._p_stall, -np.log1p(-per[..., 5]) * self._stall_s, 0.0)
        return gpu + stall, {"fc": fc * therm.mean(), "fn": fn, "fh": fh}

    def _norm(self, g: dict[str, float], code: np.ndarray) -> float:
        """E over launches of true step / measured mean step: dividing by it makes measure unbiased."""
        key = ("norm", int(code[0]))
        hit = self._cache.get(key)
        if hit is None:
            raw, _ = self._raw_steps(g, code, np.arange(_NREF))
            hit = float(np.mean(g["step"] / raw.mean(axis=1)))
            self._cache[key] = hit
        return hit

    def _noise_at(self, config: Any) -> float:
        g, _, _, code = self._one(config)
        raw, _ = self._raw_steps(g, code, np.arange(_NREF))
        rel = g["step"] / raw.mean(axis=1) / self._norm(g, code)
        return float(np.std(rel))

    # -- the interface ---------------------------------------------------------------------------

    def evaluate(self, config: Any) -> Outcome:
        g, (stage, oo, op), _, _ = self._one(config)
        start = self._startup(stage, oo, op)
        if "bad" in g:
            return Outcome("crash", 0.0, 0.3 * start)
        step = g["step"]
        first = step * (1.0 + self._first_extra) + (1.0 if stage == 3 else 0.0)
        if g["host_load_crash"]:
            return Outcome("crash", 0.0, 0.5 * start)
        if g["oom"]:
            if g["init_oom"]:
                return Outcome("oom", 0.0, 0.85 * start)
            if g["margin"] < 0.03 and not g["trans_oom"]:
                late = 1 + int((1.0 - g["margin"] / 0.03) * (END_STEP - 2))  # fragmentation grows
                return Outcome("oom", 0.0, start + first + step * late)
            if g["trans_oom"]:
                return Outcome("oom", 0.0, start + first)  # at the first optimizer step
            return Outcome("oom", 0.0, start + 0.5 * first)
        if g["host_crash"]:
            return Outcome("crash", 0.0, 0.9 * start)
        if g["nccl"]:
            return Outcome("crash", 0.0, start + first + self._nccl_timeout)
        return Outcome("ok", g["throughput"], start + first + step * (END_STEP - 1))

    def memory_gb(self, config: Any) -> float:
        g = self._one(config)[0]
        return g.get("need", 0.0) / 1e9

    def peak_memory_gb(self, config: Any, nonce: int) -> float:
        g, _, _, code = self._one(config)
        if "bad" in g:
            return 0.0
        u = float(_u01(self.seed, 41, int(code[0]), nonce)[0])
        if g["host_load_crash"]:
            return float(min(self.device_gb, 0.05 * g["need"] / 1e9 * u))  # killed while loading
        if g["oom"]:
            return self.device_gb * (0.97 + 0.025 * u)
        reported = g["need"] / 1e9 * (1.0 + 0.005 + 0.02 * u)  # the caching allocator's reserve
        if g["host_crash"]:
            reported *= 0.3 * u
        return float(min(self.device_gb - self._ctx, reported))  # the CUDA context is never reserved

    def step_times(self, config: Any, nonce: int) -> list[float]:
        g, _, _, code = self._one(config)
        if "bad" in g or not g["ok"]:
            return []
        raw, _ = self._raw_steps(g, code, np.asarray([int(nonce)]))
        return [float(v) for v in raw[0] * self._norm(g, code)]

    def measure(self, config: Any, nonce: int) -> float:
        steps = self.step_times(config, nonce)
        if not steps:
            return 0.0
        return float(int(_attr(config, "mbs", 1)) * max(1, int(_attr(config, "gas", 1))) * self.num_gpus / np.mean(steps))

    def timers(self, config: Any, nonce: int) -> dict[str, float]:
        g, _, _, code = self._one(config)
        if "bad" in g or not g["ok"]:
            return {}
        _, f = self._raw_steps(g, code, np.asarray([int(nonce)]))
        scale = 1e3 * self._norm(g, code)
        fc, fn, fh = float(f["fc"][0]), float(f["fn"][0]), float(f["fh"][0])
        total = g["comp"] + g["net"] + g["host"]
        mix = (g["comp"] * fc + g["net"] * fn + g["host"] * fh) / total if total > 0 else 1.0
        return {"fwd": g["fwd"] * mix * scale, "bwd": g["bwd"] * mix * scale,
                "bwd_allreduce": g["allreduce"] * fn * scale, "step": g["opt"] * mix * scale}

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
        mbs = np.arange(1, max_mbs + 1)[None, :]
        for stage, oo, op in self._arms(stages, offload):
            names = [] if fast else list(SPACES[stage])
            combos = list(itertools.product(*(SPACES[stage][k] for k in names)))
            eff = [_effective(stage, dict(zip(names, c))) for c in combos]
            kn = {k: np.asarray([[e[k]] for e in eff]) for k in _KNOBS}
            tput = self._grid(stage, oo, op, mbs, gas, kn)["throughput"]
            if tput.max() <= 0:
                continue
            k, j = np.unravel_index(int(np.argmax(tput)), tput.shape)
            config = Config(stage=stage, mbs=int(mbs[0, j]), gas=gas, knobs=tuple(zip(names, combos[k])),
                            offload_optimizer=oo, offload_param=op)
            out[(stage, oo, op)] = (config, float(tput[k, j]))
        return out

    def optimum(self, **kw: Any) -> tuple[Config | None, float]:
        arms = self.arm_optima(**kw)
        if not arms:
            return None, 0.0
        return max(arms.values(), key=lambda ct: ct[1])

    def oom_edge(self, stage: int, *, offload_optimizer: bool = False, offload_param: bool = False,
                 max_mbs: int = 1024) -> tuple[int, int]:
        """At default knobs: the largest micro-batch that fits, and the smallest that does not
        (max_mbs + 1 if none); the first above the second is a non-monotone edge."""
        kn = {k: np.asarray([[v]]) for k, v in _effective(stage, {}).items()}
        g = self._grid(stage, offload_optimizer, offload_param, np.arange(1, max_mbs + 1)[None, :], 1, kn)
        fits = ~(g["oom"] | g["host_crash"])[0]
        largest = int(np.nonzero(fits)[0].max()) + 1 if fits.any() else 0
        first = int(np.nonzero(~fits)[0].min()) + 1 if (~fits).any() else max_mbs + 1
        return largest, first


def blind4_job(seed: int) -> Blind4Job:
    return Blind4Job(seed)


def by_name(name: str) -> Blind4Job:
    prefix = "blind4-"
    if not name.startswith(prefix) or not name[len(prefix):].isdigit():
        raise KeyError(name)
    return Blind4Job(int(name[len(prefix):]))


# -- summary -----------------------------------------------------------------------------------


def _arm_name(arm: tuple[int, bool, bool]) -> str:
    stage, oo, op = arm
    return f"z{stage}" + ("+oo" if oo else "") + ("+op" if op else "")


def _failure_regions(job: Blind4Job) -> tuple[bool, bool]:
    """Whether some knob setting of some arm hangs NCCL, and whether host RAM rules out an arm."""
    nccl = host = False
    for stage, oo, op in job._arms((0, 1, 2, 3), True):
        names = list(SPACES[stage])
        eff = [_effective(stage, dict(zip(names, c))) for c in itertools.product(*(SPACES[stage][k] for k in names))]
        kn = {k: np.asarray([[e[k]] for e in eff]) for k in _KNOBS}
        g = job._grid(stage, oo, op, np.asarray([[1]]), 1, kn)
        nccl |= bool((g["nccl"] & ~g["oom"] & ~g["host_crash"]).any())
        host |= bool((g["host_crash"] & ~g["oom"]).all())
    return nccl, host


def _summary(count: int, start: int, full: bool) -> None:
    wins: dict[tuple[int, bool, bool], int] = {}
    wins4: dict[tuple[int, bool, bool], int] = {}
    gains, noises = [], []
    small, small_z0, offload_wins, nonmono, nccl_jobs, host_jobs = 0, 0, 0, 0, 0, 0
    print(f"{'job':<11} {'hardware':<24} {'model':<44} {'best':<9} {'mbs':>4} {'samples/s':>10} {'knobs':>6} {'noise':>6} {'start':>6}")
    for seed in range(start, start + count):
        job = Blind4Job(seed)
        fast = job.arm_optima(fast=True)
        best_fast = max(fast.items(), key=lambda kv: kv[1][1])
        arm, (config, tput) = best_fast
        gain = 0.0
        if full:
            arm, (config, tput) = max(job.arm_optima(fast=False).items(), key=lambda kv: kv[1][1])
            gain = tput / best_fast[1][1] - 1.0
        at4 = job.arm_optima(fast=True, gas=4)
        if at4:
            arm4 = max(at4.items(), key=lambda kv: kv[1][1])[0]
            wins4[arm4] = wins4.get(arm4, 0) + 1
        wins[arm] = wins.get(arm, 0) + 1
        gains.append(gain)
        noises.append(job.noise)
        offload_wins += arm[1]
        if job._nodes == 1 and job.params_b < 1.0:
            small += 1
            small_z0 += arm[0] == 0
        nonmono += any(a > b for a, b in (job.oom_edge(st, max_mbs=256) for st in range(4)))
        nccl, host = _failure_regions(job)
        nccl_jobs += nccl
        host_jobs += host
        hw = f"{job.num_gpus}x {job._card.name}" + (f"/{job._nodes}n" if job._nodes > 1 else "")
        model = job.description.split(" on ")[0]
        print(f"{job.name:<11} {hw:<24} {model[:44]:<44} {_arm_name(arm):<9} {config.mbs:>4} {tput:>10.1f} "
              f"{100 * gain:>5.1f}% {100 * job.noise:>5.1f}% {job.startup_s:>5.0f}s")
    n = count

    def shares(counts: dict[tuple[int, bool, bool], int]) -> str:
        total = max(1, sum(counts.values()))
        return ", ".join(f"{_arm_name(a)} {100 * c / total:.1f}%" for a, c in sorted(counts.items()))

    print()
    print(f"best arm ({'full knob search' if full else 'default knobs'}, gas 1): {shares(wins)}")
    print("  by stage: " + ", ".join(f"{s} {100 * sum(c for a, c in wins.items() if a[0] == s) / n:.0f}%" for s in range(4))
          + f"; offload wins {100 * offload_wins / n:.0f}%; stage 0 wins {small_z0}/{small} one-node jobs under 1B parameters")
    print(f"best arm (default knobs, gas 4): {shares(wins4)}")
    if full:
        g = np.asarray(gains)
        print(f"knobs worth >1%: {100 * np.mean(g > 0.01):.0f}%, >2%: {100 * np.mean(g > 0.02):.0f}%, >5%: {100 * np.mean(g > 0.05):.0f}% "
              f"of jobs; median {100 * np.median(g):.1f}%, max {100 * g.max():.1f}%")
    q = np.percentile(np.asarray(noises), [0, 10, 50, 90, 100]) * 100
    print(f"noise (std of measure / truth): min {q[0]:.1f}%, p10 {q[1]:.1f}%, median {q[2]:.1f}%, p90 {q[3]:.1f}%, max {q[4]:.1f}%")
    print(f"failure modes: non-monotone OOM edge at default knobs {100 * nonmono / n:.0f}% of jobs, "
          f"NCCL-timeout knob settings {100 * nccl_jobs / n:.0f}%, an arm ruled out by host RAM {100 * host_jobs / n:.0f}%")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--fast", action="store_true", help="default knobs only (skip the full knob search)")
    args = parser.parse_args(argv)
    _summary(args.count, args.start, not args.fast)
    return 0


if __name__ == "__main__":
    sys.exit(main())
