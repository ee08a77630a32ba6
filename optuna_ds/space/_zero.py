from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from optuna_ds._errors import ConfigError
from optuna_ds.domain import knob_value
from optuna_ds.space._checkpointing import checkpointing_defaults
from optuna_ds.space._levers import OFFLOAD_DEVICE
from optuna_ds.space._levers import ZEROPP
from optuna_ds.space._levers import ZEROPP_STORED
from optuna_ds.space._levers import applies
from optuna_ds.space._levers import deepspeed_default
from optuna_ds.space._levers import is_superchip
from optuna_ds.space._levers import offload_space
from optuna_ds.space._levers import zeropp_space
from optuna_ds.space._offload import OFFLOAD_KEYS
from optuna_ds.space._offload import offload_sections
from optuna_ds.space._offload import user_offloads

# Knobs that only stage 3 reads; tuning them at lower stages would spend experiments on nothing.
STAGE3_ONLY = frozenset(
    {
        "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "sub_group_size",
        "offload_param",
        *ZEROPP,
        ZEROPP_STORED,
    }
)
# Knobs DeepSpeed's stage-3 space tunes although stage 3 ignores them.
NOT_STAGE3 = frozenset({"allgather_partitions", "allgather_bucket_size", "reduce_scatter"})
_SCALAR_TYPES = (bool, int, float, str, type(None))
# The most settings a stage's knob space may hold (its offload variants' included): the
# model-based sampler scores every one at each decision (half a second for 16,000 on a busy
# node). DeepSpeed's own spaces hold at most 144; ZeRO++ over nodes and SuperOffload make 2,304.
MAX_SETTINGS = 16_384


def default_tuning_space(stage: int, *, hidden_size: int | None = None) -> dict[str, list[Any]]:
    """The knobs to tune at ``stage``: DeepSpeed's ``DEFAULT_TUNING_SPACE_ZERO_<stage>``.

    Stage 3 is corrected: the knobs stage 3 ignores are dropped and its own prefetch,
    persistence and live-parameter knobs are tuned, sized by the hidden size when known
    (as DeepSpeed's stage-3 template does).
    """
    from deepspeed.autotuning import constants

    spaces = {
        0: constants.DEFAULT_TUNING_SPACE_ZERO_0,
        1: constants.DEFAULT_TUNING_SPACE_ZERO_1,
        2: constants.DEFAULT_TUNING_SPACE_ZERO_2,
        3: constants.DEFAULT_TUNING_SPACE_ZERO_3,
    }
    zero = copy.deepcopy(spaces[stage]["zero_optimization"])
    zero.pop("stage", None)
    space = {k: list(v) for k, v in zero.items() if isinstance(v, list)}
    if stage == 3:
        for key in NOT_STAGE3:
            space.pop(key, None)
        hs2 = float(hidden_size * hidden_size) if hidden_size else 5e8
        # A whole number of elements: DeepSpeed's config model takes an int (0.9 x 1023² is not one).
        space["stage3_prefetch_bucket_size"] = _unique([float(round(0.9 * hs2)), 5e7, 5e8])
        space["stage3_param_persistence_threshold"] = _unique(
            [float(10 * hidden_size) if hidden_size else 1e5, 1e6]
        )
        space["stage3_max_live_parameters"] = [1e9, 3e9]
    return {k: _unique(v) for k, v in space.items()}


# DeepSpeed's defaults for the knobs a config leaves out (stage 3 overlaps communication by
# default): what a default config runs with, against which a knob setting is scored.
KNOB_DEFAULTS: dict[str, Any] = {
    "overlap_comm": False,
    "reduce_scatter": True,
    "reduce_bucket_size": 5e8,
    "allgather_bucket_size": 5e8,
    "allgather_partitions": True,
    "contiguous_gradients": True,
    "stage3_prefetch_bucket_size": 5e7,
    "stage3_param_persistence_threshold": 1e5,
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,
    "sub_group_size": 1e9,
}


def knob_defaults(space: KnobSpace) -> dict[str, Any]:
    """What a config of ``space``'s stage that leaves its tuned knobs out runs with: DeepSpeed's
    defaults (those it has; a dotted knob's from DeepSpeed's config models; a checkpointing
    setting's, off)."""
    defaults = {**KNOB_DEFAULTS, "overlap_comm": space.stage == 3, **checkpointing_defaults()}
    return {k: knob_value(defaults[k] if k in defaults else deepspeed_default(k)) for k in space.tuned
            if k in defaults or k.startswith(_LEVERS)}


# The knobs whose default :func:`knob_defaults` reads from DeepSpeed's models.
_LEVERS = (*ZEROPP, ZEROPP_STORED, *(f"{key}." for key in OFFLOAD_KEYS))


def _unique(values: list[Any]) -> list[Any]:
    """``values`` in their one form (:func:`knob_value`: ``5e8`` is ``500000000``), each once."""
    return list(dict.fromkeys(map(knob_value, values)))


@dataclasses.dataclass(frozen=True)
class KnobSpace:
    """The ZeRO knobs of one stage: the tuned ones with their choices, the fixed ones with a value.

    Fixed knobs include every scalar and sub-section (offload...) of the user's
    ``zero_optimization``, so the user's settings reach every experiment. A knob inside a
    section is named by its dotted path (``offload_optimizer.pin_memory``). ``offload_tuned``
    are the knobs of the offload variants the tuning adds (:meth:`with_offload`), tuned only
    where one is.
    """

    stage: int
    tuned: dict[str, list[Any]]
    fixed: dict[str, Any]
    offload: str = ""  # the offload variant we added (its label), "" for none
    offload_tuned: dict[str, list[Any]] = dataclasses.field(default_factory=dict)

    @property
    def size(self) -> int:
        n = 1
        for choices in self.tuned.values():
            n *= len(choices)
        return n

    @property
    def dimensions(self) -> dict[str, list[Any]]:
        """Every knob some config of the stage tunes, with or without an offload variant."""
        return {**self.tuned, **self.offload_tuned}

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "tuned": self.tuned, "fixed": self.fixed, "offload": self.offload,
                "offload_tuned": self.offload_tuned}

    def with_offload(self, label: str) -> KnobSpace:
        """This space with the offload variant ``label`` fixed in every experiment, and its
        knobs tuned; itself for ``""``."""
        if not label:
            return self
        sections = offload_sections(label)
        mine = {k: v for k, v in self.offload_tuned.items() if k.split(".")[0] in sections}
        return dataclasses.replace(self, tuned={**self.tuned, **mine}, fixed={**self.fixed, **sections}, offload=label,
                                   offload_tuned={})

    def zero_section(self, knobs: Mapping[str, Any]) -> dict[str, Any]:
        """The ``zero_optimization`` section (without its stage) of a config that sets
        ``knobs``: the fixed values, each knob in its place (a dotted one inside its section)."""
        zero = copy.deepcopy(self.fixed)
        for path, value in knobs.items():
            *sections, key = path.split(".")
            section = zero
            for name in sections:
                section = section.setdefault(name, {})
            section[key] = value
        return zero


def build_knob_space(
    stage: int, user_zero: dict[str, Any], *, fast: bool, hidden_size: int | None = None, ranks: int = 1, ranks_per_node: int = 1,
    superchip: bool | None = None,
) -> KnobSpace:
    """Merge DeepSpeed's default space of ``stage`` with the user's ``zero_optimization``.

    A user value fixes a knob; a user list tunes it with those values, also inside an offload
    section (``"pin_memory": [true, false]``; the config refuses one under ``device``: the
    offload variants are the planner's). In fast mode nothing is tuned but the micro-batch size, so lists collapse to
    DeepSpeed's defaults. Numbers are read here in their one form
    (:func:`~optuna_ds.domain.knob_value`), once: ``[5e8, 500000000]`` is one value.

    Beyond DeepSpeed's autotuner's space, ZeRO++ is proposed at stage 3 over ``ranks`` > 1
    data-parallel ranks (``ranks_per_node`` to a node) and SuperOffload with stage-3 optimizer
    offload on a ``superchip`` (detected where ``None``); see :mod:`optuna_ds.space._levers`.
    A list of a lever that cannot act there (ZeRO++ on one rank, qgZ on one node) tunes nothing.
    """
    superchip = is_superchip() if superchip is None and not fast and stage == 3 else bool(superchip)
    tuned = {} if fast else {**default_tuning_space(stage, hidden_size=hidden_size),
                             **zeropp_space(stage, ranks=ranks, ranks_per_node=ranks_per_node)}
    fixed: dict[str, Any] = {}

    def place(path: str, value: Any, section: dict[str, Any], *, acts: bool = True) -> None:
        """Tune or fix the knob at ``path`` (whose key is in ``section`` of ``fixed``); a list of
        one that cannot act (``acts`` false, or :func:`applies` says so) tunes nothing."""
        key = path.rsplit(".", 1)[-1]
        if not isinstance(value, list):
            tuned.pop(path, None)
            section[key] = knob_value(copy.deepcopy(value))
            return
        if not value:
            raise ConfigError(f"zero_optimization.{path} must not be an empty list")
        for v in value:
            if not isinstance(v, _SCALAR_TYPES):
                raise ConfigError(f"zero_optimization.{path} lists must hold plain values, got {v!r}")
        tuned.pop(path, None)
        if fast or not acts or not applies(path, stage=stage, ranks=ranks, ranks_per_node=ranks_per_node):
            return
        choices = _unique(value)
        if len(choices) == 1:
            section[key] = choices[0]
        else:
            tuned[path] = choices

    for key, value in user_zero.items():
        if key == "stage" or (stage != 3 and key in STAGE3_ONLY):
            continue
        if key in OFFLOAD_KEYS and isinstance(value, dict):
            fixed[key] = {}
            offloaded = value.get(OFFLOAD_DEVICE) in ("cpu", "nvme")  # a setting of no offload sets nothing
            for sub, v in value.items():
                place(f"{key}.{sub}", v, fixed[key], acts=offloaded)
            if not fast and key == "offload_optimizer":
                tuned.update(offload_space(stage, value, superchip=superchip))
        else:
            place(key, value, fixed)
    proposed = {} if fast or user_offloads(user_zero) else offload_space(stage, {OFFLOAD_DEVICE: "cpu"}, superchip=superchip)
    space = KnobSpace(stage=stage, tuned=tuned, fixed=fixed, offload_tuned=proposed)
    settings = space.size * math.prod(len(v) for v in proposed.values())
    if settings > MAX_SETTINGS:
        raise ConfigError(f"the lists of zero_optimization make {settings:,} knob settings at ZeRO "
                          f"stage {stage}, more than the {MAX_SETTINGS:,} a knob search chooses "
                          "from: list fewer values")
    return space
