from __future__ import annotations

import contextlib
import dataclasses
import glob
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence

import optuna

from optuna_ds._errors import ConfigError
from optuna_ds._errors import OptunaDSError
from optuna_ds._files import check_own_file
from optuna_ds.config import UserConfig
from optuna_ds.config import check_gpus
from optuna_ds.config import check_with_deepspeed
from optuna_ds.config import load_user_config
from optuna_ds.config import parse_user_config
from optuna_ds.launcher import CommandBuilder
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import MARK_VAR
from optuna_ds.launcher import ResultsFiles
from optuna_ds.launcher import LauncherOptions
from optuna_ds.launcher import Resources
from optuna_ds.launcher import check_ports
from optuna_ds.launcher import child_environment
from optuna_ds.launcher import deferred_signals
from optuna_ds.launcher import dies_with_this_process
from optuna_ds.launcher import cpu_ops_to_build
from optuna_ds.launcher import discover_resources
from optuna_ds.launcher import end_marked
from optuna_ds.launcher import import_deepspeed
from optuna_ds.launcher import kill_process_group
from optuna_ds.launcher import local_host_names
from optuna_ds.launcher import new_mark
from optuna_ds.launcher import ops_environment
from optuna_ds.reporting import Budget
from optuna_ds.reporting import learning_rate_advice
from optuna_ds.reporting import load_report
from optuna_ds.reporting import optimal_config
from optuna_ds.reporting import partial_summary
from optuna_ds.reporting import scale_learning_rate
from optuna_ds.reporting import register_with_dashboard
from optuna_ds.reporting import save_summary
from optuna_ds.reporting import write_optimal
from optuna_ds.reporting import write_report
from optuna_ds.reporting import summary_markdown
from optuna_ds.reporting import summary_text
from optuna_ds.reporting import write_summary
from optuna_ds.samplers import check_tuner_type
from optuna_ds.domain import ExperimentRecord
from optuna_ds.storage import DB_FILENAME
from optuna_ds.storage import GRACE_PERIOD
from optuna_ds.storage import NoDatabase
from optuna_ds.storage import TuningPlan
from optuna_ds.storage import check_study_name
from optuna_ds.storage import claim_folder
from optuna_ds.storage import create_storage
from optuna_ds.storage import default_storage_url
from optuna_ds.storage import delete_tuning
from optuna_ds.storage import load_plan
from optuna_ds.storage import redact_url
from optuna_ds.storage import storage_failures
from optuna_ds.storage import tuning_names
from optuna_ds.storage import tuning_study_names
from optuna_ds.studies import PrintObserver
from optuna_ds.studies import Tuning
from optuna_ds.studies import TuningObserver
from optuna_ds.studies import TuningResult
from optuna_ds.studies import live_trials
from optuna_ds.domain import is_finished_experiment


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


@dataclasses.dataclass(frozen=True)
class TuneOutcome:
    result: TuningResult
    summary: str
    results_dir: str
    optimal_config_path: str | None
    optimal_cmd_path: str | None
    optimal_command: list[str] | None
    storage_url: str


def resolve_deepspeed_bin(path: str | None) -> list[str]:
    """The ``deepspeed`` runner command: ``--deepspeed-bin``, else the one on PATH or beside this Python."""
    if path is None:
        beside = os.path.join(os.path.dirname(sys.executable), "deepspeed")
        found = shutil.which("deepspeed") or (beside if os.access(beside, os.X_OK) else None)
        if found is None:
            raise ConfigError("'deepspeed' not found on PATH: install deepspeed or pass --deepspeed-bin PATH")
        return [found]
    if not os.path.isfile(path):
        found = shutil.which(path)
        if found is None:
            raise ConfigError(f"--deepspeed-bin {path} not found")
        path = found
    if path.endswith(".py"):
        return [sys.executable, os.path.abspath(path)]
    if not os.access(path, os.X_OK):
        raise ConfigError(f"--deepspeed-bin {path} is not executable")
    return [os.path.abspath(path)]


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


def is_deepspeed_runner(command: Sequence[str]) -> bool:
    """Whether ``command`` is DeepSpeed's own ``deepspeed`` entry point (its console script),
    so that its per-node launcher can be started directly for single-node experiments."""
    try:
        with open(command[-1], "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b"from deepspeed.launcher.runner import main" in head


def _commands(plan: TuningPlan, user: UserConfig, resources: Resources, deepspeed_bin: list[str], options: LauncherOptions) -> CommandBuilder:
    return CommandBuilder(
        deepspeed_bin=tuple(deepspeed_bin),
        script=plan.script,
        script_args=tuple(plan.script_args),
        arg_mappings=dict(user.arg_mappings),
        options=options,
        hostfile=resources.hostfile if resources.multi_node else None,
    )


def _runner(plan: TuningPlan, user: UserConfig, resources: Resources, deepspeed_bin: list[str], options: LauncherOptions) -> ExperimentRunner:
    return ExperimentRunner(
        commands=_commands(plan, user, resources, deepspeed_bin, options),
        master_port=options.base_port,
        metric_key=user.autotuning.tuned_metric.key,
        exps_dir=plan.exps_dir,
        local_start=is_deepspeed_runner(deepspeed_bin),
    )


def _child_of(folder: str, path: str) -> bool:
    """Whether ``path`` is an entry directly inside ``folder``, links resolved."""
    return os.path.dirname(os.path.realpath(path)) == os.path.realpath(folder)


def _remove_previous_outputs(storage: optuna.storages.BaseStorage, study_name: str, results_dir: str, exps_dir: str) -> None:
    """``--overwrite``: delete the studies and the files of their experiments, nothing else.
    Refused while another process runs experiments of the tuning: they would go on in a
    tuning deleted under them."""
    studies = [optuna.load_study(study_name=name, storage=storage) for name in tuning_study_names(storage, study_name)]
    live = [(t, ExperimentRecord.from_trial(t)) for study in studies for t in live_trials(study)]
    if live:
        t, record = live[0]
        owner = record.worker if isinstance(record.worker, dict) else {}
        raise ConfigError(
            f"--overwrite: tuning '{study_name}' has {len(live)} experiment(s) running, {record.exp_name or f'trial {t.number}'} in "
            f"process {owner.get('pid', '?')} on {owner.get('host', '?')} (its heartbeat within {GRACE_PERIOD} s): stop its "
            "processes first, or rerun without --overwrite to join it"
        )
    dirs = set()
    for study in studies:
        for t in study.get_trials(deepcopy=False):
            record = ExperimentRecord.from_trial(t)
            if record.result_dir is not None:
                dirs.add((record.result_dir, record.exp_name or ""))
    dirs.add((os.path.join(results_dir, "profile_model_info"), "profile_model_info"))
    delete_tuning(storage, study_name)
    for result_dir, name in dirs:
        # The storage is not trusted to name what may be deleted: only our own folders.
        if _child_of(results_dir, result_dir):
            shutil.rmtree(result_dir, ignore_errors=True)
        description = os.path.join(exps_dir, f"{name}.json")
        if name and _child_of(exps_dir, description):
            try:
                os.remove(description)
            except OSError:
                pass
    for path in ResultsFiles(results_dir).outputs():
        try:
            os.remove(path)
        except OSError:
            pass


def tune(options: TuneOptions, *, observer: TuningObserver | None = None) -> TuneOutcome:
    """Find the fastest DeepSpeed configuration of ``options.script``.

    Resumes the tuning stored under ``options.study_name`` unless ``overwrite``. Progress goes
    to ``observer`` (plain lines on stdout by default).
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
    check_gpus(user, total_gpus=resources.total_gpus)
    check_ports(first=options.launcher_options.base_port, slots=len(resources.slots()))
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
    with storage_failures(url, advice=_RESUME):
        for folder, what in ((results_dir, "results_dir"), (exps_dir, "exps_dir")):
            claim_folder(folder, what=what, study_name=options.study_name, url=url, storage=storage)
        if overwrite:
            _remove_previous_outputs(storage, options.study_name, results_dir, exps_dir)
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
        )
        runner = _runner(plan, user, resources, deepspeed_bin, options.launcher_options)
        tuning = Tuning(plan=plan, user=user, storage=storage, resources=resources, runner=runner, observer=observer)
        log(f"storage {redact_url(url)}, study {options.study_name}; results in {results_dir}")
        if missing := cpu_ops_to_build():
            log(f"the first experiment builds DeepSpeed's CPU ops {', '.join(missing)} once, for this environment "
                "(about two minutes on 2 cores; `make venv` builds them beforehand)")
        try:
            with _sigterm_raises():
                result = tuning.run()
        except KeyboardInterrupt:
            # Interrupted is not done: a partial summary of what finished and no optimal config,
            # then the interrupt ends the process (130 or 143).
            resume = _resume_advice(options.overwrite, configured=a.overwrite)
            with deferred_signals():
                log(_write_partial(tuning.result(), storage=storage, plan=plan, resume=resume,
                                   budget=_budget(options, user, dp=resources.total_gpus)).rstrip())
                log(f"interrupted: running experiments were ended and will run again; {resume}")
            raise
        return _write_outputs(result, storage=storage, plan=plan, user=user, runner=runner, dp=resources.total_gpus, url=url,
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
    batch = user.train_batch_size or user.min_micro_batch_size * user.gradient_accumulation_steps * max(1, dp // user.autotuning.mp_size)
    samples = options.train_samples if options.train_steps is None else options.train_steps * batch
    return Budget(cost_per_gpu_hour=options.cost_per_gpu_hour, train_samples=samples, train_steps=options.train_steps)


def stale_build_locks() -> list[str]:
    """torch's extension build locks (``<op>/lock`` in the extension folder an experiment uses:
    :func:`ops_environment`'s, else torch's default) that no process of this node holds open. The process building an op holds
    its lock open until it removes it; one interrupted (Ctrl-C during the first experiment's
    build) leaves it behind, and every later experiment waits on it until its trial times out."""
    from torch.utils.cpp_extension import get_default_build_root

    root = ops_environment().get("TORCH_EXTENSIONS_DIR") or os.environ.get("TORCH_EXTENSIONS_DIR")
    pattern = os.path.join(glob.escape(root), "*", "lock") if root else \
        os.path.join(glob.escape(get_default_build_root()), "*", "*", "lock")
    # Only a lock of this user's (or root's view) can be proven stale: another user's build
    # holds it open in a process whose files this one may not look at.
    locks = {os.path.realpath(p) for p in glob.glob(pattern) if _provable(p)}
    # A lock seen, then released and removed by its build before the scan, was never stale.
    return sorted(p for p in locks - _open_files(locks) if os.path.lexists(p)) if locks else []


def _provable(path: str) -> bool:
    """Whether every process that could hold ``path`` open is one whose files we may read."""
    try:
        return os.geteuid() == 0 or os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


def _open_files(paths: set[str]) -> set[str]:
    """Which of ``paths`` some process of this node has open (those we may look at: ours)."""
    held = set()
    for fd_dir in glob.glob("/proc/[0-9]*/fd"):
        with contextlib.suppress(OSError):
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    if (target := os.readlink(os.path.join(fd_dir, fd))) in paths:
                        held.add(target)
    return held


def check_build_locks() -> None:
    """A stale build lock is one line now, not every experiment timed out waiting on it. Not in
    a worker: its extension folder may be shared (NFS) with the node whose experiment is
    building the op, a process this node cannot see."""
    stale = stale_build_locks()
    if stale:
        raise ConfigError(f"torch's extension build lock {stale[0]} was left by an interrupted build (no process holds it): every "
                          "experiment would wait on it until it times out; remove it and run again")


_PLAN_POLL_SECONDS = 0.2  # a waiting worker reads the plan this often: one small query
# What a user whose database failed mid-tuning is told.
_RESUME = "the experiments that finished are kept in it: run the same command again to resume"


class TuningInterrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the tuning is, so it unwinds like Ctrl-C: experiments are
    ended by process group and their trials marked ``interrupted``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# The terminal's descriptors, silenced once it hangs up (see _on_signal).
_terminal_fds: tuple[int, ...] = ()


def _on_signal(signum: int, _frame: object) -> None:
    if signum == signal.SIGHUP:
        # The terminal is gone (ssh dropped, window closed): writing to it fails (EIO), and the
        # summary and the interrupted trials must not die of a line nobody can read.
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in _terminal_fds:
            os.dup2(devnull, fd)
        os.close(devnull)
    raise TuningInterrupted(signum)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM and SIGHUP end the tuning as Ctrl-C does, not the process where it stands. A
    SIGHUP ignored when we started (``nohup``) stays ignored: the user asked to outlive the terminal."""
    global _terminal_fds
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signum == signal.SIGHUP and signal.getsignal(signum) is signal.SIG_IGN:
            continue
        previous[signum] = signal.signal(signum, _on_signal)
    _terminal_fds = tuple(fd for fd in (1, 2) if _isatty(fd))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
    """What ``optuna-ds worker`` was asked. Launcher options left unset (-1, empty) come from
    the tuning's plan, except the GPUs: a worker uses its own node's."""

    storage: str
    study_name: str
    launcher_options: LauncherOptions = LauncherOptions()
    deepspeed_bin: str | None = None
    wait: float = 300.0  # seconds to wait for the tuning to be started, and then for its profile run


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


def work(options: WorkerOptions, *, observer: TuningObserver | None = None) -> TuningResult:
    """Join the tuning stored under ``options.study_name`` and run its experiments on this
    node's GPUs until it is done. Everything else comes from the plan in the storage."""
    observer = observer or PrintObserver()
    check_study_name(options.study_name)
    if not (math.isfinite(options.wait) and options.wait >= 0):
        raise ConfigError(f"--wait must be a non-negative number of seconds, got {options.wait}")
    with storage_failures(options.storage, advice=_RESUME):
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
        check_gpus(user, total_gpus=resources.total_gpus)
        check_ports(first=launcher_options.base_port, slots=len(resources.slots()))
        runner = _runner(plan, user, resources, deepspeed_bin, launcher_options)
        observer.log(f"worker for tuning '{plan.study_name}' in {redact_url(options.storage)}; script {plan.script}")
        tuning = Tuning(plan=plan, user=user, storage=storage, resources=resources, runner=runner, observer=observer,
                        worker=True, wait=options.wait)
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
    runner: ExperimentRunner,
    dp: int,
    url: str,
    scale_lr: bool,
    budget: Budget,
) -> TuneOutcome:
    results_dir = plan.results_dir
    files = ResultsFiles(results_dir)
    advice = learning_rate_advice(result, user, data_parallel_size=max(1, dp // user.autotuning.mp_size))
    config = optimal_config(result)
    scaled = scale_learning_rate(advice, config=config, script_args=plan.script_args, user=user) if scale_lr and advice and config else None
    summary = write_summary(result, results_dir=results_dir, advice=scaled.note if scaled else advice, budget=budget)
    data = load_report(storage, plan.study_name, result=result, advice=scaled.note if scaled else advice, budget=budget)
    write_report(data, files.report)
    register_with_dashboard(data, storage, note=summary_markdown(result, advice=scaled.note if scaled else advice, budget=budget))
    command: list[str] | None = None
    written = None
    if config is not None:
        commands = runner.commands if scaled is None else dataclasses.replace(runner.commands, script_args=tuple(scaled.script_args))
        command = commands.training(config=scaled.config if scaled else config, config_path=files.optimal_config)
        written = write_optimal(result, results_dir=results_dir, command=command, config=scaled.config if scaled else None,
                                comment=scaled.note if scaled and scaled.applied else None)
    return TuneOutcome(
        result=result,
        summary=summary,
        results_dir=results_dir,
        optimal_config_path=written[0] if written else None,
        optimal_cmd_path=written[1] if written else None,
        optimal_command=command,
        storage_url=url,
    )


def _resume_advice(overwrite: bool | None, *, configured: bool) -> str:
    """How to resume: the same command, unless it would start afresh and delete what finished."""
    if overwrite:
        return "rerun the same command without --overwrite to resume"
    if overwrite is None and configured:
        return "rerun the same command with --no-overwrite to resume (autotuning.overwrite would start afresh)"
    return "rerun the same command to resume"


def _write_partial(result: TuningResult, *, storage: optuna.storages.BaseStorage, plan: TuningPlan, resume: str,
                   budget: Budget) -> str:
    """An interrupted tuning's summary, report and dashboard note, marked partial, and no
    optimal config: the search has not ended."""
    data = load_report(storage, plan.study_name, result=result)
    finished = sum(is_finished_experiment(t) for study in data.studies.values() for t in study.get_trials(deepcopy=False))
    summary = partial_summary(result, finished=finished, resume=resume, budget=budget)
    text = save_summary(summary.text, results_dir=plan.results_dir)
    data = dataclasses.replace(data, headline=summary.head, notes=summary.notes)
    write_report(data, ResultsFiles(plan.results_dir).report)
    register_with_dashboard(data, storage, note=summary.markdown)
    return text


def report(*, storage: str, study_name: str, output: str) -> str:
    """Write the HTML report of the tuning stored under ``study_name``; return its summary."""
    from optuna_ds.studies import load_result

    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        raise ConfigError(f"cannot write the report {output}: folder {folder} does not exist")
    store = create_storage(storage, create=False)
    with storage_failures(storage, advice="run the same command again once it accepts connections"):
        plan = load_plan(store, study_name)
        if plan is None:
            raise ConfigError(f"storage {redact_url(storage)} holds no tuning named '{study_name}'")
        user = parse_user_config(plan.user_config, path=plan.config_path, script_args=plan.script_args)
        result = load_result(store, plan, user)
        summary = summary_text(result, advice=None)
        data = load_report(store, study_name, result=result)
        try:
            write_report(data, output)
        except OSError as e:
            raise ConfigError(f"cannot write the report {output}: {e.strerror or e}") from None
        return summary


def run_training(command: Sequence[str]) -> int:
    """Train with the optimal config, streaming its output; return its exit status.

    Interrupted (Ctrl-C, SIGTERM or SIGHUP), it ends the training's process group and returns
    128 + the signal number. It also ends with this process, however it dies.
    """
    mark = new_mark()
    env = child_environment(**ops_environment(), **{MARK_VAR: mark})
    proc = subprocess.Popen(dies_with_this_process(command), start_new_session=True, env=env)
    try:
        with _sigterm_raises():
            return proc.wait()
    except KeyboardInterrupt as e:
        with deferred_signals():
            kill_process_group(proc.pid, leader=proc)
            proc.wait()
            end_marked(mark)
        return 128 + (e.signum if isinstance(e, TuningInterrupted) else signal.SIGINT)


__all__ = ["OptunaDSError", "TuneOptions", "TuneOutcome", "TuningInterrupted", "WorkerOptions", "report", "run_training", "tune", "work"]
