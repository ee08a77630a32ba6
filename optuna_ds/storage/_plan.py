from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import optuna

from optuna_ds._errors import PlanMismatchError

PLAN_VERSION = 1
_PLAN_ATTR = "optuna_ds:plan"


@dataclasses.dataclass(frozen=True)
class TuningPlan:
    """Everything a process needs to take part in a tuning, stored in the Optuna storage.

    It lives in the user attrs of the tuning's root study (named like the tuning) so that a
    resumed run or another worker reads it from the database, never from memory.
    """

    study_name: str
    script: str
    script_args: list[str]
    cwd: str
    config_path: str
    user_config: dict[str, Any]
    launcher: list[str]
    launcher_options: dict[str, Any]
    results_dir: str
    exps_dir: str
    trial_timeout: float | None
    version: int = PLAN_VERSION

    @property
    def fingerprint(self) -> str:
        """Identifies what is tuned: the same script, arguments, config and launcher options."""
        key = json.dumps(
            [self.script, self.script_args, self.user_config, self.launcher_options], sort_keys=True, default=str
        )
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuningPlan:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def stage_study_name(study_name: str, stage: int) -> str:
    return f"{study_name}-z{stage}"


def open_root_study(storage: optuna.storages.BaseStorage, plan: TuningPlan, *, direction: str) -> optuna.Study:
    """Create the root study holding ``plan``, or load it and check it holds the same plan."""
    study = optuna.create_study(storage=storage, study_name=plan.study_name, direction=direction, load_if_exists=True)
    stored = study.user_attrs.get(_PLAN_ATTR)
    if stored is None:
        study.set_user_attr(_PLAN_ATTR, plan.to_dict())
        study.set_user_attr("fingerprint", plan.fingerprint)
        return study
    previous = TuningPlan.from_dict(stored)
    if previous.fingerprint != plan.fingerprint:
        raise PlanMismatchError(
            f"study '{plan.study_name}' already holds a tuning of a different script, arguments or config "
            f"({previous.script} with {previous.config_path}): rerun that command to resume it, "
            "pass --overwrite to start afresh, or choose another --study-name"
        )
    return study


def load_plan(storage: optuna.storages.BaseStorage, study_name: str) -> TuningPlan | None:
    """The plan stored under ``study_name``, or ``None`` if no tuning was started there yet."""
    try:
        study = optuna.load_study(storage=storage, study_name=study_name)
    except KeyError:
        return None
    stored = study.user_attrs.get(_PLAN_ATTR)
    return TuningPlan.from_dict(stored) if stored else None


def stage_of(study_name: str, name: str) -> int | None:
    """The ZeRO stage of ``name`` if it is a stage study of the tuning ``study_name``."""
    suffix = name[len(study_name) + 2 :] if name.startswith(f"{study_name}-z") else ""
    return int(suffix) if suffix.isdigit() and len(suffix) == 1 else None


def tuning_study_names(storage: optuna.storages.BaseStorage, study_name: str) -> list[str]:
    """The root study and the stage studies of one tuning, and of no other (``NAME-zeta`` is not
    a stage study of ``NAME``)."""
    return [
        s.study_name
        for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
        if s.study_name == study_name or stage_of(study_name, s.study_name) is not None
    ]


def delete_tuning(storage: optuna.storages.BaseStorage, study_name: str) -> list[str]:
    """Delete the root study and the stage studies of a tuning; return their names."""
    names = tuning_study_names(storage, study_name)
    for name in names:
        optuna.delete_study(study_name=name, storage=storage)
    return names
