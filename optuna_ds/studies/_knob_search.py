"""The knob search of one stage: DeepSpeed's recommended setting at the best size, then the
``tuner_type`` sampler over the best sizes until early stopping, with its fallbacks (an
interrupted config again, an untried one when the sampler keeps repeating itself). On its own,
so that it can move into the planner."""
from __future__ import annotations

import datetime
import enum
import itertools
import random
import threading
import time
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds._optuna_compat import storage_of
from optuna_ds.domain import MBS_KEY
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import Phase
from optuna_ds.domain import given_up
from optuna_ds.domain import is_finished_experiment
from optuna_ds.launcher import Lease
from optuna_ds.pruners import TunerEarlyStoppingPruner
from optuna_ds.samplers import create_sampler
from optuna_ds.samplers import with_fixed_params
from optuna_ds.space import KnobSpace
from optuna_ds.space import recommended_knobs
from optuna_ds.storage import TrialCache
from optuna_ds.studies._claims import CLAIM_WAIT_SECONDS
from optuna_ds.studies._claims import Reaper
from optuna_ds.studies._claims import running
from optuna_ds.studies._context import StageContext
from optuna_ds.studies._experiments import StageExperiments
from optuna_ds.studies._experiments import study_with

_MAX_CONSECUTIVE_DUPLICATES = 50
_SAMPLER_DUPLICATES = 3
_IDLE_SECONDS = 0.5  # a knob search with nothing to start reads the storage again after this (or when one of ours ends)


class Step(enum.Enum):
    """What one step of a stage did."""

    RAN = "ran"  # a trial was run (or lost its claim to another worker)
    WAIT = "wait"  # nothing to start until an experiment running elsewhere finishes
    DONE = "done"  # the stage is tuned: nothing left to run, nothing running


class KnobSearch(enum.Enum):
    """How much of a stage's knob space to search."""

    NONE = "none"
    ONE = "one"  # one setting, DeepSpeed's recommended unless given: one experiment
    FULL = "full"  # the recommended setting, then the sampler until early stopping


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


class KnobSearcher:
    """The knob search of one stage (unless in fast mode): DeepSpeed's recommended setting at the
    best size, then the ``tuner_type`` sampler over the best sizes, until
    :class:`TunerEarlyStoppingPruner` prunes the next trial or the space is exhausted. Everything
    is read back from the storage at every step, so a rerun continues where it stopped and any
    number of slots (of this process, of workers elsewhere) can search at once."""

    def __init__(self, *, ctx: StageContext, stage: int, study: optuna.Study, space: KnobSpace, experiments: StageExperiments,
                 reaper: Reaper, knobs: KnobSearch, sizes: tuple[int, ...], setting: dict[str, Any] | None,
                 min_improvement: float) -> None:
        self._ctx = ctx
        self._stage = stage
        self._study = study
        self._space = space
        self._experiments = experiments
        self._reaper = reaper
        self._knobs = knobs
        self._sizes = sizes
        self._setting = setting
        self._min_improvement = min_improvement
        self._duplicates = 0  # trials in a row that stood down
        self._early_stopped = False
        self._deciding = threading.Lock()  # the slots decide one at a time
        self._idle_until = 0.0  # nothing to start before then (unless one of ours ends)
        self._sampler: optuna.samplers.BaseSampler | None = None
        self._rng = random.Random(ctx.seed)

    def step(self, lease: Lease) -> Step:
        """Run the knob search's next trial on ``lease``, or say why there is none.

        The slots of a process share this search and take turns at the decision: one reads the
        study, asks the sampler and publishes its trial's claim before the next one reads, so two
        slots of a process never ask for one config and the study is read once per decision;
        the experiments themselves run side by side.
        """
        free_since = time.monotonic()
        turn = _Turn(self._deciding, self._study)
        try:
            study = self._next_study(turn)
            if isinstance(study, Step):
                return study
            attempt = self._experiments.run(study, Phase.KNOBS, sorted(self._sizes), lease, free_since=free_since,
                                            claimed=turn.release, early_stopped=self._stop_early)
            self._duplicates = self._duplicates + 1 if attempt.stood_down else 0
        finally:
            turn.release()
        self._idle_until = 0.0  # one of ours ended: whatever waits may start now
        return Step.RAN

    def _stop_early(self) -> None:
        self._early_stopped = True

    def _next_study(self, turn: _Turn) -> optuna.Study | Step:
        """The study, with the sampler and pruner for the next knob trial; or the step to take
        when there is none."""
        ctx = self._ctx
        if ctx.fast or self._knobs is KnobSearch.NONE or not self._space.tuned or not self._sizes:
            return Step.DONE
        if time.monotonic() < self._idle_until:
            return Step.WAIT  # nothing has ended here since a slot found nothing to start
        self._reaper.reap()
        trials = turn.read()
        tuning_list = sorted(self._sizes)
        ongoing = running(trials, Phase.KNOBS)
        size = self._space.size * len(tuning_list)
        dead = given_up(trials)
        taken_records = [r for t in trials if (r := ExperimentRecord.from_trial(t)).phase is Phase.KNOBS and not r.repeat
                         and r.exp_name is not None and (is_finished_experiment(t) or t in ongoing or r.exp_name in dead)]
        taken = {r.exp_name for r in taken_records if r.exp_name is not None}
        # Trials still being asked for (here or by a worker elsewhere) take a config each soon; one
        # unclaimed for longer lost its process mid-decision (it has no worker to reap it by) and
        # must not hold a config back for ever.
        recent = datetime.datetime.now() - datetime.timedelta(seconds=CLAIM_WAIT_SECONDS)
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
            mine = {r.exp_name for r in taken_records
                    if r.config is not None and r.config.offload == self._space.offload and r.config.micro_batch in tuning_list}
            over = len(mine) >= size or self._duplicates >= _MAX_CONSECUTIVE_DUPLICATES or self._early_stopped
            spent = over or len(mine) + asking >= size
        if spent:
            if over and not ongoing:
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
        started = any((r := ExperimentRecord.from_trial(t)).phase is Phase.KNOBS and r.config is not None
                      and r.config.offload == self._space.offload for t in trials)
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
        return study_with(self._study, sampler=sampler, pruner=pruner)

    def _name(self, knobs: dict[str, Any], mbs: int) -> str:
        return self._ctx.builder.config(stage=self._stage, mbs=mbs, offload=self._space.offload, knobs=knobs).name

    def _interrupted(self, trials: list[FrozenTrial], taken: set[str], tuning_list: list[int]) -> dict[str, Any] | None:
        """The config of a knob experiment in this search's space that was interrupted (Ctrl-C,
        its worker died) and has not run since; ``None`` if there is none."""
        for t in trials:
            record = ExperimentRecord.from_trial(t)
            config = record.config
            if (t.state != TrialState.FAIL or is_finished_experiment(t) or record.phase is not Phase.KNOBS or record.repeat
                    or record.exp_name in taken or config is None or config.offload != self._space.offload
                    or config.micro_batch not in tuning_list):
                continue
            knobs = config.knob_dict
            if (knobs.keys() == self._space.tuned.keys() and all(v in self._space.tuned[k] for k, v in knobs.items())
                    and self._name(knobs, config.micro_batch) == record.exp_name):
                return {**knobs, MBS_KEY: config.micro_batch}
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
