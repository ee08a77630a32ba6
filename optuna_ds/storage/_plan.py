from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import optuna

from optuna_ds._errors import ConfigError
from optuna_ds._errors import PlanMismatchError
from optuna_ds._optuna_compat import storage_of
from optuna_ds._optuna_compat import study_id as id_of

PLAN_VERSION = 1
# On the root study: the plan whole in a system attr, and in a user attr its fingerprint only,
# which marks the study as a tuning's root. `optuna studies` prints every user attr of every
# study on one line, and no system attr; workers on other nodes read the plan from the storage.
_PLAN_ATTR = "optuna_ds:plan"
_TUNING_ATTR = "optuna_ds:tuning"  # on a stage study: the tuning that owns it
# On the root study: the tune process ending the tuning ({"host", "pid", "started"}), set once its
# planner is done, from when workers launch nothing more; {} while its search is open. A system
# attr: coordination, not a figure for `optuna studies`.
_ENDING_ATTR = "optuna_ds:ending"
# A system attr: `optuna studies` prints every user attr on one line.
_VERDICT_ATTR = "optuna_ds:verdict"
_CURVES_ATTR = "optuna_ds:model_curves"
# Optuna's study_name column holds 512 characters; stage studies add "-z<stage>".
MAX_STUDY_NAME = 500
_STAGE_SUFFIX = re.compile(r"-z[0-9]$")


@dataclasses.dataclass(frozen=True)
class TuningPlan:
    """Everything a process needs to take part in a tuning, stored in the Optuna storage.

    It lives in the system attrs of the tuning's root study (named like the tuning) so that a
    resumed run or another worker, on any node, reads it from the database, never from memory
    or a folder; the root's user attr ``optuna_ds:plan`` holds its fingerprint only.
    """

    study_name: str
    script: str
    script_args: list[str]
    cwd: str
    config_path: str
    user_config: dict[str, Any]
    deepspeed_bin: list[str]  # the deepspeed executable's command
    launcher_options: dict[str, Any]
    results_dir: str
    exps_dir: str
    trial_timeout: float | None
    # The share of each device's memory the chosen config must leave free (``--memory-margin``).
    memory_margin: float = 0.05
    # The real training's samples (``--train-samples``, or ``--train-steps`` at the user's batch):
    # the planner prices a launch against it. ``None``: not given.
    train_samples: int | None = None
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
        if "launcher" in data and "deepspeed_bin" not in data:  # stored before the executable had its own name
            data = {**data, "deepspeed_bin": data["launcher"]}
        return cls(**{k: v for k, v in data.items() if k in names})


def check_study_name(study_name: str) -> None:
    """Refuse a tuning name the storage cannot hold or that names another tuning's stage study.

    Stage studies are ``NAME-z<stage>``, so a tuning named ``NAME-z1`` would share its root
    study with tuning ``NAME``'s stage 1: names ending in ``-z<digit>`` are reserved for stages.
    """
    if not study_name.strip() or not study_name.isprintable():
        raise ConfigError(f"--study-name must be a non-empty printable name, got {study_name!r}")
    if len(study_name) > MAX_STUDY_NAME:
        raise ConfigError(f"--study-name is {len(study_name)} characters long; the storage holds at most {MAX_STUDY_NAME}")
    if _STAGE_SUFFIX.search(study_name):
        raise ConfigError(
            f"--study-name {study_name!r} ends like a stage study (-z<stage>) of tuning "
            f"{study_name[:-3]!r}: choose another name, e.g. {study_name[:-3] + '_' + study_name[-2:]!r}"
        )


def _exact_id(storage: optuna.storages.BaseStorage, name: str) -> int:
    """The id of the study named ``name`` exactly; ``KeyError`` if none. A MySQL or MariaDB
    database finds names by its collation, blind to case and trailing spaces: asked for ``MY``,
    it answers with study ``my``, another tuning's."""
    study_id = storage.get_study_id_from_name(name)
    if storage.get_study_name_from_id(study_id) != name:
        raise KeyError(name)
    return study_id


def _not_exactly(storage: optuna.storages.BaseStorage, name: str) -> PlanMismatchError:
    other = storage.get_study_name_from_id(storage.get_study_id_from_name(name))
    return PlanMismatchError(f"study {name!r} is study {other!r} to this database (its names ignore case and trailing spaces): "
                             f"optuna-ds neither uses nor deletes it; choose a --study-name no other study's name matches so")


def stage_study_name(study_name: str, stage: int) -> str:
    return f"{study_name}-z{stage}"


def _marks(study: optuna.Study) -> tuple[dict[str, Any], bool]:
    """``study``'s user attrs, and whether it was blank: no trial, no user attr. A process of
    this tuning that died between creating one of its studies and marking it leaves a blank
    study; so may another tool, but a blank study has nothing to lose.

    The trials are counted before the attrs are read: a process of the tuning marks a study
    before it adds anything to it, so a study read unmarked was blank when they were counted.
    (Reading the attrs twice, a mark that another process of the tuning set between the two
    reads had the study taken for another tool's.)"""
    empty = not study.get_trials(deepcopy=False)
    attrs = study.user_attrs
    return attrs, empty and not attrs


def _foreign(study: optuna.Study) -> str:
    n = len(study.get_trials(deepcopy=False))
    return (f"study '{study.study_name}' in the storage was not created by optuna-ds ({n} trial(s)): optuna-ds "
            "neither uses nor deletes it; choose another --study-name")


def claim_stage_study(study: optuna.Study, study_name: str, *, direction: str | None = None) -> None:
    """Mark ``study`` as a stage study of tuning ``study_name``, or check that it is marked so.

    Only a study this tuning created (its mark) or a blank one is ours: a study another tuning
    or another tool created is refused, never adopted, so that its trials are neither read as
    experiments nor deleted by ``--overwrite``.
    """
    attrs, blank = _marks(study)
    owner = attrs.get(_TUNING_ATTR)
    if _PLAN_ATTR in attrs or (owner is not None and owner != study_name):
        raise PlanMismatchError(
            f"study '{study.study_name}' belongs to another tuning, not to '{study_name}': choose another --study-name"
        )
    if owner is not None:
        return
    if not blank or (direction is not None and study.direction.name.lower() != direction):
        raise PlanMismatchError(_foreign(study))
    study.set_user_attr(_TUNING_ATTR, study_name)


def open_stage_study(storage: optuna.storages.BaseStorage, *, tuning: str, stage: int, direction: str) -> optuna.Study:
    """Create or load tuning ``tuning``'s study of ZeRO stage ``stage`` (see :func:`claim_stage_study`).
    Checked before anything reads its trials: a foreign study's running trials must not be
    taken for our orphans."""
    name = stage_study_name(tuning, stage)
    study = optuna.create_study(storage=storage, study_name=name, direction=optuna.study.StudyDirection[direction.upper()],
                                load_if_exists=True)
    try:
        _exact_id(storage, name)
    except KeyError:
        raise _not_exactly(storage, name) from None
    claim_stage_study(study, tuning, direction=direction)
    return study


def open_root_study(storage: optuna.storages.BaseStorage, plan: TuningPlan, *, direction: str,
                    replaceable: Callable[[optuna.Study], bool] = lambda root: False) -> optuna.Study:
    """Create the root study holding ``plan``, or load it and check it holds the same plan; a
    root study holding another plan takes ``plan`` in its place where ``replaceable`` says so
    (a tuning that measured nothing), else is refused. A study of that name that holds no plan
    is ours only if blank (see :func:`claim_stage_study`)."""
    study = optuna.create_study(storage=storage, study_name=plan.study_name, direction=optuna.study.StudyDirection[direction.upper()], load_if_exists=True)
    try:
        study_id = _exact_id(storage, plan.study_name)
    except KeyError:
        raise _not_exactly(storage, plan.study_name) from None
    attrs, blank = _marks(study)
    stored = stored_plan(attrs, storage.get_study_system_attrs(study_id))
    if stored is None:
        if not blank or study.direction.name.lower() != direction:
            raise PlanMismatchError(_foreign(study))
        storage.set_study_system_attr(study_id, _PLAN_ATTR, plan.to_dict())
        study.set_user_attr(_PLAN_ATTR, plan.fingerprint)
        # Two processes that created the tuning at once each stored a plan: the last one stays.
        stored = storage.get_study_system_attrs(study_id)[_PLAN_ATTR]
    previous = TuningPlan.from_dict(stored)
    if previous.fingerprint != plan.fingerprint and replaceable(study):
        storage.set_study_system_attr(study_id, _PLAN_ATTR, plan.to_dict())
        study.set_user_attr(_PLAN_ATTR, plan.fingerprint)
    elif previous.fingerprint != plan.fingerprint:
        raise PlanMismatchError(
            f"study '{plan.study_name}' already holds a tuning of {previous.script} with {previous.config_path} "
            f"whose {_difference(previous, plan)}: rerun that command to resume it, "
            "pass --overwrite to start afresh, or choose another --study-name"
        )
    return study


def _difference(stored: TuningPlan, plan: TuningPlan) -> str:
    """What tells two plans apart, as the refusal names it: the script, its arguments, the
    config's top-level keys that differ, or the launcher options."""
    if stored.script != plan.script:
        return "script differs"
    if stored.script_args != plan.script_args:
        return "script arguments differ"
    keys = sorted(k for k in {*stored.user_config, *plan.user_config} if stored.user_config.get(k) != plan.user_config.get(k))
    if keys:
        return f"config differs in {', '.join(keys)}"
    return "launcher options differ"


def load_stage_study(storage: optuna.storages.BaseStorage, *, tuning: str, stage: int) -> optuna.Study | None:
    """Tuning ``tuning``'s study of ZeRO stage ``stage``, or ``None`` if it has none (a study of that
    name another tool created is not its)."""
    try:
        _exact_id(storage, stage_study_name(tuning, stage))
        study = optuna.load_study(study_name=stage_study_name(tuning, stage), storage=storage)
    except KeyError:
        return None
    return study if study.user_attrs.get(_TUNING_ATTR) == tuning and _PLAN_ATTR not in study.user_attrs else None


def load_plan(storage: optuna.storages.BaseStorage, study_name: str) -> TuningPlan | None:
    """The plan stored under ``study_name``, or ``None`` if no tuning was started there yet."""
    try:
        study_id = _exact_id(storage, study_name)
    except KeyError:
        return None
    stored = stored_plan(storage.get_study_user_attrs(study_id), storage.get_study_system_attrs(study_id))
    return TuningPlan.from_dict(stored) if stored else None


def stored_plan(user_attrs: dict[str, Any], system_attrs: dict[str, Any]) -> dict[str, Any] | None:
    """The plan of a root study, as stored, from its attrs: in its system attrs, or whole in its
    user attrs where a tuning started before the plan moved put it; ``None`` for any other study."""
    if _PLAN_ATTR not in user_attrs:
        return None
    stored = system_attrs.get(_PLAN_ATTR, user_attrs[_PLAN_ATTR])
    return stored if isinstance(stored, dict) else None


def tuning_names(storage: optuna.storages.BaseStorage) -> list[str]:
    """The tunings the storage holds: the studies with a plan (stage studies have none)."""
    return sorted(s.study_name for s in storage.get_all_studies() if _PLAN_ATTR in s.user_attrs)


def stage_of(study_name: str, name: str) -> int | None:
    """The ZeRO stage of ``name`` if it is a stage study of the tuning ``study_name``."""
    suffix = name[len(study_name) + 2 :] if name.startswith(f"{study_name}-z") else ""
    return int(suffix) if suffix.isdigit() and len(suffix) == 1 else None


def tuning_study_names(storage: optuna.storages.BaseStorage, study_name: str) -> list[str]:
    """The root study and the stage studies of one tuning, and of no other (``NAME-zeta`` is not
    a stage study of ``NAME``): those that bear its marks, and blank ones of its names (see
    :func:`claim_stage_study`). A study another tool created under one of its names is not
    among them: ``--overwrite`` deletes these."""
    names = []
    # The studies alone, not their summaries: a summary reads every trial of every study in the
    # database (5 s at the end of each tuning on a database shared by 150 studies).
    for s in storage.get_all_studies():
        attrs = s.user_attrs
        if s.study_name == study_name:
            ours = _PLAN_ATTR in attrs
        elif stage_of(study_name, s.study_name) is not None:
            # Another tuning's root study or stage study is not ours, whatever its name.
            ours = _PLAN_ATTR not in attrs and attrs.get(_TUNING_ATTR) == study_name
        else:
            continue
        if ours or (not attrs and not storage.get_all_trials(storage.get_study_id_from_name(s.study_name), deepcopy=False)):
            names.append(s.study_name)
    return names


def delete_tuning(storage: optuna.storages.BaseStorage, study_name: str) -> list[str]:
    """Delete the root study and the stage studies of a tuning; return their names."""
    names = tuning_study_names(storage, study_name)
    for name in names:
        optuna.delete_study(study_name=name, storage=storage)
    return names


def set_ending(root: optuna.Study, owner: dict[str, Any]) -> None:
    """Record on the root study that the process ``owner`` is ending the tuning (``{}``: nobody)."""
    storage_of(root).set_study_system_attr(id_of(root), _ENDING_ATTR, owner)


def ending(root: optuna.Study) -> dict[str, Any] | None:
    """The process recorded as ending the tuning of ``root`` (:func:`set_ending`), read now."""
    owner = storage_of(root).get_study_system_attrs(id_of(root)).get(_ENDING_ATTR)
    return owner if isinstance(owner, dict) and owner else None


def set_verdict(root: optuna.Study, *, equivalent: Sequence[str], noise: float | None) -> None:
    """Record on the root study the planner's verdict beside its choice: the configs (by
    ``Config.name``) a run cannot tell from it, and the relative noise of one run it judged by."""
    stored = {"equivalent": list(equivalent), "noise": noise}
    storage_of(root).set_study_system_attr(id_of(root), _VERDICT_ATTR, stored)


def set_model_curves(root: optuna.Study, curves: Sequence[dict[str, Any]]) -> None:
    """Record on the root study the planner's model curves beside its choice (each a dict, as
    ``ModelCurve.to_dict`` writes it), for the report."""
    storage_of(root).set_study_system_attr(id_of(root), _CURVES_ATTR, list(curves))


def model_curves_of(root: optuna.Study) -> list[dict[str, Any]]:
    """The model curves recorded by :func:`set_model_curves`; none where none are."""
    stored = storage_of(root).get_study_system_attrs(id_of(root)).get(_CURVES_ATTR)
    return [c for c in stored if isinstance(c, dict)] if isinstance(stored, list) else []


def verdict(root: optuna.Study) -> tuple[tuple[str, ...], float | None] | None:
    """The planner's verdict recorded by :func:`set_verdict`; ``None`` where none is."""
    stored = storage_of(root).get_study_system_attrs(id_of(root)).get(_VERDICT_ATTR)
    if not isinstance(stored, dict) or not isinstance(stored.get("equivalent"), list):
        return None
    noise = stored.get("noise")
    equivalent = tuple(str(e) for e in stored["equivalent"])
    return equivalent, float(noise) if isinstance(noise, (int, float)) else None
