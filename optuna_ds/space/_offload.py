from __future__ import annotations

import copy
from typing import Any

OFFLOAD_KEYS = ("offload_optimizer", "offload_param")
# The offload variants tried at stage 3, cheapest first, by the label their experiments carry.
OFFLOAD_VARIANTS: dict[str, dict[str, Any]] = {
    "offload-opt": {"offload_optimizer": {"device": "cpu", "pin_memory": True}},
    "offload-opt-param": {
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
