from __future__ import annotations

import copy
import dataclasses
from typing import Any

from optuna_ds._errors import ConfigError
from optuna_ds.domain import knob_value

# Knobs that only stage 3 reads; tuning them at lower stages would spend experiments on nothing.
STAGE3_ONLY = frozenset(
    {
        "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "sub_group_size",
        "offload_param",
    }
)
# Knobs DeepSpeed's stage-3 space tunes although stage 3 ignores them.
NOT_STAGE3 = frozenset({"allgather_partitions", "allgather_bucket_size", "reduce_scatter"})
_SCALAR_TYPES = (bool, int, float, str, type(None))


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
    defaults (those it has)."""
    defaults = {**KNOB_DEFAULTS, "overlap_comm": space.stage == 3}
    return {k: knob_value(defaults[k]) for k in space.tuned if k in defaults}


def _unique(values: list[Any]) -> list[Any]:
    """``values`` in their one form (:func:`knob_value`: ``5e8`` is ``500000000``), each once."""
    out: list[Any] = []
    for v in map(knob_value, values):
        if v not in out:
            out.append(v)
    return out


@dataclasses.dataclass(frozen=True)
class KnobSpace:
    """The ZeRO knobs of one stage: the tuned ones with their choices, the fixed ones with a value.

    Fixed knobs include every scalar and sub-section (offload...) of the user's
    ``zero_optimization``, so the user's settings reach every experiment.
    """

    stage: int
    tuned: dict[str, list[Any]]
    fixed: dict[str, Any]
    offload: str = ""  # the offload variant we added (its label), "" for none

    @property
    def size(self) -> int:
        n = 1
        for choices in self.tuned.values():
            n *= len(choices)
        return n

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "tuned": self.tuned, "fixed": self.fixed, "offload": self.offload}

    def with_offload(self, label: str) -> KnobSpace:
        """This space with the offload variant ``label`` fixed in every experiment."""
        from optuna_ds.space._offload import offload_sections

        return dataclasses.replace(self, fixed={**self.fixed, **offload_sections(label)}, offload=label)


def build_knob_space(
    stage: int, user_zero: dict[str, Any], *, fast: bool, hidden_size: int | None = None
) -> KnobSpace:
    """Merge DeepSpeed's default space of ``stage`` with the user's ``zero_optimization``.

    A user value fixes a knob; a user list tunes it with those values. In fast mode nothing
    is tuned but the micro-batch size, so lists collapse to DeepSpeed's defaults. Numbers are
    read here in their one form (:func:`~optuna_ds.domain.knob_value`), once: ``[5e8, 500000000]``
    is one value.
    """
    tuned = {} if fast else default_tuning_space(stage, hidden_size=hidden_size)
    fixed: dict[str, Any] = {}
    for key, value in user_zero.items():
        if key == "stage":
            continue
        if stage != 3 and key in STAGE3_ONLY:
            continue
        if isinstance(value, list):
            if not value:
                raise ConfigError(f"zero_optimization.{key} must not be an empty list")
            for v in value:
                if not isinstance(v, _SCALAR_TYPES):
                    raise ConfigError(f"zero_optimization.{key} lists must hold plain values, got {v!r}")
            if fast:
                tuned.pop(key, None)
                continue
            choices = _unique(value)
            if len(choices) == 1:
                tuned.pop(key, None)
                fixed[key] = choices[0]
            else:
                tuned[key] = choices
        else:
            tuned.pop(key, None)
            fixed[key] = knob_value(copy.deepcopy(value))
    return KnobSpace(stage=stage, tuned=tuned, fixed=fixed)
