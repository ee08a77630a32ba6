"""A config, the thing a tuning compares: what every layer means by "the same experiment"."""
from __future__ import annotations

import dataclasses
import enum
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
# Activation checkpointing, a dimension of its own (not a ZeRO knob): the script's switch, named
# as Hugging Face's Trainer names it (the ``arg_mappings`` key that maps it to a script flag), and
# the ``activation_checkpointing`` section DeepSpeed's own checkpointing API reads (a knob
# ``activation_checkpointing.<key>``).
CHECKPOINTING_SWITCH = "gradient_checkpointing"
CHECKPOINTING_SECTION = "activation_checkpointing"
# AutoTP, a dimension of its own: DeepSpeed's ``tensor_parallel.autotp_size``, the ranks each
# layer is split over (1: off).
AUTOTP_SECTION = "tensor_parallel"
AUTOTP_KNOB = "tensor_parallel.autotp_size"


def is_checkpointing(knob: str) -> bool:
    """Whether ``knob`` is an activation-checkpointing setting rather than a ZeRO knob."""
    return knob == CHECKPOINTING_SWITCH or knob.startswith(CHECKPOINTING_SECTION + ".")


class Offload(str, enum.Enum):
    """The offload variant the planner added to a config, by the label its experiment's name
    carries (``space.OFFLOAD_VARIANTS`` has its sections): none, the optimizer, or both the
    optimizer and the parameters (stage 3). Falsy for none."""

    NONE = ""
    OPTIMIZER = "offload-opt"
    OPTIMIZER_AND_PARAMS = "offload-opt-param"

    # Its label in every respect, on every Python: equal, hashed, printed and stored alike, so a
    # label read from a stored trial or written in a name is its variant.
    __hash__ = str.__hash__
    __str__ = str.__str__

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


def knob_value(value: Any) -> Any:
    """A knob value in its one form: a whole number is the ``int`` DeepSpeed reads (its config
    types every ZeRO size as an int, and JSON reads ``5e8`` as ``500000000.0``), so ``5e8`` and
    ``500000000`` are one value to the planner, the names and the records, as they are to
    DeepSpeed; anything else as given."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class Knobs(tuple[tuple[str, Any], ...]):
    """ZeRO knobs set, as ``(name, value)`` pairs sorted by name, each value in its one form
    (:func:`knob_value`): built from a mapping or pairs, the one place knob settings are made
    comparable, so equal settings are equal and hash alike whatever order and notation they
    came in."""

    __slots__ = ()

    def __new__(cls, knobs: KnobsLike = ()) -> Knobs:
        if isinstance(knobs, Knobs):
            return knobs
        items = knobs.items() if isinstance(knobs, Mapping) else knobs
        return super().__new__(cls, sorted(((str(k), knob_value(v)) for k, v in items), key=lambda kv: kv[0]))

    def as_dict(self) -> dict[str, Any]:
        return dict(self)

    @property
    def checkpointing(self) -> Knobs:
        """The activation-checkpointing settings among them (:func:`is_checkpointing`)."""
        return Knobs(kv for kv in self if is_checkpointing(kv[0]))

    @property
    def autotp(self) -> int:
        """The AutoTP size they set (1: none, AutoTP off)."""
        return max(1, int(dict(self).get(AUTOTP_KNOB) or 1))

    @property
    def room(self) -> Knobs:
        """The settings among them that change what a sample or the model states take of a GPU
        (activation checkpointing, AutoTP): what the planner's memory model reads."""
        return Knobs(kv for kv in self if is_checkpointing(kv[0]) or kv[0] == AUTOTP_KNOB)

    @property
    def zero(self) -> Knobs:
        """The ZeRO knobs among them: the rest."""
        return Knobs(kv for kv in self if not is_checkpointing(kv[0]) and kv[0] != AUTOTP_KNOB)


KnobsLike = Knobs | Mapping[str, Any] | Iterable[tuple[str, Any]]

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


def _exact(value: Any, short: str) -> bool:
    """Whether ``short`` (:func:`_format_value`'s) reads back as ``value``: two significant
    digits write 1000000 and 1048576 alike."""
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, (int, float)):
        try:
            return float(short) == value
        except ValueError:
            return False
    return short == str(value)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]


def _experiment_name(*, stage: int, mbs: int, gas: int, knobs: Knobs) -> str:
    """DeepSpeed-style experiment name: ``z1_gas1_tmbspg3``, then the tuned knobs by acronym.

    The name is one safe path component: characters a key or value could use to leave the
    results folder (``/``, ``..`` as a component, NUL) are replaced, and where that, the
    acronyms or a value's short form (``1e6`` for 1048576) would merge two configs, or the name
    grows too long, a digest of the exact knobs keeps it an identity.
    """
    labels = {key: _abbreviate(key) for key, _ in knobs}
    if len(set(labels.values())) < len(labels):
        labels = {key: key for key, _ in knobs}  # acronyms collide: the full keys
    name = f"z{stage}_gas{gas}_tmbspg{mbs}"
    exact = name
    for key, value in knobs:
        short = _format_value(value)
        part = f"_{labels[key]}{short}"
        exact += part if _exact(value, short) else f"_{labels[key]}={value!r}"
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


# The user attrs a trial stores its config under (:meth:`Config.to_attrs`): stored tunings, the
# report and optuna-dashboard read them, so they never change.
_STAGE, _MBS, _GAS, _OFFLOAD, _KNOBS = "stage", "micro_batch_size", "gradient_accumulation_steps", "offload", "knobs"


@dataclasses.dataclass(frozen=True, init=False)
class Config:
    """One config of a tuning: a ZeRO stage, the offload variant the planner added, the
    micro-batch size, the gradient accumulation and the ZeRO knobs set (none for DeepSpeed's
    defaults). The planner proposes it, the builder makes it a DeepSpeed config, the record
    stores it (:meth:`to_attrs`), the report shows it.

    Equal configs are the same experiment: the trials that ran it are its runs, a claim is on
    it. The knobs may be given as a mapping and the offload as its label or ``None``: this is
    the one place they are normalised, to :class:`Knobs` and :class:`Offload`, the sizes to
    ``int``; so a config is hashable, and equal configs are equal whatever order and notation
    their knobs came in. Its :attr:`name` is a label of that identity, never a key of it.
    """

    stage: int
    micro_batch: int
    offload: Offload
    accumulation: int
    knobs: Knobs

    def __init__(self, *, stage: int, micro_batch: int, offload: Offload | str | None = Offload.NONE, accumulation: int = 1,
                 knobs: KnobsLike = ()) -> None:
        object.__setattr__(self, "stage", int(stage))
        object.__setattr__(self, "micro_batch", int(micro_batch))
        object.__setattr__(self, "offload", Offload(offload or ""))
        object.__setattr__(self, "accumulation", int(accumulation))
        object.__setattr__(self, "knobs", Knobs(knobs))

    @property
    def arm(self) -> tuple[int, str]:
        """The stage and offload variant: the planner's throughput curve it lies on."""
        return (self.stage, self.offload)

    @property
    def knob_dict(self) -> dict[str, Any]:
        return self.knobs.as_dict()

    @property
    def name(self) -> str:
        """Its experiment's name, DeepSpeed-style: ``z1_gas1_tmbspg3``, the knobs by acronym,
        then the offload label. One safe path component that identifies the config's exact
        values (a digest where the short form is not exact). Stored tunings are matched by it:
        it never changes."""
        name = _experiment_name(stage=self.stage, mbs=self.micro_batch, gas=self.accumulation, knobs=self.knobs)
        return name + (f"_{self.offload}" if self.offload else "")

    def to_attrs(self) -> dict[str, Any]:
        """The config as a trial's user attrs (and an experiment's ``exp.json``) store it: the
        one serialiser; the offload and the knobs only where set."""
        attrs: dict[str, Any] = {_STAGE: self.stage, _MBS: self.micro_batch, _GAS: self.accumulation}
        if self.offload:
            attrs[_OFFLOAD] = self.offload.value
        if self.knobs:
            attrs[_KNOBS] = self.knob_dict
        return attrs

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> Config | None:
        """The config :meth:`to_attrs` stored in ``attrs``; ``None`` where they hold none (a
        trial before its claim)."""
        mbs = attrs.get(_MBS)
        stage = attrs.get(_STAGE)
        if mbs is None or stage is None:
            return None
        return cls(stage=int(stage), micro_batch=int(mbs), offload=attrs.get(_OFFLOAD),
                   accumulation=int(attrs.get(_GAS) or 1), knobs=attrs.get(_KNOBS, {}))

    def run_name(self, repeat: int = 0) -> str:
        """The name of its run that follows ``repeat`` earlier ones: a re-measurement has one of
        its own, so that it claims its own trial and folder."""
        return self.name + (f"_r{repeat}" if repeat else "")
