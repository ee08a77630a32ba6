from __future__ import annotations

import contextlib
import json
import os
import uuid
from typing import Any

import optuna

from optuna_ds._errors import PlanMismatchError
from optuna_ds._files import UnsafeFileError
from optuna_ds._files import check_own_file
from optuna_ds._files import read_file
from optuna_ds._files import write_file
from optuna_ds.storage._plan import TuningPlan
from optuna_ds.storage._plan import stored_plan

CLAIM_FILE = ".optuna-ds-tuning.json"


def storage_identity(url: str) -> str:
    """The database a storage URL names, however it is spelled and with no secret: a SQLite
    file's real path, a server's backend, host, port and database."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return f"sqlite:{os.path.realpath(parsed.database or ':memory:')}"
    return f"{backend}://{parsed.host or ''}:{parsed.port or ''}/{parsed.database or ''}"


def _read(path: str) -> dict[str, Any] | None:
    try:
        claim = json.loads(read_file(path))
    except (OSError, ValueError, UnsafeFileError):
        return None
    return claim if isinstance(claim, dict) and isinstance(claim.get("study_name"), str) else None


def _publish(path: str, claim: dict[str, Any]) -> bool:
    """Write ``claim`` to ``path`` whole, unless a claim is there already; whether it was written."""
    temp = f"{path}.{uuid.uuid4().hex}.tmp"
    write_file(temp, json.dumps(claim))
    try:
        os.link(temp, path)  # atomic, and never over another's: others read it whole or not at all
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.remove(temp)


def _previous_user(storage: optuna.storages.BaseStorage, folder: str, study_name: str) -> str | None:
    """Another tuning of ``storage`` whose plan names ``folder`` (one started before folders
    were claimed)."""
    real = os.path.realpath(folder)
    for s in storage.get_all_studies():
        plan = stored_plan(s.user_attrs, s.system_attrs)
        if plan is None or s.study_name == study_name:
            continue
        try:
            other = TuningPlan.from_dict(plan)
        except TypeError:
            continue
        if real in (os.path.realpath(other.results_dir), os.path.realpath(other.exps_dir)):
            return s.study_name
    return None


def claim_folder(folder: str, *, what: str, study_name: str, url: str, storage: optuna.storages.BaseStorage) -> None:
    """Make ``folder`` (``results_dir`` or ``exps_dir``) tuning ``study_name``'s, or check that it is.

    Two tunings in one folder would overwrite each other's experiments and outputs, and one's
    ``--overwrite`` would delete the other's: a folder holds one tuning, named in its claim file,
    and another is refused before it writes anything.
    """
    path = os.path.join(folder, CLAIM_FILE)
    check_own_file(path)
    mine = {"study_name": study_name, "storage": storage_identity(url)}
    claim = _read(path)
    if claim is None and not os.path.lexists(path):
        previous = _previous_user(storage, folder, study_name)
        if previous is not None:
            claim = {"study_name": previous, "storage": mine["storage"]}
        elif _publish(path, mine):
            return
        else:
            claim = _read(path)  # another tuning claimed it a moment ago
    if claim is None:
        raise PlanMismatchError(f"cannot read {path}, which names the tuning that uses {what} {folder}: "
                                "pass another --results-dir/--exps-dir, or remove it if no other tuning uses that folder")
    if claim.get("study_name") == mine["study_name"] and claim.get("storage") == mine["storage"]:
        return
    where = "" if claim.get("storage") == mine["storage"] else f" in storage {claim.get('storage')}"
    raise PlanMismatchError(
        f"{what} {folder} holds tuning '{claim['study_name']}'{where}: give tuning '{study_name}' folders of its own "
        f"with --results-dir and --exps-dir, or resume that one with --study-name {claim['study_name']}"
    )
