from __future__ import annotations

from typing import Any

from optuna.distributions import BaseDistribution


def contains(distribution: BaseDistribution, value: Any) -> bool:
    """Whether a trial whose param has ``distribution`` can take ``value``: a sampler's own list
    may hold values the trial's suggestion does not admit (another range, another type)."""
    try:
        return distribution._contains(distribution.to_internal_repr(value))
    except (ValueError, TypeError):
        return False
