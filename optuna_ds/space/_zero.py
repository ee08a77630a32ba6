from __future__ import annotations

import copy
import dataclasses
from typing import Any

from optuna_ds._errors import ConfigError

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
        space["stage3_prefetch_bucket_size"] = _unique([0.9 * hs2, 5e7, 5e8])
        space["stage3_param_persistence_threshold"] = _unique(
            [float(10 * hidden_size) if hidden_size else 1e5, 1e6]
        )
        space["stage3_max_live_parameters"] = [1e9, 3e9]
    return space


# DeepSpeed's defaults for the knobs a config leaves out (stage 3 overlaps communication by default).
KNOB_DEFAULTS: dict[str, Any] = {
    "overlap_comm": False,
    "reduce_scatter": True,
    "reduce_bucket_size": 5e8,
    "allgather_bucket_size": 5e8,
    "allgather_partitions": True,
    "contiguous_gradients": True,
}
# What DeepSpeed's ZeRO documentation recommends for ZeRO-2 and ZeRO-3 runs.
KNOB_RECOMMENDED: dict[str, Any] = {**KNOB_DEFAULTS, "overlap_comm": True}


def recommended_knobs(space: KnobSpace) -> dict[str, Any] | None:
    """The tuned knobs set as DeepSpeed recommends, the first knob experiment of a stage; ``None``
    where that is the stage's default config, which its micro-batch search already ran."""
    return _setting(space, KNOB_RECOMMENDED)


def transferred_knobs(space: KnobSpace, values: dict[str, Any]) -> dict[str, Any] | None:
    """Another arm's best knob ``values`` where ``space`` tunes and offers them, the defaults
    elsewhere: knob effects mostly carry over between stages that read the same knob. ``None``
    where that is the stage's default config."""
    return _setting(space, values)


# Knobs that size a buffer DeepSpeed allocates (buckets; the parameters stage 3 keeps live or
# persistent): their smallest values need least memory.
_BUFFER_SIZES = frozenset({"reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                           "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_param_persistence_threshold"})
# Switches whose off position allocates less: overlap's extra buckets, the contiguous gradient buffer.
_BUFFER_SWITCHES = frozenset({"overlap_comm", "contiguous_gradients"})


def leanest_knobs(space: KnobSpace) -> dict[str, Any] | None:
    """The setting of ``space`` that needs least memory: the smallest buffers, no overlap buckets,
    no contiguous gradient buffer, the defaults elsewhere; ``None`` where that is the default
    config. Where the default config ran out of memory at a size, the one setting worth trying
    there."""
    preferred: dict[str, Any] = {}
    for key, choices in space.tuned.items():
        sizes = [c for c in choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
        if key in _BUFFER_SIZES and sizes:
            preferred[key] = min(sizes)
        elif key in _BUFFER_SWITCHES and False in choices:
            preferred[key] = False
    return _setting(space, preferred)


def _setting(space: KnobSpace, preferred: dict[str, Any]) -> dict[str, Any] | None:
    defaults = {**KNOB_DEFAULTS, "overlap_comm": space.stage == 3}
    knobs: dict[str, Any] = {}
    differs = False
    for key, choices in space.tuned.items():
        value = preferred.get(key)
        if value not in choices:
            value = defaults.get(key) if defaults.get(key) in choices else choices[0]
        knobs[key] = value
        differs |= key not in defaults or value != defaults[key]
    return knobs if differs else None


def _unique(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
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
    is tuned but the micro-batch size, so lists collapse to DeepSpeed's defaults.
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
            fixed[key] = copy.deepcopy(value)
    return KnobSpace(stage=stage, tuned=tuned, fixed=fixed)
