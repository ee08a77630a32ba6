from __future__ import annotations

import functools
import signal
import sys
import tempfile
import threading
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import click

from optuna_ds._errors import OptunaDSError
from optuna_ds._text import clean_text
from optuna_ds._text import one_line

_PASS_THROUGH = {"ignore_unknown_options": True, "allow_interspersed_args": False, "help_option_names": ["-h", "--help"]}


def _refuse(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    from optuna_ds.launcher import REFUSED_FLAGS

    if value not in (None, False):
        flag = param.opts[0]
        raise click.UsageError(f"{flag} cannot be honoured: {REFUSED_FLAGS[flag]}")
    return value


_LAUNCHER_GROUP = "DeepSpeed launcher options"


class _LauncherOption(click.Option):
    """A flag of DeepSpeed's launcher, shown in a group of its own."""

    group = _LAUNCHER_GROUP


class _GroupedCommand(click.Command):
    """Help with the command's own options first, then DeepSpeed's launcher flags in their group."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {"Options": [], _LAUNCHER_GROUP: []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None  # arguments: in the usage
            if record is not None:
                groups[getattr(param, "group", "Options")].append(record)
        for title, records in groups.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


def _launcher_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Every flag of DeepSpeed's launcher, in its spelling (short forms included) and the dashed one."""
    option = functools.partial(click.option, cls=_LauncherOption)
    options = [
        option("-H", "--hostfile", type=click.Path(dir_okay=False), default=None, help="DeepSpeed hostfile (default /job/hostfile if present)."),
        option("-i", "--include", default="", help="GPUs to use, e.g. localhost:0,1 or worker-0@worker-1:0,2."),
        option("-e", "--exclude", default="", help="GPUs not to use, same syntax as --include."),
        option("--num_nodes", "--num-nodes", "num_nodes", type=int, default=-1, help="Nodes per experiment (default: all)."),
        option("--num_gpus", "--num-gpus", "--num_accelerators", "--num-accelerators", "num_gpus", type=int, default=-1,
                     help="GPUs per experiment per node (default: all)."),
        option("--master_port", "--master-port", "master_port", type=int, default=None,
                     help="Rendezvous port of the first slot's experiments (default 29500); the optimal command keeps it only if given."),
        option("--master_addr", "--master-addr", "master_addr", default="", help="Rendezvous address for multi-node experiments."),
        option("--launcher", default="pdsh", show_default=True, help="DeepSpeed's multi-node backend: pdsh, openmpi, mvapich, slurm, mpich, impi."),
        option("--launcher_args", "--launcher-args", "launcher_args", default="", help="Arguments of the multi-node backend, as one quoted string."),
        option("--module", is_flag=True, help="Run the script as a Python module (python -m)."),
        option("--no_python", "--no-python", "no_python", is_flag=True, help="Execute the script directly, without python."),
        option("--no_local_rank", "--no-local-rank", "no_local_rank", is_flag=True, help="Do not pass --local_rank to the script."),
        option("--no_ssh_check", "--no-ssh-check", "no_ssh_check", is_flag=True, help="Skip DeepSpeed's ssh check of multi-node experiments."),
        option("--force_multi", "--force-multi", "force_multi", is_flag=True, help="Use the multi-node backend even for one node."),
        option("--save_pid", "--save-pid", "save_pid", is_flag=True, help="DeepSpeed's pid file, for the final training."),
        option("--enable_each_rank_log", "--enable-each-rank-log", "enable_each_rank_log", default="None",
                     help="Directory of per-rank logs (each experiment in its own subfolder)."),
        option("--bind_cores_to_rank", "--bind-cores-to-rank", "bind_cores_to_rank", is_flag=True, help="Bind each rank to its own cores."),
        option("--bind_core_list", "--bind-core-list", "bind_core_list", default=None, help="Cores to bind to, e.g. 1,3-5,7."),
        option("--ssh_port", "--ssh-port", "ssh_port", type=int, default=None, help="SSH port of multi-node experiments."),
        option("--venv_script", "--venv-script", "venv_script", default=None, help="Virtual environment activation script of multi-node experiments."),
        option("--log_level", "--log-level", "log_level", default="info", show_default=True, help="Log level of DeepSpeed's launcher."),
        option("--no_ssh", "--no-ssh", "no_ssh", is_flag=True, hidden=True, expose_value=False, callback=_refuse),
        option("--node_rank", "--node-rank", "node_rank", default=None, hidden=True, expose_value=False, callback=_refuse),
        option("--autotuning", default=None, hidden=True, expose_value=False, callback=_refuse),
    ]
    for decorator in reversed(options):
        f = decorator(f)
    return f


def _deepspeed_bin_option(help: str) -> Callable[..., Any]:
    return click.option("--deepspeed-bin", "--deepspeed_bin", "deepspeed_bin", default=None, help=help)


def _launcher_options_of(kwargs: dict[str, Any]) -> Any:
    import dataclasses

    from optuna_ds.launcher import LauncherOptions

    return LauncherOptions(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(LauncherOptions)})


def _check_script(script: str) -> None:
    """An unknown option before SCRIPT arrives as SCRIPT (options pass through to the script after
    it): refused as click refuses one, with its did-you-mean."""
    if script.startswith("-"):
        import difflib

        ctx = click.get_current_context()
        name = script.split("=", 1)[0]
        known = [o for p in ctx.command.params if not getattr(p, "hidden", False) for o in (*p.opts, *p.secondary_opts)]
        raise click.NoSuchOption(name, possibilities=difflib.get_close_matches(name, known, n=1), ctx=ctx)


def _tuner_options(f: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--storage", default=None, envvar="OPTUNA_STORAGE", show_envvar=True, help="Optuna RDB storage URL (default: SQLite inside results_dir)."),
        click.option("--study-name", "--study_name", "study_name", default="optuna-ds", show_default=True, help="Name of the tuning; stage studies are NAME-z<stage>."),
        click.option("--results-dir", "--results_dir", "results_dir", default=None, help="Overrides autotuning.results_dir."),
        click.option("--exps-dir", "--exps_dir", "exps_dir", default=None, help="Overrides autotuning.exps_dir."),
        click.option("--overwrite/--no-overwrite", default=None, help="Start afresh instead of resuming (overrides autotuning.overwrite)."),
        click.option("--trial-timeout", "--trial_timeout", "trial_timeout", type=float, default=None, help="Seconds before an experiment is killed (default: derived from the profile run)."),
        _deepspeed_bin_option("The deepspeed executable (default: deepspeed on PATH)."),
        click.option("--scale-lr", "--scale_lr", "scale_lr", is_flag=True, help="Write the learning rate scaled to the best global batch size into the optimal config or command."),
        click.option("--memory-margin", "--memory_margin", "memory_margin", type=float, default=0.05, show_default=True,
                     help="Share of each device's memory the chosen config leaves free (a run above the rest counts as out of memory)."),
        click.option("--cost-per-gpu-hour", "--cost_per_gpu_hour", "cost_per_gpu_hour", type=float, default=None,
                     help="Price of one device-hour: the summary gives the tuning's cost and the training's in money."),
        click.option("--train-samples", "--train_samples", "train_samples", type=int, default=None,
                     help="Samples of the real training: the summary gives its time and cost with your config and with the optimum."),
        click.option("--train-steps", "--train_steps", "train_steps", type=int, default=None,
                     help="Or its optimizer steps at your config's global batch size."),
        click.option("-q", "--quiet", is_flag=True, help="Print only the summary."),
        click.option("-v", "--verbose", is_flag=True, help="Also print each command and the end of each failure's stderr."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def misplaced_option_hint(message: str, *, script: str, script_args: tuple[str, ...],
                          options: set[str]) -> str:
    """A hint where ``message`` (why the tuning failed) names an optuna-ds option that came after
    the script, so that it went to the script (``--num_gpus 2 train.py`` is optuna-ds's,
    ``train.py --num_gpus 2`` the script's); ``""`` where none does."""
    for arg in script_args:
        name = arg.split("=", 1)[0]
        if name in options and name in message:
            return (f"{name} is an optuna-ds option, but it came after {script}, so it went to the "
                    f"script: put it before {script}")
    return ""


def _tune_from_cli(kwargs: dict[str, Any], script: str, script_args: tuple[str, ...]) -> Any:
    from optuna_ds._tune import TuneOptions
    from optuna_ds._tune import tune
    from optuna_ds.reporting import Progress

    _quiet_optuna()
    progress = Progress(quiet=kwargs.pop("quiet"), verbose=kwargs.pop("verbose"))
    _check_script(script)
    launcher_options = _launcher_options_of(kwargs)
    options = TuneOptions(script=script, script_args=list(script_args), launcher_options=launcher_options, **kwargs)
    try:
        outcome = tune(options, observer=progress)
    except OptunaDSError as e:
        params = click.get_current_context().command.params
        known = {o for p in params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}
        hint = misplaced_option_hint(str(e), script=script, script_args=script_args, options=known)
        if hint:
            e.args = (f"{e}; {hint}",)
        raise
    finally:
        progress.close()
    _say(outcome.summary.rstrip())
    if outcome.optimal_config_path:
        _say(f"Wrote {outcome.optimal_config_path} and {outcome.optimal_cmd_path}")
    return outcome


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="optuna-ds")
def cli() -> None:
    """Find the fastest DeepSpeed configuration for a training script, with Optuna."""


@cli.command(cls=_GroupedCommand, context_settings=_PASS_THROUGH)
@_launcher_options
@_tuner_options
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def tune(script: str, script_args: tuple[str, ...], **kwargs: Any) -> None:
    """Find the optimal DeepSpeed config of SCRIPT: the drop-in for `deepspeed --autotuning tune`.

    SCRIPT ARGS must name the DeepSpeed config: --deepspeed ds_config.json or
    --deepspeed_config ds_config.json.
    """
    outcome = _tune_from_cli(kwargs, script, script_args)
    if outcome.optimal_config_path is None:
        sys.exit(1)


@cli.command(cls=_GroupedCommand, context_settings=_PASS_THROUGH)
@_launcher_options
@_tuner_options
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def run(script: str, script_args: tuple[str, ...], **kwargs: Any) -> None:
    """Tune SCRIPT, then train with the optimal config: the drop-in for `deepspeed --autotuning run`.

    Exits with the training's exit status.
    """
    from optuna_ds._tune import run_training

    outcome = _tune_from_cli(kwargs, script, script_args)
    if outcome.optimal_command is None:
        sys.exit(1)
    from optuna_ds.launcher import shell_line

    _say("Training with the optimal config: " + shell_line(outcome.optimal_command))
    sys.exit(run_training(outcome.optimal_command))


@cli.command(cls=_GroupedCommand)
@_launcher_options
@click.option("--storage", required=True, envvar="OPTUNA_STORAGE", show_envvar=True, help="The tuning's Optuna storage URL, as given to `optuna-ds tune`.")
@click.option("--study-name", "--study_name", "study_name", default="optuna-ds", show_default=True, help="The tuning's name.")
@_deepspeed_bin_option("The deepspeed executable (default: the tuning's, else deepspeed on PATH).")
@click.option("--wait", type=float, default=300.0, show_default=True,
              help="Seconds to wait for the tuning to be started, and then for its profile run, before giving up.")
@click.option("-q", "--quiet", is_flag=True, help="Print only warnings.")
@click.option("-v", "--verbose", is_flag=True, help="Also print each command and the end of each failure's stderr.")
def worker(storage: str, study_name: str, deepspeed_bin: str | None, wait: float, quiet: bool, verbose: bool,
           **launcher_kwargs: Any) -> None:
    """Join a tuning started by `optuna-ds tune`: run its experiments on this node's GPUs.

    The plan (script, arguments, config, stages) comes from the storage; the script must be
    at the same path here (a shared file system or a copy). Waits up to --wait seconds if the
    tuning has not been started yet (naming the tunings the storage holds); exits 0 once it is done.
    """
    from optuna_ds._tune import WorkerOptions
    from optuna_ds._tune import work
    from optuna_ds.reporting import Progress

    _quiet_optuna()
    progress = Progress(quiet=quiet, verbose=verbose)
    options = WorkerOptions(storage=storage, study_name=study_name, launcher_options=_launcher_options_of(launcher_kwargs),
                            deepspeed_bin=deepspeed_bin, wait=wait)
    try:
        outcome = work(options, observer=progress)
    finally:
        progress.close()
    choice = outcome.choice
    _say(f"tuning '{study_name}' is done" + (f": optimum {choice['name']} {choice['figure']} (tune's choice)" if choice else
                                           f"; tune chooses its optimum and writes it to {outcome.results_dir}"))


@cli.command()
@click.option("--storage", required=True, envvar="OPTUNA_STORAGE", show_envvar=True, help="The tuning's Optuna storage URL.")
@click.option("--study-name", "--study_name", "study_name", default="optuna-ds", show_default=True)
@click.option("-o", "--output", default="report.html", show_default=True, type=click.Path(dir_okay=False))
def report(storage: str, study_name: str, output: str) -> None:
    """Write a self-contained HTML report of a tuning: plots and every experiment."""
    from optuna_ds._tune import report as write

    _quiet_optuna()
    summary = write(storage=storage, study_name=study_name, output=output)
    _say(summary.rstrip())
    _say(f"Wrote {output}")


@cli.command()
@click.argument("storage_url", metavar="[STORAGE]", required=False)
@click.option("--storage", default=None, envvar="OPTUNA_STORAGE", show_envvar=True, help="The tuning's Optuna storage URL (or give it as STORAGE).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; localhost unless told otherwise.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
def dashboard(storage_url: str | None, storage: str | None, host: str, port: int) -> None:
    """Serve optuna-dashboard on the tuning's storage, as `optuna-dashboard STORAGE` does."""
    import bottle
    import optuna_dashboard

    from optuna_ds.reporting import best_stage_study
    from optuna_ds.reporting import opening_on
    from optuna_ds.storage import create_storage
    from optuna_ds.storage import redact_url

    _quiet_optuna()
    storage = storage_url or storage
    if storage is None:
        raise click.UsageError("give the storage: optuna-ds dashboard STORAGE, --storage URL or OPTUNA_STORAGE")
    _check_bindable(host, port)
    store = create_storage(storage, create=False)
    _say(f"optuna-dashboard on http://{host}:{port}/ for {redact_url(storage)} (Ctrl-C to stop)")
    best = best_stage_study(store)
    app = optuna_dashboard.wsgi(store)
    if best is not None:
        _say(f"best experiments: http://{host}:{port}/dashboard/studies/{best[0]} ({best[1]})")
        app = opening_on(app, f"/dashboard/studies/{best[0]}")
    try:
        bottle.run(app, host=host, port=port)
    except OSError as e:
        raise click.UsageError(f"cannot serve on {host}:{port}: {e.strerror or e}") from None


def _quiet_optuna() -> None:
    """Heartbeats and metric names are Optuna's experimental features, relied on knowingly:
    their warnings are ours to know, not the user's."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def _check_bindable(host: str, port: int) -> None:
    """Bind once before serving, so a port in use or a bad host is one line, not a traceback."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except (OSError, UnicodeError) as e:
        raise click.UsageError(f"cannot serve on {host}:{port}: {getattr(e, 'strerror', None) or e}") from None


def _interrupted(cause: BaseException | None) -> None:
    from optuna_ds._tune import TuningInterrupted

    signum = cause.signum if isinstance(cause, TuningInterrupted) else signal.SIGINT
    click.echo(f"optuna-ds: interrupted by {signal.Signals(signum).name}", err=True)
    sys.exit(128 + signum)


def _say(text: str, *, err: bool = False) -> None:
    """Print ``text`` for the user: it quotes their paths, names and config, cleaned of what
    would drive their terminal."""
    click.echo(clean_text(text), err=err)


def _error(message: str) -> None:
    from optuna_ds._redact import redact_text

    _say(one_line(redact_text(message)), err=True)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: bad input is one line on stderr and exit status 2, never a traceback."""
    threading.excepthook = _thread_failed
    try:
        cli.main(args=argv, prog_name="optuna-ds", standalone_mode=False)
    except click.exceptions.UsageError as e:
        ctx = f" ({e.ctx.command_path})" if e.ctx is not None else ""
        _error(f"optuna-ds: error{ctx}: {e.format_message()}")
        sys.exit(2)
    except click.exceptions.Abort as e:  # click's wrapping of KeyboardInterrupt
        _interrupted(e.__cause__)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        _error(f"optuna-ds: error: {e.format_message()}")
        sys.exit(e.exit_code)
    except OptunaDSError as e:
        _error(f"optuna-ds: error: {e}")
        sys.exit(e.exit_code)
    except KeyboardInterrupt as e:
        _interrupted(e)
    except Exception as e:  # a bug of ours: one line, and the traceback kept for the report
        _crashed(e)
        sys.exit(1)
    sys.exit(0)


def _crashed(e: BaseException, *, where: str = "") -> None:
    from optuna_ds._redact import redact_text

    with tempfile.NamedTemporaryFile("w", prefix="optuna-ds-crash-", suffix=".log", delete=False) as f:
        f.write(redact_text("".join(traceback.format_exception(e))))
    _error(f"optuna-ds: internal error{where}: {type(e).__name__}: {e} (traceback in {f.name})")


def _thread_failed(args: threading.ExceptHookArgs) -> None:
    """A helper thread's failure (a trial's heartbeat): a failure of the storage is left to
    the main thread, which meets the same storage and says it once; anything else is one line."""
    from optuna_ds.storage import database_error

    if args.exc_value is None or isinstance(args.exc_value, SystemExit) or database_error(args.exc_value) is not None:
        return
    _crashed(args.exc_value, where=f" in thread {args.thread.name if args.thread else '?'}")

