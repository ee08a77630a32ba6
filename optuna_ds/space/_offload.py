from __future__ import annotations

import copy
from typing import Any

from optuna_ds.domain import Offload

OFFLOAD_KEYS = ("offload_optimizer", "offload_param")
# The offload variants tried at stage 3, cheapest first, by their label (:class:`Offload`).
OFFLOAD_VARIANTS: dict[str, dict[str, Any]] = {
    Offload.OPTIMIZER: {"offload_optimizer": {"device": "cpu", "pin_memory": True}},
    Offload.OPTIMIZER_AND_PARAMS: {
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
    },
}


def user_offloads(zero: dict[str, Any]) -> bool:
    """The user's config has offload sections of its own: they are kept as they are, and no
    other offload is tried."""
    return any(key in zero for key in OFFLOAD_KEYS)


def offload_sections(label: str) -> dict[str, Any]:
    return copy.deepcopy(OFFLOAD_VARIANTS[label])
