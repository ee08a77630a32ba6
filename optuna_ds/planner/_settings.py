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
        rivals:
            The measured configs the choice is likeliest to lose to, whose re-measurement is
            priced.
        late:
            Of the usual run: an experiment running this long is in its round's second half
            (a batch's member may end at most this much of its run after the last under way).
        chunk:
            A batch's candidates whose value is brought up to date at once.
    """

    broken: float = 0.5
    size_fails: float = 0.3
    shared_threshold: float = 0.5
    knob_cause: float = 0.05
    contradiction: float = 0.03
    memory_sd: float = 0.03
    saturated: float = 0.95
    rivals: int = 1
    late: float = 0.5
    chunk: int = 16


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
            plateau is not walked size by size.
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
