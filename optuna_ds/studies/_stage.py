from __future__ import annotations

import dataclasses
import datetime
import enum
import itertools
import os
import random
import threading
import shlex
import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds._errors import OptunaDSError
from optuna_ds._optuna_compat import optimize_once
from optuna_ds._optuna_compat import storage_of
from optuna_ds._optuna_compat import trial_id
from optuna_ds._errors import ScriptError
from optuna_ds.config import GAS_KEY
from optuna_ds.config import MBS_KEY
from optuna_ds.config import Metric
from optuna_ds.launcher import ExperimentResult
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import FailureReason
from optuna_ds.launcher import Phase
from optuna_ds.launcher import Lease
from optuna_ds.launcher import new_mark
from optuna_ds.launcher import SlotPool
from optuna_ds.launcher import shell_line
from optuna_ds.pruners import TunerEarlyStoppingPruner
from optuna_ds.samplers import create_sampler
from optuna_ds.samplers import with_fixed_params
from optuna_ds.space import KnobSpace
from optuna_ds.space import recommended_knobs
from optuna_ds.storage import ExperimentRecord
from optuna_ds.storage import TrialCache
from optuna_ds.storage import database_error
from optuna_ds.storage import open_stage_study
from optuna_ds.storage import stage_study_name
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
_IDLE_SECONDS = 0.5  # a knob search with nothing to start reads the storage again after this (or when one of ours ends)


class Step(enum.Enum):
    """What one step of a stage did."""

    RAN = "ran"  # a trial was run (or lost its claim to another worker)
    WAIT = "wait"  # nothing to start until an experiment running elsewhere finishes
    DONE = "done"  # the stage is tuned: nothing left to run, nothing running


class Stopped(Exception):
    """The tuning was stopped (Ctrl-C, SIGTERM, or another driver failed)."""


class UnreadableTrial(OptunaDSError):
    """A settled trial claims an experiment the planner wants, with a record it cannot read."""


class ExperimentFailed(Exception):
    """Raised by the objective so that Optuna records the trial as failed; the reason is in
    the trial's user attrs."""

    def __init__(self, result: ExperimentResult) -> None:
        super().__init__(f"{result.reason.value if result.reason else 'failed'}: {result.detail}")
        self.result = result


@dataclasses.dataclass
class _Attempt:
    """One trial as its objective left it; ``claimed`` is called once its claim is published."""

    claimed: Callable[[], None] = lambda: None
    stood_down: bool = False
    competitor: FrozenTrial | None = None  # the trial it stood down to
    script_failed: ExperimentResult | None = None  # failed whatever its config: the tuning stops


class _Turn:
    """A process's turn at the knob decision: held until the trial's claim is published (or
    the decision ends without one), released once. After :meth:`read`, this thread reads the
    study once (:meth:`TrialCache.freeze`) until then."""

    def __init__(self, lock: threading.Lock, study: optuna.Study) -> None:
        lock.acquire()
        self._lock: threading.Lock | None = lock
        self._study = study
        storage = storage_of(study)
        self._cache = storage if isinstance(storage, TrialCache) else None

    def read(self) -> list[FrozenTrial]:
        """The study's trials, read now; what the rest of the turn reads."""
        if self._cache is not None:
            self._cache.freeze(self._study)
        return self._study.get_trials(deepcopy=False)

    def release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            if self._cache is not None:
                self._cache.thaw()
            lock.release()


class KnobSearch(enum.Enum):
    """How much of a stage's knob space to search."""

    NONE = "none"
    ONE = "one"  # one setting, DeepSpeed's recommended unless given: one experiment
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


def _store(trial: optuna.Trial, record: ExperimentRecord) -> None:
    """Write ``record`` to the trial: in one transaction where the storage allows (``exp_name``
    is then seen with the rest of its claim), else field by field, ``exp_name`` last."""
    storage = storage_of(trial.study)
    if isinstance(storage, TrialCache):
        storage.set_trial_user_attrs(trial_id(trial), record.attrs())
    else:
        record.write(trial.set_user_attr)


def run_trial(study: optuna.Study, objective: Callable[[optuna.Trial], float], *, catch: tuple[type[Exception], ...]) -> None:
    """One trial of ``objective`` with Optuna's heartbeat; a failed database is raised as such
    (see :func:`optimize_once`)."""
    optimize_once(study, objective, catch=catch, storage_failed=lambda e: database_error(e) is not None)


class StageTuner:
    """Runs the experiments of one ZeRO stage in its own Optuna study, one trial per experiment.

    The planner decides the micro-batch experiments (:meth:`run_config`, trials with fixed
    params); the knob search (:meth:`step_knobs`, unless in fast mode) runs DeepSpeed's
    recommended setting at the best size, then the ``tuner_type`` sampler over the best sizes,
    until :class:`TunerEarlyStoppingPruner` prunes the next trial or the space is exhausted.
    Everything is read back from the storage at every step, so a rerun continues where it
    stopped and any number of slots (of this process, of workers elsewhere) can run the same
    stage: a trial claims its experiment by name, and of two claimants of one experiment one runs
    it and the other stands down (:meth:`_competitor`).

    Every study of a stage this process opens shares :attr:`study`'s storage cache, which reads
    again only the trials that are new or still running: a step reads little however many trials
    the study has.
    """

    def __init__(self, *, ctx: StageContext, tuning: str, stage: int, space: KnobSpace,
                 knobs: KnobSearch = KnobSearch.NONE, sizes: tuple[int, ...] = (),
                 setting: dict[str, Any] | None = None, study: optuna.Study | None = None,
                 min_improvement: float = 0.0) -> None:
        self._ctx = ctx
        self._knobs = knobs
        self._min_improvement = min_improvement
        self._setting = setting
        self._sizes = sizes
        self._tuning = tuning
        self._study_name = stage_study_name(tuning, stage)
        self._stage = stage
        self._space = space
        self._duplicates = 0
        self._settled: set[int] = set()  # settled trials the planner's experiments stood down to
        self._early_stopped = False
        self._reaped = 0.0
        self._deciding = threading.Lock()  # the knob search's slots decide one at a time
        self._idle_until = 0.0  # nothing to start before then (unless one of ours ends)
        self._sampler: optuna.samplers.BaseSampler | None = None
        self._rng = random.Random(ctx.seed)
        if study is None:
            storage = TrialCache(ctx.storage) if isinstance(ctx.storage, optuna.storages.RDBStorage) else ctx.storage
            study = open_stage_study(storage, tuning=tuning, stage=stage, direction=ctx.metric.direction)
        self.study = study
        self.reap(force=True)

    @property
    def stage(self) -> int:
        return self._stage

    @property
    def space(self) -> KnobSpace:
        return self._space

    def with_knobs(self, knobs: KnobSearch, *, sizes: tuple[int, ...], offload: str = "",
                   setting: dict[str, Any] | None = None, min_improvement: float = 0.0) -> StageTuner:
        """This stage's tuner searching as much of the knob space as ``knobs`` says, at the
        micro-batch ``sizes`` (best first) and with the offload variant the choice has;
        ``setting``: the one setting of :attr:`KnobSearch.ONE`, if not DeepSpeed's recommended;
        ``min_improvement``: what early stopping counts as an improvement (the noise)."""
        space = self._space.with_offload(offload) if offload else self._space
        return StageTuner(ctx=self._ctx, tuning=self._tuning, stage=self._stage, space=space,
                          knobs=knobs, sizes=sizes, setting=setting, study=self.study, min_improvement=min_improvement)

    def _load(self, **kwargs: Any) -> optuna.Study:
        """This stage's study with a sampler or pruner of its own, on :attr:`study`'s cache."""
        return optuna.load_study(storage=storage_of(self.study), study_name=self._study_name, **kwargs)

    # -- reading the study ------------------------------------------------------------------

    def _trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    @staticmethod
    def _running(trials: list[FrozenTrial], phase: Phase) -> list[FrozenTrial]:
        # A claimed record has all its claim's attrs (ExperimentRecord writes exp_name last).
        return [t for t in trials if t.state == TrialState.RUNNING
                and (r := ExperimentRecord.from_trial(t)).phase is phase and r.claimed]

    def reap(self, *, force: bool = False) -> None:
        """Fail the trials of dead workers so that their experiments run again: at once for a
        process of this host, after the heartbeat's grace period for one elsewhere."""
        now = time.monotonic()
        if not force and now - self._reaped < _REAP_SECONDS:
            return
        self._reaped = now
        completed, failed, unclaimed = fail_orphaned_trials(self.study, metric=self._ctx.metric)
        for number in completed:
            self._ctx.observer.log(f"[z{self._stage}] trial {number}: its process died, but its experiment finished: result kept")
        for number in failed:
            self._ctx.observer.log(f"[z{self._stage}] trial {number}: its process died; its experiment will run again")
        for number in unclaimed:
            self._ctx.observer.log(f"[z{self._stage}] trial {number}: its process died before it claimed an experiment; it launched nothing")
        optuna.storages.fail_stale_trials(self.study)

    @staticmethod
    def _should_prune(trial: optuna.Trial) -> bool:
        """``trial.should_prune()`` on the trials the claim's check just read: the pruner counts
        finished trials and those started ahead of this one, which that read holds."""
        cache = storage_of(trial.study)
        if not isinstance(cache, TrialCache):
            return trial.should_prune()
        with cache.held():
            return trial.should_prune()

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

    def _objective(self, phase: Phase, tuning_list: list[int], lease: Lease, attempt: _Attempt, *, free_since: float,
                   space: KnobSpace | None = None, repeat: int = 0) -> Callable[[optuna.Trial], float]:
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
            mark = new_mark()  # this trial's launch: a resumed tuning tells its processes and files by it
            _store(trial, ExperimentRecord.claim(experiment, slot=slot, offload=space.offload, repeat=repeat, mark=mark))  # the claim
            attempt.claimed()
            previous = self._competitor(trial, experiment.name)
            if previous is not None:
                ExperimentRecord(duplicate_of=previous.number).write(trial.set_user_attr)
                attempt.stood_down, attempt.competitor = True, previous
                raise optuna.TrialPruned(f"{experiment.name} already ran as trial {previous.number}")
            if phase is Phase.KNOBS and self._should_prune(trial):  # tuner_early_stopping, tuner_num_trials
                ExperimentRecord(early_stopped=True).write(trial.set_user_attr)
                self._early_stopped = True
                raise optuna.TrialPruned("the knob search is over")
            ctx.observer.decided(stage=self._stage, number=trial.number, name=experiment.name, seconds=time.monotonic() - free_since)
            ctx.observer.started(stage=self._stage, number=trial.number, name=experiment.name, slot=slot)
            try:
                result = ctx.runner.run(
                    experiment,
                    slot=lease.slot,
                    slot_index=lease.index,
                    timeout=ctx.timeout,
                    on_start=lambda pid: ExperimentRecord(experiment_process=process_identity(pid)).write(trial.set_user_attr),
                    on_command=lambda cmd: ctx.observer.detail(f"  cd {shlex.quote(os.getcwd())} && {shell_line(cmd)}"),
                    on_retry=lambda why: ctx.observer.log(f"[z{self._stage}] trial {trial.number}: {why}"),
                    stop=ctx.stop,
                    pass_fds=lease.fds,
                    mark=mark,
                )
            except BaseException:
                ExperimentRecord(reason=FailureReason.INTERRUPTED).write(trial.set_user_attr)
                raise
            _store(trial, ExperimentRecord.outcome(result))
            if not result.ok:
                assert result.reason is not None
                ctx.observer.finished(stage=self._stage, number=trial.number, name=experiment.name, value=None,
                                      duration=result.duration, outcome=f"failed ({result.reason.value}: {result.detail})")
                if result.stderr_tail:
                    ctx.observer.detail("\n".join("  | " + line for line in result.stderr_tail.splitlines()[-5:]))
                if result.reason is FailureReason.SCRIPT:
                    attempt.script_failed = result
                raise ExperimentFailed(result)
            value = float(result.metrics[ctx.metric.key])
            ctx.observer.finished(stage=self._stage, number=trial.number, name=experiment.name, value=value,
                                  duration=result.duration, outcome=f"{ctx.metric.key}={value:.4g}")
            return value

        return objective

    def _optimize_one(self, study: optuna.Study, phase: Phase, tuning_list: list[int], lease: Lease, *, free_since: float,
                      space: KnobSpace | None = None, repeat: int = 0, claimed: Callable[[], None] | None = None) -> _Attempt:
        attempt = _Attempt(claimed=claimed) if claimed is not None else _Attempt()
        objective = self._objective(phase, tuning_list, lease, attempt, free_since=free_since, space=space, repeat=repeat)
        run_trial(study, objective, catch=(ExperimentFailed,))
        self._duplicates = self._duplicates + 1 if attempt.stood_down else 0
        failed = attempt.script_failed
        if failed is not None:
            # Recorded (reason "script", run again on resume); the other slots are stopped.
            raise ScriptError(
                f"{failed.name} failed whatever its config ({failed.detail}): every experiment would; "
                f"fix the script, its arguments or its environment and run again -- see "
                f"{self._ctx.builder.result_dir(failed.name)}/stderr.log"
            )
        return attempt

    # -- one step ---------------------------------------------------------------------------

    def run_config(self, mbs: int, lease: Lease, *, free_since: float, offload: str = "", knobs: dict[str, Any] | None = None,
                   repeat: int = 0, why: str = "") -> None:
        """Run the planner's experiment on ``lease``: size ``mbs`` with the offload variant
        ``offload`` and the default knobs, or ``knobs`` (a knob setting that ran, measured
        again); ``repeat``: how many times it ran before; ``free_since``: when the slot became
        free (``time.monotonic()``), the start of the decision the observer is told the time of."""
        self.reap()
        space = self._space.with_offload(offload) if offload else self._space
        # A fresh trial with fixed params, not an enqueued one: Optuna's pop of a waiting trial
        # is not atomic on SQLite, and any slot could pop another's.
        fixed = {**(knobs or {}), MBS_KEY: mbs, GAS_KEY: self._ctx.builder.gas_for(mbs)}
        sampler = optuna.samplers.PartialFixedSampler(fixed, optuna.samplers.RandomSampler())
        study = self._load(sampler=sampler, pruner=optuna.pruners.NopPruner())
        if why:
            setting = f" {knobs}" if knobs else ""
            self._ctx.observer.detail(f"[z{self._stage}] next: micro-batch {mbs}{' ' + offload if offload else ''}{setting}: {why}")
        attempt = self._optimize_one(study, Phase.KNOBS if knobs else Phase.MICRO_BATCH, [mbs], lease, free_since=free_since,
                                     space=space, repeat=repeat)
        self._check_settled(attempt.competitor)

    def _check_settled(self, competitor: FrozenTrial | None) -> None:
        """The planner asks again only for an experiment it saw no result of: standing down twice
        to the same settled trial means the planner cannot read that trial's record (another tool
        wrote it), and asking again would only add a pruned trial each time, for ever."""
        if competitor is None or competitor.state == TrialState.RUNNING:
            return
        if competitor.number in self._settled:
            name = ExperimentRecord.from_trial(competitor).exp_name
            raise UnreadableTrial(
                f"trial {competitor.number} of study '{self._study_name}' claims experiment {name} but holds no result "
                "optuna-ds can read (another tool wrote it): optuna-ds will neither run that experiment again nor "
                "change the trial; choose another --study-name"
            )
        self._settled.add(competitor.number)

    def step_knobs(self, lease: Lease) -> Step:
        """Run the knob search's next trial on ``lease``, or say why there is none.

        The slots of a process share this tuner and take turns at the decision: one reads the
        study, asks the sampler and publishes its trial's claim before the next one reads, so two
        slots of a process never ask for one config and the study is read once per decision;
        the experiments themselves run side by side.
        """
        free_since = time.monotonic()
        turn = _Turn(self._deciding, self.study)
        try:
            study = self._next_knob_study(turn)
            if isinstance(study, Step):
                return study
            self._optimize_one(study, Phase.KNOBS, sorted(self._sizes), lease, free_since=free_since, claimed=turn.release)
        finally:
            turn.release()
        self._idle_until = 0.0  # one of ours ended: whatever waits may start now
        return Step.RAN

    def _next_knob_study(self, turn: _Turn) -> optuna.Study | Step:
        """The study, with the sampler and pruner for the next knob trial; or the step to take
        when there is none."""
        ctx = self._ctx
        if ctx.fast or self._knobs is KnobSearch.NONE or not self._space.tuned or not self._sizes:
            return Step.DONE
        if time.monotonic() < self._idle_until:
            return Step.WAIT  # nothing has ended here since a slot found nothing to start
        self.reap()
        trials = turn.read()
        tuning_list = sorted(self._sizes)
        running = self._running(trials, Phase.KNOBS)
        size = self._space.size * len(tuning_list)
        dead = given_up(trials)
        taken_records = [r for t in trials if (r := ExperimentRecord.from_trial(t)).phase is Phase.KNOBS and not r.repeat
                         and r.exp_name is not None and (is_finished_experiment(t) or t in running or r.exp_name in dead)]
        taken = {r.exp_name for r in taken_records}
        # Trials still being asked for (here or by a worker elsewhere) take a config each soon; one
        # unclaimed for longer lost its process mid-decision (it has no worker to reap it by) and
        # must not hold a config back for ever.
        recent = datetime.datetime.now() - datetime.timedelta(seconds=_CLAIM_WAIT_SECONDS)
        asking = sum(1 for t in trials if t.state == TrialState.RUNNING and not ExperimentRecord.from_trial(t).claimed
                     and t.datetime_start is not None and t.datetime_start > recent)
        first = self._setting if self._setting is not None else recommended_knobs(self._space)
        one = self._knobs is KnobSearch.ONE
        if one:
            # One experiment: over once its name is taken.
            over = spent = first is None or self._name(first, self._sizes[0]) in taken
        else:
            # The search's space is spent once its own configs are taken: the stage's knob
            # experiments at other sizes or offloads (a close arm's, the leanest setting's) are not in it.
            mine = {r.exp_name for r in taken_records if (r.offload or "") == self._space.offload and r.micro_batch_size in tuning_list}
            over = len(mine) >= size or self._duplicates >= _MAX_CONSECUTIVE_DUPLICATES or self._early_stopped
            spent = over or len(mine) + asking >= size
        if spent:
            if over and not running:
                return Step.DONE
            self._idle_until = time.monotonic() + _IDLE_SECONDS
            return Step.WAIT
        # One deliberate experiment is not the sampler's search: early stopping does not end it.
        pruner = optuna.pruners.NopPruner() if one else \
            TunerEarlyStoppingPruner(ctx.early_stopping, max_trials=ctx.num_trials, phase=Phase.KNOBS,
                                     min_improvement=self._min_improvement)
        search_space: dict[str, list[Any]] = {**self._space.tuned, MBS_KEY: tuning_list}
        if self._sampler is None:
            # One sampler for the search: its random state goes on from one trial to the next.
            self._sampler = create_sampler(ctx.tuner_type, search_space, seed=ctx.seed)
        sampler = self._sampler
        started = any((r := ExperimentRecord.from_trial(t)).phase is Phase.KNOBS and (r.offload or "") == self._space.offload
                      for t in trials)
        retry = None if one else self._interrupted(trials, taken, tuning_list)
        if first is not None and (one or not started):
            # DeepSpeed's recommended settings first: the one knob experiment most likely to pay.
            sampler = with_fixed_params(optuna.samplers.RandomSampler() if one else sampler, {**first, MBS_KEY: self._sizes[0]})
        elif retry is not None:
            # An experiment of the search that was interrupted runs again: the sampler has moved
            # on from it (a grid counts its point as visited).
            sampler = with_fixed_params(sampler, retry)
        elif self._duplicates >= _SAMPLER_DUPLICATES:
            # The sampler keeps proposing taken configs (a random sampler late in a small space,
            # a grid point whose worker died): run an untried one.
            sampler = with_fixed_params(sampler, self._untried(search_space, taken))
        if one:
            what = "DeepSpeed's recommended knob setting" if self._setting is None else f"the knobs {first}"
            ctx.observer.log(f"[z{self._stage}{' ' + self._space.offload if self._space.offload else ''}] {what}, at micro-batch {self._sizes[0]}")
        elif not started:
            ctx.observer.log(f"[z{self._stage}] knob search: {len(self._space.tuned)} knob(s) x {len(tuning_list)} micro-batch size(s) = {size} configs, sampler {ctx.tuner_type}")
        return self._load(sampler=sampler, pruner=pruner)

    def _name(self, knobs: dict[str, Any], mbs: int) -> str:
        return self._ctx.builder.build(stage=self._stage, phase=Phase.KNOBS, mbs=mbs, gas=self._ctx.builder.gas_for(mbs),
                                       space=self._space, knobs=knobs).name

    def _interrupted(self, trials: list[FrozenTrial], taken: set[str], tuning_list: list[int]) -> dict[str, Any] | None:
        """The config of a knob experiment in this search's space that was interrupted (Ctrl-C,
        its worker died) and has not run since; ``None`` if there is none."""
        for t in trials:
            record = ExperimentRecord.from_trial(t)
            if (t.state != TrialState.FAIL or is_finished_experiment(t) or record.phase is not Phase.KNOBS or record.repeat
                    or record.exp_name in taken or (record.offload or "") != self._space.offload
                    or record.micro_batch_size not in tuning_list):
                continue
            knobs = {k: v for k, v in t.params.items() if k not in (MBS_KEY, GAS_KEY)}
            if (knobs.keys() == self._space.tuned.keys() and all(v in self._space.tuned[k] for k, v in knobs.items())
                    and self._name(knobs, int(record.micro_batch_size)) == record.exp_name):
                return {**knobs, MBS_KEY: int(record.micro_batch_size)}
        return None

    def _untried(self, search_space: dict[str, list[Any]], taken: set[str]) -> dict[str, Any]:
        """An untried config, at random: workers that all fall back to this pick different ones."""
        names = sorted(search_space)
        untried = []
        for values in itertools.product(*(search_space[k] for k in names)):
            params = dict(zip(names, values))
            mbs = params.pop(MBS_KEY)
            if self._name(params, mbs) not in taken:
                untried.append({**params, MBS_KEY: mbs})
        return self._rng.choice(untried) if untried else {}
