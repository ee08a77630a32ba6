from __future__ import annotations

import collections
import dataclasses
import datetime
import threading
import time
from collections.abc import Callable
from collections.abc import Hashable
from typing import Protocol

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
from optuna_ds.studies._decider import BEAT_SECONDS
from optuna_ds.studies._decider import Look
from optuna_ds.studies._decider import Peers
from optuna_ds.studies._experiments import StageExperiments
from optuna_ds.studies._experiments import check_unreadable
from optuna_ds.studies._handout import addressee
from optuna_ds.studies._handout import hand_out
from optuna_ds.studies._handout import handed
from optuna_ds.studies._handout import order_of
from optuna_ds.studies._handout import pop
from optuna_ds.studies._handout import waiting
from optuna_ds.studies._knob_search import KnobCandidates
from optuna_ds.studies._owner import this_process

_REFINEMENTS = 3  # the progress display's guess of the experiments an explored arm still takes
# A process reads the storage this often for what other processes did (its own slots wake it).
_POLL_SECONDS = 0.2
# An interrupted slot ends its experiment's process group (SIGKILL after 10 s) and marks its
# trial; one still busy after this (stuck in I/O: a hung file system, a database that does not
# answer) is left behind, a daemon thread, so that the process ends within seconds of a signal.
_STOP_GRACE = 20.0


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


def run_slots(targets: list[Callable[[], None]], *, halt: Callable[[], None]) -> None:
    """Run each of ``targets`` on a thread of its own until each returns. An error of one or an
    interrupt of this thread calls ``halt`` (which stops every one) and is raised once they
    have ended, or after ``_STOP_GRACE`` seconds for one stuck in I/O: so a return says they
    were not stopped, and a signal ends the process within seconds."""
    errors: list[BaseException] = []
    finished = [threading.Event() for _ in targets]

    def slot(index: int) -> None:
        try:
            targets[index]()
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
        for i in range(len(targets)):
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


def _unclaimed(snapshot: dict[int, list[FrozenTrial]]) -> list[Proposal]:
    """The experiments handed out and not claimed yet (queued, or taken by a slot that has not
    claimed it yet): what the planner counts as under way beside the claimed trials."""
    return [p for trials in snapshot.values() for t in trials
            if t.state in (TrialState.RUNNING, TrialState.WAITING) and "exp_name" not in t.user_attrs
            and (p := handed(t)) is not None]


def _finished(snapshot: dict[int, list[FrozenTrial]]) -> frozenset[tuple[int, int, TrialState]]:
    return frozenset((stage, t.number, t.state) for stage, trials in snapshot.items() for t in trials
                     if t.state not in (TrialState.RUNNING, TrialState.WAITING))


class Finishing(Protocol):
    """The experiments the decider queues beside the planner's: once it is done (``spare`` 0),
    or on ``spare`` slots its decision left free."""

    def __call__(self, decision: Decision, *, spare: int = 0) -> list[Proposal]: ...


class Coordinator:
    """One per process: its slots run the experiments the tuning's decider hands out, and where
    this process holds the decision (:class:`Peers`), it is the decider: it asks the planner for
    every free slot of every process at once (``free_slots``) and queues the proposals in the
    storage (:mod:`._handout`), whence any free slot pops one. No two processes decide, so no
    two pick the same experiment; a trial's claim (:func:`._claims.competitor`) still settles
    the rare moment two processes both believe they decide.

    One thread per process reads the storage (every ``_POLL_SECONDS``, or at once when a slot of
    this process frees) and wakes the slots when something is queued; a slot takes its GPUs
    only once an experiment waits for it. Unless in fast mode, the planner also scores the knob
    settings :class:`KnobCandidates` proposes at each arm. ``peers``: ``None`` for a process
    alone on its storage (it decides, for its own slots). ``finishing``: what the decider
    queues once the planner is done (the headline's runs, :meth:`Tuning.alike_runs`), none to end.
    """

    def __init__(self, *, problem: Problem, stages: dict[int, StageExperiments], ctx: StageContext, root: optuna.Study | None,
                 knobs: KnobCandidates | None = None, peers: Peers | None = None,
                 finishing: Finishing | None = None) -> None:
        self._problem = problem
        self._knobs = knobs
        self._root = root
        self._stages = stages
        self._ctx = ctx
        self._pool = ctx.pool
        self._stop = ctx.stop
        self._log = ctx.observer.log
        self._peers = peers
        self._finishing = finishing
        self._remaining: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queue: list[tuple[int, FrozenTrial]] = []  # the queued trials as last read, in order
        self._done = False  # the search is over for this process's slots
        self._poke = threading.Event()  # a slot of this process freed: read the storage now
        self._first_seen: dict[tuple[int, int], float] = {}  # a running trial: when this process first saw it
        self._handed_seen: set[tuple[Config, int, Hashable]] = set()
        self._free_since: dict[str, list[float]] = {}  # a live process: since when each free slot is (the decider's clock)
        self._order = 0
        self._last: Hashable = None  # what the last decision saw, with the slots free then
        self._seen: Hashable = None
        self._stopped_said: str | None = None
        self.decision: Decision | None = None

    @property
    def problem(self) -> Problem:
        return self._problem

    # -- the storage, as the planner sees it ------------------------------------------------------

    def _snapshot(self) -> dict[int, list[FrozenTrial]]:
        """Every stage study's trials, read once: a decision reads one snapshot, so a queued
        trial a slot claims meanwhile is either pending or observed, never neither."""
        return {stage: experiments.study.get_trials(deepcopy=False) for stage, experiments in self._stages.items()}

    def observations(self, snapshot: dict[int, list[FrozenTrial]] | None = None) -> list[Observation]:
        """What the trials of ``snapshot`` (read now by default) tell the planner."""
        seen: list[Observation] = []
        now = time.monotonic()
        for stage, trials in (snapshot if snapshot is not None else self._snapshot()).items():
            dead = given_up(trials)
            for t in trials:
                o = observation_of(t, metric=self._ctx.metric, dead=dead, memory_limit=self._ctx.memory_limit, timeout=self._ctx.timeout)
                if o is None:
                    continue
                if o.status is Status.RUNNING:
                    # Its age by this process's clock (first seen running), not another host's.
                    o = dataclasses.replace(o, seconds=now - self._first_seen.setdefault((stage, t.number), now))
                seen.append(o)
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

    def _decide(self, free_slots: int = 1, snapshot: dict[int, list[FrozenTrial]] | None = None) -> Decision:
        """The planner's decision for ``free_slots`` slots, the queued experiments counted as under way."""
        snapshot = snapshot if snapshot is not None else self._snapshot()
        observations = self.observations(snapshot)
        # A handed trial is claimed (an observation) or not (pending), never both, and never
        # neither: both are read from one snapshot. Each run of a config counts, its repeats apart.
        pending = [Observation(config=p.config, status=Status.RUNNING, repeat=p.repeat, seconds=0.0)
                   for p in _unclaimed(snapshot)]
        noise = _noise(observations)
        candidates = (self._knobs(self._problem.arms, {s: e.study for s, e in self._stages.items()}, noise,
                                  [o.config for o in pending]) if self._knobs is not None else None)
        decision = plan(self._problem, observations + pending, free_slots=free_slots, knob_candidates=candidates)
        self.decision = decision
        # What "nothing new in the storage" means to the loop check: the observations and the
        # failed trials (a handed trial its dead taker left unclaimed, failed by the reaper, is
        # new; one that stood down, pruned, is not).
        self._seen = (frozenset(collections.Counter((o.config, o.status, o.score, o.repeat) for o in observations).items()),
                      frozenset(k for k in _finished(snapshot) if k[2] == TrialState.FAIL))
        self._progress(decision, observations)
        return decision

    def _say_stopped(self, reason: str) -> None:
        """Once a reason: asked again after the runs measured alike, the same verdict is not news."""
        if reason != self._stopped_said:
            self._stopped_said = reason
            self._log(f"the planner stopped: {reason}")

    # -- the decider --------------------------------------------------------------------------------

    def _read(self, snapshot: dict[int, list[FrozenTrial]]) -> tuple[list[tuple[int, FrozenTrial]], int,
                                                                  collections.Counter[str | None], Hashable]:
        """Of ``snapshot``: the queued trials in order; the trials under way (running, queued),
        in all and by the process they were handed to; and what a decision depends on: the
        finished trials."""
        queued: list[tuple[int, FrozenTrial]] = []
        under_way: collections.Counter[str | None] = collections.Counter()
        for stage, trials in snapshot.items():
            queued += [(stage, t) for t in waiting(trials)]
            for t in trials:
                if t.state in (TrialState.RUNNING, TrialState.WAITING):
                    under_way[addressee(t) if handed(t) is not None else None] += 1
        queued.sort(key=lambda item: order_of(item[1]))
        return queued, sum(under_way.values()), under_way, _finished(snapshot)

    def _hand_out(self, proposals: list[Proposal], queued: list[tuple[int, FrozenTrial]], *, check: bool,
                  to: list[str | None]) -> None:
        """Queue ``proposals``, each for the process ``to`` names beside it (``None``: any)."""
        by = self._peers.identity if self._peers is not None else {}
        # After the queue's last, whoever decided it (a decider taking over starts at none).
        self._order = max([self._order] + [order_of(t)[0] for _, t in queued])
        for i, proposal in enumerate(proposals):
            if check:
                key = (proposal.config, proposal.repeat, self._seen)
                if key in self._handed_seen:
                    # Its commonest cause: a settled trial the planner cannot read claims it.
                    check_unreadable(self._stages[proposal.stage].study, proposal.config.run_name(proposal.repeat))
                    raise PlannerLoop(
                        f"internal error: the planner proposed {proposal.config.run_name(proposal.repeat)} twice with "
                        "nothing launched and nothing new in the storage in between, and would for ever (a bug of "
                        "optuna-ds: please report it); every finished experiment is kept")
                self._handed_seen.add(key)
            self._order += 1
            hand_out(self._stages[proposal.stage].study, proposal, order=self._order, by=by, to=to[i] if i < len(to) else None)

    def _addresses(self, look: Look | None, under_way: collections.Counter[str | None], n: int) -> list[str | None]:
        """Whose slot each of ``n`` proposals goes to: the free slots of the live processes, the
        slot free longest first (another process's before this one's where they freed
        together), so that the decider's own slots, which hear of a queued trial first, cannot
        take every one. A slot's free time is when the decider first counted it free. ``None``
        (any process's) alone, or for proposals beyond the slots counted (GPUs shared)."""
        if look is None or len(look.members) <= 1:
            return [None] * n
        now = time.monotonic()
        me = look.members[0][0]
        members = dict(look.members)
        for key in list(self._free_since):
            if key not in members:
                del self._free_since[key]
        for key, slots in members.items():
            since = self._free_since.setdefault(key, [])
            free = max(0, slots - under_way[key])
            del since[:max(0, len(since) - free)]  # taken otherwise: its longest free first
            since += [now] * (free - len(since))
        entries = sorted(((t, key != me, key) for key, since in self._free_since.items() for t in since),
                         key=lambda e: (e[0], not e[1], e[2]))
        to: list[str | None] = []
        for _, _, key in entries[:n]:
            to.append(key)
            self._free_since[key].pop(0)  # served: the slot is busy now
        return to + [None] * (n - len(to))

    def _decide_now(self, free: int, busy: int, digest: Hashable, queued: list[tuple[int, FrozenTrial]], *,
                    snapshot: dict[int, list[FrozenTrial]], look: Look | None,
                    under_way: collections.Counter[str | None]) -> bool:
        """Decide for ``free`` slots where a trial ended or slots freed since the last decision;
        returns whether it queued anything. Marks the search done where nothing is left to run."""
        key = (digest, free)
        if free <= 0 or key == self._last:
            return False
        self._last = key
        decision = self._decide(free, snapshot)
        if decision.proposals:
            extra = []
            spare = free - len(decision.proposals)
            if spare >= 2 and self._finishing is not None:
                # The headline's runs on slots the search leaves free: no wall time of their own.
                extra = self._finishing(decision, spare=spare)
            to = self._addresses(look, under_way, len(decision.proposals) + len(extra))
            self._hand_out(list(decision.proposals), queued, check=True, to=to)
            self._hand_out(extra, queued, check=False, to=to[len(decision.proposals):])
            return True
        if not decision.done or busy:
            return False
        extra = self._finishing(decision) if self._finishing is not None else []
        if extra:
            self._hand_out(extra, queued, check=False, to=self._addresses(look, under_way, len(extra)))
            return True
        self._say_stopped(decision.reason)
        self._finish()
        return False

    def _finish(self) -> None:
        with self._lock:
            self._done = True
            self._changed.notify_all()
        if self._peers is not None and self._peers.deciding:
            self._peers.finish()

    def _ended_elsewhere(self) -> bool:
        """Whether a tune process is ending the tuning (a worker's search ends then: tune's
        choice and files are the last word)."""
        owner = self._ctx.ending_tune()
        if owner is None:
            return False
        self._say_stopped(f"tune (process {owner.get('pid')} on {owner.get('host')}) is ending the tuning: "
                          "this worker launches nothing more")
        return True

    def _watch(self) -> None:
        """This process's one reader of the storage: it decides where this process holds the
        decision, and tells the slots what is queued, until the search is done or stopped."""
        beat = 0.0
        look = None
        ended = False
        while not self._stop.is_set():
            now = time.monotonic()
            if self._peers is not None and now >= beat:
                deciding = look is not None and look.deciding
                look, beat = self._peers.look(), now + BEAT_SECONDS
                if look.deciding and not deciding:
                    # Taken (again): what another decider handed meanwhile is not this one's loop.
                    self._handed_seen.clear()
                ended = not look.deciding and self._ended_elsewhere()
            for stage in self._stages.values():
                # A dead worker's running experiment holds the planner up until it is failed.
                stage.reap()
            snapshot = self._snapshot()
            queued, busy, under_way, digest = self._read(snapshot)
            if look is None or look.deciding:
                slots = look.slots if look is not None else self._pool.size
                if self._decide_now(slots - busy, busy, digest, queued, snapshot=snapshot, look=look, under_way=under_way):
                    queued = self._read(self._snapshot())[0]
            elif (look.done and not queued) or ended:
                self._finish()
            # This process's slots take what was handed to it or to any, or to a process gone.
            mine = queued if look is None or self._peers is None else [
                (stage, t) for stage, t in queued if addressee(t) in (None, self._peers.key) or addressee(t) in look.gone]
            with self._lock:
                self._queue = mine
                self._changed.notify_all()
                if self._done:
                    return
            # Alone and deciding, only this process's slots change the storage (they poke): a
            # process that joins is seen at the next beat.
            alone = look is None or (look.deciding and len(look.members) <= 1)
            self._poke.wait(BEAT_SECONDS if alone else _POLL_SECONDS)
            self._poke.clear()

    # -- the slots --------------------------------------------------------------------------------

    def run(self) -> None:
        """Run the tuning's experiments on every slot of this process until the search is done.
        Ctrl-C or SIGTERM stops every slot: each ends its running experiment by process group
        and marks its trial ``interrupted``."""
        try:
            run_slots([self._watch] + [self._slot] * self._pool.size, halt=self._halt)
        finally:
            if self._peers is not None:
                self._peers.leave()

    def _halt(self) -> None:
        """Stop every slot: a waiting one wakes at once."""
        self._stop.set()
        self._poke.set()
        with self._lock:
            self._changed.notify_all()

    def _take(self) -> tuple[StageExperiments, optuna.Trial, Proposal] | None:
        """Pop the first queued experiment another slot has not taken."""
        with self._lock:
            while self._queue:
                stage, trial = self._queue.pop(0)
                proposal = handed(trial)
                popped = pop(self._stages[stage].study, trial, worker=this_process()) if proposal is not None else None
                if popped is not None and proposal is not None:
                    return self._stages[stage], popped, proposal
        return None

    def _slot(self) -> None:
        free_since = time.monotonic()  # the decision time the observer is told runs from here
        while True:
            with self._lock:
                while not self._queue and not self._done and not self._stop.is_set():
                    self._changed.wait()
                if self._done or self._stop.is_set():
                    return
            # GPUs only once an experiment is queued: a slot that waits holds none.
            lease = self._pool.try_acquire() or self._pool.acquire(self._stop, on_wait=self._log)
            if lease is None:
                return  # stopped
            taken = None
            try:
                taken = self._take()
                if taken is not None:
                    stage, trial, proposal = taken
                    stage.run(proposal.config, lease, free_since=free_since, repeat=proposal.repeat, why=proposal.why,
                              trial=trial)
            finally:
                self._pool.release(lease)
                self._poke.set()
            if taken is not None:
                free_since = time.monotonic()
