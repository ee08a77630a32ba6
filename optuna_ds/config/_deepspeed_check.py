from __future__ import annotations

import contextlib
import copy
import difflib
import itertools
import logging
import os
import typing
from collections.abc import Iterator
from typing import Any

from optuna_ds._errors import ConfigError
from optuna_ds.config._integers import with_integer_sizes
from optuna_ds.config._user_config import UserConfig
from optuna_ds.domain import AUTOTP_SECTION
from optuna_ds.domain import CHECKPOINTING_SECTION
from optuna_ds.domain import GAS_KEY
from optuna_ds.domain import MBS_KEY
from optuna_ds.domain import TBS_KEY
from optuna_ds.domain import ZERO_KEY


def check_with_deepspeed(user: UserConfig) -> None:
    """Give every config the tuning could launch to DeepSpeed's own config parser
    (``DeepSpeedConfig``: its pydantic models for ZeRO, fp16/bf16, monitors... and its
    assertions), and raise :class:`ConfigError` naming the key it rejects.

    DeepSpeed parses the config only once the engine starts, in every experiment: a typo such
    as ``overlap_com`` would otherwise fail every one of them, after minutes each. Each stage
    is checked with every value of every tuned ``zero_optimization`` list (the other lists at
    their first value), so a bad value in a list is found although the search might never
    reach it.
    """
    from deepspeed.runtime.config import DeepSpeedConfig
    from pydantic import ValidationError

    name = os.path.basename(user.path)
    read: set[str] = set()
    with _quiet_deepspeed():
        for config, stage, value in _candidates(user):
            try:
                DeepSpeedConfig(_Reads(config, read=read))
            except ValidationError as e:
                # The message names the key and its value; a check of the whole section (a
                # validator's assertion) names neither: then the tuned value is said.
                why = _describe(e, config)
                tuned = value if value.removeprefix(" with ") not in why else ""
                raise ConfigError(f"{name}{stage}{tuned}: {why}") from None
            except Exception as e:  # noqa: BLE001 - DeepSpeed asserts and indexes: any error is its verdict
                raise ConfigError(f"{name}{stage}{value}: DeepSpeed rejects the config: {type(e).__name__}: {e}") from None
    _check_top_level(user, read=read, name=name)
    _check_checkpointing(user, name=name)


def _check_checkpointing(user: UserConfig, *, name: str) -> None:
    """Every value listed in ``activation_checkpointing`` must run in some setting of the
    section: DeepSpeed's ``deepspeed.checkpointing.configure()`` asserts that contiguous
    checkpoints have partitioned activations and ``number_checkpoints`` (its config model,
    ``get_scalar_param``, takes any value; the script's ``configure()`` call would fail in every
    experiment that sets it)."""
    section = user.raw.get(CHECKPOINTING_SECTION)
    if not isinstance(section, dict):
        return
    lists = {k: v for k, v in section.items() if isinstance(v, list)}
    fixed = {k: v for k, v in section.items() if not isinstance(v, list)}
    lists = {k: _once(v) for k, v in lists.items()}
    combos = (dict(zip(lists, c)) for c in itertools.product(*lists.values()))
    runs = [combo for combo in combos if _checkpoints_configure({**fixed, **combo})]
    for key, values in lists.items():
        for value in values:
            if not any(combo[key] == value for combo in runs):
                raise ConfigError(f"{name} with {CHECKPOINTING_SECTION}.{key} = {value!r}: DeepSpeed's checkpointing refuses it "
                                  "in every setting: contiguous_memory_optimization needs partition_activations true and "
                                  "number_checkpoints set")
    if not lists and not _checkpoints_configure(fixed):
        raise ConfigError(f"{name}: DeepSpeed's checkpointing refuses {CHECKPOINTING_SECTION}: contiguous_memory_optimization "
                          "needs partition_activations true and number_checkpoints set")


def _checkpoints_configure(section: dict[str, Any]) -> bool:
    """Whether ``deepspeed.checkpointing.configure()`` accepts the section (its two asserts)."""
    if section.get("contiguous_memory_optimization") is True:
        return section.get("partition_activations") is True and section.get("number_checkpoints") is not None
    return True


def _check_top_level(user: UserConfig, *, read: set[str], name: str) -> None:
    """Refuse a top-level key DeepSpeed never looked up while parsing the config: DeepSpeed
    ignores it without a word, so ``train_micro_batch_size_per_gp`` would spend a whole tuning
    on its default instead of failing."""
    known = read | {"autotuning"}
    for key in user.raw:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else " (it would ignore it): remove it"
            raise ConfigError(f"{name}: DeepSpeed does not know {key}{hint}")


class _Reads(dict[str, Any]):
    """A config that records the top-level keys looked up in it (``get``, ``[]``, ``in``, also
    on ``keys()``), through the shallow copy ``DeepSpeedConfig`` parses."""

    def __init__(self, items: dict[str, Any], *, read: set[str]) -> None:
        super().__init__(items)
        self.read = read

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(key)  # type: ignore[arg-type]
        return super().__contains__(key)

    def keys(self) -> Any:
        return _KeysRead(self)

    def __copy__(self) -> _Reads:
        return _Reads(self, read=self.read)


class _KeysRead:
    """``config.keys()`` whose ``in`` is recorded as a look-up."""

    def __init__(self, config: _Reads) -> None:
        self._config = config

    def __contains__(self, key: object) -> bool:
        return key in self._config

    def __iter__(self) -> Iterator[str]:
        return iter(dict.keys(self._config))

    def __len__(self) -> int:
        return len(self._config)


def _candidates(user: UserConfig) -> Iterator[tuple[dict[str, Any], str, str]]:
    """The configs to check, each with its stage and tuned value as the message says them."""
    base = _without_auto(copy.deepcopy(user.raw))
    base.pop("autotuning", None)  # checked by our own model; DeepSpeed's autotuner reads it differently
    mbs = user.micro_batch_sizes[0] if user.micro_batch_sizes else user.min_micro_batch_size
    gas = user.gradient_accumulation_steps
    # DeepSpeed checks them against its world size (1 here); check_gpus checks the real one.
    base.update({MBS_KEY: mbs, GAS_KEY: gas, TBS_KEY: mbs * gas})
    if isinstance(base.get(CHECKPOINTING_SECTION), dict):
        base[CHECKPOINTING_SECTION] = {k: v[0] if isinstance(v, list) and v else v for k, v in base[CHECKPOINTING_SECTION].items()}
    zero = base.get(ZERO_KEY) if isinstance(base.get(ZERO_KEY), dict) else {}
    lists = dict(_zero_lists(zero))
    first = {k: v[0] for k, v in lists.items()}
    variants = [({}, "")] + [({k: v}, f" with {ZERO_KEY}.{'.'.join(k)} = {v!r}") for k, vs in lists.items() for v in vs[1:]]
    # The activation_checkpointing section's lists: each value through DeepSpeed's parser too.
    section = base.get(CHECKPOINTING_SECTION)  # each list at its first value
    mine = user.raw.get(CHECKPOINTING_SECTION)
    listed = ({k: _once(v) for k, v in mine.items() if isinstance(v, list) and v}
              if isinstance(mine, dict) else {})
    checkpointing = [({k: v}, f" with {CHECKPOINTING_SECTION}.{k} = {v!r}") for k, vs in listed.items() for v in vs[1:]]
    # The tensor_parallel section's AutoTP sizes: each listed one through DeepSpeed's model too.
    tp = base.get(AUTOTP_SECTION)
    sizes = tp.get("autotp_size") if isinstance(tp, dict) else None
    autotp: list[tuple[dict[str, Any], str]] = []
    if isinstance(sizes, list) and sizes:
        base[AUTOTP_SECTION] = {**tp, "autotp_size": sizes[0]}
        autotp = [({**tp, "autotp_size": v}, f" with {AUTOTP_SECTION}.autotp_size = {v!r}")
                  for v in _once(sizes)[1:]]
    for stage in user.stages:
        at = f" at ZeRO stage {stage}" if len(user.stages) > 1 else ""
        for change, value in variants:
            config = {**base, ZERO_KEY: {**_setting(zero, {**first, **change}), "stage": stage}}
            yield with_integer_sizes(config), at, value
        for change, value in checkpointing:
            config = {**base, ZERO_KEY: {**_setting(zero, first), "stage": stage}, CHECKPOINTING_SECTION: {**section, **change}}
            yield with_integer_sizes(config), at, value
        for tp_section, value in autotp:
            config = {**base, ZERO_KEY: {**_setting(zero, first), "stage": stage}, AUTOTP_SECTION: tp_section}
            yield with_integer_sizes(config), at, value


# The sections of ``zero_optimization`` whose keys may hold lists too; their ``device`` is no
# dimension (the offload variants are the tuning's), so a list there is DeepSpeed's to refuse.
_LISTING_SECTIONS = ("offload_optimizer", "offload_param")


def _zero_lists(zero: dict[str, Any]) -> Iterator[tuple[tuple[str, ...], list[Any]]]:
    """The non-empty lists of a ``zero_optimization`` section, each with its key path: the
    values the tuning may give the key (the space decides which it tunes where)."""
    for key, value in zero.items():
        if key != "stage" and isinstance(value, list) and value:
            yield (key,), _once(value)
        elif key in _LISTING_SECTIONS and isinstance(value, dict):
            for sub, v in value.items():
                if sub != "device" and isinstance(v, list) and v:
                    yield (key, sub), _once(v)


def _once(values: list[Any]) -> list[Any]:
    """``values`` each once, in their order (``1`` and ``true`` are two values: DeepSpeed may
    take one and refuse the other)."""
    try:
        return [v for _, v in dict.fromkeys((type(v), v) for v in values)]
    except TypeError:  # an object or a list in the list: DeepSpeed's to refuse, as listed
        return values


def _setting(zero: dict[str, Any], values: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    """``zero`` with the value at each path of ``values``: a copy of the sections on those paths
    only (``base`` is a copy of the user's config already, and DeepSpeed's parser changes
    nothing in it), so a setting costs its paths, not the whole section."""
    out = dict(zero)
    for path, value in values.items():
        section = out
        for key in path[:-1]:
            section[key] = dict(section[key])
            section = section[key]
        section[path[-1]] = value
    return out


def _without_auto(value: Any) -> Any:
    """``value`` without the ``"auto"`` entries that the Hugging Face Trainer fills in before
    DeepSpeed reads the config (DeepSpeed's models drop them too): they take DeepSpeed's defaults."""
    if isinstance(value, dict):
        return {k: _without_auto(v) for k, v in value.items() if v != "auto"}
    return value


@contextlib.contextmanager
def _quiet_deepspeed() -> Iterator[None]:
    """DeepSpeed logs the parsed config and its deprecations at every parse: not for the user here."""
    from deepspeed.utils import logger

    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _describe(error: Any, config: dict[str, Any]) -> str:
    """The first problem of a pydantic ``ValidationError``, as the config's key path and what is wrong."""
    first = error.errors()[0]
    loc = tuple(str(p) for p in first["loc"])
    path = ".".join(_section_of(loc, config, error.title) + loc)
    if first["type"] == "extra_forbidden":
        return f"DeepSpeed does not know {path}{_suggest(loc, error.title)}"
    # A value, not a section (a validator of the whole section gets the parsed model as its input).
    shown = f" = {first['input']!r}" if isinstance(first.get("input"), (str, int, float, list, type(None))) else ""
    return f"DeepSpeed rejects {path}{shown}: {first['msg']}"


# The sections DeepSpeed's models parse, where a key such as "enabled" could be anyone's.
_SECTIONS = {"DeepSpeedZeroConfig": (ZERO_KEY,), "DeepSpeedFP16Config": ("fp16",), "DeepSpeedBF16Config": ("bf16", "bfloat16"),
             "TPTrainingConfig": (AUTOTP_SECTION,)}


def _section_of(loc: tuple[str, ...], config: dict[str, Any], title: str) -> tuple[str, ...]:
    """The top-level key whose section the model that failed parsed: the one holding ``loc``."""
    for key in _SECTIONS.get(title, ()):
        if key in config:
            return (key,)
    if loc and loc[0] in config:
        return ()
    for key, section in config.items():
        if isinstance(section, dict) and (not loc or loc[0] in section):
            return (key,)
    return (title,)


def _suggest(loc: tuple[str, ...], title: str) -> str:
    fields = _fields_at(title, loc[:-1])
    close = difflib.get_close_matches(loc[-1], sorted(fields), n=1, cutoff=0.6) if loc else []
    return f"; did you mean '{close[0]}'?" if close else ""


def _fields_at(title: str, path: tuple[str, ...]) -> set[str]:
    """The keys (names and aliases) the DeepSpeed model named ``title`` accepts at ``path``."""
    from pydantic import BaseModel

    model = _models().get(title)
    for key in path:
        if model is None:
            return set()
        field = model.model_fields.get(key) or next((f for f in model.model_fields.values() if f.alias == key), None)
        if field is None:
            return set()
        candidates = [field.annotation, *typing.get_args(field.annotation)]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    if model is None:
        return set()
    return {n for name, f in model.model_fields.items() for n in (name, f.alias) if n}


def _models() -> dict[str, type]:
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel

    found: dict[str, type] = {}
    todo = [DeepSpeedConfigModel]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.__name__, cls)
        todo.extend(cls.__subclasses__())
    return found
