"""``optuna-ds tune``: every check of what was asked before anything runs, then the tuning."""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile

from optuna_ds._errors import ConfigError
from optuna_ds._files import check_own_file
from optuna_ds._tune._deepspeed import check_build_locks
from optuna_ds._tune._deepspeed import experiment_runner
from optuna_ds._tune._deepspeed import resolve_deepspeed_bin
from optuna_ds._tune._interrupts import RESUME
from optuna_ds._tune._interrupts import resume_advice
from optuna_ds._tune._interrupts import sigterm_raises
from optuna_ds._tune._outputs import TuneOutcome
from optuna_ds._tune._outputs import remove_previous_outputs
from optuna_ds._tune._outputs import write_outputs
from optuna_ds._tune._outputs import write_partial
from optuna_ds.config import UserConfig
from optuna_ds.config import check_gpus
from optuna_ds.config import check_with_deepspeed
from optuna_ds.config import load_user_config
from optuna_ds.launcher import LauncherOptions
from optuna_ds.launcher import ResultsFiles
from optuna_ds.launcher import Spawn
from optuna_ds.launcher import check_ports
from optuna_ds.launcher import cpu_op_sources
from optuna_ds.launcher import cpu_ops_to_build
from optuna_ds.launcher import extensions_root
from optuna_ds.launcher import watching_build
from optuna_ds.launcher import deferred_signals
from optuna_ds.launcher import discover_resources
from optuna_ds.reporting import Budget
from optuna_ds.samplers import check_tuner_type
from optuna_ds.space import build_knob_space
from optuna_ds.storage import DB_FILENAME
from optuna_ds.storage import TuningPlan
from optuna_ds.storage import check_study_name
from optuna_ds.storage import claim_folder
from optuna_ds.storage import create_storage
from optuna_ds.storage import default_storage_url
from optuna_ds.storage import redact_url
from optuna_ds.storage import storage_failures
from optuna_ds.studies import PrintObserver
from optuna_ds.studies import Tuning
from optuna_ds.studies import TuningObserver


@dataclasses.dataclass(frozen=True)
class TuneOptions:
    """What ``optuna-ds tune`` was asked; ``None`` means "from the config's autotuning section"."""

    script: str
    script_args: list[str]
    launcher_options: LauncherOptions = LauncherOptions()
    storage: str | None = None
    study_name: str = "optuna-ds"
    results_dir: str | None = None
    exps_dir: str | None = None
    overwrite: bool | None = None
    trial_timeout: float | None = None
    deepspeed_bin: str | None = None
    scale_lr: bool = False
    memory_margin: float = 0.05
    cost_per_gpu_hour: float | None = None
    train_samples: int | None = None
    train_steps: int | None = None


_PATH_MAX = os.pathconf("/", "PC_PATH_MAX") if hasattr(os, "pathconf") else 4096  # with its final NUL
_ROOM = 256  # under a folder: an experiment's (a name of at most 200 bytes) and its files' names


def check_path(path: str, *, what: str) -> None:
    """Refuse a path no file can have (a NUL byte) or the storage cannot keep (not UTF-8: the plan
    and every trial record paths as text), before anything runs."""
    if "\0" in path:
        raise ConfigError(f"{what} {path!r} holds a NUL byte, which no path can hold")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{what} {path!r} is not valid UTF-8: the storage keeps paths as text; rename it") from None


def writable_folder(path: str, *, what: str) -> None:
    """Create ``path`` if needed and prove we can write there, before anything is launched:
    a folder we cannot write must be one line now, not a lost profile run. Its path must leave
    room for the experiments' folders and files under it, or they would fail one by one."""
    check_path(path, what=what)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{what} {path} is a file, not a folder")
    size = len(os.fsencode(os.path.abspath(path)))
    if size + _ROOM >= _PATH_MAX:
        raise ConfigError(f"{what} is a path of {size} bytes: the experiments' files under it need {_ROOM} more, and "
                          f"paths hold at most {_PATH_MAX - 1}; choose a shorter folder")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ConfigError(f"{what} {path} is not writable: {e.strerror or e}") from None


def tune(options: TuneOptions, *, observer: TuningObserver | None = None, spawn: Spawn | None = None) -> TuneOutcome:
    """Find the fastest DeepSpeed configuration of ``options.script``.

    Resumes the tuning stored under ``options.study_name`` unless ``overwrite``. Progress goes
    to ``observer`` (plain lines on stdout by default). ``spawn`` starts each experiment's
    launcher (a real process by default; benchmarks/product.py simulates one).
    """
    observer = observer or PrintObserver()
    log = observer.log
    check_path(options.script, what="training script")
    check_path(os.getcwd(), what="working directory")
    if not os.path.isfile(options.script):
        raise ConfigError(f"training script {options.script} not found")
    user = load_user_config(options.script_args)
    check_path(user.path, what="DeepSpeed config")
    a = user.autotuning
    if not a.enabled:
        raise ConfigError(f'autotuning is not enabled in {user.path}: add "autotuning": {{"enabled": true}}')
    if options.trial_timeout is not None and not (math.isfinite(options.trial_timeout) and options.trial_timeout > 0):
        raise ConfigError(f"--trial-timeout must be a positive number of seconds, got {options.trial_timeout}")
    check_study_name(options.study_name)
    check_budget_options(options)
    deepspeed_bin = resolve_deepspeed_bin(options.deepspeed_bin)
    results_dir = os.path.abspath(options.results_dir or a.results_dir)
    exps_dir = os.path.abspath(options.exps_dir or a.exps_dir)
    overwrite = a.overwrite if options.overwrite is None else options.overwrite
    resources = discover_resources(options.launcher_options)
    check_gpus(user, total_gpus=resources.total_gpus, gpus_per_node=resources.gpus_per_node)
    check_ports(first=options.launcher_options.base_port, slots=len(resources.slots()))
    for stage in user.stages:  # a knob space too large to search: refused now, not after the profile
        build_knob_space(stage, user.zero_section(), fast=a.fast,
                         ranks=max(1, resources.total_gpus // a.mp_size),
                         ranks_per_node=resources.gpus_per_node)
    check_with_deepspeed(user)
    check_tuner_type(a.tuner_type, fast=a.fast)
    check_build_locks()
    for folder, what in ((results_dir, "results_dir"), (exps_dir, "exps_dir")):
        writable_folder(folder, what=what)
    files = ResultsFiles(results_dir)
    for path in (*files.outputs(), files.report):
        check_own_file(path)  # a link there is told now, not once the experiments have run

    url = options.storage or default_storage_url(results_dir)
    if options.storage is None:
        check_own_file(os.path.join(results_dir, DB_FILENAME))  # our database, in our folder: never through a link
    storage = create_storage(url)
    with storage_failures(url, advice=RESUME):
        for folder, what in ((results_dir, "results_dir"), (exps_dir, "exps_dir")):
            claim_folder(folder, what=what, study_name=options.study_name, url=url, storage=storage)
        if overwrite:
            remove_previous_outputs(storage, options.study_name, results_dir, exps_dir)
        plan = TuningPlan(
            study_name=options.study_name,
            script=os.path.abspath(options.script),
            script_args=list(options.script_args),
            cwd=os.getcwd(),
            config_path=user.path,
            user_config=user.raw,
            deepspeed_bin=deepspeed_bin,
            launcher_options=dataclasses.asdict(options.launcher_options),
            results_dir=results_dir,
            exps_dir=exps_dir,
            trial_timeout=options.trial_timeout,
            memory_margin=options.memory_margin,
            train_samples=_budget(options, user, dp=resources.total_gpus).train_samples,
        )
        runner = experiment_runner(plan, user, resources, deepspeed_bin, options.launcher_options, spawn=spawn)
        tuning = Tuning(plan=plan, user=user, storage=storage, resources=resources, runner=runner, observer=observer)
        log(f"storage {redact_url(url)}, study {options.study_name}; results in {results_dir}")
        ops = cpu_op_sources(missing) if (missing := cpu_ops_to_build()) else {}
        if ops:
            log(f"the first experiment builds DeepSpeed's CPU ops {', '.join(missing)} once, for this "
                "environment (minutes: 4 to 5 on 2 busy cores; its progress is shown; `make venv` "
                "builds them beforehand)")
        # The outputs too: a SIGTERM or SIGHUP while they are written unwinds as Ctrl-C does (told,
        # exit 128 + signal, no temp file left), instead of killing the process where it stands.
        with sigterm_raises(), watching_build(extensions_root(), ops, say=log):
            try:
                result = tuning.run()
            except KeyboardInterrupt:
                # Interrupted is not done: a partial summary of what finished and no optimal config,
                # then the interrupt ends the process (130 or 143).
                resume = resume_advice(options.overwrite, configured=a.overwrite)
                with deferred_signals():
                    log(write_partial(tuning.result(), storage=storage, plan=plan, resume=resume,
                                       budget=_budget(options, user, dp=resources.total_gpus)).rstrip())
                    log(f"interrupted: running experiments were ended and will run again; {resume}")
                raise
            return write_outputs(result, storage=storage, plan=plan, user=user, runner=runner, dp=resources.total_gpus, url=url,
                                  scale_lr=options.scale_lr, budget=_budget(options, user, dp=resources.total_gpus))


def check_budget_options(options: TuneOptions) -> None:
    """The memory margin, the price and the training's length: each a number that means something."""
    if not (math.isfinite(options.memory_margin) and 0 <= options.memory_margin < 0.5):
        raise ConfigError(f"--memory-margin must be a share of the memory from 0 to 0.5 (0.05 keeps 5% free), got {options.memory_margin}")
    if options.cost_per_gpu_hour is not None and not (math.isfinite(options.cost_per_gpu_hour) and options.cost_per_gpu_hour > 0):
        raise ConfigError(f"--cost-per-gpu-hour must be a positive price, got {options.cost_per_gpu_hour}")
    for flag, value in (("--train-samples", options.train_samples), ("--train-steps", options.train_steps)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be a positive number, got {value}")
    if options.train_samples is not None and options.train_steps is not None:
        raise ConfigError("give --train-samples or --train-steps, not both")


def _budget(options: TuneOptions, user: UserConfig, *, dp: int) -> Budget:
    """The real training in samples: ``--train-steps`` at the user's own global batch size."""
    batch = user.own_train_batch_size or user.min_micro_batch_size * user.gradient_accumulation_steps * max(
        1, dp // (user.autotuning.mp_size * user.own_autotp_size))
    samples = options.train_samples if options.train_steps is None else options.train_steps * batch
    return Budget(cost_per_gpu_hour=options.cost_per_gpu_hour, train_samples=samples, train_steps=options.train_steps)
