"""Every value a user lists (``zero_optimization``'s knobs, micro-batch sizes), accounted for:
the ones no experiment ran with, each with its reason."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

from optuna.trial import FrozenTrial

from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import FailureReason
from optuna_ds.domain import knob_value
from optuna_ds.domain import launched
from optuna_ds.space import OFFLOAD_KEYS
from optuna_ds.space import STAGE3_ONLY
from optuna_ds.space import deepspeed_default
from optuna_ds.space import knob_defaults
from optuna_ds.space import KnobSpace


@dataclasses.dataclass(frozen=True)
class Unrun:
    """A value listed at ``path`` (dotted, from the config's top) that no experiment ran with,
    and why."""

    path: str
    value: Any
    reason: str

    @property
    def setting(self) -> str:
        text = (
            "true" if self.value is True else "false" if self.value is False else str(self.value)
        )
        return f"{self.path}={text}"


def listed(zero: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The lists of a ``zero_optimization`` section (without its stage), by dotted path, each
    value in its one form, once."""
    out: dict[str, list[Any]] = {}
    for key, value in zero.items():
        if key == "stage":
            continue
        items = value.items() if key in OFFLOAD_KEYS and isinstance(value, dict) else [("", value)]
        for sub, v in items:
            if isinstance(v, list):
                out[f"{key}.{sub}" if sub else key] = list(
                    dict.fromkeys(knob_value(x) for x in v if _hashable(x))
                )
    return out


def _hashable(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str, type(None)))


def _ran_with(record: ExperimentRecord, path: str) -> Any:
    """The value ``record``'s experiment ran with at ``path``: its config's, else DeepSpeed's
    default (``None`` where none is known)."""
    section: Any = (record.ds_config or {}).get("zero_optimization") or {}
    *sections, key = path.split(".")
    for name in sections:
        section = section.get(name) if isinstance(section, dict) else None
    if isinstance(section, dict) and key in section:
        return knob_value(section[key])
    stage = record.config.stage if record.config is not None else 0
    defaults = knob_defaults(KnobSpace(stage=stage, tuned={path: []}, fixed={}))
    if path in defaults:
        return defaults[path]
    try:
        return knob_value(deepspeed_default(path))
    except (KeyError, AttributeError, StopIteration):
        return None


def _not_tuned(
    path: str,
    *,
    fast: bool,
    stages: Iterable[int],
    zero: Mapping[str, Any],
    skipped: Mapping[int, str],
) -> str:
    """Why a listed path is no dimension of any stage's knob space."""
    if fast:
        return ("autotuning.fast is true, which tunes the micro-batch size alone "
                '(set "fast": false to tune it)')
    key = path.split(".")[0]
    section = zero.get(key)
    if (
        key in OFFLOAD_KEYS
        and isinstance(section, dict)
        and section.get("device") not in ("cpu", "nvme")
    ):
        device = section.get("device")
        return f"{key} offloads nothing (its device is {device!r}), so its settings act on nothing"
    if key in STAGE3_ONLY and 3 in skipped:
        return f"it acts at ZeRO-3 only, and z3 was skipped: {skipped[3]}"
    if key in STAGE3_ONLY and 3 not in stages:
        return "it acts at ZeRO-3 only, which this tuning does not run"
    if path == "zero_quantized_gradients":
        return (
            "qgZ acts only where the data-parallel ranks span nodes (on one node DeepSpeed "
            "reduces the gradients unquantized whatever the setting), and this job's ranks do not"
        )
    if key.startswith("zero_quantized") or key == "zero_hpz_partition_size":
        return "ZeRO++ acts between data-parallel ranks, at ZeRO-3, and this job has one rank"
    return "it is no dimension of any stage this tuning runs"


def unrun_values(
    zero: Mapping[str, Any],
    *,
    fast: bool,
    spaces: Mapping[int, Mapping[str, Any]],
    trials: Mapping[int, Iterable[FrozenTrial]],
    skipped: Mapping[int, str],
) -> tuple[Unrun, ...]:
    """Each value listed in ``zero`` (the user's ``zero_optimization``) that no launched
    experiment ran with, and why: the knob was no dimension (``spaces``: each stage study's
    recorded knob space), the stage that tunes it was ``skipped``, or the planner's search ended
    without it. A value that ran and failed ran: its failure is the stage's note."""
    out = []
    records = {
        s: [ExperimentRecord.from_trial(t) for t in launched(ts)] for s, ts in trials.items()
    }
    for path, values in listed(zero).items():
        tuned_at = [
            s
            for s, space in spaces.items()
            if path in (space.get("tuned") or {}) or path in (space.get("offload_tuned") or {})
        ]
        ran = {
            _ran_with(r, path) for rs in records.values() for r in rs if r.ds_config is not None
        }
        for value in values:
            if value in ran:
                continue
            if fast or not tuned_at:
                reason = _not_tuned(path, fast=fast, stages=spaces, zero=zero, skipped=skipped)
            elif all(s in skipped for s in tuned_at):
                reason = "; ".join(
                    f"z{s}, where it is tuned, was skipped: {skipped[s]}" for s in tuned_at
                )
            else:
                reason = (
                    "the planner's search ended without it: it expected no gain from it over the "
                    "settings that ran"
                )
            out.append(Unrun(path=f"zero_optimization.{path}", value=value, reason=reason))
    return tuple(out)


def unrun_sizes(
    sizes: Iterable[int], *, trials: Mapping[int, Iterable[FrozenTrial]]
) -> tuple[Unrun, ...]:
    """Each listed micro-batch size no launched experiment ran with, and why: the planner tries a
    listed size at every stage it explores unless its memory model says it cannot fit there
    (after a smaller size ran out of memory, where one did)."""
    records = [ExperimentRecord.from_trial(t) for ts in trials.values() for t in launched(ts)]
    ran = {r.config.micro_batch for r in records if r.config is not None}
    out = []
    for size in sizes:
        if size in ran:
            continue
        oom = sorted(
            (r.config.micro_batch, r.config.stage)
            for r in records
            if r.config is not None
            and r.reason is FailureReason.OOM
            and r.config.micro_batch <= size
        )
        reason = "the planner's memory model says it cannot fit at any stage it explored"
        if oom:
            reason += f" (z{oom[0][1]} ran out of memory at micro-batch {oom[0][0]})"
        out.append(Unrun(path="train_micro_batch_size_per_gpu", value=size, reason=reason))
    return tuple(out)
