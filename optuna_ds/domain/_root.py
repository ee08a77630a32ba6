"""What a tuning records on its root study, beside its plan (``storage``'s): one typed record."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

import optuna

from optuna_ds.domain._config import Config
from optuna_ds.domain._config import Offload

_STAGE_PREFIX = "stage:"  # one attr per stage, "stage:z<stage>": several drivers write them, a shared dict would lose updates


@dataclasses.dataclass(frozen=True)
class RecordedResources:
    """What one experiment runs on, as the tuning's first process found it: every process of a
    tuning runs experiments of one size on one kind of device."""

    gpus_per_experiment: int = 1
    device_memory: float = 0.0  # bytes per device
    gpu_memory: str = ""  # whether peak GPU memory is measured here, and if not why
    device: str = ""  # the accelerator's kind: "GPU", "CPU"


@dataclasses.dataclass(frozen=True)
class StageRecord:
    """A ZeRO stage's status: ``tuned``, ``skipped`` or ``pending``, with why, its memory
    estimate, and where tuned, its largest micro-batch size that ran and the offload variants
    it explored (stored as a list of labels)."""

    status: str
    reason: str = ""
    memory: dict[str, Any] | None = None
    max_runnable_micro_batch_size: int | None = None
    offload: tuple[Offload, ...] | None = None

    @classmethod
    def from_attrs(cls, stored: Mapping[str, Any]) -> StageRecord:
        known = _known(cls, dict(stored))
        if known.get("offload") is not None:
            known["offload"] = tuple(Offload(label) for label in known["offload"])
        return cls(**known)

    def attrs(self) -> dict[str, Any]:
        attrs = _plain(self)
        if self.offload is not None:
            attrs["offload"] = [label.value for label in self.offload]
        return attrs


@dataclasses.dataclass(frozen=True)
class ChoiceRecord:
    """The planner's final choice: its config (stored as :meth:`Config.to_attrs` writes it), the
    planner's estimate of its metric, the figure it was judged by (``level``: the robust level of
    its runs, ``optuna_ds.planner.robust_level``), and its stage and first run's trial in that
    stage's study."""

    stage: int
    trial: int
    config: Config
    estimate: float | None = None
    regret: float | None = None  # what the planner expected the choice still to lose (a share)
    level: float | None = None  # the metric's figure the planner judged it by: the robust level of its runs

    def attrs(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {"stage": self.stage, "trial": self.trial}
        if self.estimate is not None:
            attrs["estimate"] = self.estimate
        if self.regret is not None:
            attrs["regret"] = self.regret
        if self.level is not None:
            attrs["level"] = self.level
        attrs["config"] = self.config.to_attrs()
        return attrs

    @classmethod
    def from_attrs(cls, stored: Mapping[str, Any]) -> ChoiceRecord | None:
        """The choice :meth:`attrs` stored; ``None`` where ``stored`` holds none (``{}``)."""
        config = stored.get("config")
        config = Config.from_attrs(config) if isinstance(config, dict) else None
        if config is None:
            return None
        return cls(stage=int(stored["stage"]), trial=int(stored["trial"]), config=config, estimate=stored.get("estimate"),
                   regret=stored.get("regret"), level=stored.get("level"))


def _known(cls: type[Any], stored: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``stored`` that ``cls`` has: a later version may store more."""
    return {k: v for k, v in stored.items() if k in {f.name for f in dataclasses.fields(cls)}}


def _plain(value: Any) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(value).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class RootRecord:
    """The root study's user attrs, the one place their keys are named: each field under its
    own name, but the stages (``stage:z<stage>``, one each). Stored tunings, the report and optuna-dashboard read them:
    the keys never change. Written in parts, by whoever knows each (:meth:`write`); a field the
    study does not hold is ``None`` (empty, ``False``)."""

    resources: RecordedResources | None = None
    model_info: dict[str, Any] | None = None  # the user's and the profile run's
    profile_duration: float | None = None  # seconds
    profile_end: str | None = None  # ISO time, for the report's timeline
    # The profile run while it has no model info: {"state": "running", "host", "pid", "started"} (its
    # process), "failed" or "interrupted" with "why"; workers wait for it, or end saying why;
    # "finished" once its model info is stored.
    profile_run: dict[str, Any] | None = None
    elapsed: float | None = None  # the tuning's wall time across its resumed runs, seconds
    stages: Mapping[int, StageRecord] = dataclasses.field(default_factory=dict)
    choice: ChoiceRecord | None = None

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> RootRecord:
        n = len(_STAGE_PREFIX) + 1
        stages = {int(k[n:]): StageRecord.from_attrs(v) for k, v in attrs.items()
                  if k.startswith(f"{_STAGE_PREFIX}z") and k[n:].isdigit() and isinstance(v, dict)}
        resources, choice = attrs.get("resources"), attrs.get("choice")
        return cls(
            resources=RecordedResources(**_known(RecordedResources, resources)) if isinstance(resources, dict) else None,
            model_info=attrs.get("model_info"),
            profile_duration=attrs.get("profile_duration"),
            profile_end=attrs.get("profile_end"),
            profile_run=attrs.get("profile_run") if isinstance(attrs.get("profile_run"), dict) else None,
            elapsed=attrs.get("elapsed"),
            stages=dict(sorted(stages.items())),
            choice=ChoiceRecord.from_attrs(choice) if isinstance(choice, dict) else None,
        )

    def attrs(self) -> dict[str, Any]:
        """The user attrs of the fields this record sets."""
        attrs: dict[str, Any] = {}
        if self.resources is not None:
            attrs["resources"] = dataclasses.asdict(self.resources)
        for key in ("model_info", "profile_duration", "profile_end", "profile_run", "elapsed"):
            if getattr(self, key) is not None:
                attrs[key] = getattr(self, key)
        attrs.update({f"{_STAGE_PREFIX}z{stage}": record.attrs() for stage, record in self.stages.items()})
        if self.choice is not None:
            attrs["choice"] = self.choice.attrs()
        return attrs

    def write(self, set_user_attr: Callable[[str, Any], None]) -> None:
        """Store :meth:`attrs`; ``set_user_attr`` is the root study's."""
        for key, value in self.attrs().items():
            set_user_attr(key, value)

    @staticmethod
    def reopen_choice(set_user_attr: Callable[[str, Any], None]) -> None:
        """Store that tune's search is open again: no choice until it chooses anew (a worker
        names none meanwhile)."""
        set_user_attr("choice", {})


def restart_unmeasured(root: optuna.Study) -> bool:
    """Where the tuning of root study ``root`` stopped at its profile run (failed or interrupted,
    no model info: no experiment ran), forget what its first process recorded (its resources) and
    return ``True``: another command may take its place (:func:`optuna_ds.storage.open_root_study`).
    ``False``, touching nothing, otherwise."""
    record = RootRecord.from_attrs(root.user_attrs)
    if record.model_info is not None or (record.profile_run or {}).get("state") not in ("failed", "interrupted"):
        return False
    root.set_user_attr("resources", None)
    return True
