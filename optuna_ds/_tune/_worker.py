"""``optuna-ds worker``: another node joins a tuning stored in a shared database."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable

import optuna

from optuna_ds._errors import ConfigError
from optuna_ds._tune._deepspeed import experiment_runner
from optuna_ds._tune._deepspeed import resolve_deepspeed_bin
from optuna_ds._tune._interrupts import RESUME
from optuna_ds._tune._interrupts import sigterm_raises
from optuna_ds.config import check_gpus
from optuna_ds.config import parse_user_config
from optuna_ds.domain import RootRecord
from optuna_ds.launcher import LauncherOptions
from optuna_ds.launcher import Spawn
from optuna_ds.launcher import check_ports
from optuna_ds.launcher import discover_resources
from optuna_ds.launcher import import_deepspeed
from optuna_ds.launcher import local_host_names
from optuna_ds.samplers import check_tuner_type
from optuna_ds.storage import NoDatabase
from optuna_ds.storage import TuningPlan
from optuna_ds.storage import check_study_name
from optuna_ds.storage import create_storage
from optuna_ds.storage import load_plan
from optuna_ds.storage import redact_url
from optuna_ds.storage import storage_failures
from optuna_ds.storage import tuning_names
from optuna_ds.studies import PrintObserver
from optuna_ds.studies import Tuning
from optuna_ds.studies import TuningObserver
from optuna_ds.studies import TuningResult


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
    """What ``optuna-ds worker`` was asked. Launcher options left unset (-1, empty) come from
    the tuning's plan, except the GPUs: a worker uses its own node's."""

    storage: str
    study_name: str
    launcher_options: LauncherOptions = LauncherOptions()
    deepspeed_bin: str | None = None
    wait: float = 300.0  # seconds to wait for the tuning to be started, and then for its profile run


@dataclasses.dataclass(frozen=True)
class WorkerOutcome:
    """What a worker saw when the tuning was done: the storage's results then, and the optimum
    tune chose (``{"name", "figure"}``), ``None`` where tune has chosen none yet."""

    result: TuningResult
    choice: dict[str, str] | None
    results_dir: str


_PLAN_POLL_SECONDS = 0.2  # a waiting worker reads the plan this often: one small query


def _wait_for_plan(options: WorkerOptions, log: Callable[[str], None]) -> tuple[optuna.storages.RDBStorage, TuningPlan]:
    """The storage and the tuning's plan, once stored, waiting at most ``options.wait`` seconds.

    A worker started first does its slow start-up (importing DeepSpeed) while it waits and
    looks often: the tuning may have little work left by the time the worker could start any.
    A missing SQLite file is waited for, never created: a mistyped name or path must leave
    nothing behind. The tunings the storage holds are named at once, so a typo shows.
    """
    deadline = time.monotonic() + options.wait
    shown = redact_url(options.storage)
    storage: optuna.storages.RDBStorage | None = None
    told = False
    while True:
        if storage is None:
            try:
                create_storage(options.storage, create=False)
                storage = create_storage(options.storage)  # it exists: opened as tune opens it, under its lock
            except NoDatabase:
                pass
        if storage is not None:
            plan = load_plan(storage, options.study_name)
            if plan is not None:
                return storage, plan
        held = _held_tunings(storage)
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"{shown} holds no tuning named '{options.study_name}' ({held}) after {options.wait:g} s: "
                f"start it with optuna-ds tune --study-name {options.study_name}, or give the name of one it holds"
            )
        if not told:
            log(f"waiting up to {options.wait:g} s for tuning '{options.study_name}' to be started in {shown} ({held})")
            import_deepspeed()
            told = True
        time.sleep(_PLAN_POLL_SECONDS)


def _held_tunings(storage: optuna.storages.RDBStorage | None) -> str:
    if storage is None:
        return "no database there yet"
    names = tuning_names(storage)
    return f"it holds {', '.join(repr(n) for n in names)}" if names else "it holds no tuning yet"


def worker_launcher_options(*, mine: LauncherOptions, planned: LauncherOptions) -> LauncherOptions:
    """A worker's launcher flags: its own GPU selection (else the tuning's GPUs per experiment),
    the tuning's rendezvous unless given, every other flag of the tuning unless given."""
    own_gpus = bool(mine.include or mine.exclude or mine.hostfile)
    default = LauncherOptions()
    merged = {
        f.name: getattr(mine, f.name) if getattr(mine, f.name) != getattr(default, f.name) else getattr(planned, f.name)
        for f in dataclasses.fields(LauncherOptions)
        if f.name not in ("hostfile", "include", "exclude")
    }
    merged["num_gpus"] = mine.num_gpus if mine.num_gpus > 0 or own_gpus else planned.num_gpus
    merged["num_nodes"] = mine.num_nodes if mine.num_nodes > 0 or own_gpus else planned.num_nodes
    return dataclasses.replace(mine, **merged)


def work(options: WorkerOptions, *, observer: TuningObserver | None = None, spawn: Spawn | None = None) -> WorkerOutcome:
    """Join the tuning stored under ``options.study_name`` and run its experiments on this
    node's GPUs until it is done. Everything else comes from the plan in the storage. The
    optimum is tune's to choose: the outcome names tune's choice, never one of the worker's.
    ``spawn`` starts each experiment's launcher (a real process by default; benchmarks/product.py
    simulates one)."""
    observer = observer or PrintObserver()
    check_study_name(options.study_name)
    if not (math.isfinite(options.wait) and options.wait >= 0):
        raise ConfigError(f"--wait must be a non-negative number of seconds, got {options.wait}")
    with storage_failures(options.storage, advice=RESUME):
        storage, plan = _wait_for_plan(options, observer.log)
        user = parse_user_config(plan.user_config, path=plan.config_path, script_args=plan.script_args)
        check_tuner_type(user.autotuning.tuner_type, fast=user.autotuning.fast)
        for path, what in ((plan.cwd, "working directory"), (plan.script, "training script")):
            if not os.path.exists(path):
                raise ConfigError(
                    f"the tuning's {what} {path} does not exist on this node: share it (NFS) or copy it to the same path"
                )
        os.chdir(plan.cwd)
        deepspeed_bin = resolve_deepspeed_bin(options.deepspeed_bin) if options.deepspeed_bin else plan.deepspeed_bin
        if not os.path.exists(deepspeed_bin[-1]):
            deepspeed_bin = resolve_deepspeed_bin(None)
        launcher_options = worker_launcher_options(mine=options.launcher_options, planned=LauncherOptions(**plan.launcher_options))
        resources = discover_resources(launcher_options)
        if resources.multi_node and resources.nodes_per_experiment == 1:
            resources = resources.restricted_to(local_host_names())
        check_gpus(user, total_gpus=resources.total_gpus, gpus_per_node=resources.gpus_per_node)
        check_ports(first=launcher_options.base_port, slots=len(resources.slots()))
        runner = experiment_runner(plan, user, resources, deepspeed_bin, launcher_options, spawn=spawn)
        observer.log(f"worker for tuning '{plan.study_name}' in {redact_url(options.storage)}; script {plan.script}")
        tuning = Tuning(plan=plan, user=user, storage=storage, resources=resources, runner=runner, observer=observer,
                        worker=True, wait=options.wait)
        try:
            with sigterm_raises():
                result = tuning.run()
        except KeyboardInterrupt:
            observer.log("interrupted: this worker's experiments were ended and will run again elsewhere")
            raise
        return WorkerOutcome(result=result, choice=_tune_choice(tuning), results_dir=plan.results_dir)


def _tune_choice(tuning: Tuning) -> dict[str, str] | None:
    """The optimum tune chose (:class:`RootRecord`'s choice), its name and figure as the tuning's
    results read now; ``None`` while tune has chosen none."""
    recorded = RootRecord.from_attrs(tuning.root.user_attrs).choice
    if recorded is None:
        return None
    result = tuning.result()
    best = result.best
    if best is None or best.config != recorded.config:
        return None
    return {"name": best.name, "figure": best.figure(result.metric)}
