from __future__ import annotations

import collections
import datetime
import random
import threading
import time
from collections.abc import Callable
from collections.abc import Hashable

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds._errors import OptunaDSError
from optuna_ds.config import Metric
from optuna_ds.domain import Config
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import FailureReason
from optuna_ds.domain import given_up
from optuna_ds.domain import is_finished_experiment
from optuna_ds.launcher import ExperimentInterrupted
from optuna_ds.launcher import deferred_signals
from optuna_ds.launcher import is_measurement
from optuna_ds.planner import Decision
from optuna_ds.planner import Observation
from optuna_ds.planner import Problem
from optuna_ds.planner import Proposal
from optuna_ds.planner import Status
from optuna_ds.planner import measured_noise
from optuna_ds.planner import plan
from optuna_ds.studies._context import StageContext
from optuna_ds.studies._experiments import StageExperiments
from optuna_ds.studies._knob_search import KnobCandidates

_REFINEMENTS = 3  # the progress display's guess of the experiments an explored arm still takes
_WAIT_SECONDS = 2.0  # a slot with nothing to start looks again after this (or when one of ours ends)
_FAIRNESS_PAUSE = 0.1  # twice the slot pool's poll interval
# An interrupted slot ends its experiment's process group (SIGKILL after 10 s) and marks its
# trial; one still busy after this (stuck in I/O: a hung file system, a database that does not
# answer) is left behind, a daemon thread, so that the process ends within seconds of a signal.
_STOP_GRACE = 20.0
_IDLE_SECONDS = 0.5  # after a decision with nothing to start, the process decides again after this (or when one of ours ends)


class PlannerLoop(OptunaDSError):
    """The planner proposed an experiment it had proposed before, with nothing launched and
    nothing new in the storage since: it is a pure function of the storage, so it would propose
    it for ever. A bug of optuna-ds, said in one line instead of a tuning that never ends."""

    exit_code = 1


def observation_of(trial: FrozenTrial, *, metric: Metric, dead: dict[str, FrozenTrial],
                   memory_limit: float | None = None, timeout: float | None = None) -> Observation | None:
    """What a stage study's trial tells the planner; ``None`` for a trial that launched nothing or
    whose experiment must run again (interrupted, its worker died, the machine failed it, timed
    out under a shorter trial timeout than ``timeout``: see :func:`is_finished_experiment`). A run whose measured peak
    memory exceeds ``memory_limit`` (the device's less the user's margin) counts as out of
    memory: it ran, but without the headroom the chosen config must keep."""
    record = ExperimentRecord.from_trial(trial)
    config = record.config
    if not record.claimed or (trial.state == TrialState.PRUNED and not record.pruned) or config is None:
        return None
    repeat = record.repeat or 0
    if record.pruned:  # ended early by the pruner: a measurement of fewer steps (docs/steps.md)
        return Observation(config=config, status=Status.OK, score=metric.rate(float(record.pruned["figure"])),
                           seconds=record.duration, repeat=repeat)
    if trial.state == TrialState.RUNNING:
        # How long it has run: the planner starts no extra experiment late in a round.
        started = trial.datetime_start
        seconds = max(0.0, (datetime.datetime.now() - started).total_seconds()) if started is not None else None
        return Observation(config=config, status=Status.RUNNING, seconds=seconds, repeat=repeat)
    # A value an earlier version stored unchecked (a latency of 5e-324: a rate of infinity) is a failed run.
    if trial.state == TrialState.COMPLETE and is_measurement(trial.value):
        if memory_limit is not None and record.peak_gpu_memory and record.peak_gpu_memory > memory_limit:
            return Observation(config=config, status=Status.OOM, seconds=record.duration, repeat=repeat)
        logged = record.checkpointing
        return Observation(config=config, status=Status.OK, score=metric.rate(trial.value), seconds=record.duration, repeat=repeat,
                           memory=record.peak_gpu_memory or None, timers=tuple(sorted((record.timers_ms or {}).items())),
                           checkpointing=tuple(sorted(logged.items())) if isinstance(logged, dict) else None)
    if is_finished_experiment(trial, timeout=timeout) or record.exp_name in dead:
        status = Status.OOM if record.reason is FailureReason.OOM else Status.FAILED
        return Observation(config=config, status=status, seconds=record.duration, repeat=repeat,
                           reason=record.reason.value if record.reason is not None else None)
    return None


def _noise(observations: list[Observation]) -> float | None:
    """The noise of one run as the planner measures it from ``observations`` (``None`` before
    one ran): the knob search's early stopping reads it, so it comes from the storage, as every
    other input of the planner does, and every process given the same trials decides the same."""
    runs: dict[Config, list[float]] = {}
    for o in observations:
        if o.status is Status.OK and o.score is not None and o.score > 0:
            runs.setdefault(o.config, []).append(o.score)
    return measured_noise(runs.values())[0] if runs else None


def run_slots(size: int, target: Callable[[], None], *, halt: Callable[[], None]) -> None:
    """Run ``target`` on ``size`` slot threads until each returns. A slot's error or an
    interrupt of this thread calls ``halt`` (which stops every slot) and is raised once they
    have ended, or after ``_STOP_GRACE`` seconds for a slot stuck in I/O: so a return says the
    slots were not stopped, and a signal ends the process within seconds."""
    errors: list[BaseException] = []
    finished = [threading.Event() for _ in range(size)]

    def slot(index: int) -> None:
        try:
            target()
        except ExperimentInterrupted:
            pass  # the stop, seen by a running experiment: this slot is done
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            errors.append(e)
            halt()
        finally:
            finished[index].set()

    launched: list[threading.Event] = []
    # Events, not Thread.join: an interrupted join marks a running thread as stopped.
    try:
        for i in range(size):
            launched.append(finished[i])
            threading.Thread(target=slot, args=(i,), name=f"optuna-ds-slot-{i}", daemon=True).start()
        for done in finished:
            while not done.wait(0.1):
                pass
    except BaseException:  # noqa: BLE001 - re-raised: an interrupt (Ctrl-C, SIGTERM) first stops every slot
        halt()
        deadline = time.monotonic() + _STOP_GRACE
        with deferred_signals():
            for done in launched:
                done.wait(max(0.0, deadline - time.monotonic()))
        raise
    if errors:
        raise errors[0]


class Coordinator:
    """One per process: asks the planner for the next experiment whenever a slot of this process
    is free and hands it to that slot.

    The planner sees every stage study's trials (this process's, and those of workers elsewhere,
    running ones included) plus the proposals this process handed out but not yet claimed in
    the storage, so two slots never get the same experiment; across processes a trial's claim
    (:func:`._claims.competitor`) settles a race. Unless in fast mode, the planner also scores the
    knob settings :class:`KnobCandidates` proposes at each arm; the choice is stored on the root
    study.
    """

    def __init__(self, *, problem: Problem, stages: dict[int, StageExperiments], ctx: StageContext, root: optuna.Study,
                 knobs: KnobCandidates | None = None) -> None:
        self._problem = problem
        self._knobs = knobs
        self._root = root
        self._stages = stages
        self._ctx = ctx
        self._pool = ctx.pool
        self._stop = ctx.stop
        self._log = ctx.observer.log
        self._remaining: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._handed: list[Proposal] = []
        # Proposals whose run launched nothing, with what the planner saw when it proposed them;
        # emptied by any launch of this process.
        self._unlaunched: set[tuple[Config, int, Hashable]] = set()
        self._seen: Hashable = None
        self._stopped_said: str | None = None
        self._phase_done = False
        self._idle_until = 0.0
        self.decision: Decision | None = None

    @property
    def problem(self) -> Problem:
        return self._problem

    # -- the storage, as the planner sees it ------------------------------------------------------

    def observations(self) -> list[Observation]:
        seen: list[Observation] = []
        for stage in self._stages.values():
            trials = stage.study.get_trials(deepcopy=False)
            dead = given_up(trials)
            seen += [o for t in trials if (o := observation_of(t, metric=self._ctx.metric, dead=dead, memory_limit=self._ctx.memory_limit,
                                                               timeout=self._ctx.timeout)) is not None]
        return seen

    def _progress(self, decision: Decision, observations: list[Observation]) -> None:
        """The progress display's estimate of the experiments left: a few more while any arm is
        unexplored or anything is proposed, none once the planner is done."""
        # The arm of the experiment about to start is explored: counted among those under way,
        # not again among the arms still to explore.
        explored = {o.arm for o in observations} | {p.config.arm for p in decision.proposals}
        left = 0 if decision.done else _REFINEMENTS + sum(1 for a in self._problem.arms if a.key not in explored and not a.offload)
        starting = len(decision.proposals)
        if (left, starting) != self._remaining:
            self._remaining = (left, starting)
            self._ctx.observer.plan(left, metric=self._ctx.metric, ceiling=self._problem.max_experiments, starting=starting)

    def _decide(self) -> Decision:
        observations = self.observations()
        running = {o.config for o in observations if o.status is Status.RUNNING}
        pending = [Observation(config=p.config, status=Status.RUNNING) for p in self._handed if p.config not in running]
        noise = _noise(observations)
        candidates = (self._knobs(self._problem.arms, {s: e.study for s, e in self._stages.items()}, noise,
                                  [o.config for o in pending]) if self._knobs is not None else None)
        decision = plan(self._problem, observations + pending, free_slots=1, knob_candidates=candidates)
        self.decision = decision
        self._seen = frozenset(collections.Counter((o.config, o.status, o.score, o.repeat) for o in observations).items())
        self._progress(decision, observations)
        return decision

    def _next(self) -> tuple[Proposal, Hashable] | None:
        """The next experiment for a free slot, with what the planner saw; ``None`` when there
        is none now. Sets ``_phase_done`` once the planner is done."""
        with self._lock:
            if self._phase_done or time.monotonic() < self._idle_until or self._ended_elsewhere():
                return None  # nothing changed here since a slot found nothing to start
            for stage in self._stages.values():
                # A dead worker's running experiment holds the planner up until it is failed,
                # and with nothing proposed no experiment would start here to fail it.
                stage.reap()
            decision = self._decide()
            if decision.proposals:
                proposal = decision.proposals[0]
                self._handed.append(proposal)
                return proposal, self._seen
            if decision.done:
                self._phase_done = True
                self._say_stopped(decision.reason)
                self._changed.notify_all()
            self._idle_until = time.monotonic() + _IDLE_SECONDS
            return None

    def _ended_elsewhere(self) -> bool:
        """Whether a tune process is ending the tuning (a worker's search ends then: tune's
        choice and files are the last word). Sets ``_phase_done``; called under the lock."""
        owner = self._ctx.ending_tune()
        if owner is None:
            return False
        self._phase_done = True
        self._say_stopped(f"tune (process {owner.get('pid')} on {owner.get('host')}) is ending the tuning: "
                          "this worker launches nothing more")
        self._changed.notify_all()
        return True

    def _say_stopped(self, reason: str) -> None:
        """Once a reason: asked again after the runs measured alike, the same verdict is not news."""
        if reason != self._stopped_said:
            self._stopped_said = reason
            self._log(f"the planner stopped: {reason}")

    def end(self, publish: Callable[[], None]) -> None:
        """End the search for every process once this one's planner is done: ``publish`` tells
        the others (tune's end, on the root study), then the planner is asked again, so an
        experiment another process claimed before it is waited for (and, should it change the
        planner's mind, the search goes on here); a claim after it stands down unlaunched."""
        publish()
        self.reopen()
        self.run()

    def reopen(self) -> None:
        """Ask the planner again after experiments it did not propose (the runs measured alike)."""
        with self._lock:
            self._phase_done = False
            self._idle_until = 0.0

    # -- the slots --------------------------------------------------------------------------------

    def run(self) -> None:
        """Run the planner's experiments on every slot of this process until it is done. Ctrl-C
        or SIGTERM stops every slot: each ends its running experiment by process group and
        marks its trial ``interrupted``."""
        run_slots(self._pool.size, self._plan_slot, halt=self._halt)
        with self._lock:
            # Done, the decision stands: asked again, it could see another process's claim made
            # since (as not done), and tune would not end the tuning (:meth:`end` waits for it).
            if not self._phase_done:
                self._decide()

    def _halt(self) -> None:
        """Stop every slot: a waiting one wakes at once."""
        self._stop.set()
        with self._lock:
            self._changed.notify_all()

    def _nothing_to_start(self) -> bool:
        """Whether the planner is done, asked before waiting for a slot another process holds:
        a resumed tuning with nothing left to launch must not wait on someone else's experiment."""
        with self._lock:
            if not self._phase_done and not self._ended_elsewhere():
                for stage in self._stages.values():
                    stage.reap()  # as _next does: a dead worker's running experiment must not pass for one under way
                decision = self._decide()
                if decision.done and not decision.proposals:
                    self._phase_done = True
                    self._say_stopped(decision.reason)
                    self._changed.notify_all()
            return self._phase_done

    def _plan_slot(self) -> None:
        while not self._stop.is_set():
            lease = self._pool.try_acquire()
            if lease is None:
                if self._nothing_to_start():
                    return
                lease = self._pool.acquire(self._stop, on_wait=self._log)
            if lease is None:
                return  # stopped
            proposal = None
            try:
                free_since = time.monotonic()
                handed = self._next()
                if handed is not None:
                    proposal, seen = handed
                    launched = self._stages[proposal.stage].run(proposal.config, lease, free_since=free_since,
                                                                repeat=proposal.repeat, why=proposal.why)
                    with self._lock:
                        if launched:
                            self._unlaunched.clear()
                        elif (proposal.config, proposal.repeat, seen) in self._unlaunched:
                            raise PlannerLoop(
                                f"internal error: the planner proposed {proposal.config.run_name(proposal.repeat)} twice with "
                                "nothing launched and nothing new in the storage in between, and would for ever (a bug of "
                                "optuna-ds: please report it); every finished experiment is kept")
                        else:
                            self._unlaunched.add((proposal.config, proposal.repeat, seen))
            finally:
                self._pool.release(lease)
                if proposal is not None:
                    with self._lock:
                        self._handed.remove(proposal)
                        self._idle_until = 0.0
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
