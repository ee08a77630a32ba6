from __future__ import annotations

import functools
import json
import os
import socket
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds._files import UnsafeFileError
from optuna_ds._files import read_file
from optuna_ds._optuna_compat import stale_trial_ids
from optuna_ds._optuna_compat import storage_of
from optuna_ds._optuna_compat import trial_id
from optuna_ds.config import Metric
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import FailureReason
from optuna_ds.launcher import ExperimentFiles
from optuna_ds.launcher import StepMeasurement
from optuna_ds.launcher import end_marked
from optuna_ds.launcher import kill_process_group
from optuna_ds.launcher import read_finished


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_identity(pid: int) -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": pid, "started": _start_time(pid)}


def this_process() -> dict[str, Any]:
    return process_identity(os.getpid())


def dead(owner: dict[str, Any]) -> bool:
    """Whether the process that ran a trial is known to be gone. Only a process on this host
    can be checked; elsewhere the storage's heartbeat decides."""
    if owner.get("host") != socket.gethostname():
        return False
    pid = int(owner.get("pid", 0))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    started = owner.get("started")
    return started is not None and _start_time(pid) not in (None, started)


def live_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The running trials of ``study`` whose process is alive: on this host by its pid,
    elsewhere by a heartbeat within the grace period."""
    stale = stale_trial_ids(study)
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if trial_id(t) not in stale
            and not (isinstance(worker := ExperimentRecord.from_trial(t).worker, dict) and dead(worker))]


def _folder_mark(record: ExperimentRecord) -> str | None:
    """The token of the launch that last wrote the trial's experiment folder (its exp.json)."""
    try:
        mark = json.loads(read_file(ExperimentFiles(str(record.result_dir)).exp)).get("mark")
    except (OSError, ValueError, AttributeError, UnsafeFileError):  # AttributeError: exp.json holds no object
        return None
    return mark if isinstance(mark, str) and mark else None


def _finished_result(record: ExperimentRecord, metric: Metric) -> tuple[dict[str, Any], StepMeasurement] | None:
    """The metrics an orphaned experiment wrote after its process died, with its steps: it ran
    to the end and measured, so it is a result, whoever was watching it.

    Only while the folder is still this trial's launch's: a launch deletes the metrics file
    before it starts and then names itself in exp.json, so metrics read before exp.json is seen
    to name this trial's token are this launch's. A folder another launch took since (another
    process of the tuning, another tool) is not this trial's result, nor a folder of a trial
    whose token was not recorded.
    """
    if not record.launched or not isinstance(record.result_dir, str) or not record.mark:
        return None
    finished = read_finished(record.result_dir, metric=metric, ds_config=record.ds_config or {})
    return finished if _folder_mark(record) == record.mark else None


def fail_orphaned_trials(study: optuna.Study, *, metric: Metric) -> tuple[list[int], list[int], list[int]]:
    """Settle the running trials whose process died on this host (killed with SIGKILL, say).

    An experiment that finished meanwhile and wrote its metrics completes its trial with them.
    An experiment such a process left running is ended first, by its process group; metrics it
    wrote before it ended still count. Otherwise the trial fails at once (not after the
    heartbeat's grace period): its experiment counts as not run, and the planner decides afresh
    whether it runs (a size you listed does; a knob setting or a re-measurement may no longer
    pay). A trial whose process died between its claim and its launch is such a trial too, one
    that launched nothing (:func:`given_up` does not count it). A trial whose process died
    after taking it but before claiming an experiment (no ``exp_name``) fails too, lost like the
    others but with no experiment: it launched nothing, cost no GPU time, and no one counts it
    as an experiment (the report, the summary, the planner and :func:`given_up` read claimed
    trials only). Returns the numbers of the trials completed, of those failed after their
    claim, and of those failed before it.
    """
    completed: list[int] = []
    failed: list[int] = []
    unclaimed: list[int] = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        record = ExperimentRecord.from_trial(t)
        if not (isinstance(record.worker, dict) and dead(record.worker)):
            continue
        experiment = record.experiment_process
        if isinstance(experiment, dict) and not dead(experiment):
            # End the orphan first, then read: metrics it wrote before it ended are a result,
            # even when written a moment before its exit.
            kill_process_group(int(experiment["pid"]))
        finished = _finished_result(record, metric)
        # The token from the storage, never from the folder, which another launch may have
        # rewritten: its processes are not this trial's to end.
        mark = record.mark
        storage = storage_of(study)
        set_user_attr = functools.partial(storage.set_trial_user_attr, trial_id(t))
        try:
            if finished is not None:
                metrics, measured = finished
                ExperimentRecord(metrics=metrics, recovered="its process died; the experiment finished and wrote its metrics",
                                 **measured.to_attrs()).write(set_user_attr)
                storage.set_trial_state_values(trial_id(t), TrialState.COMPLETE, [measured.value])
                completed.append(t.number)
                if mark:
                    end_marked(mark)  # what it left running outside its group
                continue
            detail = ("its process died" if record.launched else "its process died before it launched its experiment") \
                if record.claimed else "its process died before it claimed an experiment"
            ExperimentRecord(reason=FailureReason.INTERRUPTED, detail=detail, lost=True).write(set_user_attr)
            storage.set_trial_state_values(trial_id(t), TrialState.FAIL)
        except RuntimeError:
            continue  # finished meanwhile
        if mark:
            end_marked(mark)  # and what it started outside the group
        (failed if record.claimed else unclaimed).append(t.number)
    return completed, failed, unclaimed
