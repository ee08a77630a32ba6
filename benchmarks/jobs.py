"""Random simulated jobs for `make bench`: the search is judged on jobs it was never tuned on.

``random_job(seed)`` draws one :class:`surfaces.Surface` from a wide distribution -- model size
against GPU memory (some jobs fit only with offload), GPU counts, per-sample memory, how far the
profile's activation figure is off, stage communication costs, memory-pressure zones of random
width and depth, memory cliffs, non-OOM crashes, knob effects, measurement noise 0.5-4% and
start-up time. The same seed always gives the same job, so the simulated launcher rebuilds it
from its name (``random-<seed>``).
"""
from __future__ import annotations

import math
import random
from typing import Any

from surfaces import SPACES
from surfaces import Surface
from surfaces import _gain


def _log_uniform(r: random.Random, low: float, high: float) -> float:
    return math.exp(r.uniform(math.log(low), math.log(high)))


def _knob_effects(r: random.Random) -> dict[str, dict[Any, float]]:
    tables: dict[str, dict[Any, float]] = {}
    knobs = sorted({k for space in SPACES.values() for k in space})
    for knob in knobs:
        if r.random() >= 0.5:
            continue
        values = SPACES[2].get(knob) or SPACES[1].get(knob) or SPACES[3][knob]
        tables[knob] = {v: 1.0 + r.uniform(-0.06, 0.06) for v in values if r.random() < 0.7}
    return _gain(**tables)


def _crash(r: random.Random) -> dict[str, Any] | None:
    if r.random() >= 0.15:
        return None
    return r.choice([
        {"stage": 2, "reduce_scatter": False},
        {"stage": 3, "contiguous_gradients": False},
        {"stage": r.choice([1, 2, 3]), "mbs_at_least": int(_log_uniform(r, 2, 128))},
        {"stage": 3},
        {"stage": 1, "overlap_comm": True},
    ])


def random_job(seed: int) -> Surface:
    """The job of ``seed``: every feature drawn independently, so no rule fitted to a few jobs
    holds on all of them."""
    r = random.Random(f"optuna-ds-bench-job-{seed}")
    num_gpus = r.choice([1, 2, 4, 8, 8, 16])
    device_gb = r.choice([24.0, 40.0, 80.0, 80.0, 141.0])
    # Model states at stage 0 (16 bytes a parameter) as a share of one GPU: above 1, stage 0
    # cannot run; far above, only partitioning or offload can.
    states_share = _log_uniform(r, 0.02, 2.5 if num_gpus > 1 else 1.2)
    params_b = states_share * device_gb / 16.0
    act_gb = device_gb * _log_uniform(r, 1 / 800, 1 / 3)
    comm = r.uniform(0.0, 1.0) if num_gpus > 1 else 0.1
    s1 = 1.0 - comm * r.uniform(0.0, 0.03)
    s2 = s1 - comm * r.uniform(0.0, 0.06)
    s3 = s2 - max(comm, 0.2) * r.uniform(0.02, 0.3)
    pressured = r.random() < 0.6
    cliff = r.random() < 0.2
    return Surface(
        name=f"random-{seed}",
        description="a generated job",
        params_b=params_b,
        act_gb=act_gb,
        act_ratio=r.uniform(0.85, 1.5),
        context_gb=r.uniform(1.0, 4.0),
        peak=200.0 / max(params_b, 0.05) ** 0.7 * r.uniform(0.5, 2.0),
        half_mbs=_log_uniform(r, 0.5, 32.0),
        stage_factor=(1.0, s1, s2, s3),
        pressure_from=r.uniform(0.55, 0.97) if pressured else 0.9,
        pressure_loss=r.uniform(0.05, 0.6) if pressured else 0.0,
        cliff_mbs=int(_log_uniform(r, 2, 256)) if cliff else 0,
        cliff_gb=device_gb * r.uniform(0.05, 0.4) if cliff else 0.0,
        knob_gain=_knob_effects(r),
        crash=_crash(r),
        noise=r.uniform(0.005, 0.04),
        startup_s=r.uniform(20.0, 180.0),
        num_gpus=num_gpus,
        device_gb=device_gb,
    )
