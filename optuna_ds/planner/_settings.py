from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Priors:
    """The planner's beliefs before a tuning's runs say otherwise, and the limits of its search:
    a field of :class:`PlannerSettings`, so a benchmark varies them by argument.

    Args:
        broken:
            A stage that fails for a reason other than memory may fail at every size.
        size_fails:
            Else, once one size of a stage failed, another may.
        shared_threshold:
            Each other stage failing above every size that ran anywhere makes a threshold of
            the job's (an int32 index over the logits) likelier by this share.
        knob_cause:
            A knob value makes a stage crash (reduce_scatter off on NCCL, a bucket over 2 GB).
        contradiction:
            A run that contradicts the linear memory model (a workspace that switches on at some
            size, fragmentation) is believed this much less than one that agrees.
        memory_sd:
            A run's peak memory, where the accelerator reports it, is the linear memory model's
            figure within this share of the device (the caching allocator reserves a little more
            than it needs).
        saturated:
            A peak memory this close to full says only that the run fitted (the allocator took
            what was there).
        first_arm_sd:
            The first stage's log throughput scale, before any run: this wide about the runs' mean.
        stage_steps:
            How each of ZeRO-1, -2 and -3 relates to the stage before it, in log throughput:
            (mean, sd). ZeRO-1 may run either side of stage 0; ZeRO-2's reduce-scatter and
            all-gather run 10-20% slower than ZeRO-1 on 8+ GPUs, about even on one; ZeRO-3 also
            gathers the parameters (1.5x the volume). Wide on purpose: each is settled by one run.
        offload_step:
            Offloading the optimizer, in log throughput: (mean, sd); from 0.9x to 0.25x of the
            GPU run at the same size, never faster (what it buys is memory).
        knob_own:
            A stage's own deviation of a knob value's effect, as a share of the effect shared by
            the stages: the collective a bucket feeds differs by stage, so as large.
        residual_shared:
            The share of the throughput curve's smooth deviation from its shape that the arms
            share (the same kernels run at every stage); the rest is each arm's own.
        residual_length:
            In log size: sizes this far apart (1.6x) deviate independently.
        straggler_p:
            A config's runs hold a straggler (a slow node, a preempted step, a checkpoint: a run
            slower, never faster) with this probability...
        straggler_range:
            ...anywhere within this range below the others (log); it tells nothing of the noise.
        straggler_z:
            A run measured this many deviations below what the others predict for it is taken
            for a straggler.
        surprise:
            A config's only run this likely a straggler, by what the other runs predict for it
            (and not taken for one), is a surprise: a re-measurement is priced with both
            explanations, a straggler or the curve bending there, in the posterior.
        keep:
            The surrogate's mixture components below this weight are dropped.
        max_components:
            A re-measurement is priced on the heaviest components, at most this many: its
            knowledge gradient is quadratic in their number.
        rivals:
            The measured configs the choice is likeliest to lose to, whose re-measurement is
            priced.
        late:
            Of the usual run: an experiment running this long is in its round's second half
            (a batch's member may end at most this much of its run after the last under way).
        chunk:
            A batch's candidates whose value is brought up to date at once.
        lever_savings:
            The most each ZeRO++ lever saves of a ZeRO-3 step's communication (its two parameter
            all-gathers and its gradient reduce-scatter move a third of the volume each): qwZ
            halves both all-gathers' bytes (fp16 to int8: 1/3), qgZ quarters the reduce-scatter's
            across nodes (int4: 1/4), hpZ keeps the backward all-gather within a node (1/3).
            DeepSpeed reports up to 2x end to end with all three, on low-bandwidth clusters only.
        lever_costs:
            What each lever costs in log throughput whatever it saves: qwZ and qgZ run block
            (de)quantization kernels over every gathered or reduced tensor (a few % of a step,
            ZeRO++ paper), hpZ copies each gathered parameter's slice into its secondary
            partition. hpZ's memory is the memory model's (the knob setting's buffers).
        lever_cost_sd:
            A lever's cost is known to within this share of itself.
        internode_share:
            Before a ZeRO-3 run's timers say otherwise, the share of its step spent
            communicating across nodes: the ZeRO++ paper's ZeRO-3 baseline spends about half its
            step communicating at 100 Gb/s; a prior below that, as clusters vary tenfold.
        intranode_share:
            The same within one node (NVLink or PCIe): ZeRO-3's gathers mostly hide behind
            compute there.
        lever_model:
            Parameters below which a model's communication share is believed smaller in
            proportion: a small model's all-gathers are short beside the compute of the large
            micro-batches it leaves room for.
        recompute:
            What activation checkpointing adds to a sample's compute before a run's timers say:
            one more forward pass, a third of the forward and backward (the backward computes
            the gradients of the activations and of the weights, twice the forward's FLOPs).
            Once a run without it logged DeepSpeed's timers, the step's own forward share
            (``fwd / (fwd + bwd + step)``) replaces it: the optimizer step and the waits on
            communication are not recomputed.
        recompute_sd:
            How far the recompute's cost strays from that, in log throughput: before timers, the
            step's share outside the compute (optimizer, communication) is unknown; measured,
            the recomputed forward runs without storing its activations, a little faster.
        recompute_sd_measured:
            ...and once the job's timers gave its forward share.
        checkpoint_kept:
            The range of the share of a sample's activation memory a fully checkpointed model
            still holds (log-uniform within it until its runs say where): each layer's input,
            about 2 of the ~34 bytes per token and hidden unit a transformer layer keeps (with
            the attention scores on top; Korthikanti et al. 2022), plus one layer's activations
            while it is recomputed, plus what no layer boundary frees (embeddings, the logits and
            the loss: a large vocabulary's logits dominate a small model's activations). From a
            twentieth for a deep model to about half for a shallow one with a large vocabulary.
        section_kept:
            The same for a setting of DeepSpeed's ``activation_checkpointing`` section that
            frees memory (the checkpoints in host memory, or partitioned over model-parallel
            ranks), against the same script without it: what the checkpoints are of a sample's
            memory depends on the model, from most of it to little.
        section_cost:
            Such a setting's cost in log throughput, and ``section_cost_sd`` how well it is known:
            a copy of each checkpoint to the host and back, or a gather over the model-parallel
            ranks, mostly overlapped with compute.
        recompute_growth:
            A checkpointing run's backward grows by the forward it recomputes (DeepSpeed's
            ``bwd`` over ``fwd`` rises by one against the same config without it), less what the
            forward's timer holds that the recompute does not repeat: at ZeRO-3 the wait on the
            parameter gathers (the backward gathers them anyway), per-micro-batch overheads. A
            growth credibly below this share of a forward (twice the spread of the ratio over
            the runs without it included) says the script never checkpoints; one that ignores
            the switch grows by nothing but the noise.
        autotp_exchange:
            AutoTP's all-reduces' share of a step is this over the hidden size, times the group
            less one (:mod:`optuna_ds.planner._autotp`): ``(2/9) FLOPS / bandwidth``, a layer's
            four all-reduces of ``s h`` activations against its ``72 s h^2`` FLOPs a sample. An
            H100 at ~400 TFLOPS achieved over NVLink at ~350 GB/s per GPU gives about 250 (6% of
            the step at ``h`` 4096, ``t`` 2); PCIe at ~25 GB/s, ten times that.
        autotp_exchange_sd:
            Its cost is known to within this share of itself before a run: NVLink's figure, as
            AutoTP is made for a node's fast links; a node whose links are slower (PCIe) shows it
            in its first run with AutoTP, which the model learns from like any run.
        pressure_none:
            The prior weight of no slowdown under memory pressure: a curve that rises to its
            memory edge. The rest believes in a monotone slowdown of the memory share in use, shared
            by every arm and learned from all of their runs: a loss growing linearly from an
            onset to a full device (allocator retries, smaller fused kernels, cuDNN falling back
            to slower algorithms for want of workspace) -- of the device, the same zone at every
            stage, or of the arm's own room for activations, a zone that moves with its edge.
            Curved families (a loss growing as the square or the fourth power of the share
            beyond the onset), narrower onsets and each run's measured peak in place of the
            fitted share were tried and did no better on any benchmark: the runs near the edge
            show no slowdown beyond their noise to tell the shapes apart.
        pressure_onset:
            The onsets, as ``numpy.linspace`` arguments, in shares of the memory: 3% apart, as
            the optimum often sits where the loss starts (a step's error there costs about
            ``loss / (1 - onset)`` of it).
        pressure_losses:
            The losses at a full device (or room).
        autotp_unsplit:
            The range of the share of a sample's activations AutoTP leaves whole on every rank of
            its group: a transformer layer splits 24 of its ~34 bytes per token and hidden unit
            over the group and keeps the rest (the residual stream, the norms' inputs, dropout
            masks: Korthikanti et al. 2022), with the embeddings, and the logits unless the head
            is vocabulary-parallel (a large vocabulary's logits dominate a small model's); a
            model that checkpoints its layers keeps each one's whole input and splits only the
            layer it recomputes: nearly all of it.
    """

    broken: float = 0.5
    size_fails: float = 0.3
    shared_threshold: float = 0.5
    knob_cause: float = 0.05
    contradiction: float = 0.03
    memory_sd: float = 0.03
    saturated: float = 0.95
    first_arm_sd: float = 3.0
    stage_steps: tuple[tuple[float, float], ...] = ((0.0, 0.06), (-0.06, 0.08), (-0.12, 0.15))
    offload_step: tuple[float, float] = (-0.7, 0.3)
    knob_own: float = 1.0
    residual_shared: float = 0.5
    residual_length: float = 0.5
    straggler_p: float = 0.1
    straggler_range: float = 0.3
    straggler_z: float = 3.0
    surprise: float = 0.05
    keep: float = 1e-3
    max_components: int = 256
    rivals: int = 1
    late: float = 0.5
    chunk: int = 16
    lever_savings: tuple[tuple[str, float], ...] = (
        ("zero_quantized_weights", 1 / 3), ("zero_quantized_gradients", 1 / 4), ("zero_hpz_partition_size", 1 / 3))
    lever_costs: tuple[tuple[str, float], ...] = (
        ("zero_quantized_weights", 0.03), ("zero_quantized_gradients", 0.03), ("zero_hpz_partition_size", 0.01))
    lever_cost_sd: float = 0.5
    internode_share: float = 0.3
    intranode_share: float = 0.05
    lever_model: float = 1e9
    recompute: float = 1 / 3
    recompute_sd: float = 0.08
    recompute_sd_measured: float = 0.03
    checkpoint_kept: tuple[float, float] = (0.05, 0.5)
    section_kept: tuple[float, float] = (0.3, 1.0)
    section_cost: float = 0.03
    section_cost_sd: float = 0.03
    recompute_growth: float = 0.25
    autotp_exchange: float = 250.0
    autotp_exchange_sd: float = 0.5
    autotp_unsplit: tuple[float, float] = (0.15, 0.95)
    pressure_none: float = 0.4
    pressure_onset: tuple[float, float, int] = (0.5, 0.98, 17)
    pressure_losses: tuple[float, ...] = (0.05, 0.1, 0.2, 0.35, 0.5, 0.7)


@dataclasses.dataclass(frozen=True)
class PlannerSettings:
    """The settings of the planner's search, passed to :func:`~optuna_ds.planner.plan` as a
    value (as Optuna's samplers take theirs), so a benchmark or a caller varies them without
    touching module state.

    Args:
        min_gain:
            A launch is made while it is expected to raise the final choice by this share of
            throughput (its knowledge gradient times the chance it runs): a new size or stage, a
            knob setting and a re-measurement alike. The search ends when none is; a launch that
            runs out of memory counts as the launch it is. The knowledge gradient moves a
            candidate by what one run of the measured noise can show, so under noisy runs a
            plateau is not walked size by size. The price of a launch where the user gives no
            training length (:func:`~optuna_ds.planner.launch_price`): a training about 500
            launches long.
        hopeless_oom:
            Sizes this likely to run out of memory are not candidates.
        max_remeasures:
            Re-measurements of finalists in one tuning, at most.
        plausible_z:
            A config whose measured mean lies this many noise deviations below the best
            measured one is not chosen, whatever the model estimates for it.
        growth:
            Candidate sizes above 64 step by this factor.
        noise_after:
            Once this many runs succeeded and no config ran twice, the best so far runs again:
            the noise is measured, not inferred from how well the model fits; every later
            launch is priced against it and the summary reports it.
        batch_gain:
            A slot free while other experiments run takes the candidate of highest expected
            gain per second while that gain (per run of the usual length) is at least this,
            and while the tuning goes on anyway (see :mod:`optuna_ds.planner._batch`): such a
            run costs GPU-seconds but no wall time, and saves a round where the search would
            have waited for its result. Between 0 and ``min_gain``: the lower, the more
            GPU-hours a tuning spends to finish sooner; at ``min_gain`` a batch holds what the
            sequential search would run, plus every stage once. With one slot it never acts.
        priors:
            The planner's priors and the limits of its search (see :class:`Priors`).
    """

    min_gain: float = 0.002
    hopeless_oom: float = 0.98
    max_remeasures: int = 3
    plausible_z: float = 2.0
    growth: float = 1.04
    noise_after: int = 3
    batch_gain: float = 0.0005
    priors: Priors = Priors()
