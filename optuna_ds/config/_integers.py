from __future__ import annotations

import copy
import functools
from typing import Any

from optuna_ds.domain import ZERO_KEY


@functools.cache
def zero_int_keys() -> frozenset[str]:
    """The ``zero_optimization`` keys DeepSpeed's config model types as ``int``, by name and alias."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    keys = set()
    for name, field in DeepSpeedZeroConfig.model_fields.items():
        if field.annotation is int:
            keys.add(name)
            if field.alias:
                keys.add(field.alias)
    return frozenset(keys)


def with_integer_sizes(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` whose integer ZeRO sizes are written as integers.

    JSON reads ``5e8`` as ``500000000.0``; DeepSpeed accepts it, but a config written back with
    ``500000000.0`` reads as if it were fractional and does not round-trip into a script that
    parses it as an int.
    """
    zero = config.get(ZERO_KEY)
    if not isinstance(zero, dict):
        return config
    out = copy.copy(config)
    out[ZERO_KEY] = {
        k: int(v) if k in zero_int_keys() and isinstance(v, float) and v.is_integer() else v for k, v in zero.items()
    }
    return out
