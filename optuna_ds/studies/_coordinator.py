from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Callable

from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.config import GAS_KEY
from optuna_ds.config import Metric
from optuna_ds.config import MBS_KEY
from optuna_ds.launcher import ExperimentInterrupted
from optuna_ds.launcher import FailureReason
from optuna_ds.launcher import Phase
from optuna_ds.launcher import deferred_signals
from optuna_ds.planner import Choice
from optuna_ds.planner import Decision
from optuna_ds.planner import Observation
from optuna_ds.planner import Problem
from optuna_ds.planner import Proposal
from optuna_ds.planner import Status
from optuna_ds.planner import plan
from optuna_ds.space import recommended_knobs
from optuna_ds.storage import ExperimentRecord
from optuna_ds.studies._results import is_finished_experiment
from optuna_ds.studies._results import given_up
from optuna_ds.studies._stage import KnobSearch
from optuna_ds.studies._stage import StageContext
from optuna_ds.studies._stage import StageTuner
from optuna_ds.studies._stage import Step
from optuna_ds.studies._stage import Stopped
from optuna_ds.studies._stage import decision_started

KNOB_MARGIN = 0.05
_REFINEMENTS = 3  # the progress display's guess of the experiments an explored arm still takes
_WAIT_SECONDS = 2.0  # a slot with nothing to start looks again after this (or when one of ours ends)
_FAIRNESS_PAUSE = 0.1  # twice the slot pool's poll interval


def observation_of(trial: FrozenTrial, *, stage: int, metric: Metric, dead: dict[str, FrozenTrial]) -> Observation | None:
    """What a stage study's trial tells the planner; ``None`` for a trial that launched nothing or
    whose experiment must run again (interrupted, its worker died)."""
    record = ExperimentRecord.from_trial(trial)
    if not record.claimed or trial.state == TrialState.PRUNED or record.micro_batch_size is None:
        return None
    knobs: tuple = ()
    if record.phase is Phase.KNOBS:
        knobs = tuple(sorted((k, v) for k, v in trial.params.items() if k not in (MBS_KEY, GAS_KEY)))
    base = dict(stage=stage, mbs=int(record.micro_batch_size), offload=record.offload or "", knobs=knobs,
                seconds=record.duration)
    if trial.state == TrialState.RUNNING:
        return Observation(status=Status.RUNNING, **base)
    if trial.state == TrialState.COMPLETE and trial.value is not None and trial.value > 0:
        return Observation(status=Status.OK, score=metric.rate(trial.value), **base)
    if is_finished_experiment(trial) or record.exp_name in dead:
        return Observation(status=Status.OOM if record.reason is FailureReason.OOM else Status.FAILED, **base)
    return None


class Coordinator:
    """One per process: asks the planner for the next experiment whenever a slot of this process
    is free and hands it to that slot.

    The planner sees every stage study's trials (this process's, and those of workers elsewhere,
    running ones included) plus the proposals this process handed out but not yet claimed in
    the storage, so two slots never get the same experiment; across processes a trial's claim
    (:meth:`StageTuner._competitor`) settles a race. When the planner has nothing left, the knob
    search runs at the chosen stage (unless in fast mode), and the choice is stored on the root
    study.
    """

    def __init__(self, *, problem: Problem, tuners: dict[int, StageTuner], ctx: StageContext) -> None:
        self._problem = problem
        self._tuners = tuners
        self._ctx = ctx
        self._pool = ctx.pool
        self._stop = ctx.stop
        self._log = ctx.observer.log
        self._remaining: int | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._handed: list[Proposal] = []
        self._phase_done = False
        self.decision: Decision | None = None

    # -- the storage, as the planner sees it ------------------------------------------------------

    def observations(self) -> list[Observation]:
        seen: list[Observation] = []
        for stage, tuner in self._tuners.items():
            trials = tuner.study.get_trials(deepcopy=False)
            dead = given_up(trials)
            seen += [o for t in trials if (o := observation_of(t, stage=stage, metric=self._ctx.metric, dead=dead)) is not None]
        return seen

    def _progress(self, decision: Decision, observations: list[Observation]) -> None:
        """The progress display's estimate of the experiments left: a few more while any arm is
        unexplored or anything is proposed, none once the planner is done."""
        explored = {o.arm for o in observations}
        left = 0 if decision.done else _REFINEMENTS + sum(1 for a in self._problem.arms if a.key not in explored and not a.offload)
        if left != self._remaining:
            self._remaining = left
            self._ctx.observer.plan(left, metric=self._ctx.metric)

    def _decide(self) -> Decision:
        # The knob search's running trials are the knob search's: they hold no planner decision up.
        observations = [o for o in self.observations() if not (o.knobs and o.status is Status.RUNNING)]
        running = {o.config for o in observations if o.status is Status.RUNNING}
        pending = [Observation(stage=p.stage, mbs=p.mbs, offload=p.offload, knobs=p.knobs, status=Status.RUNNING)
                   for p in self._handed if p.config not in running]
        decision = plan(self._problem, observations + pending, free_slots=1)
        self.decision = decision
        self._progress(decision, observations)
        return decision

    def _next(self) -> Proposal | None:
        """The next experiment for a free slot; ``None`` when there is none now. Sets
        ``_phase_done`` once the planner is done."""
        decision_started()
        with self._lock:
            if self._phase_done:
                return None
            decision = self._decide()
            if decision.proposals:
                proposal = decision.proposals[0]
                self._handed.append(proposal)
                return proposal
            if decision.done:
                self._phase_done = True
                self._log(f"the planner stopped: {decision.reason}")
                self._changed.notify_all()
            return None

    # -- the slots --------------------------------------------------------------------------------

    def run(self) -> None:
        """Run the planner's experiments on every slot of this process until it is done; then the
        knob search (unless fast). Ctrl-C or SIGTERM stops every slot: each ends its running
        experiment by process group and marks its trial ``interrupted``."""
        self._slots(self._plan_slot)
        if self._stop.is_set():
            raise Stopped
        if not self._ctx.fast:
            self._knob_search()
        self.decision = None
        with self._lock:
            decision = self._decide()
        if not decision.done and not self._ctx.fast and not any(o.status is Status.RUNNING for o in self.observations()):
            # The knob search ended the tuning: what its results would make the planner try next
            # is not run, and the choice stands.
            self.decision = dataclasses.replace(decision, proposals=(), done=True, reason="the knob search is over")

    def _slots(self, target: Callable[[], None]) -> None:
        errors: list[BaseException] = []
        finished = [threading.Event() for _ in range(self._pool.size)]

        def slot(index: int) -> None:
            try:
                target()
            except (Stopped, ExperimentInterrupted):
                pass
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                errors.append(e)
                self._stop.set()
                with self._lock:
                    self._changed.notify_all()
            finally:
                finished[index].set()

        for i in range(self._pool.size):
            threading.Thread(target=slot, args=(i,), name=f"optuna-ds-slot-{i}", daemon=True).start()
        # Events, not Thread.join: an interrupted join marks a running thread as stopped.
        try:
            for done in finished:
                while not done.wait(0.1):
                    pass
        except BaseException:
            self._stop.set()
            with self._lock:
                self._changed.notify_all()
            with deferred_signals():
                for done in finished:
                    done.wait()
            raise
        if errors:
            raise errors[0]

    def _plan_slot(self) -> None:
        while not self._stop.is_set():
            lease = self._pool.acquire(self._stop, on_wait=self._log)
            if lease is None:
                raise Stopped
            proposal = None
            try:
                proposal = self._next()
                if proposal is not None:
                    self._tuners[proposal.stage].run_micro_batch(proposal.mbs, lease, offload=proposal.offload,
                                                                 repeat=proposal.repeat, why=proposal.why)
            finally:
                self._pool.release(lease)
                if proposal is not None:
                    with self._lock:
                        self._handed.remove(proposal)
                        self._changed.notify_all()
            if proposal is None:
                with self._lock:
                    if self._phase_done:
                        return
                    self._changed.wait(_WAIT_SECONDS)
            else:
                self._yield_slot()

    def _yield_slot(self) -> None:
        """Locks are not fair: after an experiment, give the slots of other processes waiting
        for these GPUs a turn."""
        self._stop.wait(random.uniform(0.0, _FAIRNESS_PAUSE))

    # -- the knob search --------------------------------------------------------------------------

    def _knob_search(self) -> None:
        """DeepSpeed's recommended knob setting once at each arm within ``KNOB_MARGIN`` of the
        choice (knobs rarely pay more), then the sampler's search at the arm chosen after them."""
        with self._lock:
            choice = (self.decision or self._decide()).choice
        if choice is None:
            return
        best: dict[tuple[int, str], tuple[float, int]] = {}
        for o in self.observations():
            if o.status is Status.OK and not o.knobs and (o.arm not in best or (o.score or 0.0) > best[o.arm][0]):
                best[o.arm] = (float(o.score or 0.0), o.mbs)
        close = [(arm, mbs) for arm, (score, mbs) in sorted(best.items())
                 if score >= (1.0 - KNOB_MARGIN) * choice.measured and recommended_knobs(self._tuners[arm[0]].space) is not None]
        for (stage, offload), mbs in close:
            self._slots(lambda: self._knob_slot(self._tuners[stage].with_knobs(KnobSearch.RECOMMENDED, sizes=(mbs,), offload=offload)))
            if self._stop.is_set():
                raise Stopped
        with self._lock:
            choice = self._decide().choice
        if choice is not None and self._tuners[choice.stage].space.tuned:
            self._slots(lambda: self._knob_slot(self._knob_tuner(choice)))

    def _knob_tuner(self, choice: Choice) -> StageTuner:
        """The chosen arm's tuner for the sampler's search, at the choice's size and the arm's
        next best sizes (``num_tuning_micro_batch_sizes`` in all)."""
        scores: dict[int, list[float]] = {}
        for o in self.observations():
            if o.status is Status.OK and o.arm == (choice.stage, choice.offload) and not o.knobs:
                scores.setdefault(o.mbs, []).append(float(o.score or 0.0))
        ranked = sorted(scores, key=lambda m: -sum(scores[m]) / len(scores[m]))
        sizes = [choice.mbs] + [m for m in ranked if m != choice.mbs]
        return self._tuners[choice.stage].with_knobs(KnobSearch.FULL, sizes=tuple(sizes[: max(1, self._ctx.num_tuning)]),
                                                     offload=choice.offload)

    def _knob_slot(self, tuner: StageTuner) -> None:
        """One slot's knob search; each slot has its own tuner (it counts its stand-downs)."""
        while True:
            lease = self._pool.acquire(self._stop, on_wait=self._log)
            if lease is None:
                raise Stopped
            try:
                step = tuner.step_knobs(lease)
            finally:
                self._pool.release(lease)
            if step is Step.DONE:
                return
            if self._stop.is_set():
                raise Stopped
            if step is Step.WAIT:
                self._stop.wait(0.2)
            else:
                self._yield_slot()
