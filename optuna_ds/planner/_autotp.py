"""What AutoTP is worth before it runs, in physical terms (issue 37).

AutoTP splits each layer's weights over ``t`` ranks of a node, which then work on one batch: a
rank holds ``1/t`` of the parameters (and, below ZeRO-3, their gradients and optimizer states
over the ``ranks / t`` data-parallel ranks left: the model states of mp size ``t``), and keeps a
share ``u + (1 - u) / t`` of a sample's activations, ``u`` the part no layer splits (the
residual stream and its norms, the embeddings, the logits of a head that is not
vocabulary-parallel; :func:`kept_range`). What it costs is its all-reduces: two per layer in
the forward and two in the backward, each of a micro-batch's activations, over the group's
links, against the ``1/t`` of the compute a rank keeps. Per sample, all ranks together, that is
``t * (t - 1) / t`` times an all-reduce of ``16 L s h`` bytes against ``72 L s h^2`` FLOPs of
compute: a share ``k (t - 1) / h`` of the step, ``k = (2/9) FLOPS / bandwidth``
(:attr:`Priors.autotp_exchange`), so it shrinks with the hidden size and grows with the group.
At a size both run it is slower but for the gradients each rank reduces (1/t of them); what it
buys is room: the sizes the config without it runs out of memory at, or a stage whose model
states fit only so. The planner prices it as it prices activation checkpointing
(:mod:`optuna_ds.planner._checkpointing`): tried beyond the memory edge, and only where the
curve's rise there can beat its cost; every size shares one effect, so a run of one teaches
what the others cost (:func:`autotp_shares`). Every function here is pure.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from optuna_ds.domain import AUTOTP_KNOB
from optuna_ds.domain import FailureReason
from optuna_ds.planner._problem import Knobs
from optuna_ds.planner._problem import Observation
from optuna_ds.planner._problem import Problem
from optuna_ds.planner._problem import Status
from optuna_ds.planner._settings import Priors

Effect = tuple[float, float]  # (mean, sd) of a log throughput effect


def hidden_size(problem: Problem) -> float:
    """The model's hidden size: the user's figure, else one a transformer of the model's
    parameters has (``12 L h^2`` parameters at ``L ~ h / 128`` layers: 768 for 125M, 4096 for 7B);
    a large model's where the parameters are unknown."""
    if problem.hidden > 0:
        return float(problem.hidden)
    params = problem.params if problem.params > 0 else 7e9
    return float(math.pow(params * 128.0 / 12.0, 1.0 / 3.0))


def kept_range(size: int, priors: Priors) -> tuple[float, float]:
    """The range of the share of a sample's activation memory a rank of an AutoTP group of
    ``size`` keeps: ``u + (1 - u) / size`` over :attr:`Priors.autotp_unsplit`'s range of ``u``."""
    low, high = priors.autotp_unsplit
    return low + (1.0 - low) / size, high + (1.0 - high) / size


# The one effect every AutoTP size shares: what the group's all-reduces cost on these links at
# this hidden size, a size's own a multiple of it (:func:`autotp_shares`).
EXCHANGE = (AUTOTP_KNOB, "exchange")


def _cost(size: int, h: float, priors: Priors) -> float:
    return math.log1p(priors.autotp_exchange * (size - 1) / h)


def autotp_effects(problem: Problem, priors: Priors) -> dict[tuple[str, Any], Effect]:
    """The prior of each AutoTP size on log throughput at a micro-batch size both run, and of
    :data:`EXCHANGE`, a group of two's: its all-reduces' share of the step, ``k (t - 1) / h``
    (:attr:`Priors.autotp_exchange`), known to within :attr:`Priors.autotp_exchange_sd` of
    itself, with little weight above nothing: at a size both run it adds the all-reduces. What it
    saves there (each rank reduces and steps 1/t of the parameters) is small beside them on a
    node's links, and slower links show in its first run, which the model learns from."""
    h = hidden_size(problem)
    out: dict[tuple[str, Any], Effect] = {}
    for size in {2, *(setting.autotp for setting in problem.autotp)} if problem.autotp else ():
        cost = _cost(size, h, priors)
        out[EXCHANGE if size == 2 else (AUTOTP_KNOB, size)] = (-cost, priors.autotp_exchange_sd * cost)
    if problem.autotp:
        out[(AUTOTP_KNOB, 2)] = out[EXCHANGE]
    return out


def autotp_shares(problem: Problem, priors: Priors) -> dict[tuple[str, Any], float]:
    """Each AutoTP size's effect as a multiple of :data:`EXCHANGE`'s: the same links and hidden
    size carry every size's all-reduces, so a run of one teaches what the others cost."""
    h = hidden_size(problem)
    return {(AUTOTP_KNOB, s.autotp): _cost(s.autotp, h, priors) / _cost(2, h, priors) for s in problem.autotp}


def broken(observations: Sequence[Observation]) -> bool:
    """Whether a run showed that AutoTP cannot run this job at any size: its model AutoTP cannot
    shard, or its data differ within a tensor-parallel group (:attr:`FailureReason.AUTOTP`). The
    script's, not the size's: said once, and no size is tried again."""
    return any(o.status is Status.FAILED and o.reason == FailureReason.AUTOTP.value and o.knobs.autotp > 1 for o in observations)


def usable(problem: Problem, observations: Sequence[Observation]) -> tuple[Knobs, ...]:
    """The problem's AutoTP settings still worth a launch: none once AutoTP failed for the
    script's reason."""
    return () if broken(observations) else problem.autotp
