from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence

import optuna

from optuna_ds._errors import ConfigError
from optuna_ds._errors import OptunaDSError
from optuna_ds.config import UserConfig
from optuna_ds.config import load_user_config
from optuna_ds.config import parse_user_config
from optuna_ds.config import replace_config_path
from optuna_ds.config import set_arg
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import LauncherOptions
from optuna_ds.launcher import Resources
from optuna_ds.launcher import deferred_signals
from optuna_ds.launcher import discover_resources
from optuna_ds.launcher import kill_process_group
from optuna_ds.reporting import learning_rate_advice
from optuna_ds.reporting import load_report
from optuna_ds.reporting import optimal_config
from optuna_ds.reporting import scale_learning_rate
from optuna_ds.reporting import register_with_dashboard
from optuna_ds.reporting import write_optimal
from optuna_ds.reporting import write_report
from optuna_ds.reporting import summary_markdown
from optuna_ds.reporting import summary_text
from optuna_ds.reporting import write_summary
from optuna_ds.storage import TuningPlan
from optuna_ds.storage import create_storage
from optuna_ds.storage import default_storage_url
from optuna_ds.storage import delete_tuning
from optuna_ds.storage import load_plan
from optuna_ds.storage import redact_url
from optuna_ds.storage import tuning_study_names
from optuna_ds.studies import PrintObserver
from optuna_ds.studies import Tuning
from optuna_ds.studies import TuningObserver
from optuna_ds.studies import TuningResult


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
    launcher: str | None = None
    seed: int | None = None
    scale_lr: bool = False


@dataclasses.dataclass(frozen=True)
class TuneOutcome:
    result: TuningResult
    summary: str
    results_dir: str
    optimal_config_path: str | None
    optimal_cmd_path: str | None
    optimal_command: list[str] | None
    storage_url: str


def resolve_launcher(path: str | None) -> list[str]:
    """The ``deepspeed`` launcher command: ``--launcher``, else the one on PATH or beside this Python."""
    if path is None:
        beside = os.path.join(os.path.dirname(sys.executable), "deepspeed")
        found = shutil.which("deepspeed") or (beside if os.access(beside, os.X_OK) else None)
        if found is None:
            raise ConfigError("launcher 'deepspeed' not found on PATH: install deepspeed or pass --launcher PATH")
        return [found]
    if not os.path.isfile(path):
        found = shutil.which(path)
        if found is None:
            raise ConfigError(f"launcher {path} not found")
        path = found
    if path.endswith(".py"):
        return [sys.executable, os.path.abspath(path)]
    if not os.access(path, os.X_OK):
        raise ConfigError(f"launcher {path} is not executable")
    return [os.path.abspath(path)]


def _training_args(script_args: Sequence[str], config_path: str, user: UserConfig, config: dict) -> list[str]:
    args = replace_config_path(script_args, config_path)
    for key, flag in user.arg_mappings.items():
        value = config.get(key)
        if value is not None and value != "auto":
            args = set_arg(args, flag, str(value))
    return args


def _runner(plan: TuningPlan, user: UserConfig, resources: Resources, launcher: list[str], options: LauncherOptions) -> ExperimentRunner:
    return ExperimentRunner(
        launcher=launcher,
        script=plan.script,
        script_args=plan.script_args,
        arg_mappings=user.arg_mappings,
        resources=resources,
        master_port=options.master_port,
        master_addr=options.master_addr,
        metric_key=user.autotuning.metric_key,
        exps_dir=plan.exps_dir,
    )


def _remove_previous_outputs(storage: optuna.storages.BaseStorage, study_name: str, results_dir: str, exps_dir: str) -> None:
    """``--overwrite``: delete the studies and the files of their experiments, nothing else."""
    dirs = set()
    for name in tuning_study_names(storage, study_name):
        study = optuna.load_study(study_name=name, storage=storage)
        for t in study.get_trials(deepcopy=False):
            if "result_dir" in t.user_attrs:
                dirs.add((t.user_attrs["result_dir"], t.user_attrs.get("exp_name", "")))
    dirs.add((os.path.join(results_dir, "profile_model_info"), "profile_model_info"))
    delete_tuning(storage, study_name)
    for result_dir, name in dirs:
        shutil.rmtree(result_dir, ignore_errors=True)
        if name:
            try:
                os.remove(os.path.join(exps_dir, f"{name}.json"))
            except OSError:
                pass
    for name in ("summary.txt", "ds_config_optimal.json", "cmd_optimal.txt"):
        try:
            os.remove(os.path.join(results_dir, name))
        except OSError:
            pass


def tune(options: TuneOptions, *, observer: TuningObserver | None = None) -> TuneOutcome:
    """Find the fastest DeepSpeed configuration of ``options.script``.

    Resumes the tuning stored under ``options.study_name`` unless ``overwrite``. Progress goes
    to ``observer`` (plain lines on stdout by default).
    """
    observer = observer or PrintObserver()
    log = observer.log
    if not os.path.isfile(options.script):
        raise ConfigError(f"training script {options.script} not found")
    user = load_user_config(options.script_args)
    a = user.autotuning
    if not a.enabled:
        raise ConfigError(f'autotuning is not enabled in {user.path}: add "autotuning": {{"enabled": true}}')
    if options.trial_timeout is not None and options.trial_timeout <= 0:
        raise ConfigError(f"--trial-timeout must be positive, got {options.trial_timeout}")
    launcher = resolve_launcher(options.launcher)
    results_dir = os.path.abspath(options.results_dir or a.results_dir)
    exps_dir = os.path.abspath(options.exps_dir or a.exps_dir)
    overwrite = a.overwrite if options.overwrite is None else options.overwrite
    resources = discover_resources(options.launcher_options)

    url = options.storage or default_storage_url(results_dir)
    storage = create_storage(url)
    if overwrite:
        _remove_previous_outputs(storage, options.study_name, results_dir, exps_dir)
    plan = TuningPlan(
        study_name=options.study_name,
        script=os.path.abspath(options.script),
        script_args=list(options.script_args),
        cwd=os.getcwd(),
        config_path=user.path,
        user_config=user.raw,
        launcher=launcher,
        launcher_options=dataclasses.asdict(options.launcher_options),
        results_dir=results_dir,
        exps_dir=exps_dir,
        trial_timeout=options.trial_timeout,
    )
    runner = _runner(plan, user, resources, launcher, options.launcher_options)
    log(f"storage {redact_url(url)}, study {options.study_name}; results in {results_dir}")
    tuning = Tuning(plan=plan, user=user, storage=storage, resources=resources, runner=runner, observer=observer, seed=options.seed)
    try:
        with _sigterm_raises():
            result = tuning.run()
    except KeyboardInterrupt:
        # Write what finished, then let the interrupt end the process (130 or 143).
        with deferred_signals():
            outcome = _write_outputs(tuning.result(), storage=storage, plan=plan, user=user, options=options, launcher=launcher, dp=resources.total_gpus, url=url)
            log(outcome.summary.rstrip())
            log("interrupted: running experiments were ended and will run again; rerun the same command to resume")
        raise
    return _write_outputs(result, storage=storage, plan=plan, user=user, options=options, launcher=launcher, dp=resources.total_gpus, url=url)


class TuningInterrupted(KeyboardInterrupt):
    """SIGTERM, raised where the tuning is, so it unwinds like Ctrl-C: experiments are ended
    by process group and their trials marked ``interrupted``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_sigterm(signum: int, _frame: object) -> None:
    raise TuningInterrupted(signum)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if threading.current_thread() is threading.main_thread() else None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
    """What ``optuna-ds worker`` was asked. Launcher options left unset (-1, empty) come from
    the tuning's plan, except the GPUs: a worker uses its own node's."""

    storage: str
    study_name: str
    launcher_options: LauncherOptions = LauncherOptions()
    launcher: str | None = None
    seed: int | None = None


def _wait_for_plan(storage: optuna.storages.BaseStorage, options: WorkerOptions, log: Callable[[str], None]) -> TuningPlan:
    plan = load_plan(storage, options.study_name)
    if plan is None:
        log(f"waiting for tuning '{options.study_name}' to be started in {redact_url(options.storage)}")
    while plan is None:
        time.sleep(1.0)
        plan = load_plan(storage, options.study_name)
    return plan


def _local_hosts() -> set[str]:
    name = socket.gethostname()
    return {name, name.split(".")[0], socket.getfqdn(), "localhost", "127.0.0.1"}


def work(options: WorkerOptions, *, observer: TuningObserver | None = None) -> TuningResult:
    """Join the tuning stored under ``options.study_name`` and run its experiments on this
    node's GPUs until it is done. Everything else comes from the plan in the storage."""
    observer = observer or PrintObserver()
    storage = create_storage(options.storage)
    plan = _wait_for_plan(storage, options, observer.log)
    user = parse_user_config(plan.user_config, path=plan.config_path, script_args=plan.script_args)
    for path, what in ((plan.cwd, "working directory"), (plan.script, "training script")):
        if not os.path.exists(path):
            raise ConfigError(
                f"the tuning's {what} {path} does not exist on this node: share it (NFS) or copy it to the same path"
            )
    os.chdir(plan.cwd)
    launcher = resolve_launcher(options.launcher) if options.launcher else plan.launcher
    if not os.path.exists(launcher[0]):
        launcher = resolve_launcher(None)
    planned = LauncherOptions(**plan.launcher_options)
    mine = options.launcher_options
    own_gpus = bool(mine.include or mine.exclude or mine.hostfile)
    launcher_options = dataclasses.replace(
        mine,
        num_gpus=mine.num_gpus if mine.num_gpus > 0 or own_gpus else planned.num_gpus,
        num_nodes=mine.num_nodes if mine.num_nodes > 0 or own_gpus else planned.num_nodes,
        master_port=mine.master_port if mine.master_port != LauncherOptions.master_port else planned.master_port,
        master_addr=mine.master_addr or planned.master_addr,
    )
    resources = discover_resources(launcher_options)
    if resources.multi_node and resources.nodes_per_experiment == 1:
        resources = resources.restricted_to(_local_hosts())
    runner = _runner(plan, user, resources, launcher, launcher_options)
    observer.log(f"worker for tuning '{plan.study_name}' in {redact_url(options.storage)}; script {plan.script}")
    tuning = Tuning(plan=plan, user=user, storage=storage, resources=resources, runner=runner, observer=observer,
                    seed=options.seed, worker=True)
    try:
        with _sigterm_raises():
            return tuning.run()
    except KeyboardInterrupt:
        observer.log("interrupted: this worker's experiments were ended and will run again elsewhere")
        raise


def _write_outputs(
    result: TuningResult,
    *,
    storage: optuna.storages.BaseStorage,
    plan: TuningPlan,
    user: UserConfig,
    options: TuneOptions,
    launcher: list[str],
    dp: int,
    url: str,
) -> TuneOutcome:
    results_dir = plan.results_dir
    advice = learning_rate_advice(result, user, data_parallel_size=max(1, dp // user.autotuning.mp_size))
    config = optimal_config(result)
    scaled = scale_learning_rate(advice, config=config, script_args=plan.script_args, user=user) if options.scale_lr and advice and config else None
    summary = write_summary(result, results_dir=results_dir, advice=scaled.note if scaled else advice)
    data = load_report(storage, plan.study_name, result=result)
    write_report(data, os.path.join(results_dir, "report.html"), summary=summary)
    register_with_dashboard(data, storage, note=summary_markdown(result, advice=scaled.note if scaled else advice))
    command: list[str] | None = None
    paths = None
    if config is not None:
        config_path = os.path.join(results_dir, "ds_config_optimal.json")
        command = [
            *launcher,
            *options.launcher_options.training_args(),
            plan.script,
            *_training_args(scaled.script_args if scaled else plan.script_args, config_path, user, config),
        ]
        paths = write_optimal(result, results_dir=results_dir, command=command, config=scaled.config if scaled else None,
                              comment=scaled.note if scaled and scaled.applied else None)
    return TuneOutcome(
        result=result,
        summary=summary,
        results_dir=results_dir,
        optimal_config_path=paths[0] if paths else None,
        optimal_cmd_path=paths[1] if paths else None,
        optimal_command=command,
        storage_url=url,
    )


def report(*, storage: str, study_name: str, output: str) -> str:
    """Write the HTML report of the tuning stored under ``study_name``; return its summary."""
    from optuna_ds.studies import load_result

    store = create_storage(storage)
    plan = load_plan(store, study_name)
    if plan is None:
        raise ConfigError(f"storage {redact_url(storage)} holds no tuning named '{study_name}'")
    user = parse_user_config(plan.user_config, path=plan.config_path, script_args=plan.script_args)
    result = load_result(store, plan, user)
    summary = summary_text(result, advice=None)
    write_report(load_report(store, study_name, result=result), output, summary=summary)
    return summary


def run_training(command: Sequence[str]) -> int:
    """Train with the optimal config, streaming its output; return its exit status.

    Interrupted (Ctrl-C or SIGTERM), it ends the training's process group and returns
    128 + the signal number.
    """
    proc = subprocess.Popen(list(command), start_new_session=True)
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if threading.current_thread() is threading.main_thread() else None
    try:
        return proc.wait()
    except KeyboardInterrupt as e:
        with deferred_signals():
            kill_process_group(proc.pid, leader=proc)
            proc.wait()
        return 128 + (e.signum if isinstance(e, TuningInterrupted) else signal.SIGINT)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


__all__ = ["OptunaDSError", "TuneOptions", "TuneOutcome", "TuningInterrupted", "WorkerOptions", "report", "run_training", "tune", "work"]
