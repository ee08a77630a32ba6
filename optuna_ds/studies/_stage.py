from __future__ import annotations

import dataclasses
import enum
import itertools
import json
import random
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
from optuna_ds.launcher import Experiment
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
from optuna_ds.space import MicroBatchSearch
from optuna_ds.space import Observation
from optuna_ds.space import recommended_knobs
from optuna_ds.studies._builder import ExperimentBuilder
from optuna_ds.studies._observer import TuningObserver
from optuna_ds.studies._owner import OWNER_ATTR
from optuna_ds.studies._owner import PROCESS_ATTR
from optuna_ds.studies._owner import fail_orphaned_trials
from optuna_ds.studies._owner import process_identity
from optuna_ds.studies._owner import this_process
from optuna_ds.studies._results import given_up
from optuna_ds.studies._results import is_finished_experiment

_MAX_CONSECUTIVE_DUPLICATES = 50
_SAMPLER_DUPLICATES = 3
_POLL_SECONDS = 0.2
_REAP_SECONDS = 2.0
_CLAIM_WAIT_SECONDS = 10.0
_FAIRNESS_PAUSE = 0.1  # twice the slot pool's poll interval
_DECISION_LOG_VAR = "OPTUNA_DS_DECISION_LOG"
_decision = threading.local()  # when this driver thread entered StageTuner.step


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


class LocalClaims:
    """Micro-batch sizes chosen by this process's drivers and not yet claimed in the storage,
    so that two drivers of one process never pick the same next size."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sizes: set[tuple[str, int]] = set()


@dataclasses.dataclass(frozen=True)
class StageContext:
    """What every stage of one tuning shares."""

    storage: optuna.storages.BaseStorage
    builder: ExperimentBuilder
    runner: ExperimentRunner
    pool: SlotPool
    stop: threading.Event
    metric_key: str
    direction: str
    tuner_type: str
    fast: bool
    num_tuning: int
    early_stopping: int
    num_trials: int
    mbs_high: int
    gas_high: int
    timeout: float | None
    observer: TuningObserver
    local: LocalClaims
    seed: int | None = None


def record_result(trial: optuna.Trial, experiment: Experiment, result: ExperimentResult) -> None:
    """Store on the trial what users look for: the metrics, the config, the command, the
    result folder, and for a failure its reason and the last lines of stderr."""
    attrs: dict[str, Any] = {
        "metrics": result.metrics,
        "cmd": result.cmd,
        "duration": round(result.duration, 3),
        "returncode": result.returncode,
    }
    if result.peak_memory is not None:
        attrs["peak_gpu_memory"] = result.peak_memory
    if result.reason is not None:
        attrs["reason"] = result.reason.value
        attrs["detail"] = result.detail
        attrs["stderr_tail"] = result.stderr_tail
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


def _log_decision(*, stage: int, number: int, name: str) -> None:
    """With ``OPTUNA_DS_DECISION_LOG=<path>``, append how long this driver took from entering
    :meth:`StageTuner.step` to launching: the planner's cost that `make bench-parallel` reports."""
    path = os.environ.get(_DECISION_LOG_VAR)
    start = getattr(_decision, "start", None)
    if not path or start is None:
        return
    entry = {"pid": os.getpid(), "stage": stage, "trial": number, "name": name, "seconds": round(time.monotonic() - start, 6)}
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


class StageTuner:
    """Tunes one ZeRO stage in its own Optuna study, one trial per experiment.

    First the micro-batch search (trials with fixed params, decided by :class:`MicroBatchSearch`
    from the finished and running ones); then, unless in fast mode, as much of the knob search as
    ``knobs`` says: DeepSpeed's recommended setting at the best size, then the ``tuner_type``
    sampler over the best micro-batch sizes, until :class:`TunerEarlyStoppingPruner` says stop
    or the space is exhausted. Everything is read back from the storage at every step,
    so a rerun continues where it stopped and any number of drivers (threads of this process,
    workers elsewhere) can step the same stage: a trial claims its experiment by name, and of
    two claimants of one experiment one runs it and the other stands down (:meth:`_competitor`).
    """

    def __init__(self, *, ctx: StageContext, study_name: str, stage: int, space: KnobSpace, search: MicroBatchSearch,
                 knobs: KnobSearch = KnobSearch.FULL) -> None:
        self._ctx = ctx
        self._knobs = knobs
        self._study_name = study_name
        self._stage = stage
        self._space = space
        self._search = search
        self._duplicates = 0
        self._stood_down = False
        self._reaped = 0.0
        self.study = optuna.create_study(
            storage=ctx.storage, study_name=study_name, direction=ctx.direction, load_if_exists=True
        )
        self._reap(force=True)

    @property
    def stage(self) -> int:
        return self._stage

    @property
    def space(self) -> KnobSpace:
        return self._space

    def with_knobs(self, knobs: KnobSearch) -> StageTuner:
        """This stage's tuner, searching as much of the knob space as ``knobs`` says."""
        return StageTuner(ctx=self._ctx, study_name=self._study_name, stage=self._stage, space=self._space,
                          search=self._search, knobs=knobs)

    # -- reading the study ------------------------------------------------------------------

    def _trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    def observations(self, trials: list[FrozenTrial] | None = None) -> dict[int, Observation]:
        sign = 1.0 if self._ctx.direction == "maximize" else -1.0
        obs: dict[int, Observation] = {}
        trials = self._trials() if trials is None else trials
        dead = given_up(trials)
        for t in trials:
            if t.user_attrs.get("phase") != Phase.MICRO_BATCH.value:
                continue
            if t.user_attrs.get("exp_name") in dead:
                mbs = int(t.user_attrs["micro_batch_size"])
                obs[mbs] = Observation(mbs=mbs, score=None)
            elif is_finished_experiment(t):
                mbs = int(t.user_attrs["micro_batch_size"])
                if t.state == TrialState.COMPLETE and t.value is not None:
                    obs[mbs] = Observation(mbs=mbs, score=sign * t.value)
                else:
                    obs[mbs] = Observation(mbs=mbs, score=None, oom=t.user_attrs.get("reason") == FailureReason.OOM.value)
        return obs

    @staticmethod
    def _running(trials: list[FrozenTrial], phase: Phase) -> list[FrozenTrial]:
        # exp_name is written last: a trial that has it has all its attrs.
        return [t for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get("phase") == phase.value and "exp_name" in t.user_attrs]

    def _reap(self, *, force: bool = False) -> None:
        """Fail the trials of dead workers so that their experiments run again: at once for a
        process of this host, after the heartbeat's grace period for one elsewhere."""
        now = time.monotonic()
        if not force and now - self._reaped < _REAP_SECONDS:
            return
        self._reaped = now
        completed, failed = fail_orphaned_trials(self.study, metric_key=self._ctx.metric_key)
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
                if t.number == trial.number or t.user_attrs.get("exp_name") != name:
                    continue
                if is_finished_experiment(t):
                    return t
                if t.state == TrialState.RUNNING:
                    if t.number > trial.number or PROCESS_ATTR in t.user_attrs:
                        return t
                    undecided = t
            if undecided is None:
                return None
            if time.monotonic() > deadline:
                return undecided
            time.sleep(0.05)

    # -- running one trial ------------------------------------------------------------------

    def _objective(self, phase: Phase, tuning_list: list[int], lease: Lease,
                   pruner: TunerEarlyStoppingPruner | None) -> Callable[[optuna.Trial], float]:
        ctx = self._ctx

        def objective(trial: optuna.Trial) -> float:
            trial.set_user_attr(OWNER_ATTR, this_process())
            if phase is Phase.MICRO_BATCH:
                mbs = trial.suggest_int(MBS_KEY, 1, ctx.mbs_high)
                knobs: dict[str, Any] = {}
            else:
                mbs = trial.suggest_int(MBS_KEY, min(tuning_list), max(tuning_list))
                knobs = {k: trial.suggest_categorical(k, choices) for k, choices in self._space.tuned.items()}
            gas = ctx.builder.gas_for(mbs)
            if phase is Phase.KNOBS:
                trial.suggest_int(GAS_KEY, gas, gas)  # derived from mbs: recorded, not sampled
            else:
                trial.suggest_int(GAS_KEY, 1, ctx.gas_high)
            experiment = ctx.builder.build(stage=self._stage, phase=phase, mbs=mbs, gas=gas, space=self._space, knobs=knobs)
            slot = lease.slot.include
            for key, value in {
                "phase": phase.value,
                "micro_batch_size": mbs,
                "gradient_accumulation_steps": gas,
                "train_batch_size": experiment.ds_config.get("train_batch_size"),
                "ds_config": experiment.ds_config,
                "result_dir": experiment.result_dir,
                "slot": slot,
                "exp_name": experiment.name,  # last: the claim, read back by the others
            }.items():
                trial.set_user_attr(key, value)
            previous = self._competitor(trial, experiment.name)
            if previous is not None:
                trial.set_user_attr("duplicate_of", previous.number)
                self._stood_down = True
                raise optuna.TrialPruned(f"{experiment.name} already ran as trial {previous.number}")
            if phase is Phase.KNOBS and pruner is not None and pruner.exhausted(self.study, before=trial.number):
                trial.set_user_attr("early_stopped", True)
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
                    on_start=lambda pid: trial.set_user_attr(PROCESS_ATTR, process_identity(pid)),
                    stop=ctx.stop,
                    pass_fds=lease.fds,
                )
            except BaseException:
                trial.set_user_attr("reason", FailureReason.INTERRUPTED.value)
                raise
            record_result(trial, experiment, result)
            if not result.ok:
                assert result.reason is not None
                ctx.observer.finished(stage=self._stage, number=trial.number, name=experiment.name, value=None,
                                      duration=result.duration, outcome=f"failed ({result.reason.value}: {result.detail})")
                if result.stderr_tail:
                    ctx.observer.detail("\n".join("  | " + line for line in result.stderr_tail.splitlines()[-5:]))
                raise ExperimentFailed(result)
            value = float(result.metrics[ctx.metric_key])
            ctx.observer.finished(stage=self._stage, number=trial.number, name=experiment.name, value=value,
                                  duration=result.duration, outcome=f"{ctx.metric_key}={value:.4g}")
            return value

        return objective

    def _optimize_one(self, study: optuna.Study, phase: Phase, tuning_list: list[int], lease: Lease,
                      pruner: TunerEarlyStoppingPruner | None = None) -> None:
        self._stood_down = False
        study.optimize(
            self._objective(phase, tuning_list, lease, pruner), n_trials=1, catch=(ExperimentFailed,), gc_after_trial=False
        )
        self._duplicates = self._duplicates + 1 if self._stood_down else 0

    # -- one step ---------------------------------------------------------------------------

    def step(self, lease: Lease) -> Step:
        """Run the next experiment this stage needs on ``lease``, or say why there is none."""
        _decision.start = time.monotonic()
        self._reap()
        local = self._ctx.local
        with local.lock:
            trials = self._trials()
            obs = self.observations(trials)
            pending = {int(t.user_attrs["micro_batch_size"]) for t in self._running(trials, Phase.MICRO_BATCH)}
            pending |= {m for study, m in local.sizes if study == self._study_name}
            mbs = self._search.next_mbs(obs, pending)
            if mbs is not None:
                local.sizes.add((self._study_name, mbs))
        if mbs is not None:
            try:
                self._run_micro_batch(mbs, lease)
            finally:
                with local.lock:
                    local.sizes.discard((self._study_name, mbs))
            return Step.RAN
        if pending:
            return Step.WAIT
        return self._step_knobs(trials, obs, lease)

    def _run_micro_batch(self, mbs: int, lease: Lease) -> None:
        # A fresh trial with fixed params, not an enqueued one: Optuna's pop of a waiting trial
        # is not atomic on SQLite, and any driver could pop another's.
        sampler = optuna.samplers.PartialFixedSampler({MBS_KEY: mbs, GAS_KEY: self._ctx.builder.gas_for(mbs)}, optuna.samplers.RandomSampler())
        study = optuna.load_study(storage=self._ctx.storage, study_name=self._study_name, sampler=sampler)
        self._optimize_one(study, Phase.MICRO_BATCH, [mbs], lease)

    def _step_knobs(self, trials: list[FrozenTrial], obs: dict[int, Observation], lease: Lease) -> Step:
        ctx = self._ctx
        if ctx.fast or self._knobs is KnobSearch.NONE or not self._space.tuned:
            return Step.DONE
        tuning_list = sorted(self._search.best(obs, n=ctx.num_tuning))
        if not tuning_list:
            return Step.DONE
        running = self._running(trials, Phase.KNOBS)
        size = self._space.size * len(tuning_list)
        dead = given_up(trials)
        taken = {t.user_attrs.get("exp_name") for t in trials if t.user_attrs.get("phase") == Phase.KNOBS.value
                 and (is_finished_experiment(t) or t in running or t.user_attrs.get("exp_name") in dead)} - {None}
        first = recommended_knobs(self._space)
        if self._knobs is KnobSearch.RECOMMENDED and (first is None or taken):
            return Step.WAIT if running else Step.DONE
        pruner = TunerEarlyStoppingPruner(ctx.early_stopping, max_trials=ctx.num_trials, phase=Phase.KNOBS.value)
        if len(taken) >= size or self._duplicates >= _MAX_CONSECUTIVE_DUPLICATES or pruner.exhausted(self.study):
            return Step.WAIT if running else Step.DONE
        search_space: dict[str, list[Any]] = {**self._space.tuned, MBS_KEY: tuning_list}
        sampler = create_sampler(ctx.tuner_type, search_space, seed=ctx.seed)
        started = any(t.user_attrs.get("phase") == Phase.KNOBS.value for t in trials)
        if first is not None and not started:
            # DeepSpeed's recommended settings first: the one knob experiment most likely to pay.
            sampler = optuna.samplers.PartialFixedSampler({**first, MBS_KEY: self._search.best(obs)[0]}, sampler)
        elif self._duplicates >= _SAMPLER_DUPLICATES:
            # The sampler keeps proposing taken configs (a random sampler late in a small space,
            # a grid point whose worker died): run an untried one.
            sampler = optuna.samplers.PartialFixedSampler(self._untried(search_space, taken), sampler)
        study = optuna.load_study(storage=ctx.storage, study_name=self._study_name, sampler=sampler, pruner=pruner)
        if not started:
            ctx.observer.log(f"[z{self._stage}] knob search: {len(self._space.tuned)} knob(s) x {len(tuning_list)} micro-batch size(s) = {size} configs, sampler {ctx.tuner_type}")
        self._optimize_one(study, Phase.KNOBS, tuning_list, lease, pruner)
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

    def run(self) -> None:
        """Step this stage on the slots of ``ctx.pool`` until it is tuned; :class:`Stopped`
        if the tuning is stopped first."""
        ctx = self._ctx
        while True:
            lease = ctx.pool.acquire(ctx.stop, on_wait=ctx.observer.log)
            if lease is None:
                raise Stopped
            try:
                step = self.step(lease)
            finally:
                ctx.pool.release(lease)
            if step is Step.RAN:
                # Locks are not fair: give the drivers of other processes waiting for a slot a turn.
                ctx.stop.wait(random.uniform(0.0, _FAIRNESS_PAUSE))
            if step is Step.DONE:
                return
            if ctx.stop.is_set():
                raise Stopped
            if step is Step.WAIT:
                ctx.stop.wait(_POLL_SECONDS)
