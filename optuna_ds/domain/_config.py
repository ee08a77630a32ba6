"""A config, the thing a tuning compares: what every layer means by "the same experiment"."""
from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

# DeepSpeed's keys for what a config sets; the first two are also its trials' Optuna params.
MBS_KEY = "train_micro_batch_size_per_gpu"
GAS_KEY = "gradient_accumulation_steps"
TBS_KEY = "train_batch_size"
ZERO_KEY = "zero_optimization"

Knobs = tuple[tuple[str, Any], ...]  # ZeRO knobs by name, sorted

# A name is one path component made of these characters, whatever the config's keys and values.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")
_MAX_NAME = 200  # file systems allow 255 bytes a component; room for ".json" and ".tmp"


def _safe(text: str) -> str:
    return _UNSAFE.sub("-", text)


def _abbreviate(key: str) -> str:
    return "".join(word[0] for word in key.split("_") if word)


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "T" if value else "F"
    if isinstance(value, (int, float)) and 10000 <= abs(value) < 1e300:  # also not inf, nan or a 400-digit int
        mantissa, exponent = f"{float(value):.1e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).replace(" ", "")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]


def _experiment_name(*, stage: int, mbs: int, gas: int, knobs: Mapping[str, Any]) -> str:
    """DeepSpeed-style experiment name: ``z1_gas1_tmbspg3``, then the tuned knobs by acronym.

    The name is one safe path component: characters a key or value could use to leave the
    results folder (``/``, ``..`` as a component, NUL) are replaced, and where that or the
    acronyms would merge two configs, or the name grows too long, a digest of the exact knobs
    keeps it an identity.
    """
    labels = {key: _abbreviate(key) for key in knobs}
    if len(set(labels.values())) < len(labels):
        labels = {key: key for key in knobs}  # acronyms collide: the full keys
    name = f"z{stage}_gas{gas}_tmbspg{mbs}"
    exact = name
    for key in sorted(knobs):
        part = f"_{labels[key]}{_format_value(knobs[key])}"
        exact += part
        name += _safe(part)
    if name != exact or len(name) > _MAX_NAME:
        name = f"{name[:_MAX_NAME - 11]}_{_digest(exact)}"
    return name


def accumulation_for(micro_batch: int, *, max_batch: int | None = None, min_batch: int = 1, default: int = 1) -> int:
    """The gradient accumulation of a size: as much as ``max_batch`` (the bound on
    ``micro_batch * accumulation`` of one data-parallel rank) allows, else ``default`` (the
    user's); and at least enough for ``min_batch`` (the floor). Where no accumulation fits both
    bounds at this size, the floor wins: a global batch below it is one the user said the
    training cannot use, while one above the bound exceeds it by less than a micro-batch."""
    gas = default if max_batch is None else max_batch // micro_batch
    return max(1, gas, -(-min_batch // micro_batch))


KnobsLike = Knobs | Mapping[str, Any] | Iterable[tuple[str, Any]]


@dataclasses.dataclass(frozen=True, init=False)
class Config:
    """One config of a tuning: a ZeRO stage, the offload variant the planner added (by its
    label, ``""`` for none), the micro-batch size, the gradient accumulation and the ZeRO knobs
    set (none for DeepSpeed's defaults). The planner proposes it, the builder makes it a
    DeepSpeed config, the record stores it, the report shows it.

    Equal configs are the same experiment (:attr:`key`). The knobs may be given as a mapping
    and the offload as ``None``: this is the one place they are normalised, to a sorted tuple of
    pairs (:attr:`knob_dict` is the mapping) and ``""``, the sizes to ``int``; so a config is
    hashable, and equal configs are equal whatever order their knobs came in.
    """

    stage: int
    micro_batch: int
    offload: str
    accumulation: int
    knobs: Knobs

    def __init__(self, *, stage: int, micro_batch: int, offload: str | None = "", accumulation: int = 1,
                 knobs: KnobsLike = ()) -> None:
        items = knobs.items() if isinstance(knobs, Mapping) else knobs
        object.__setattr__(self, "stage", int(stage))
        object.__setattr__(self, "micro_batch", int(micro_batch))
        object.__setattr__(self, "offload", offload or "")
        object.__setattr__(self, "accumulation", int(accumulation))
        object.__setattr__(self, "knobs", tuple(sorted((str(k), v) for k, v in items)))

    @property
    def key(self) -> tuple[int, str, int, int, Knobs]:
        """The config's identity: the trials that ran it are its runs, a claim is on it (and on
        how many times it ran before: :meth:`run_name`)."""
        return (self.stage, self.offload, self.micro_batch, self.accumulation, self.knobs)

    @property
    def arm(self) -> tuple[int, str]:
        """The stage and offload variant: the planner's throughput curve it lies on."""
        return (self.stage, self.offload)

    @property
    def knob_dict(self) -> dict[str, Any]:
        return dict(self.knobs)

    @property
    def name(self) -> str:
        """Its experiment's name, DeepSpeed-style: ``z1_gas1_tmbspg3``, the knobs by acronym,
        then the offload label. One safe path component, and an identity: same name, same
        config. Stored tunings are matched by it: it never changes."""
        name = _experiment_name(stage=self.stage, mbs=self.micro_batch, gas=self.accumulation, knobs=self.knob_dict)
        return name + (f"_{self.offload}" if self.offload else "")

    def run_name(self, repeat: int = 0) -> str:
        """The name of its run that follows ``repeat`` earlier ones: a re-measurement has one of
        its own, so that it claims its own trial and folder."""
        return self.name + (f"_r{repeat}" if repeat else "")
