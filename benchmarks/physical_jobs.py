"""Physically derived simulated DeepSpeed jobs: a second, independent benchmark generator.

Each job is a transformer (layers L, hidden h, sequence s, vocabulary V) trained with mixed-precision
Adam on `num_gpus` data-parallel GPUs (nodes x gpus_per_node). For a Config it computes, from first
principles, the peak memory per GPU and the time of one optimizer step (gas micro-batches):

Memory per GPU (bytes; psi = parameters, n = data-parallel GPUs)
  * model states as DeepSpeed's estimators count them (autotuner.get_instantiation_memory_required_per_gpu:
    2 fp16 params + 2 fp16 grads + 16 optimizer incl. fp32 grads; stage_1_and_2.
    estimate_zero2_model_states_mem_needs: 2 psi + 18 psi/n, offload 2 psi; stage3.
    estimate_zero3_model_states_mem_needs: 4 x largest layer + 18 psi/n, offload optimizer + 2 psi/n,
    offload params: largest layer only);
  * buckets: the IPG buffer of reduce_bucket_size elements (fp32 at stage 1, fp16 at 2; DeepSpeed's
    setup_buckets allocates it at full size, doubled by overlap_comm), the all-gather bucket; HF's
    DeepSpeed docs: overlap_comm costs ~4.5x (reduce + allgather bucket) x 2 bytes;
  * activations: mbs x the per-sample activations of Korthikanti et al. 2022 (s h (34 + 5 a s / h)
    bytes per layer; flash attention drops the s^2 term; full checkpointing keeps 2 s h per layer
    plus one layer's working set) plus the logits (10 s V bytes), times a job fudge factor;
  * CUDA context / NCCL buffers, and allocator fragmentation that grows with mbs and jitters per mbs,
    so the OOM edge is not exactly where a straight line says (at large mbs it is not even monotone).

Time per optimizer step
  * compute: (6 psi + 12 L h s) s FLOPs per sample (x4/3 with checkpointing) at peak x MFU, with an
    efficiency tokens/(tokens + tokens_half) that rises with mbs and saturates, plus a fixed launch
    overhead per micro-batch; a slowdown under allocator pressure near the memory edge (DeepSpeed warns
    "pytorch allocator cache flushes ... detrimental to performance"), so throughput can peak below it;
  * communication (ring: all-reduce 2(n-1)/n, reduce-scatter/all-gather (n-1)/n of the bytes, at the
    slowest link; message-size efficiency m/(m + m_half) and a latency per launch):
      stage 0: all-reduce of fp16 grads once per optimizer step; stage 1: reduce-scatter + all-gather
      once per step (same volume as stage 0, smaller optimizer step); stage 2: the reduce runs in the
      backward hooks EVERY micro-batch, as DeepSpeed's average_tensor does it (per-rank dist.reduce
      calls: efficiency eta_rs and bucket/n-sized messages), synchronously unless overlap_comm (then
      hidden behind backward up to the last bucket, with some compute contention); reduce_scatter=False
      is a plain all-reduce (2x the volume, full NCCL efficiency); stage 3: two parameter all-gathers
      (prefetched behind forward/backward) and a reduce-scatter per micro-batch (1.5x stage 2's volume,
      ZeRO paper) plus per-module hook overhead;
  * optimizer: Adam over the local partition at HBM bandwidth (~32-36 B/param), or CPU Adam over the
    node's partitions (1-3 Gparams/s per node, ZeRO-Offload) plus PCIe copies of grads and params.
Deliberate differences from a naive model: stage 2's reduction is per micro-batch (its comm share does
not fall with gas; stages 0/1 do), reduce_scatter can lose to all-reduce, big buckets cost memory and
overlap tail, the reported act_gb is off from the real one by a job factor (both directions), there is
a throughput cliff before the memory edge on some jobs, non-OOM crashes on ~15% of jobs, and offload
transfers (PCIe) stay even on 1 GPU. Knob effects on throughput are nil on 1 GPU without offload
(except through memory pressure near the edge).

Noise: a per-run factor (lognormal, sd `noise_run`, shared by the run's steps: clock, placement, data)
x per-step jitter (Student-t, 4 d.o.f., sd `step_sd`) with stragglers (prob. `straggler_p` per step,
1.5-3x slower). A run reports what DeepSpeed's engine reports for autotuning: its step times'
trimmed mean (`trim_mean(records, 0.1)` in deepspeed/utils/timer.py: round(10%) of the steps
dropped at each end, none of 5, one of 10, two of 15 or 20), so a run of 10+ steps sheds a lone
straggler and a run of 5 keeps it. The true throughput is what a typical run reports: multipliers
are divided by the median (over runs) of a run's trimmed mean multiplier, so median(measure) ~= true.
`noise` is the robust sd (1.4826 x MAD) of
log(measure / true) over runs at the job's `steps`, by Monte Carlo (6000 runs) of this same model.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import random
import sys
from typing import Any
from collections.abc import Iterator

import numpy as np

from surfaces import GB, SPACES, Config, Outcome  # knob defaults (DEFAULTS) come via Config.knob

# name: (memory GB, dense bf16 TFLOP/s, HBM TB/s, NVLink?) -- vendor data sheets
GPUS = {"A10G-24": (24, 125, 0.6, False), "RTX4090-24": (24, 165, 1.0, False), "V100-32": (32, 125, 0.9, True),
        "A100-40": (40, 312, 1.55, True), "L40S-48": (48, 362, 0.86, False), "A100-80": (80, 312, 2.0, True),
        "H100-80": (80, 989, 3.35, True), "H200-141": (141, 989, 4.8, True)}
GPU_WEIGHTS = {"A10G-24": 8, "RTX4090-24": 7, "V100-32": 9, "A100-40": 17, "L40S-48": 7, "A100-80": 22,
               "H100-80": 21, "H200-141": 9}
NVLINK_BUSBW = {"V100": (80, 130), "A100": (150, 230), "H100": (250, 450), "H200": (250, 450)}  # NCCL busbw GB/s
ARMS = [(0, False, False), (1, False, False), (1, True, False), (2, False, False), (2, True, False),
        (3, False, False), (3, True, False), (3, True, True)]
CRASH_RULES = {"": 0.86, "rs_off": 0.04, "noncontig3": 0.03, "overlap_big": 0.03, "int32": 0.04}


QWZ, QGZ, HPZ = "zero_quantized_weights", "zero_quantized_gradients", "zero_hpz_partition_size"
LEVER_DEFAULTS = {QWZ: False, QGZ: False, HPZ: 1}


def _levers(knobs, nodes: int) -> tuple[bool, bool, int]:
    """The ZeRO++ levers a stage-3 setting turns on, as they act: qgZ only across nodes (DeepSpeed
    reduces unquantized on one node), hpZ only where its group is smaller than the ranks."""
    kn = dict(knobs)
    hpz = int(kn.get(HPZ) or 1)
    return kn.get(QWZ) is True, kn.get(QGZ) is True and nodes > 1, hpz if nodes > 1 else 1


AUTOTP = "tensor_parallel.autotp_size"  # DeepSpeed's AutoTP size, as optuna-ds names the knob


def _autotp(knobs) -> int:
    """The AutoTP size a setting runs with (1: off)."""
    return int(dict(knobs).get(AUTOTP) or 1)


def _seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


def _logu(rng, lo, hi):
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _trimmed(steps: np.ndarray) -> np.ndarray:
    """DeepSpeed's ``trim_mean(data, 0.1)`` (deepspeed/utils/timer.py) of each row."""
    n = steps.shape[1]
    k = int(round(n * 0.1))
    return np.sort(steps, axis=1)[:, k:n - k].mean(axis=1)


@dataclasses.dataclass(frozen=True)
class PhysicalJob:
    name: str
    gpu: str
    gpus_per_node: int
    nodes: int
    intra_gbps: float      # NCCL bus bandwidth inside a node, GB/s (NVLink 80-450, PCIe 8-25)
    inter_gbps: float      # per GPU across nodes, GB/s (IB 5-50, Ethernet 2-12)
    pcie_gbps: float       # host <-> GPU per GPU, GB/s (offload)
    cpu_adam_gps: float    # CPU Adam, Gparams/s per node (shared by its GPUs)
    host_gb: float         # host RAM per node
    mfu: float             # achieved fraction of peak at saturated kernels
    layers: int
    hidden: int
    seq: int
    vocab: int
    checkpointing: bool
    flash: bool
    act_fudge: float       # real activations / Korthikanti formula
    act_err: float         # reported act_gb / real
    tokens_half: float     # tokens per micro-batch at which kernels reach half of peak efficiency
    mb_overhead_s: float   # launch/Python overhead per micro-batch
    step_overhead_s: float  # engine overhead per optimizer step
    hook_s: float          # per-gradient-tensor hook cost at stage >= 2
    module_s: float        # per-module fetch/release cost at stage 3
    eta_rs: float          # efficiency of DeepSpeed's per-rank reduce vs NCCL ring (stages 2)
    lat_s: float           # latency per collective launch
    msg_half_mb: float     # message size at half bus bandwidth
    overlap_eff: float     # fraction of backward time that can hide overlapped communication
    prefetch_eff: float    # fraction of fwd/bwd time that hides stage-3 all-gathers / param uploads
    contention: float      # compute slowdown per second of overlapped communication
    context_gb: float
    frag: float            # allocator fragmentation, fraction of activations
    pressure_u0: float     # memory fraction where allocator pressure starts to slow steps
    pressure_k: float      # slowdown at a full device
    crash_rule: str
    noise_run: float
    step_sd: float
    straggler_p: float
    base_startup_s: float
    steps: int
    warmup: int = 3
    description: str = ""
    # derived in __post_init__
    device_gb: float = dataclasses.field(init=False)
    num_gpus: int = dataclasses.field(init=False)
    params_b: float = dataclasses.field(init=False)
    act_gb: float = dataclasses.field(init=False)
    act_real_gb: float = dataclasses.field(init=False)
    startup_s: float = dataclasses.field(init=False)
    noise: float = dataclasses.field(init=False)
    typical_mult: float = dataclasses.field(init=False, repr=False)  # median of a run's mean step multiplier
    _cache: dict = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        L, h, s, V = self.layers, self.hidden, self.seq, self.vocab
        put = lambda k, v: object.__setattr__(self, k, v)
        put("device_gb", float(GPUS[self.gpu][0]))
        put("num_gpus", self.nodes * self.gpus_per_node)
        put("params_b", (12 * L * h * h + V * h + s * h) / 1e9)
        # Korthikanti et al. 2022, eq. 2 (bytes per layer per sample, fp16, no tensor parallelism)
        layer = s * h * (34 + (0 if self.flash else 5 * (h / 64) * s / h))
        act = (2 * s * h * L + layer if self.checkpointing else layer * L) + 10 * s * V
        put("act_real_gb", act * self.act_fudge / GB)
        put("act_gb", self.act_real_gb * self.act_err)
        put("startup_s", self.base_startup_s)
        put("_cache", {})
        if not self.description:
            put("description", f"{self.params_b:.2f}B params (L{L} h{h} s{s} V{V}"
                f"{', ckpt' if self.checkpointing else ''}) on {self.nodes}x{self.gpus_per_node} {self.gpu}")
        put("typical_mult", 1.0)
        center, noise = self._noise_mc()
        put("typical_mult", center)
        put("noise", noise)

    # ---------------------------------------------------------------- noise
    def _step_mults(self, rng: random.Random, k: int) -> list[float]:
        run = math.exp(self.noise_run * rng.gauss(0, 1) - self.noise_run ** 2 / 2)
        out = []
        for _ in range(k):
            t = rng.gauss(0, 1) / math.sqrt(rng.gammavariate(2.0, 2.0) / 4)  # Student-t, 4 d.o.f.
            m = max(0.3, 1 + self.step_sd * t / math.sqrt(2))  # t4 has sd sqrt(2)
            if rng.random() < self.straggler_p:
                m *= rng.uniform(1.5, 3.0)
            out.append(run * m / self.typical_mult)
        return out

    def _noise_mc(self, runs: int = 6000) -> tuple[float, float]:
        g = np.random.default_rng(_seed(self.name, "noise"))
        run = np.exp(self.noise_run * g.standard_normal(runs) - self.noise_run ** 2 / 2)
        m = np.maximum(0.3, 1 + self.step_sd * g.standard_t(4, (runs, self.steps)) / math.sqrt(2))
        m = np.where(g.random((runs, self.steps)) < self.straggler_p, m * g.uniform(1.5, 3.0, m.shape), m)
        lr = np.log(run * _trimmed(m))
        return float(np.exp(np.median(lr))), float(1.4826 * np.median(np.abs(lr - np.median(lr))))

    # ---------------------------------------------------------------- physics
    def _act_tp_gb(self, tp: int) -> float:
        """A sample's activations on a rank of an AutoTP group of ``tp`` (Korthikanti et al.
        2022, tensor parallelism without sequence parallelism: s h (10 + 24/t + 5 a s / (h t))
        a layer; a checkpointed layer's input and the logits are whole on every rank)."""
        L, h, s, V = self.layers, self.hidden, self.seq, self.vocab
        layer = s * h * (10 + 24 / tp + (0 if self.flash else 5 * (h / 64) * s / (h * tp)))
        act = (2 * s * h * L + layer if self.checkpointing else layer * L) + 10 * s * V
        return act * self.act_fudge / GB

    def _data_ranks(self, knobs) -> int:
        """The ranks that train on samples of their own: all but AutoTP's group mates."""
        return self.num_gpus // _autotp(knobs)

    def _jitter(self) -> np.ndarray:
        if "jit" not in self._cache:
            self._cache["jit"] = np.random.default_rng(_seed(self.name, "frag")).random(4096)
        return self._cache["jit"]

    def _curve(self, stage, oo, op, knobs, gas, mbs: np.ndarray) -> dict[str, np.ndarray]:
        """Memory (GB) and step time parts (s per optimizer step) for an array of mbs."""
        c = Config(stage, 1, gas, knobs, oo, op)
        ov, cg, rs = bool(c.knob("overlap_comm")), bool(c.knob("contiguous_gradients")), bool(c.knob("reduce_scatter"))
        rbs, abs_ = float(c.knob("reduce_bucket_size")), float(c.knob("allgather_bucket_size"))
        # AutoTP (absent from every job's space but autotp_job's): each rank of a group of tp
        # holds 1/tp of the weights, so ZeRO sees psi/tp parameters over n/tp data-parallel ranks.
        tp = _autotp(knobs)
        psi, n, L, h, s = self.params_b * 1e9 / tp, self.num_gpus // tp, self.layers, self.hidden, self.seq
        hbm = GPUS[self.gpu][2] * 1e12 * 0.7
        # ---- memory (bytes)
        largest = max(self.vocab * h, 4 * h * h)
        if stage == 0:
            states = 20 * psi + (min(2 * psi, 1e9) if n > 1 else 0.0)  # + the engine's flat all-reduce bucket
        elif stage in (1, 2):
            grads = 2 * psi if stage == 1 else 2 * psi / n
            ipg = rbs * (4 if stage == 1 else 2) if cg else 0.0
            buckets = (ipg + 2 * min(abs_, psi)) * (4.5 if ov else 1.0)
            states = 2 * psi + grads + (4 * min(rbs, psi / n) if oo else 16 * psi / n) + buckets
        else:
            states = 4 * largest + (0 if op else 2 * psi / n) + (0 if oo else 16 * psi / n) + 2 * 5e7
            states += (2 * rbs * (2 if ov else 1) if cg else 0.0)
            hpz = _levers(knobs, self.nodes)[2]
            states += 2 * psi / hpz if hpz > 1 and not op else 0.0  # hpZ's secondary partition
        if stage >= 2 and not cg:
            states += 0.3 * 2 * psi / n  # unflattened gradient partitions fragment the heap
        act_gb = self.act_real_gb if tp == 1 else self._act_tp_gb(tp)
        act = act_gb * GB * (1 + self.frag + 0.05 * self._jitter()[mbs % 4096]
                             + (0.12 if stage >= 2 and not cg else 0.0))
        mem = (self.context_gb * GB + states + mbs * act) / GB
        # ---- compute per micro-batch (s)
        flops = s * (6 * psi + 12 * L * h * s / tp) * (4 / 3 if self.checkpointing else 1)
        rate = GPUS[self.gpu][1] * 1e12 * self.mfu
        u = mem / self.device_gb
        pressure = 1 + self.pressure_k * np.clip((u - self.pressure_u0) / (1 - self.pressure_u0), 0, 1) ** 2
        # A rank of an AutoTP group multiplies matrices 1/tp as wide: they need more tokens to saturate.
        comp = flops / rate * (mbs + self.tokens_half * math.sqrt(tp) / s) * pressure
        bwd = comp * (0.75 if self.checkpointing else 2 / 3)
        fwd = comp - bwd
        # ZeRO's backward hooks: a Python hook per gradient tensor and a copy into the IPG bucket
        mb_extra = self.mb_overhead_s + (12 * L * self.hook_s + 4 * psi / hbm if stage in (1, 2) else 0.0)
        mb_extra += 2 * 8 * L * self.module_s if stage == 3 else 0.0  # ~8 submodules per layer, fwd + bwd
        # ---- communication
        bw = (self.intra_gbps if self.nodes == 1 else min(self.intra_gbps, self.inter_gbps)) * 1e9
        mh = self.msg_half_mb * 1e6

        def coll(factor, nbytes, msg, eff=1.0):
            if n == 1:
                return 0.0
            return factor * nbytes / (bw * eff * msg / (msg + mh)) + math.ceil(nbytes / msg) * self.lat_s

        def within(g, nbytes, msg):  # a ring over g ranks of one node
            return 0.0 if g <= 1 else (g - 1) / g * nbytes / (self.intra_gbps * 1e9 * msg / (msg + mh)) + math.ceil(nbytes / msg) * self.lat_s

        rsf, arf = (n - 1) / n, 2 * (n - 1) / n
        zero = np.zeros_like(comp)
        mb_comm, step_comm, gathers = zero, 0.0, zero
        if tp > 1:
            # Two all-reduces a layer in the forward, two in the backward (three with the
            # recompute), of the micro-batch's activations (fp16), over the group's NVLink or
            # PCIe, on the critical path (DeepSpeed's tp_overlap_comm is off by default); the
            # timers see them in fwd and bwd.
            per = 2.0 * mbs * s * h
            one = 2 * (tp - 1) / tp * per / (self.intra_gbps * 1e9 * per / (per + mh)) + self.lat_s
            mb_comm = gathers = (4 + (2 if self.checkpointing else 0)) * L * one
        if stage == 0:
            step_comm = coll(arf, 2 * psi, min(2 * psi, 1e9))
        elif stage == 1:
            step_comm = coll(rsf, 2 * psi, 2 * min(rbs, psi)) + coll(rsf, 2 * psi, 2 * min(abs_, psi))
        else:
            nb = math.ceil(psi / rbs)
            if stage == 2:
                t_rs = (coll(rsf, 2 * psi, 2 * min(rbs, psi) / n, self.eta_rs) if rs
                        else coll(arf, 2 * psi, 2 * min(rbs, psi)))
                step_comm = coll(rsf, 2 * psi, 2 * min(abs_, psi))
            else:
                # ZeRO++ (absent from every job's space but lever_job's): qgZ quarters the
                # reduce-scatter's bytes across nodes (int4, after an unquantized intra-node
                # step), qwZ halves the all-gathers' (int8), hpZ gathers in backward from the
                # node's secondary partition over NVLink; each (de)quantization pass reads and
                # writes the tensor at HBM bandwidth, on the critical path.
                qwz, qgz, hpz = _levers(knobs, self.nodes)
                t_rs = coll(rsf, 2 * psi, 2 * min(rbs, psi)) if not qgz else (
                    coll(rsf, 0.5 * psi, 0.5 * min(rbs, psi)) + within(self.gpus_per_node, 2 * psi, 2 * min(rbs, psi)))
                # a few modules' params per fetch (at most stage3_prefetch_bucket_size, default 5e7)
                msg = 2 * min(5e7, 4 * h * h)
                t_ag = coll(rsf, 2 * psi, msg) if not qwz else coll(rsf, psi, msg / 2)
                t_agb = within(hpz, 2 * psi, msg) if hpz > 1 else t_ag
                hid_f, hid_b = np.minimum(t_ag, self.prefetch_eff * fwd), np.minimum(t_agb, self.prefetch_eff * bwd)
                mb_comm = t_ag + t_agb - hid_f - hid_b + self.contention * (hid_f + hid_b)
                gathers = mb_comm
                mb_extra += ((4 * psi / hbm) * (1 if hpz > 1 else 2) if qwz else 0.0) + (6 * psi / hbm if qgz else 0.0)
                mb_extra += 2 * psi / hpz / hbm if hpz > 1 else 0.0
            t_rs *= 1.0 if cg else 1.15
            if ov and n > 1:
                hidden = np.minimum(t_rs, self.overlap_eff * bwd)
                exposed = np.maximum(t_rs * min(1.0, rbs / psi), t_rs - hidden) + self.contention * hidden
            else:
                exposed = t_rs + (nb * 3 * self.lat_s if n > 1 else 0.0)
            mb_comm = mb_comm + exposed
        # ---- optimizer and offload
        opt, off_mb, off_step = 0.0, zero, 0.0
        pcie = self.pcie_gbps * 1e9
        if oo:
            d2h = 2 * psi / n / pcie * (0.4 if ov else 0.8)  # gradient partition to host, partly overlapped
            if stage == 1:
                off_step += d2h
            else:
                off_mb = off_mb + d2h
            opt = psi / self.nodes / (self.cpu_adam_gps * 1e9) + 2 * psi / n / pcie  # CPU Adam + fp16 params up
        else:
            opt = (36 * psi if stage == 0 else 32 * psi / n) / hbm
        if op:
            up = 2 * 2 * psi / n / pcie  # the fp16 partition uploaded for forward and for backward
            off_mb = off_mb + np.maximum(0, up - self.prefetch_eff * comp)
        mb_total = comp + mb_extra + mb_comm + off_mb
        step = gas * mb_total + step_comm + opt + off_step + self.step_overhead_s
        # DeepSpeed's timers: the gathers wait in fwd and bwd_inner (half each, as exposed here),
        # the reduction's exposed part is bwd_allreduce, the optimizer and its collectives step.
        return {"mem": mem, "step": step, "compute": gas * (comp + mb_extra), "comm": gas * mb_comm + step_comm,
                "offload": zero + gas * off_mb + off_step, "optimizer": zero + opt,
                "fwd": gas * (fwd + mb_extra / 2 + gathers / 2), "bwd_inner": gas * (bwd + mb_extra / 2 + gathers / 2 + off_mb),
                "bwd_allreduce": gas * (mb_comm - gathers), "opt_step": zero + step_comm + opt + off_step + self.step_overhead_s}

    def _crashes(self, stage, oo, op, knobs, mbs: np.ndarray) -> np.ndarray:
        c = Config(stage, 1, 1, knobs, oo, op)
        rule, bad = self.crash_rule, False
        if rule == "rs_off":
            bad = stage == 2 and not c.knob("reduce_scatter") and self.num_gpus > 1  # NCCL error
        elif rule == "noncontig3":
            bad = stage == 3 and not c.knob("contiguous_gradients")
        elif rule == "overlap_big":
            bad = stage == 2 and bool(c.knob("overlap_comm")) and c.knob("reduce_bucket_size") >= 1e9
        out = np.full(mbs.shape, bad)
        if rule == "int32":  # a fused cross-entropy kernel indexes logits with int32
            out = out | (mbs * self.seq * self.vocab >= 2 ** 31)
        if oo:  # host RAM: DeepSpeed's estimate of CPU memory with offload (x1.5 buffer factor)
            need = self.params_b * 1e9 * (18 if op else 16) / self.nodes * 1.5 / GB
            out = out | (need > self.host_gb)
        return out

    def _key_curve(self, stage, oo, op, knobs, gas, upto: int):
        key = (stage, oo, op, knobs, gas)
        got = self._cache.get(key)
        if got is None or len(got["mem"]) < upto:
            mbs = np.arange(1, max(upto, 64) + 1)
            got = self._curve(stage, oo, op, knobs, gas, mbs)
            got["crash"] = self._crashes(stage, oo, op, knobs, mbs)
            self._cache[key] = got
        return got

    def _at(self, config: Config, name: str) -> float:
        return float(self._key_curve(config.stage, config.offload_optimizer, config.offload_param and config.stage == 3,
                                     config.knobs, config.gas, config.mbs)[name][config.mbs - 1])

    def memory_gb(self, config: Config) -> float:
        return self._at(config, "mem")

    def step_time(self, config: Config) -> float:
        return self._at(config, "step")

    def breakdown(self, config: Config) -> dict[str, float]:
        """Seconds per optimizer step: compute (incl. per-micro-batch overheads), comm (exposed), offload, step."""
        return {k: self._at(config, k) for k in ("compute", "comm", "offload", "optimizer", "step")}

    def timers_ms(self, config: Config) -> dict[str, float]:
        """What DeepSpeed's engine logs for one step of ``config`` (``wall_clock_breakdown``), in ms."""
        fwd, inner, reduce, step = (1e3 * self._at(config, k) for k in ("fwd", "bwd_inner", "bwd_allreduce", "opt_step"))
        return {"fwd": fwd, "bwd": inner + reduce, "bwd_inner": inner, "bwd_allreduce": reduce, "step": step}

    def startup_for(self, config: Config) -> float:
        psi = self.params_b * 1e9
        extra = (3 + psi / 2e9) if config.stage == 3 else 0.0  # zero.Init partitioning
        if config.offload_optimizer:
            extra += 5 + 16 * psi / self.nodes / 4e9  # pinned host buffers
        return self.startup_s + extra

    def evaluate(self, config: Config) -> Outcome:
        t, start = self.step_time(config), self.startup_for(config)
        if self.memory_gb(config) > self.device_gb:
            return Outcome("oom", 0.0, start + min(t, 60.0) + 3.0)
        if self._at(config, "crash"):
            return Outcome("crash", 0.0, start + min(t, 60.0) + (2.0 if self.crash_rule == "int32" else 30.0))
        return Outcome("ok", config.mbs * config.gas * self._data_ranks(config.knobs) / t, start + (self.warmup + self.steps) * t)

    # ---------------------------------------------------------------- one run
    def step_times(self, config: Config, nonce: int) -> list[float]:
        if self.evaluate(config).kind != "ok":
            return []
        t = self.step_time(config)
        return [t * m for m in self._step_mults(random.Random(_seed(self.name, config, nonce)), self.steps)]

    def measure(self, config: Config, nonce: int) -> float:
        """Samples per optimizer step over this run's profiled step times as DeepSpeed's engine
        averages them for autotuning (0.0 unless ok): ``SynchronizedWallClockTimer.Timer.mean``
        is ``trim_mean(records, 0.1)``, which drops round(10%) of the steps at each end."""
        st = self.step_times(config, nonce)
        return config.mbs * config.gas * self._data_ranks(config.knobs) / _trimmed(np.array([st]))[0] if st else 0.0

    def peak_memory_gb(self, config: Config, nonce: int) -> float:
        """NVML's view: the true peak plus 0-3% allocator reserve, never above the device."""
        reserve = random.Random(_seed(self.name, config, nonce, "nvml")).uniform(0.0, 0.03)
        return min(self.device_gb, self.memory_gb(config) * (1 + reserve))

    # ---------------------------------------------------------------- spaces
    def spaces(self) -> dict[int, dict[str, list[Any]]]:
        """The knob spaces full mode tunes (DeepSpeed's autotuner's)."""
        return SPACES

    def _settings(self, stage: int, fast: bool, offloaded: bool = False):
        spaces = self.spaces()
        if fast or not spaces[stage]:
            yield ()
            return
        names = sorted(spaces[stage])

        def rec(i, acc):
            if i == len(names):
                yield tuple(acc)
                return
            for v in spaces[stage][names[i]]:
                yield from rec(i + 1, acc + [(names[i], v)])
        yield from rec(0, [])

    def _arms(self, stages, offload):
        return [a for a in ARMS if a[0] in stages and (offload or not a[1])]

    def _fit_len(self, stage, oo, op, knobs, max_mbs) -> int:
        """Number of leading mbs (1..k) that fit."""
        mem = self._key_curve(stage, oo, op, knobs, 1, min(max_mbs, 64))["mem"]
        while True:
            over = np.nonzero(mem[:max_mbs] > self.device_gb)[0]
            if len(over) or len(mem) >= max_mbs:
                return int(over[0]) if len(over) else max_mbs
            slope = max((mem[-1] - mem[0]) / (len(mem) - 1), 1e-9)  # memory is ~linear in mbs: aim past the edge
            guess = max(2 * len(mem), int(1.1 * (self.device_gb - mem[0]) / slope) + 16)
            mem = self._key_curve(stage, oo, op, knobs, 1, min(max_mbs, guess))["mem"]

    def configs(self, *, fast: bool, stages=(0, 1, 2, 3), max_mbs=1024, offload=False) -> Iterator[Config]:
        for stage, oo, op in self._arms(stages, offload):
            for knobs in self._settings(stage, fast, offloaded=oo):
                for m in range(1, self._fit_len(stage, oo, op, knobs, max_mbs) + 1):
                    yield Config(stage, m, 1, knobs, oo, op)

    def arm_optima(self, **kwargs) -> dict[tuple[int, bool, bool], tuple[Config, float]]:
        fast, stages = kwargs["fast"], kwargs.get("stages", (0, 1, 2, 3))
        max_mbs, offload = kwargs.get("max_mbs", 1024), kwargs.get("offload", False)
        out = {}
        for stage, oo, op in self._arms(stages, offload):
            best = None
            for knobs in self._settings(stage, fast, offloaded=oo):
                k = self._fit_len(stage, oo, op, knobs, max_mbs)
                if k == 0:
                    continue
                cur = self._cache[(stage, oo, op, knobs, 1)]
                mbs = np.arange(1, k + 1)
                thr = np.where(cur["crash"][:k], -1.0, mbs * self._data_ranks(knobs) / cur["step"][:k])
                i = int(np.argmax(thr))
                if thr[i] > 0 and (best is None or thr[i] > best[1]):
                    best = (Config(stage, i + 1, 1, knobs, oo, op), float(thr[i]))
            if best is not None:
                out[(stage, oo, op)] = best
        return out

    def optimum(self, **kwargs) -> tuple[Config | None, float]:
        best = max(self.arm_optima(**kwargs).values(), key=lambda ct: ct[1], default=None)
        return best if best is not None else (None, 0.0)


# -------------------------------------------------------------------- drawing jobs
# Distributions (physical units):
#   GPU: A10G-24/RTX4090-24 (PCIe, 125-165 TFLOP/s), V100-32, A100-40/80, L40S-48, H100-80, H200-141 (weights in
#     GPU_WEIGHTS); MFU at saturation U(0.30, 0.60); GPUs per node 1/2/4/8 (NVLink boxes mostly 8, PCIe mostly 1);
#     nodes 1 (most), 2, 4, 8 (8-GPU NVLink nodes only) -> ~30% of jobs on 1 GPU, up to 64 GPUs.
#   links: intra-node NCCL bus bandwidth NVLink V100 80-130, A100 150-230, H100/H200 250-450 GB/s, PCIe 8-25;
#     inter-node per GPU log-U(5, 50) GB/s (IB) or log-U(2, 12) (Ethernet); host PCIe U(6, 24) GB/s per GPU;
#     CPU Adam U(1, 3) Gparams/s per node; host RAM 256-2048 GB per node.
#   model: params log-U(0.05B, min(70B, 1.6 n x device / 18 B)) (the top of the range needs offload even at
#     stage 3); hidden/layers log-U(48, 160); seq 128-1024 (< 0.5B) or 1024-8192; vocab 30k/32k/50k/128k;
#     activation checkpointing p = 0.6 (>1B) or 0.15; flash attention p = 0.6; real activations = formula x
#     lognormal(0.1, 0.15); reported act_gb = real x lognormal(0, 0.2) clipped to [0.6, 1.6].
#   software: tokens at half kernel efficiency log-U(150, 2500) x sqrt(1024/h); per-micro-batch overhead
#     (1-4 ms + 0.05-0.25 ms per layer); per-step overhead 5-40 ms; hooks 3-20 us per gradient tensor; stage-3
#     module fetch 50-300 us; per-rank reduce efficiency U(0.4, 0.9); collective latency 15-60 us x (1 + log2
#     nodes); message size at half bandwidth log-U(2, 16) MB (x2 across nodes); allocator pressure from
#     U(0.88, 0.97) of the device, slowdown at full 0 (p = 0.5) or log-U(2%, 20%).
#   noise: per-run sd log-U(0.4%, 3%), per-step sd log-U(0.5%, 5%), straggler probability U(0, 3%) per step;
#     profiled steps 5/10/15/20 after 3 warm-up steps; start-up 15-35 s + weights load + 3-10 s per extra node.
def _draw(rng: random.Random, name: str, **fixed: Any) -> PhysicalJob:
    def pick(key, fn):
        return fixed[key] if key in fixed else fn()

    gpu = pick("gpu", lambda: rng.choices(list(GPU_WEIGHTS), list(GPU_WEIGHTS.values()))[0])
    nvl = GPUS[gpu][3]
    gpn = pick("gpus_per_node", lambda: rng.choices([1, 2, 4, 8], [25, 10, 20, 45] if nvl else [40, 25, 20, 15])[0])
    nodes = pick("nodes", lambda: (rng.choices([1, 2, 4, 8], [50, 25, 17, 8])[0] if gpn == 8 and nvl
                                   else rng.choices([1, 2], [85, 15])[0] if gpn >= 4 else 1))
    n, dev = gpn * nodes, GPUS[gpu][0]
    lo, hi = NVLINK_BUSBW.get(gpu.split("-")[0], (8, 25)) if nvl else (8, 25)
    if "layers" in fixed:
        L, h, s, V = fixed["layers"], fixed["hidden"], fixed["seq"], fixed["vocab"]
    else:  # size up to where even stage 3 needs offload (ψ > n·dev/18), capped at 70B
        psi = _logu(rng, 0.05e9, min(70e9, 1.6 * n * dev * GB / 18))
        V = rng.choice([30522, 32000, 50257, 128256])
        s = rng.choice([128, 256, 512, 1024] if psi < 0.5e9 else [1024, 2048, 2048, 4096, 8192])
        aspect = _logu(rng, 48, 160)  # hidden / layers (GPT-2 small 64, LLaMA-7B 128)
        core = max(psi - V * 1024, 0.3 * psi)
        h = max(256, round((core * aspect / 12) ** (1 / 3) / 64) * 64)
        L = max(2, round(max(psi - V * h, 0.3 * psi) / (12 * h * h)))
    big = 12 * L * h * h > 1e9
    kw = dict(
        gpu=gpu, gpus_per_node=gpn, nodes=nodes,
        intra_gbps=rng.uniform(lo, hi), inter_gbps=_logu(rng, 5, 50) if nvl else _logu(rng, 2, 12),
        pcie_gbps=rng.uniform(6, 24), cpu_adam_gps=rng.uniform(1, 3), host_gb=rng.choice([256, 512, 1024, 2048]),
        mfu=rng.uniform(0.3, 0.6), layers=L, hidden=h, seq=s, vocab=V,
        checkpointing=rng.random() < (0.6 if big else 0.15), flash=rng.random() < 0.6,
        act_fudge=math.exp(rng.gauss(0.1, 0.15)), act_err=min(1.6, max(0.6, math.exp(rng.gauss(0, 0.2)))),
        tokens_half=_logu(rng, 150, 2500) * math.sqrt(1024 / h),
        mb_overhead_s=L * rng.uniform(0.05, 0.25) * 1e-3 + rng.uniform(1, 4) * 1e-3,
        step_overhead_s=rng.uniform(5, 40) * 1e-3, hook_s=rng.uniform(3, 20) * 1e-6,
        module_s=rng.uniform(50, 300) * 1e-6, eta_rs=rng.uniform(0.4, 0.9),
        lat_s=rng.uniform(15, 60) * 1e-6 * (1 + math.log2(nodes)),
        msg_half_mb=_logu(rng, 2, 16) * (2 if nodes > 1 else 1), overlap_eff=rng.uniform(0.4, 0.9),
        prefetch_eff=rng.uniform(0.2, 0.7), contention=rng.uniform(0.03, 0.2),
        context_gb=rng.uniform(0.6, 1.4) + (rng.uniform(0.3, 0.8) if n > 1 else 0.0), frag=rng.uniform(0, 0.08),
        pressure_u0=rng.uniform(0.88, 0.97), pressure_k=0.0 if rng.random() < 0.5 else _logu(rng, 0.02, 0.2),
        crash_rule=rng.choices(list(CRASH_RULES), list(CRASH_RULES.values()))[0],
        noise_run=_logu(rng, 0.004, 0.03), step_sd=_logu(rng, 0.005, 0.05), straggler_p=rng.uniform(0, 0.03),
        base_startup_s=rng.uniform(15, 35) + 2 * (12 * L * h * h) / (rng.uniform(1, 4) * 1e9) + (nodes - 1) * rng.uniform(3, 10),
        steps=rng.choice([5, 10, 10, 15, 20]),
    )
    kw.update({k: v for k, v in fixed.items() if k in kw or k == "description"})
    return PhysicalJob(name=name, **kw)


def physical_job(seed: int) -> PhysicalJob:
    """Job `phys-<seed>`; redrawn (same stream) until some default-knob config runs (with offload if need be)."""
    rng = random.Random(f"physical-job-{seed}")
    for _ in range(100):
        job = _draw(rng, f"phys-{seed}")
        if job.num_gpus <= 64 and job.optimum(fast=True, offload=True)[0] is not None:
            return job
    return job


def _hand(name, **fixed):
    return _draw(random.Random(f"physical-hand-{name}"), name, **fixed)


PHYSICAL_JOBS = [
    _hand("phys-gpt2l-h100", gpu="H100-80", gpus_per_node=1, nodes=1, layers=36, hidden=1280, seq=1024,
          vocab=50257, checkpointing=False, flash=True, description="GPT-2 large (0.77B), seq 1024, on 1 H100 80GB"),
    _hand("phys-1p3b-8xa100", gpu="A100-40", gpus_per_node=8, nodes=1, layers=24, hidden=2048, seq=2048,
          vocab=50257, checkpointing=False, flash=True, intra_gbps=200.0,
          description="1.3B GPT, seq 2048, on 8xA100-40GB NVLink, one node"),
    _hand("phys-7b-2x8a100", gpu="A100-80", gpus_per_node=8, nodes=2, layers=32, hidden=4096, seq=2048,
          vocab=32000, checkpointing=True, flash=True, inter_gbps=25.0, crash_rule="rs_off",
          description="LLaMA-7B-like, seq 2048, checkpointing, 2 nodes x 8 A100-80GB, 200 Gb/s IB per GPU; "
                      "NCCL fails with reduce_scatter off"),
    _hand("phys-13b-8xa100-40", gpu="A100-40", gpus_per_node=8, nodes=1, layers=40, hidden=5120, seq=2048,
          vocab=32000, checkpointing=True, flash=True,
          description="13B, seq 2048, checkpointing, 8xA100-40GB: needs ZeRO-3 or offload"),
    _hand("phys-bert-4xa10", gpu="A10G-24", gpus_per_node=4, nodes=1, layers=12, hidden=768, seq=128,
          vocab=30522, checkpointing=False, flash=False, intra_gbps=12.0,
          description="BERT-base (0.11B), seq 128, on 4xA10G-24GB over PCIe: tiny compute per sample"),
    _hand("phys-30b-4xh100", gpu="H100-80", gpus_per_node=4, nodes=1, layers=60, hidden=6656, seq=2048,
          vocab=32000, checkpointing=True, flash=True, host_gb=1024,
          description="30B, seq 2048, checkpointing, 4xH100-80GB: fits only with offload"),
]


@dataclasses.dataclass(frozen=True)
class LeverJob(PhysicalJob):
    """A multi-GPU ZeRO-3 job whose full-mode space holds ZeRO++ where optuna-ds proposes it
    (optuna_ds.space.zeropp_space: hpZ, qwZ and qgZ where the ranks span nodes) or, on one node,
    where the user lists qwZ; ``levers`` off: DeepSpeed's autotuner's space alone."""

    levers: bool = True

    def spaces(self) -> dict[int, dict[str, list[Any]]]:
        if not self.levers:
            return SPACES
        zeropp = ({HPZ: [1, self.gpus_per_node], QGZ: [False, True], QWZ: [False, True]} if self.nodes > 1
                  else {QWZ: [False, True]})
        return {**SPACES, 3: {**SPACES[3], **zeropp}}

    def defaults(self) -> dict[str, Any]:
        from surfaces import DEFAULTS

        return {**DEFAULTS, **LEVER_DEFAULTS}


# The lever families (`benchmarks/planner.py --levers N`): where ZeRO++ pays, ZeRO-3 across nodes
# of a slow interconnect (Ethernet or a shared fabric: 1.5-6 GB/s per GPU) with a model that needs
# ZeRO-3; where it cannot, the same models on one NVLink node (qwZ listed) or across nodes of a
# fast fabric (25-50 GB/s per GPU) with long sequences, whose compute hides the gathers.
LEVER_FAMILIES = {"zpp-slow": "ZeRO-3 across nodes of a slow interconnect", "zpp-fast": "one node, or a fast fabric"}


def lever_job(family: str, seed: int, *, levers: bool = True) -> LeverJob:
    rng = random.Random(f"lever-job-{family}-{seed}")
    gpu = rng.choice(["A100-80", "H100-80"])
    psi = _logu(rng, 10e9, 40e9)
    h = round((psi * _logu(rng, 80, 140) / 12) ** (1 / 3) / 128) * 128
    fixed: dict[str, Any] = dict(gpu=gpu, gpus_per_node=8, layers=max(2, round(psi / (12 * h * h))), hidden=h, vocab=32000,
                                 checkpointing=True, flash=True, crash_rule="", host_gb=2048)
    if family == "zpp-slow":
        fixed.update(nodes=rng.choice([2, 4, 8]), inter_gbps=_logu(rng, 1.5, 6), seq=rng.choice([2048, 4096]))
    elif rng.random() < 0.5:
        fixed.update(nodes=1, seq=rng.choice([2048, 4096]))
    else:
        fixed.update(nodes=rng.choice([2, 4]), inter_gbps=_logu(rng, 25, 50), seq=8192)
    job = _draw(rng, f"{family}-{seed}", **fixed)
    init = {f.name: getattr(job, f.name) for f in dataclasses.fields(PhysicalJob) if f.init}
    return LeverJob(**{**init, "name": f"{family}-{seed}" + ("" if levers else "-off")}, levers=levers)


CKPT = "gradient_checkpointing"  # the script's switch, as optuna-ds names it (arg_mappings' key)


@dataclasses.dataclass(frozen=True)
class CheckpointJob(PhysicalJob):
    """A job whose script takes activation checkpointing as a switch (Hugging Face's
    ``--gradient_checkpointing``): a config that sets ``gradient_checkpointing`` true runs as
    the same job with full checkpointing (its activations and its recomputed forward, as
    ``PhysicalJob`` models them); ``switch`` off: the fast-mode space without it."""

    switch: bool = True

    def _twin(self) -> PhysicalJob:
        if "twin" not in self._cache:
            init = {f.name: getattr(self, f.name) for f in dataclasses.fields(PhysicalJob) if f.init}
            self._cache["twin"] = PhysicalJob(**{**init, "checkpointing": True})
        return self._cache["twin"]

    def _curve(self, stage, oo, op, knobs, gas, mbs):
        if (CKPT, True) in knobs:
            return self._twin()._curve(stage, oo, op, tuple(kv for kv in knobs if kv[0] != CKPT), gas, mbs)
        return super()._curve(stage, oo, op, knobs, gas, mbs)

    def _crashes(self, stage, oo, op, knobs, mbs):
        return super()._crashes(stage, oo, op, tuple(kv for kv in knobs if kv[0] != CKPT), mbs)

    def _settings(self, stage: int, fast: bool, offloaded: bool = False):
        for knobs in super()._settings(stage, fast, offloaded):
            yield knobs
            if self.switch:
                yield tuple(sorted((*knobs, (CKPT, True))))


# The checkpointing families (`benchmarks/planner.py --checkpointing N`), 0.3-7B models on drawn
# hardware whose script takes the switch: long sequences (4096-8192 tokens), whose activations
# bound the micro-batch at a few samples or none, and short ones (256-1024), whose activations
# bound it only on small devices or beside large model states. Whether it pays is the job's.
CHECKPOINT_FAMILIES = {"ckpt-long": "sequences of 4096-8192 tokens", "ckpt-short": "sequences of 256-1024 tokens"}


def checkpoint_job(family: str, seed: int, *, switch: bool = True) -> CheckpointJob:
    rng = random.Random(f"checkpoint-job-{family}-{seed}")
    job = None
    for _ in range(100):
        psi = _logu(rng, 0.3e9, 7e9)
        h = max(512, round((psi * _logu(rng, 64, 140) / 12) ** (1 / 3) / 128) * 128)
        seq = rng.choice([4096, 8192]) if family == "ckpt-long" else rng.choice([256, 512, 1024])
        drawn = _draw(rng, f"{family}-{seed}", layers=max(2, round(psi / (12 * h * h))), hidden=h, seq=seq, vocab=32000,
                      checkpointing=False, crash_rule="")
        init = {f.name: getattr(drawn, f.name) for f in dataclasses.fields(PhysicalJob) if f.init}
        job = CheckpointJob(**init)
        if job.num_gpus <= 64 and job.optimum(fast=True, offload=True)[0] is not None:
            break  # some config runs, with the switch (the same job without it is its twin)
    assert job is not None
    return job if switch else dataclasses.replace(job, switch=False)  # the same physics, the space without it


@dataclasses.dataclass(frozen=True)
class AutotpJob(PhysicalJob):
    """A job whose script runs AutoTP (a Hugging Face model, data the same within a group) and
    whose config lists ``sizes``: at stages 0-2 without offload each size is a setting beside
    AutoTP off (``PhysicalJob._curve`` has its physics); ``listed`` off: the space without it."""

    sizes: tuple[int, ...] = (2, 4)
    listed: bool = True

    def _settings(self, stage: int, fast: bool, offloaded: bool = False):
        for knobs in super()._settings(stage, fast, offloaded):
            yield knobs
            if self.listed and stage <= 2 and not offloaded:
                for t in self.sizes:
                    yield tuple(sorted((*knobs, (AUTOTP, t))))


# The AutoTP families (`benchmarks/planner.py --autotp N`): models whose script runs AutoTP,
# listing sizes 2 and 4 (8 on 8-GPU nodes): 3-20B on one node of 8 NVLink GPUs (A100, H100),
# 7-30B on 2-4 such nodes over InfiniBand (5-25 GB/s a GPU: ZeRO-3 gathers across nodes, AutoTP's
# all-reduces stay in a node), and 1.5-8B on one node of PCIe GPUs (L40S, RTX 4090, A10G: its
# all-reduces cost ten times as much). Whether it pays is the job's.
AUTOTP_FAMILIES = {"tp-nvlink": "one node of 8 NVLink GPUs", "tp-nodes": "2-4 nodes of 8 NVLink GPUs",
                   "tp-pcie": "one node of 4-8 PCIe GPUs"}


def autotp_job(family: str, seed: int, *, listed: bool = True) -> AutotpJob:
    rng = random.Random(f"autotp-job-{family}-{seed}")
    job = None
    for _ in range(100):
        nodes, inter = 1, {}
        if family == "tp-nvlink":
            gpu, gpn, psi = rng.choice(["A100-40", "A100-80", "H100-80"]), 8, _logu(rng, 3e9, 20e9)
        elif family == "tp-nodes":
            gpu, gpn, psi = rng.choice(["A100-40", "A100-80", "H100-80"]), 8, _logu(rng, 7e9, 30e9)
            nodes, inter = rng.choice([2, 4]), {"inter_gbps": _logu(rng, 5, 25)}
        else:
            gpu, gpn, psi = rng.choice(["L40S-48", "RTX4090-24", "A10G-24"]), rng.choice([4, 8]), _logu(rng, 1.5e9, 8e9)
        h = max(1024, round((psi * _logu(rng, 80, 140) / 12) ** (1 / 3) / 128) * 128)
        drawn = _draw(rng, f"{family}-{seed}", gpu=gpu, gpus_per_node=gpn, nodes=nodes, layers=max(2, round(psi / (12 * h * h))),
                      hidden=h, seq=rng.choice([1024, 2048, 4096]), vocab=32000, crash_rule="", host_gb=2048, **inter)
        init = {f.name: getattr(drawn, f.name) for f in dataclasses.fields(PhysicalJob) if f.init}
        job = AutotpJob(**init, sizes=(2, 4, 8) if gpn == 8 else (2, 4))
        if job.optimum(fast=True, offload=True)[0] is not None:
            break  # some config runs, with AutoTP listed (the same job without it is its twin)
    assert job is not None
    return job if listed else dataclasses.replace(job, listed=False)  # the same physics, the space without it


def by_name(name: str) -> PhysicalJob:
    for j in PHYSICAL_JOBS:
        if j.name == name:
            return j
    for family in CHECKPOINT_FAMILIES:
        if name.startswith(family + "-"):
            seed, _, off = name[len(family) + 1:].partition("-")
            return checkpoint_job(family, int(seed), switch=off != "off")
    for family in LEVER_FAMILIES:
        if name.startswith(family + "-"):
            seed, _, off = name[len(family) + 1:].partition("-")
            return lever_job(family, int(seed), levers=off != "off")
    for family in AUTOTP_FAMILIES:
        if name.startswith(family + "-"):
            seed, _, off = name[len(family) + 1:].partition("-")
            return autotp_job(family, int(seed), listed=off != "off")
    if name.startswith("phys-") and name[5:].lstrip("-").isdigit():
        return physical_job(int(name[5:]))
    raise KeyError(name)


# -------------------------------------------------------------------- summary
def _arm_label(arm) -> str:
    return f"z{arm[0]}" + ("+oo" if arm[1] else "") + ("+op" if arm[2] else "")


def summary(count: int) -> None:
    from collections import Counter
    wins, fast_wins, gpus, gpu_types, rows = Counter(), Counter(), Counter(), Counter(), []
    below = naive_not = 0
    noises, gains, knob_gain, errs, starts, rules = [], [], [], [], [], Counter()
    for seed in range(count):
        j = physical_job(seed)
        opt = j.arm_optima(fast=False, offload=True)
        cfg, thr = max(opt.values(), key=lambda ct: ct[1])
        arm = (cfg.stage, cfg.offload_optimizer, cfg.offload_param)
        wins[_arm_label(arm)] += 1
        fcfg, _ = j.optimum(fast=True, offload=True)
        fast_wins[_arm_label((fcfg.stage, fcfg.offload_optimizer, fcfg.offload_param))] += 1
        edge = j._fit_len(cfg.stage, cfg.offload_optimizer, cfg.offload_param, cfg.knobs, 1024)
        below += cfg.mbs < edge
        k0 = j._fit_len(0, False, False, (), 1024)
        naive = Config(0, k0, 1) if k0 else None
        naive_ok = naive is not None and j.evaluate(naive).kind == "ok"
        naive_thr = j.evaluate(naive).throughput if naive_ok else 0.0
        naive_not += not (cfg.stage == 0 and cfg.mbs == k0)
        fast_thr = j.optimum(fast=True, offload=True)[1]
        knob_gain.append(thr / fast_thr)
        rules[j.crash_rule or "none"] += 1
        errs.append(j.act_gb / j.act_real_gb)
        starts.append(j.startup_s)
        gains.append(thr / naive_thr if naive_thr else float("inf"))
        noises.append(j.noise)
        gpus[j.num_gpus] += 1
        gpu_types[j.gpu] += 1
        rows.append(j.params_b)
    pct = lambda x: f"{100 * x / count:.0f}%"
    print(f"{count} physical jobs")
    print("winner (full, offload):", ", ".join(f"{k} {pct(v)}" for k, v in sorted(wins.items())))
    print("winner (fast, offload):", ", ".join(f"{k} {pct(v)}" for k, v in sorted(fast_wins.items())))
    print(f"optimum below its memory edge: {pct(below)}; optimum is not 'stage 0 at its largest mbs': {pct(naive_not)}")
    finite = sorted(g for g in gains if g != float("inf"))
    print(f"stage 0 cannot run at all: {pct(len(gains) - len(finite))}; optimum / naive: median "
          f"{finite[len(finite) // 2]:.3f}, p90 {finite[int(0.9 * len(finite))]:.3f}, max {finite[-1]:.2f}; "
          f"naive >2% short of the optimum (or cannot run): {pct(sum(g > 1.02 for g in gains))}")
    kg = sorted(knob_gain)
    print(f"full-mode optimum / fast-mode optimum: median {kg[count // 2]:.3f}, p90 {kg[9 * count // 10]:.3f}, "
          f"max {kg[-1]:.3f}; >1%: {pct(sum(g > 1.01 for g in kg))}")
    es, ss = sorted(errs), sorted(starts)
    print(f"reported act_gb / real: p10 {es[count // 10]:.2f} median {es[count // 2]:.2f} p90 {es[9 * count // 10]:.2f}; "
          f"start-up s: p10 {ss[count // 10]:.0f} median {ss[count // 2]:.0f} p90 {ss[9 * count // 10]:.0f}")
    print("crash rules:", ", ".join(f"{k}: {v}" for k, v in sorted(rules.items())))
    ns = sorted(noises)
    print(f"noise (robust sd per run): min {ns[0]:.3f} p10 {ns[count // 10]:.3f} median {ns[count // 2]:.3f} "
          f"p90 {ns[9 * count // 10]:.3f} max {ns[-1]:.3f}")
    print("GPUs:", ", ".join(f"{k}: {v}" for k, v in sorted(gpus.items())))
    print("GPU types:", ", ".join(f"{k}: {v}" for k, v in sorted(gpu_types.items())))
    ps = sorted(rows)
    print(f"params (B): p10 {ps[count // 10]:.2f} median {ps[count // 2]:.2f} p90 {ps[9 * count // 10]:.1f} max {ps[-1]:.1f}")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--summary":
        summary(int(sys.argv[2]) if len(sys.argv) > 2 else 200)
    else:
        for j in PHYSICAL_JOBS:
            c, t = j.optimum(fast=False, offload=True)
            print(f"{j.name}: {j.description}\n   optimum {c} {t:.1f} samples/s, noise {j.noise:.3f}")
