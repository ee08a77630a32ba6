"""One experiment as a trial of its stage study: claimed, run through the launcher, its record and
outcome stored on the trial; and the planner's experiments, one such trial each."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
import shlex
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.distributions import CategoricalDistribution
from optuna.distributions import IntDistribution
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds._errors import OptunaDSError
from optuna_ds._errors import ResourceError
from optuna_ds._errors import ResultsError
from optuna_ds._errors import ScriptError
from optuna_ds._optuna_compat import heartbeat
from optuna_ds._optuna_compat import storage_of
from optuna_ds._optuna_compat import trial_id
from optuna_ds.domain import GAS_KEY
from optuna_ds.domain import MBS_KEY
from optuna_ds.domain import Config
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import ExperimentResult
from optuna_ds.domain import FailureReason
from optuna_ds.domain import Phase
from optuna_ds.config import Metric
from optuna_ds.domain import Experiment
from optuna_ds.launcher import ExperimentFiles
from optuna_ds.launcher import Judge
from optuna_ds.launcher import Lease
from optuna_ds.launcher import StepMeasurement
from optuna_ds.launcher import deferred_signals
from optuna_ds.launcher import measure_steps
from optuna_ds.launcher import later_window
from optuna_ds.launcher import profile_window
from optuna_ds.launcher import profiled_steps
from optuna_ds.launcher import still_falling
from optuna_ds.launcher import read_finished
from optuna_ds.launcher import new_mark
from optuna_ds.launcher import shell_line
from optuna_ds.studies._incumbent import IncumbentPruner
from optuna_ds.space import KnobSpace
from optuna_ds.storage import GRACE_PERIOD
from optuna_ds.storage import TrialCache
from optuna_ds.storage import database_error
from optuna_ds.storage import open_stage_study
from optuna_ds.studies._claims import Reaper
from optuna_ds.studies._claims import competitor
from optuna_ds.studies._context import StageContext
from optuna_ds.studies._owner import process_identity
from optuna_ds.studies._owner import this_process
from optuna_ds.studies._pruning import LiveReport
from optuna_ds.studies._pruning import live_judge


class UnreadableTrial(OptunaDSError):
    """A settled trial claims an experiment the planner wants, with a record it cannot read."""


@dataclasses.dataclass
class Attempt:
    """One trial as its objective left it."""

    launched: bool = False
    competitor: FrozenTrial | None = None  # the trial it stood down to
    stops: ExperimentResult | None = None  # failed whatever its config (the script, the node's ports, the machine): the tuning stops


def _store(trial: optuna.Trial, record: ExperimentRecord) -> None:
    """Write ``record`` to the trial: in one transaction where the storage allows (``exp_name``
    is then seen with the rest of its claim), else field by field, ``exp_name`` last."""
    storage = storage_of(trial.study)
    if isinstance(storage, TrialCache):
        storage.set_trial_user_attrs(trial_id(trial), record.attrs())
    else:
        record.write(trial.set_user_attr)


def _keep_stale(study: optuna.Study, trial: optuna.Trial, outcome: ExperimentRecord, *, value: float | None) -> int:
    """Keep the run of ``trial``, which another process failed as stale while its experiment ran
    (no heartbeat for the grace period: this process was stopped, or the database away), in a
    trial of its own: its record, the outcome, and ``recovered`` saying why; the stale trial, of
    the same launch (``mark``), then counts for nothing (:func:`superseded`). Returns its number.
    Optuna never changes a finished trial, so the stale one cannot be given the result itself."""
    stale = storage_of(study).get_trial(trial_id(trial))
    why = (f"trial {stale.number} was failed as stale (no heartbeat for {GRACE_PERIOD} s) while its experiment ran; "
           "the experiment finished: its result is kept here")
    attrs = {**stale.user_attrs, **dataclasses.replace(outcome, recovered=why).attrs()}
    attrs["exp_name"] = attrs.pop("exp_name")  # last, as in every record
    kept = FrozenTrial(
        number=-1, trial_id=-1, state=TrialState.COMPLETE if value is not None else TrialState.FAIL, value=value,
        datetime_start=stale.datetime_start, datetime_complete=datetime.datetime.now(), params=stale.params,
        distributions=stale.distributions, user_attrs=attrs, system_attrs={}, intermediate_values={},
    )
    study.add_trial(kept)
    return max(t.number for t in study.get_trials(deepcopy=False) if ExperimentRecord.from_trial(t).recovered == why)


def _measured_before_the_end(experiment: Experiment, *, metric: Metric, since: float) -> tuple[dict[str, Any], StepMeasurement] | None:
    """The metrics an interrupted run wrote, with its steps; ``None`` where it wrote none whole.
    The runner deletes the folder's metrics file before it launches: one written ``since`` the
    run began (``time.time()``) is this launch's."""
    try:
        if os.stat(ExperimentFiles(experiment.result_dir).metrics).st_mtime < since:
            return None
    except OSError:
        return None
    return read_finished(experiment.result_dir, metric=metric, ds_config=experiment.ds_config)


def run_trial(study: optuna.Study, objective: Callable[[optuna.Trial], float], trial: optuna.Trial | None = None) -> None:
    """One trial of ``objective`` (on ``trial``, taken from the queue, else a new one), as
    ``study.optimize(n_trials=1)`` runs one, with a heartbeat
    that a database away for a while does not end (:func:`heartbeat`). The trial ends as the
    objective says (a value, NaN for a failure, :class:`optuna.TrialPruned`, an exception raised
    on), unless another process failed it as stale meanwhile: that is not undone, and a trial
    another process failed is never told again (Optuna's optimize raised "Cannot tell a FAIL trial")."""
    trial = trial if trial is not None else study.ask()
    try:
        with heartbeat(study, trial, transient=lambda e: database_error(e) is not None):
            value = objective(trial)
    except optuna.TrialPruned:
        study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
        return
    except optuna.exceptions.UpdateFinishedTrialError:
        return  # failed as stale by another process while it held it: its experiment runs again
    except BaseException:
        with contextlib.suppress(Exception):  # the objective's error is the one to tell (a failed database's, as it may be)
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        raise
    if math.isfinite(value):
        study.tell(trial, value, skip_if_finished=True)
    else:
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)


# What a run can break, as Optuna constraints (Optuna's system attr ``constraints``, a list): the
# device's memory, and the trial timeout.
CONSTRAINTS = (FailureReason.OOM, FailureReason.TIMEOUT)
_CONSTRAINTS_KEY = "constraints"
# How often a run whose steps still fall is measured again, its window later (docs/steps.md).
_WINDOW_MOVES = 2
OFFLOAD_PARAM = "offload"  # the param a stage study records the offload variant under
_NO_OFFLOAD = "none"  # its value for none, as the dashboard shows it


def stage_distributions(*, mbs_high: int, gas_high: int, offloads: Sequence[str], space: KnobSpace,
                        checkpointing: Mapping[str, Sequence[Any]] | None = None) -> dict[str, BaseDistribution]:
    """The params of a stage study's trials, each with one distribution for the whole study, so
    optuna-dashboard's plots and importances (PED-ANOVA groups trials by distribution) and
    ``optuna best-trial`` read it as any Optuna study: the micro-batch size and accumulation up
    to ``mbs_high`` and ``gas_high``, the offload variant among ``offloads`` (labels, ``""`` for
    none) where the stage has several, and each knob tuned with or without offload among its values,
    each checkpointing setting among its (``checkpointing``)."""
    distributions: dict[str, BaseDistribution] = {MBS_KEY: IntDistribution(1, mbs_high), GAS_KEY: IntDistribution(1, gas_high)}
    if len(offloads) > 1:
        distributions[OFFLOAD_PARAM] = CategoricalDistribution([label or _NO_OFFLOAD for label in offloads])
    distributions.update({k: CategoricalDistribution(v) for k, v in space.dimensions.items()})
    distributions.update({k: CategoricalDistribution(list(v)) for k, v in (checkpointing or {}).items()})
    return distributions


def record_params(trial: optuna.Trial, config: Config, distributions: Mapping[str, BaseDistribution]) -> None:
    """Record ``config`` as ``trial``'s params, with the study's distributions: the values the
    planner chose, set, not sampled (a knob the config leaves at DeepSpeed's default has none)."""
    values: dict[str, Any] = {MBS_KEY: config.micro_batch, GAS_KEY: config.accumulation,
                              OFFLOAD_PARAM: config.offload or _NO_OFFLOAD, **config.knob_dict}
    storage, number = storage_of(trial.study), trial_id(trial)
    for name, value in values.items():
        distribution = distributions.get(name)
        if distribution is not None:
            storage.set_trial_param(number, name, distribution.to_internal_repr(value), distribution)


_Hold = Callable[[contextlib.ExitStack], Any]  # takes the signals a launch holds, until its trial is told


@dataclasses.dataclass
class _Launches:
    """What the launches of one trial showed: each profiled step's figure by its global step,
    and where its steps still fell, each launch's window (its fall, or why it failed)."""

    figures: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    windows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    live: LiveReport = dataclasses.field(default_factory=LiveReport)  # reported as they ran

    @property
    def warmup(self) -> dict[str, Any] | None:
        """The record's ``warmup``: the windows, and whether the last one held."""
        if not self.windows:
            return None
        return {"windows": self.windows, "settled": self.windows[-1].get("fell") == 0.0}


class StageExperiments:
    """Runs the experiments of one ZeRO stage in its own Optuna study, one trial each.

    The planner decides every experiment, knob settings included (:meth:`run`: trials with fixed
    params, :func:`record_params`). Everything is read back from the storage, so a rerun
    continues where it stopped. A trial claims its experiment by name, and of two claimants of
    one experiment one runs it and the other stands down (:func:`competitor`): any number of
    slots, of this process and of workers elsewhere, can run the same stage.

    Every study of a stage this process opens shares :attr:`study`'s storage cache, which reads
    again only the trials that are new or still running: a step reads little however many trials
    the study has.
    """

    def __init__(self, *, ctx: StageContext, tuning: str, stage: int, space: KnobSpace,
                 distributions: Mapping[str, BaseDistribution]) -> None:
        self._ctx = ctx
        self._stage = stage
        storage = TrialCache(ctx.storage) if isinstance(ctx.storage, optuna.storages.RDBStorage) else ctx.storage
        self._study = open_stage_study(storage, tuning=tuning, stage=stage, direction=ctx.metric.direction)
        self._study.pruner = IncumbentPruner()  # asked while a run runs (studies/_pruning.py)
        self._space = space
        self._reaper = Reaper(self._study, stage=stage, metric=ctx.metric, observer=ctx.observer)
        self._distributions = distributions
        self._settled: set[int] = set()  # settled trials the planner's experiments stood down to
        self.reap(force=True)

    @property
    def study(self) -> optuna.Study:
        return self._study

    def reap(self, *, force: bool = False) -> None:
        """Fail the trials of dead workers so that their experiments run again (:meth:`Reaper.reap`)."""
        self._reaper.reap(force=force)

    def run(self, config: Config, lease: Lease, *, free_since: float, repeat: int = 0, why: str = "",
            trial: optuna.Trial | None = None) -> bool:
        """Run the planner's experiment of ``config`` on ``lease``, one trial (``trial``, taken
        from the queue, else a new one), and say whether it launched (not where it stood down);
        ``repeat``: how many times it ran before;
        ``free_since``: when the slot became free (``time.monotonic()``), the start of the
        decision the observer is told the time of; ``why``: the planner's reason for it, which
        its line on screen carries."""
        self._reaper.reap()
        attempt = Attempt()
        # From its launcher's exit until its trial is told, SIGINT, SIGTERM and SIGHUP wait: a run
        # that finished is stored as it measured, then the tuning ends (one landing as the last
        # experiment ended lost its result, and the resumed tuning ran it again).
        with contextlib.ExitStack() as held:
            run_trial(self._study, self._objective(config, lease, attempt, free_since=free_since, repeat=repeat, why=why,
                                                   hold_signals=held.enter_context), trial)
        failed = attempt.stops
        # Recorded (reason "port", "machine" or "script", run again on resume); the other slots are stopped.
        if failed is not None and failed.reason is FailureReason.MACHINE:
            raise ResultsError(f"{failed.name} failed for the machine, not its config ({failed.detail}): it counts as no "
                               "result; fix it and run the same command again to resume, and it runs again")
        if failed is not None and failed.reason is FailureReason.PORT:
            raise ResourceError(f"{failed.name}: {failed.detail}: free ports there or pass another --master_port, then run "
                                "the same command again; the experiment runs then")
        if failed is not None:
            raise ScriptError(
                f"{failed.name} failed whatever its config ({failed.detail}): every experiment would; "
                f"fix the script, its arguments or its environment and run again -- see "
                f"{self._ctx.builder.result_dir(failed.name)}/stderr.log"
            )
        self._check_settled(attempt.competitor)
        return attempt.launched

    def _objective(self, config: Config, lease: Lease, attempt: Attempt, *, free_since: float,
                   repeat: int, why: str = "", hold_signals: _Hold | None = None,
                   ) -> Callable[[optuna.Trial], float]:
        """The trial of ``config``: the objective closes over the planner's config, and its trial
        records it (:func:`record_params`); no sampler is asked anything."""
        ctx = self._ctx
        space = self._space.with_offload(config.offload) if config.offload else self._space
        phase = Phase.KNOBS if config.knobs.zero else Phase.MICRO_BATCH  # checkpointing, like offload, is the size search's

        # A trial that stands down is pruned: Optuna's optimize knows no other way than its
        # objective raising TrialPruned.
        def objective(trial: optuna.Trial) -> float:
            ExperimentRecord(worker=this_process()).write(trial.set_user_attr)
            record_params(trial, config, self._distributions)
            experiment = ctx.builder.build(config, phase=phase, space=space, repeat=repeat)
            slot = lease.slot.include
            mark = new_mark()  # this trial's launch: a resumed tuning tells its processes and files by it
            _store(trial, ExperimentRecord.claim(experiment, slot=slot, repeat=repeat, mark=mark, timeout=ctx.timeout))  # the claim
            previous = competitor(self._study, trial, experiment.name, timeout=ctx.timeout)
            if previous is not None:
                ExperimentRecord(duplicate_of=previous.number).write(trial.set_user_attr)
                attempt.competitor = previous
                raise optuna.TrialPruned(f"{experiment.name} already ran as trial {previous.number}")
            # Checked after the claim is published, as tune publishes its end before it reads the
            # trials: of the two, at least one sees the other (tune waits for this experiment).
            owner = ctx.ending_tune()
            if owner is not None:
                ExperimentRecord(ended_by=owner).write(trial.set_user_attr)
                raise optuna.TrialPruned(f"{experiment.name}: tune is ending the tuning")
            ctx.observer.decided(stage=self._stage, number=trial.number, name=experiment.name, seconds=time.monotonic() - free_since)
            ctx.observer.started(stage=self._stage, number=trial.number, name=experiment.name, slot=slot, why=why)
            attempt.launched = True
            result, measured, runs = self._measure(trial, experiment, lease, mark=mark, hold_signals=hold_signals,
                                                   protected=bool(repeat) or ctx.protected(config))
            engine = measured.value if measured is not None and measured.exit_off else None
            outcome = ExperimentRecord.outcome(result, warmup=runs.warmup, engine_figure=engine,
                                               **(measured.to_attrs() if measured else {}))
            try:
                _store(trial, outcome)
            except optuna.exceptions.UpdateFinishedTrialError:
                value = measured.figure(ctx.metric) if measured else None
                kept = _keep_stale(self._study, trial, outcome, value=value)
                ctx.observer.log(f"[z{self._stage}] trial {trial.number}: failed as stale by another process while its experiment "
                                 f"ran (no heartbeat for {GRACE_PERIOD} s); the experiment finished: result kept as trial {kept}")
                ctx.observer.finished(stage=self._stage, number=trial.number, name=experiment.name, value=value,
                                      duration=result.duration, outcome=f"kept as trial {kept}")
                raise
            # Optuna's constraints, in the list form optuna-dashboard reads (``constraints``): each
            # positive where the run broke it, so the dashboard marks the trial infeasible.
            broken = [1.0 if result.reason is reason else 0.0 for reason in CONSTRAINTS]
            storage_of(trial.study).set_trial_system_attr(trial_id(trial), _CONSTRAINTS_KEY, broken)
            if result.reason is FailureReason.PRUNED:
                # Its partial figure kept (the record's ``pruned``): the planner reads it as a
                # measurement of fewer steps (docs/steps.md).
                ExperimentRecord(pruned=runs.live.pruned_attrs()).write(trial.set_user_attr)
                ctx.observer.finished(stage=self._stage, number=trial.number, name=experiment.name, value=None,
                                      duration=result.duration, outcome=f"pruned ({result.detail})")
                raise optuna.TrialPruned(result.detail)
            if not result.ok:
                assert result.reason is not None
                ctx.observer.finished(stage=self._stage, number=trial.number, name=experiment.name, value=None,
                                      duration=result.duration, outcome=f"failed ({result.reason.value}: {result.detail})")
                if result.stderr_tail:
                    ctx.observer.detail("\n".join("  | " + line for line in result.stderr_tail.splitlines()[-5:]))
                if result.reason in (FailureReason.SCRIPT, FailureReason.PORT, FailureReason.MACHINE):
                    attempt.stops = result
                return math.nan  # Optuna records the trial as failed; the reason is in its user attrs
            assert measured is not None
            value = measured.figure(ctx.metric)
            # Optuna's intermediate values: the dashboard draws each run's steps.
            for step, figure in runs.figures:
                if step not in runs.live.figures:  # reported as it ran
                    trial.report(figure, step)
            ctx.observer.finished(stage=self._stage, number=trial.number, name=experiment.name, value=value,
                                  duration=result.duration, outcome=f"{ctx.metric.key}={value:.4g}")
            return value

        return objective

    def _measure(self, trial: optuna.Trial, experiment: Experiment, lease: Lease, *, mark: str,
                 hold_signals: _Hold | None, protected: bool = False,
                 ) -> tuple[ExperimentResult, StepMeasurement | None, _Launches]:
        """Run ``experiment`` for ``trial``, again with its profiled window later where its steps
        still fell (:func:`still_falling`), at most ``_WINDOW_MOVES`` times: the launch that
        stands (its duration all of theirs), its steps, and what the launches showed. The last
        launch's signals are handed to ``hold_signals``, held until the trial is told."""
        ctx = self._ctx
        launch, moves, seconds = experiment, 0, 0.0
        earlier: tuple[ExperimentResult, StepMeasurement | None, Experiment] | None = None
        runs = _Launches()
        while True:
            with contextlib.ExitStack() as local:
                judge = live_judge(trial, launch, metric=ctx.metric, report=runs.live, protected=protected)
                result, measured = self._launch(trial, launch, lease, mark=mark, held=local, judge=judge)
                seconds += result.duration
                steps = list(profile_window(launch.ds_config))
                if earlier is not None and not result.ok:
                    # A later window that failed (its longer run timed out, say) judges nothing:
                    # the launch before it stands, its steps still falling.
                    why = result.reason.value if result.reason else "error"
                    runs.windows.append({"steps": steps, "failed": why})
                    (result, measured, launch), fell = earlier, None
                    _store(trial, ExperimentRecord(ds_config=launch.ds_config))
                else:
                    fell = still_falling(measured.step_times_ms) if measured else None
                    if measured is not None:
                        runs.figures += measured.figures(ctx.metric, first_step=steps[0])
                        if fell is not None or runs.windows:
                            runs.windows.append({"steps": steps, "fell": round(fell or 0.0, 3)})
                if fell is None or moves >= _WINDOW_MOVES:
                    if hold_signals is not None:
                        hold_signals(local.pop_all())
                    return dataclasses.replace(result, duration=seconds), measured, runs
                # Measured again later in the run: a signal held meanwhile lands as the hold ends.
                try:
                    local.close()
                except BaseException:
                    ExperimentRecord(reason=FailureReason.INTERRUPTED).write(trial.set_user_attr)
                    raise
            earlier = (result, measured, launch)
            launch = dataclasses.replace(launch, ds_config=later_window(launch.ds_config))
            moves += 1
            start, end = profile_window(launch.ds_config)
            ctx.observer.log(f"[z{self._stage}] trial {trial.number}: {experiment.name}'s step times "
                             f"still fell {fell:.0%} across its profiled steps: measured again at "
                             f"steps {start}-{end}")
            _store(trial, ExperimentRecord(ds_config=launch.ds_config))

    def _launch(self, trial: optuna.Trial, experiment: Experiment, lease: Lease, *, mark: str,
                held: contextlib.ExitStack, judge: Judge | None = None) -> tuple[ExperimentResult, StepMeasurement | None]:
        """One launch of ``experiment`` for ``trial``, and its steps where it measured; from its
        launcher's exit, SIGINT, SIGTERM and SIGHUP wait in ``held``. Whatever ends the launch (a
        signal, the stop) leaves the trial marked, with the metrics it wrote before the end."""
        ctx = self._ctx
        began = time.time()
        try:
            result = ctx.runner.run(
                experiment,
                slot=lease.slot,
                slot_index=lease.index,
                timeout=ctx.timeout,
                on_start=lambda pid: ExperimentRecord(
                    experiment_process=process_identity(pid)).write(trial.set_user_attr),
                on_command=lambda cmd: ctx.observer.detail(
                    f"  cd {shlex.quote(os.getcwd())} && {shell_line(cmd)}"),
                on_retry=lambda why: ctx.observer.log(
                    f"[z{self._stage}] trial {trial.number}: {why}"),
                stop=ctx.stop,
                pass_fds=lease.fds,
                mark=mark,
                on_exit=lambda: held.enter_context(deferred_signals()),
                judge=judge,
            )
        except optuna.exceptions.UpdateFinishedTrialError:
            raise  # failed as stale before its launch was recorded: the runner ended the launch
        except BaseException:  # noqa: BLE001 - re-raised: whatever ends the run leaves its trial marked
            with deferred_signals():
                # Its metrics written before the end (the run had measured, its launcher not
                # yet seen to exit): a result, kept and told, as an orphan's is.
                before = _measured_before_the_end(experiment, metric=ctx.metric, since=began)
                if before is not None:
                    metrics, steps = before
                    kept = ExperimentRecord(metrics=metrics, recovered="interrupted after it measured",
                                            **steps.to_attrs())
                    _store(trial, kept)
                    self._study.tell(trial, steps.value)
                else:
                    ExperimentRecord(reason=FailureReason.INTERRUPTED).write(trial.set_user_attr)
            raise
        if not result.ok:
            return result, None
        return result, measure_steps(metric=ctx.metric, metrics=result.metrics,
                                     logged=result.logged_steps,
                                     profiled=profiled_steps(experiment.ds_config))

    def _check_settled(self, competitor: FrozenTrial | None) -> None:
        """The planner asks again only for an experiment it saw no result of: standing down twice
        to the same settled trial means the planner cannot read that trial's record (another tool
        wrote it), and asking again would only add a pruned trial each time, for ever."""
        if competitor is None or competitor.state == TrialState.RUNNING:
            return
        if competitor.number in self._settled:
            raise unreadable(self._study, competitor)
        self._settled.add(competitor.number)


def unreadable(study: optuna.Study, settled: FrozenTrial) -> UnreadableTrial:
    """The error for ``settled``, a finished trial of ``study`` claiming an experiment with a
    record the planner cannot read."""
    name = ExperimentRecord.from_trial(settled).exp_name
    return UnreadableTrial(
        f"trial {settled.number} of study '{study.study_name}' claims experiment {name} but holds no result "
        "optuna-ds can read (another tool wrote it): optuna-ds will neither run that experiment again nor "
        "change the trial; choose another --study-name"
    )


def check_unreadable(study: optuna.Study, name: str) -> None:
    """Raise :class:`UnreadableTrial` where a trial of ``study`` (of any process) stood down to
    a settled trial claiming experiment ``name``: the decider, asked for ``name`` again with
    nothing new, tells the cause from the storage, whichever process's slot stood down."""
    trials = study.get_trials(deepcopy=False)
    by_number = {t.number: t for t in trials}
    for t in trials:
        of = ExperimentRecord.from_trial(t).duplicate_of
        settled = by_number.get(of) if of is not None else None
        if (settled is not None and settled.state not in (TrialState.RUNNING, TrialState.WAITING)
                and ExperimentRecord.from_trial(settled).exp_name == name):
            raise unreadable(study, settled)
