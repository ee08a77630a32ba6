"""What a tuning leaves in its results folder: written when it ends or is interrupted, rewritten
by ``optuna-ds report``, deleted by ``--overwrite``."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Iterator

import optuna

from optuna_ds._errors import ConfigError
from optuna_ds._errors import ResultsError
from optuna_ds.config import UserConfig
from optuna_ds.config import parse_user_config
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import is_finished_experiment
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import ResultsFiles
from optuna_ds.reporting import Budget
from optuna_ds.reporting import LearningRateAdvice
from optuna_ds.reporting import learning_rate_advice
from optuna_ds.reporting import load_report
from optuna_ds.reporting import optimal_config
from optuna_ds.reporting import partial_summary
from optuna_ds.reporting import register_with_dashboard
from optuna_ds.reporting import save_summary
from optuna_ds.reporting import scale_learning_rate
from optuna_ds.reporting import summary_markdown
from optuna_ds.reporting import summary_text
from optuna_ds.reporting import write_optimal
from optuna_ds.reporting import write_report
from optuna_ds.reporting import write_summary
from optuna_ds.storage import GRACE_PERIOD
from optuna_ds.storage import TuningPlan
from optuna_ds.storage import create_storage
from optuna_ds.storage import delete_tuning
from optuna_ds.storage import load_plan
from optuna_ds.storage import redact_url
from optuna_ds.storage import storage_failures
from optuna_ds.storage import tuning_study_names
from optuna_ds.studies import TuningResult
from optuna_ds.studies import checkpointing_space
from optuna_ds.studies import script_switches
from optuna_ds.studies import live_trials
from optuna_ds.studies import load_result


@dataclasses.dataclass(frozen=True)
class TuneOutcome:
    result: TuningResult
    summary: str
    results_dir: str
    optimal_config_path: str | None
    optimal_cmd_path: str | None
    optimal_command: list[str] | None
    storage_url: str


def _child_of(folder: str, path: str) -> bool:
    """Whether ``path`` is an entry directly inside ``folder``, links resolved."""
    return os.path.dirname(os.path.realpath(path)) == os.path.realpath(folder)


def remove_previous_outputs(storage: optuna.storages.BaseStorage, study_name: str, results_dir: str, exps_dir: str) -> None:
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


@contextlib.contextmanager
def _writing(path: str, *, kept: str) -> Iterator[None]:
    """An :class:`OSError` inside the block (a full disk, a folder turned read-only) becomes one
    :class:`ResultsError` naming the file that could not be written (the error's, else
    ``path``) and what is ``kept``."""
    try:
        yield
    except OSError as e:
        raise ResultsError(f"cannot write {e.filename if isinstance(e.filename, str) else path}: {e.strerror or e}; {kept}: fix it and run the same command again to "
                           "write it (nothing runs again)") from None


def write_outputs(
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
    advice = learning_rate_advice(result, user, data_parallel_size=max(1, dp // (user.autotuning.mp_size * user.own_autotp_size)))
    config = optimal_config(result)
    scaled = scale_learning_rate(advice, config=config, script_args=plan.script_args, user=user) if scale_lr and isinstance(advice, LearningRateAdvice) and config else None
    note = scaled.note if scaled else advice
    command: list[str] | None = None
    written = None
    if config is not None:
        commands = runner.commands if scaled is None else dataclasses.replace(runner.commands, script_args=tuple(scaled.script_args))
        # The optimum's script switches (checkpointing through arg_mappings) go on its command line.
        switches = script_switches(checkpointing_space(user), result.best.config) if result.best is not None else {}
        command = commands.training(config=scaled.config if scaled else config, config_path=files.optimal_config, switches=switches)
        with _writing(files.optimal_config, kept="its experiments are kept"):
            written = write_optimal(result, results_dir=results_dir, command=command, config=scaled.config if scaled else None,
                                    comment=scaled.note if scaled and scaled.applied else None)
    kept = f"{os.path.basename(files.optimal_config)} and {os.path.basename(files.optimal_cmd)} are written" if written else "its experiments are kept"
    with _writing(files.summary, kept=kept):
        summary = write_summary(result, results_dir=results_dir, advice=note, budget=budget)
    data = load_report(storage, plan.study_name, result=result, advice=note, budget=budget)
    with _writing(files.report, kept=kept):
        write_report(data, files.report)
    register_with_dashboard(data, storage, note=summary_markdown(result, advice=note, budget=budget))
    return TuneOutcome(
        result=result,
        summary=summary,
        results_dir=results_dir,
        optimal_config_path=written[0] if written else None,
        optimal_cmd_path=written[1] if written else None,
        optimal_command=command,
        storage_url=url,
    )


def write_partial(result: TuningResult, *, storage: optuna.storages.BaseStorage, plan: TuningPlan, resume: str,
                   budget: Budget) -> str:
    """An interrupted tuning's summary, report and dashboard note, marked partial, and no
    optimal config: the search has not ended. Returns the summary to show, whose last line names
    each file that could not be written (a full disk, a folder turned read-only): the others are
    written, and the interrupt goes on (what finished is in the storage, not in these files)."""
    data = load_report(storage, plan.study_name, result=result)
    finished = sum(is_finished_experiment(t) for study in data.studies.values() for t in study.get_trials(deepcopy=False))
    summary = partial_summary(result, finished=finished, resume=resume, budget=budget)
    files = ResultsFiles(plan.results_dir)
    unwritten: list[str] = []
    try:
        text = save_summary(summary.text, results_dir=plan.results_dir)
    except OSError as e:
        text = summary.text
        unwritten.append(_unwritten(e, files.summary))
    data = dataclasses.replace(data, headline=summary.head, notes=summary.notes)
    try:
        write_report(data, files.report)
    except OSError as e:
        unwritten.append(_unwritten(e, files.report))
    register_with_dashboard(data, storage, note=summary.markdown)
    if unwritten:
        text = (f"{text.rstrip()}\ncannot write {'; nor '.join(unwritten)}: the experiments that "
                "finished are kept\n")
    return text


def _unwritten(error: OSError, path: str) -> str:
    """The file ``error`` could not write (its own, else ``path``) and why, in a few words."""
    name = error.filename if isinstance(error.filename, str) else path
    return f"{name} ({error.strerror or error})"


def report(*, storage: str, study_name: str, output: str) -> str:
    """Write the HTML report of the tuning stored under ``study_name``; return its summary."""
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
