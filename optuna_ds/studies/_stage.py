from __future__ import annotations

import dataclasses
import enum
import itertools
import json
import threading
import os
import shlex
import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.config import GAS_KEY
from optuna_ds.config import MBS_KEY
from optuna_ds.config import Metric
from optuna_ds.launcher import ExperimentResult
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import FailureReason
from optuna_ds.launcher import Phase
from optuna_ds.launcher import Lease
from optuna_ds.launcher import SlotPool
from optuna_ds.launcher import shell_line
from optuna_ds.pruners import TunerEarlyStoppingPruner
from optuna_ds.samplers import create_sampler
from optuna_ds.space import KnobSpace
from optuna_ds.space import recommended_knobs
from optuna_ds.storage import ExperimentRecord
from optuna_ds.storage import database_error
from optuna_ds.studies._builder import ExperimentBuilder
from optuna_ds.studies._observer import TuningObserver
from optuna_ds.studies._owner import fail_orphaned_trials
from optuna_ds.studies._owner import process_identity
from optuna_ds.studies._owner import this_process
from optuna_ds.studies._results import given_up
from optuna_ds.studies._results import is_finished_experiment

_MAX_CONSECUTIVE_DUPLICATES = 50
_SAMPLER_DUPLICATES = 3
_REAP_SECONDS = 2.0
_CLAIM_WAIT_SECONDS = 10.0
_DECISION_LOG_VAR = "OPTUNA_DS_DECISION_LOG"
_decision = threading.local()  # when this slot became free: the decision's start


class Step(enum.Enum):
    """What one step of a stage did."""

    RAN = "ran"  # a trial was run (or lost its claim to another worker)
    WAIT = "wait"  # nothing to start until an experiment running elsewhere finishes
    DONE = "done"  # the stage is tuned: nothing left to run, nothing running


class Stopped(Exception):
    """The tuning was stopped (Ctrl-C, SIGTERM, or another driver failed)."""


class ExperimentFailed(Exception):
    """Raised by the objective so that Optuna records the trial as failed; the reason is in
    the trial's user attrs."""

    def __init__(self, result: ExperimentResult) -> None:
        super().__init__(f"{result.reason.value if result.reason else 'failed'}: {result.detail}")
        self.result = result


class KnobSearch(enum.Enum):
    """How much of a stage's knob space to search."""

    NONE = "none"
    RECOMMENDED = "recommended"  # DeepSpeed's recommended setting only: one experiment
    FULL = "full"  # the recommended setting, then the sampler until early stopping


@dataclasses.dataclass(frozen=True)
class StageContext:
    """What every stage of one tuning shares."""

    storage: optuna.storages.BaseStorage
    builder: ExperimentBuilder
    runner: ExperimentRunner
    pool: SlotPool
    stop: threading.Event
    metric: Metric
    tuner_type: str
    fast: bool
    num_tuning: int
    early_stopping: int
    num_trials: int
    mbs_high: int
    gas_high: int
    timeout: float | None
    observer: TuningObserver
    seed: int | None = None


def _log_decision(*, stage: int, number: int, name: str) -> None:
    """With ``OPTUNA_DS_DECISION_LOG=<path>``, append how long this slot took from becoming free
    (:func:`decision_started`) to launching: the decision's cost that `make bench-parallel` reports."""
    path = os.environ.get(_DECISION_LOG_VAR)
    start = getattr(_decision, "start", None)
    if not path or start is None:
        return
    entry = {"pid": os.getpid(), "stage": stage, "trial": number, "name": name, "seconds": round(time.monotonic() - start, 6)}
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def decision_started() -> None:
    """Mark the start of a decision on this slot's thread, for :func:`_log_decision`."""
    _decision.start = time.monotonic()


def run_trial(study: optuna.Study, objective: Callable[[optuna.Trial], float], *, catch: tuple[type[Exception], ...]) -> None:
    """One trial of ``objective`` with Optuna's heartbeat. When the storage fails both to record
    the trial and to read it back, Optuna's ``_run_trial`` raises ``UnboundLocalError`` from its
    ``finally`` (optuna/optuna#5280): the storage's error is raised instead, so that the user
    is told the database failed, not shown a bug."""
    try:
        study.optimize(objective, n_trials=1, catch=catch, gc_after_trial=False)
    except UnboundLocalError as e:
        if e.__context__ is None or database_error(e.__context__) is None:
            raise
        raise e.__context__  # noqa: B904 - with its own cause, the driver's error


class StageTuner:
    """Runs the experiments of one ZeRO stage in its own Optuna study, one trial per experiment.

    The planner decides the micro-batch experiments (:meth:`run_micro_batch`, trials with fixed
    params); the knob search (:meth:`step_knobs`, unless in fast mode) runs DeepSpeed's
    recommended setting at the best size, then the ``tuner_type`` sampler over the best sizes,
    until :class:`TunerEarlyStoppingPruner` prunes the next trial or the space is exhausted.
    Everything is read back from the storage at every step, so a rerun continues where it
    stopped and any number of slots (of this process, of workers elsewhere) can run the same
    stage: a trial claims its experiment by name, and of two claimants of one experiment one runs
    it and the other stands down (:meth:`_competitor`).
    """

    def __init__(self, *, ctx: StageContext, study_name: str, stage: int, space: KnobSpace,
                 knobs: KnobSearch = KnobSearch.NONE, sizes: tuple[int, ...] = ()) -> None:
        self._ctx = ctx
        self._knobs = knobs
        self._sizes = sizes
        self._study_name = study_name
        self._stage = stage
        self._space = space
        self._duplicates = 0
        self._stood_down = False
        self._early_stopped = False
        self._reaped = 0.0
        self.study = optuna.create_study(
            storage=ctx.storage, study_name=study_name, direction=ctx.metric.direction, load_if_exists=True
        )
        self._reap(force=True)

    @property
    def stage(self) -> int:
        return self._stage

    @property
    def space(self) -> KnobSpace:
        return self._space

    def with_knobs(self, knobs: KnobSearch, *, sizes: tuple[int, ...], offload: str = "") -> StageTuner:
        """This stage's tuner searching as much of the knob space as ``knobs`` says, at the
        micro-batch ``sizes`` (best first) and with the offload variant the choice has."""
        space = self._space.with_offload(offload) if offload else self._space
        return StageTuner(ctx=self._ctx, study_name=self._study_name, stage=self._stage, space=space,
                          knobs=knobs, sizes=sizes)

    # -- reading the study ------------------------------------------------------------------

    def _trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    @staticmethod
    def _running(trials: list[FrozenTrial], phase: Phase) -> list[FrozenTrial]:
        # A claimed record has all its claim's attrs (ExperimentRecord writes exp_name last).
        return [t for t in trials if t.state == TrialState.RUNNING
                and (r := ExperimentRecord.from_trial(t)).phase is phase and r.claimed]

    def _reap(self, *, force: bool = False) -> None:
        """Fail the trials of dead workers so that their experiments run again: at once for a
        process of this host, after the heartbeat's grace period for one elsewhere."""
        now = time.monotonic()
        if not force and now - self._reaped < _REAP_SECONDS:
            return
        self._reaped = now
        completed, failed = fail_orphaned_trials(self.study, metric=self._ctx.metric)
        for number in completed:
            self._ctx.observer.log(f"[z{self._stage}] trial {number}: its process died, but its experiment finished: result kept")
        for number in failed:
            self._ctx.observer.log(f"[z{self._stage}] trial {number}: its process died; its experiment will run again")
        optuna.storages.fail_stale_trials(self.study)

    def _competitor(self, trial: optuna.Trial, name: str) -> FrozenTrial | None:
        """Another trial that has this experiment, so this one must stand down; ``None`` if
        this trial may run it.

        Called after this trial published its claim (``exp_name``), so of two simultaneous
        claimants at least one sees the other. A claimant yields to a finished or launched
        competitor and to a later-numbered one; it waits for the fate of an earlier-numbered
        one still claiming. So never two run one experiment, and never both stand down.
        """
        deadline = time.monotonic() + _CLAIM_WAIT_SECONDS
        while True:
            trials = self._trials()
            dead = given_up(trials)
            if name in dead:
                return dead[name]
            undecided = None
            for t in trials:
                record = ExperimentRecord.from_trial(t)
                if t.number == trial.number or record.exp_name != name:
                    continue
                if is_finished_experiment(t):
                    return t
                if t.state == TrialState.RUNNING:
                    if t.number > trial.number or record.launched:
                        return t
                    undecided = t
            if undecided is None:
                return None
            if time.monotonic() > deadline:
                return undecided
            time.sleep(0.05)

    # -- running one trial ------------------------------------------------------------------

    def _objective(self, phase: Phase, tuning_list: list[int], lease: Lease, *, space: KnobSpace | None = None,
                   repeat: int = 0) -> Callable[[optuna.Trial], float]:
        ctx = self._ctx
        space = space or self._space

        def objective(trial: optuna.Trial) -> float:
            ExperimentRecord(worker=this_process()).write(trial.set_user_attr)
            if phase is Phase.MICRO_BATCH:
                mbs = trial.suggest_int(MBS_KEY, 1, ctx.mbs_high)
                knobs: dict[str, Any] = {}
            else:
                mbs = trial.suggest_int(MBS_KEY, min(tuning_list), max(tuning_list))
                knobs = {k: trial.suggest_categorical(k, choices) for k, choices in space.tuned.items()}
            gas = ctx.builder.gas_for(mbs)
            if phase is Phase.KNOBS:
                trial.suggest_int(GAS_KEY, gas, gas)  # derived from mbs: recorded, not sampled
            else:
                trial.suggest_int(GAS_KEY, 1, ctx.gas_high)
            experiment = ctx.builder.build(stage=self._stage, phase=phase, mbs=mbs, gas=gas, space=space, knobs=knobs,
                                           repeat=repeat)
            slot = lease.slot.include
            ExperimentRecord.claim(experiment, slot=slot, offload=space.offload, repeat=repeat).write(trial.set_user_attr)  # exp_name last: the claim
            previous = self._competitor(trial, experiment.name)
            if previous is not None:
                ExperimentRecord(duplicate_of=previous.number).write(trial.set_user_attr)
                self._stood_down = True
                raise optuna.TrialPruned(f"{experiment.name} already ran as trial {previous.number}")
            if phase is Phase.KNOBS and trial.should_prune():  # tuner_early_stopping, tuner_num_trials
                ExperimentRecord(early_stopped=True).write(trial.set_user_attr)
                self._early_stopped = True
                raise optuna.TrialPruned("the knob search is over")
            _log_decision(stage=self._stage, number=trial.number, name=experiment.name)
            ctx.observer.started(stage=self._stage, number=trial.number, name=experiment.name, slot=slot)
            port = ctx.runner.port(lease.index)
            ctx.observer.detail(f"  cd {shlex.quote(os.getcwd())} && {shell_line(ctx.runner.command(experiment, experiment.files.ds_config, slot=lease.slot, port=port))}")
            try:
                result = ctx.runner.run(
                    experiment,
                    slot=lease.slot,
                    slot_index=lease.index,
                    timeout=ctx.timeout,
                    on_start=lambda pid: ExperimentRecord(experiment_process=process_identity(pid)).write(trial.set_user_attr),
                    stop=ctx.stop,
                    pass_fds=lease.fds,
                )
            except BaseException:
                ExperimentRecord(reason=FailureReason.INTERRUPTED).write(trial.set_user_attr)
                raise
            ExperimentRecord.outcome(result).write(trial.set_user_attr)
            if not result.ok:
                assert result.reason is not None
                ctx.observer.finished(stage=self._stage, number=trial.number, name=experiment.name, value=None,
                                      duration=result.duration, outcome=f"failed ({result.reason.value}: {result.detail})")
                if result.stderr_tail:
                    ctx.observer.detail("\n".join("  | " + line for line in result.stderr_tail.splitlines()[-5:]))
                raise ExperimentFailed(result)
            value = float(result.metrics[ctx.metric.key])
            ctx.observer.finished(stage=self._stage, number=trial.number, name=experiment.name, value=value,
                                  duration=result.duration, outcome=f"{ctx.metric.key}={value:.4g}")
            return value

        return objective

    def _optimize_one(self, study: optuna.Study, phase: Phase, tuning_list: list[int], lease: Lease, *,
                      space: KnobSpace | None = None, repeat: int = 0) -> None:
        self._stood_down = False
        run_trial(study, self._objective(phase, tuning_list, lease, space=space, repeat=repeat), catch=(ExperimentFailed,))
        self._duplicates = self._duplicates + 1 if self._stood_down else 0

    # -- one step ---------------------------------------------------------------------------

    def run_micro_batch(self, mbs: int, lease: Lease, *, offload: str = "", repeat: int = 0, why: str = "") -> None:
        """Run the planner's experiment: size ``mbs`` with the default knobs (and the offload
        variant ``offload``) on ``lease``; ``repeat``: how many times it ran before."""
        self._reap()
        space = self._space.with_offload(offload) if offload else self._space
        # A fresh trial with fixed params, not an enqueued one: Optuna's pop of a waiting trial
        # is not atomic on SQLite, and any slot could pop another's.
        sampler = optuna.samplers.PartialFixedSampler({MBS_KEY: mbs, GAS_KEY: self._ctx.builder.gas_for(mbs)}, optuna.samplers.RandomSampler())
        study = optuna.load_study(storage=self._ctx.storage, study_name=self._study_name, sampler=sampler)
        if why:
            self._ctx.observer.detail(f"[z{self._stage}] next: micro-batch {mbs}{' ' + offload if offload else ''}: {why}")
        self._optimize_one(study, Phase.MICRO_BATCH, [mbs], lease, space=space, repeat=repeat)

    def step_knobs(self, lease: Lease) -> Step:
        """Run the knob search's next trial on ``lease``, or say why there is none."""
        decision_started()
        self._reap()
        ctx = self._ctx
        trials = self._trials()
        if ctx.fast or self._knobs is KnobSearch.NONE or not self._space.tuned:
            return Step.DONE
        tuning_list = sorted(self._sizes)
        if not tuning_list:
            return Step.DONE
        running = self._running(trials, Phase.KNOBS)
        size = self._space.size * len(tuning_list)
        dead = given_up(trials)
        taken = {r.exp_name for t in trials if (r := ExperimentRecord.from_trial(t)).phase is Phase.KNOBS
                 and (is_finished_experiment(t) or t in running or r.exp_name in dead)} - {None}
        first = recommended_knobs(self._space)
        if self._knobs is KnobSearch.RECOMMENDED and (first is None or taken):
            return Step.WAIT if running else Step.DONE
        pruner = TunerEarlyStoppingPruner(ctx.early_stopping, max_trials=ctx.num_trials, phase=Phase.KNOBS)
        if len(taken) >= size or self._duplicates >= _MAX_CONSECUTIVE_DUPLICATES or self._early_stopped:
            return Step.WAIT if running else Step.DONE
        search_space: dict[str, list[Any]] = {**self._space.tuned, MBS_KEY: tuning_list}
        sampler = create_sampler(ctx.tuner_type, search_space, seed=ctx.seed)
        started = any((r := ExperimentRecord.from_trial(t)).phase is Phase.KNOBS and (r.offload or "") == self._space.offload
                      for t in trials)
        if first is not None and not started:
            # DeepSpeed's recommended settings first: the one knob experiment most likely to pay.
            sampler = optuna.samplers.PartialFixedSampler({**first, MBS_KEY: self._sizes[0]}, sampler)
        elif self._duplicates >= _SAMPLER_DUPLICATES:
            # The sampler keeps proposing taken configs (a random sampler late in a small space,
            # a grid point whose worker died): run an untried one.
            sampler = optuna.samplers.PartialFixedSampler(self._untried(search_space, taken), sampler)
        study = optuna.load_study(storage=ctx.storage, study_name=self._study_name, sampler=sampler, pruner=pruner)
        if not started:
            ctx.observer.log(f"[z{self._stage}] knob search: {len(self._space.tuned)} knob(s) x {len(tuning_list)} micro-batch size(s) = {size} configs, sampler {ctx.tuner_type}")
        self._optimize_one(study, Phase.KNOBS, tuning_list, lease)
        return Step.RAN

    def _untried(self, search_space: dict[str, list[Any]], taken: set[str]) -> dict[str, Any]:
        names = sorted(search_space)
        for values in itertools.product(*(search_space[k] for k in names)):
            params = dict(zip(names, values))
            mbs = params.pop(MBS_KEY)
            name = self._ctx.builder.build(stage=self._stage, phase=Phase.KNOBS, mbs=mbs, gas=self._ctx.builder.gas_for(mbs),
                                           space=self._space, knobs=params).name
            if name not in taken:
                return {**params, MBS_KEY: mbs}
        return {}
