from __future__ import annotations

import datetime
import random
import threading
import time
from collections.abc import Callable

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.config import Metric
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import FailureReason
from optuna_ds.domain import RootRecord
from optuna_ds.domain import given_up
from optuna_ds.domain import is_finished_experiment
from optuna_ds.launcher import ExperimentInterrupted
from optuna_ds.launcher import deferred_signals
from optuna_ds.planner import Decision
from optuna_ds.planner import Observation
from optuna_ds.planner import Problem
from optuna_ds.planner import Proposal
from optuna_ds.planner import Status
from optuna_ds.planner import plan
from optuna_ds.space import leanest_knobs
from optuna_ds.space import recommended_knobs
from optuna_ds.space import transferred_knobs
from optuna_ds.studies._context import StageContext
from optuna_ds.studies._knob_search import KnobSearch
from optuna_ds.studies._knob_search import Step
from optuna_ds.studies._stage import StageTuner

KNOB_MARGIN = 0.05
LEAN_REACH = 1.3  # the leanest knobs are tried at an out-of-memory size at most this far above the choice
LEAN_STEP = 1.1  # ...and then at sizes this much larger while they win
_REFINEMENTS = 3  # the progress display's guess of the experiments an explored arm still takes
_WAIT_SECONDS = 2.0  # a slot with nothing to start looks again after this (or when one of ours ends)
_FAIRNESS_PAUSE = 0.1  # twice the slot pool's poll interval
_IDLE_SECONDS = 0.5  # after a decision with nothing to start, the process decides again after this (or when one of ours ends)
_KNOB_WAIT_SECONDS = 0.2  # a knob slot with nothing to start looks again after this (the tuner reads at most every 0.5 s)


def observation_of(trial: FrozenTrial, *, metric: Metric, dead: dict[str, FrozenTrial]) -> Observation | None:
    """What a stage study's trial tells the planner; ``None`` for a trial that launched nothing or
    whose experiment must run again (interrupted, its worker died)."""
    record = ExperimentRecord.from_trial(trial)
    config = record.config
    if not record.claimed or trial.state == TrialState.PRUNED or config is None:
        return None
    repeat = record.repeat or 0
    if trial.state == TrialState.RUNNING:
        # How long it has run: the planner starts no extra experiment late in a round.
        started = trial.datetime_start
        seconds = max(0.0, (datetime.datetime.now() - started).total_seconds()) if started is not None else None
        return Observation(config=config, status=Status.RUNNING, seconds=seconds, repeat=repeat)
    if trial.state == TrialState.COMPLETE and trial.value is not None and trial.value > 0:
        return Observation(config=config, status=Status.OK, score=metric.rate(trial.value), seconds=record.duration, repeat=repeat,
                           memory=record.peak_gpu_memory or None)
    if is_finished_experiment(trial) or record.exp_name in dead:
        status = Status.OOM if record.reason is FailureReason.OOM else Status.FAILED
        return Observation(config=config, status=status, seconds=record.duration, repeat=repeat)
    return None


class Coordinator:
    """One per process: asks the planner for the next experiment whenever a slot of this process
    is free and hands it to that slot.

    The planner sees every stage study's trials (this process's, and those of workers elsewhere,
    running ones included) plus the proposals this process handed out but not yet claimed in
    the storage, so two slots never get the same experiment; across processes a trial's claim
    (:func:`._claims.competitor`) settles a race. When the planner has nothing left, the knob
    search runs (unless in fast mode, or once it is over: see :meth:`run`), then the planner
    again, which may measure knob settings again before its choice; the choice is stored on the
    root study.
    """

    def __init__(self, *, problem: Problem, tuners: dict[int, StageTuner], ctx: StageContext, root: optuna.Study) -> None:
        self._problem = problem
        self._root = root
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
        self._finals = False  # the planner's last phase, after the knob search
        self._idle_until = 0.0
        self.decision: Decision | None = None

    # -- the storage, as the planner sees it ------------------------------------------------------

    def observations(self) -> list[Observation]:
        seen: list[Observation] = []
        for tuner in self._tuners.values():
            trials = tuner.study.get_trials(deepcopy=False)
            dead = given_up(trials)
            seen += [o for t in trials if (o := observation_of(t, metric=self._ctx.metric, dead=dead)) is not None]
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
        # The knob search's running trials (first runs of knob settings; the planner's re-measure
        # theirs) are the knob search's: they hold no planner decision up -- until the finals,
        # whose choice waits for those still running elsewhere.
        observations = [o for o in self.observations()
                        if self._finals or not (o.knobs and not o.repeat and o.status is Status.RUNNING)]
        running = {o.config for o in observations if o.status is Status.RUNNING}
        pending = [Observation(config=p.config, status=Status.RUNNING) for p in self._handed if p.config not in running]
        decision = plan(self._problem, observations + pending, free_slots=1)
        self.decision = decision
        self._progress(decision, observations)
        return decision

    def _next(self) -> Proposal | None:
        """The next experiment for a free slot; ``None`` when there is none now. Sets
        ``_phase_done`` once the planner is done."""
        with self._lock:
            if self._phase_done or time.monotonic() < self._idle_until:
                return None  # nothing changed here since a slot found nothing to start
            for tuner in self._tuners.values():
                # A dead worker's running experiment holds the planner up until it is failed,
                # and with nothing proposed no experiment would start here to fail it.
                tuner.reap()
            decision = self._decide()
            if decision.proposals:
                proposal = decision.proposals[0]
                self._handed.append(proposal)
                return proposal
            if decision.done:
                self._phase_done = True
                self._log(f"the planner stopped: {decision.reason}")
                self._changed.notify_all()
            self._idle_until = time.monotonic() + _IDLE_SECONDS
            return None

    # -- the slots --------------------------------------------------------------------------------

    def run(self) -> None:
        """Run the planner's experiments on every slot of this process until it is done; then the
        knob search (unless fast). Ctrl-C or SIGTERM stops every slot: each ends its running
        experiment by process group and marks its trial ``interrupted``."""
        self._slots(self._plan_slot)
        if not self._ctx.fast:
            # Once over, the knob search is not run again (a rerun, a worker joining the finals):
            # its steps follow the choice, which its own results and the finals have moved since,
            # so they would search afresh.
            if not RootRecord.from_attrs(self._root.user_attrs).knob_search_done:
                self._knob_search()
                RootRecord(knob_search_done=True).write(self._root.set_user_attr)
            # The planner again, with the knob results: finalists within the noise of each other
            # (knob settings measured once) are measured again before the choice.
            with self._lock:
                self._phase_done, self._idle_until, self._finals = False, 0.0, True
            self._slots(self._plan_slot)
        with self._lock:
            self._decide()

    def _slots(self, target: Callable[[], None]) -> None:
        """Run ``target`` on every slot of this process until each returns. A slot's error or an
        interrupt of this thread sets the stop, which ends every slot, and is raised once they
        have ended: so a return says the slots were not stopped."""
        errors: list[BaseException] = []
        finished = [threading.Event() for _ in range(self._pool.size)]

        def slot(index: int) -> None:
            try:
                target()
            except ExperimentInterrupted:
                pass  # the stop, seen by a running experiment: this slot is done
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
        except BaseException:  # noqa: BLE001 - re-raised: an interrupt (Ctrl-C, SIGTERM) first stops every slot
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
                return  # stopped
            proposal = None
            try:
                free_since = time.monotonic()
                proposal = self._next()
                if proposal is not None:
                    self._tuners[proposal.stage].run_config(proposal.config, lease, free_since=free_since, repeat=proposal.repeat,
                                                            why=proposal.why)
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

    # -- the knob search --------------------------------------------------------------------------

    def _knob_search(self) -> None:
        """DeepSpeed's recommended knob setting once at each arm within ``KNOB_MARGIN`` of the
        choice (knobs rarely pay more), side by side, then the sampler's search at the arm chosen
        after them (or, where the chosen arm has no knobs, at the best close arm that has some). The
        chosen arm's own recommended setting is its search's first trial: when no other arm is
        close, the search starts at once and fills every slot."""
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
        tried: set[tuple[int, str]] = set()
        # Another arm's recommended setting may overtake the choice, whose own then runs too.
        while others := [(arm, mbs) for arm, mbs in close if arm != choice.arm and arm not in tried]:
            tuners = [self._tuners[stage].with_knobs(KnobSearch.ONE, sizes=(mbs,), offload=offload)
                      for (stage, offload), mbs in others]
            self._slots(lambda: self._knob_slot(*tuners))
            tried |= {arm for arm, _ in others}
            with self._lock:
                choice = self._decide().choice
            if choice is None:
                return
        stage, offload, mbs = choice.stage, choice.offload, choice.mbs
        if not self._tuners[stage].space.tuned:
            # The chosen arm has no knobs (ZeRO-0): the best close arm that has some may overtake it.
            knobbed = [(score, arm, size) for arm, (score, size) in best.items()
                       if self._tuners[arm[0]].space.tuned and score >= (1.0 - KNOB_MARGIN) * choice.measured]
            if not knobbed:
                return
            _, (stage, offload), mbs = max(knobbed)
        search = self._knob_tuner(stage, offload, mbs)
        self._slots(lambda: self._knob_slot(search))
        self._transfer()
        self._leaner()

    def _transfer(self) -> None:
        """Where the chosen arm's knob search paid, its best setting once at each other arm that
        the same gain would bring within ``KNOB_MARGIN`` of the choice (knob effects mostly carry
        over between stages that read the same knob, but not exactly: a stage a few percent behind
        by default may lead with its knobs set); then the sampler's search at an arm that won."""
        with self._lock:
            decision = self._decide()
        choice = decision.choice
        if choice is None:
            return
        chosen = choice.arm
        default: dict[tuple[int, str], tuple[float, int]] = {}
        tuned: tuple[float, tuple] | None = None
        for o in self.observations():
            if o.status is not Status.OK or not o.score:
                continue
            if not o.knobs and (o.arm not in default or o.score > default[o.arm][0]):
                default[o.arm] = (o.score, o.mbs)
            elif o.knobs and o.arm == chosen and (tuned is None or o.score > tuned[0]):
                tuned = (o.score, o.knobs)
        if tuned is None or chosen not in default:
            return
        gain = tuned[0] / default[chosen][0]
        if gain <= 1.0 + (decision.noise or 0.0):
            return
        tuners = []
        for (stage, offload), (score, mbs) in sorted(default.items()):
            space = self._tuners[stage].space.with_offload(offload) if offload else self._tuners[stage].space
            setting = transferred_knobs(space, dict(tuned[1])) if space.tuned else None
            if (stage, offload) != chosen and score * gain >= (1.0 - KNOB_MARGIN) * choice.measured and setting is not None:
                tuners.append(self._tuners[stage].with_knobs(KnobSearch.ONE, sizes=(mbs,), offload=offload, setting=setting))
        if not tuners:
            return
        self._slots(lambda: self._knob_slot(*tuners))
        with self._lock:
            choice = self._decide().choice
        if choice is not None and choice.arm != chosen:
            search = self._knob_tuner(choice.stage, choice.offload, choice.mbs)
            self._slots(lambda: self._knob_slot(search))

    def _leaner(self) -> None:
        """Where the choice sits at its arm's memory edge (the next size measured ran out with the
        default knobs), the leanest knob setting at that size, and at larger ones while each runs
        and wins: smaller buffers leave room, and a larger micro-batch may pay more than the knobs
        cost."""
        with self._lock:
            choice = self._decide().choice
        if choice is None:
            return
        arm = choice.arm
        edge = min((o.mbs for o in self.observations() if o.arm == arm and not o.knobs and o.status is Status.OOM
                    and o.mbs > choice.mbs), default=None)
        if edge is None or edge > LEAN_REACH * choice.mbs + 1:
            return
        tuner = self._tuners[choice.stage]
        setting = leanest_knobs(tuner.space.with_offload(choice.offload) if choice.offload else tuner.space)
        known = self._problem.arm(arm)
        cap = known.cap if known is not None else edge
        size = edge
        while setting is not None and size <= cap:
            lean = tuner.with_knobs(KnobSearch.ONE, sizes=(size,), offload=choice.offload, setting=setting)
            self._slots(lambda: self._knob_slot(lean))
            with self._lock:
                choice = self._decide().choice
            if choice is None or (choice.stage, choice.offload, choice.mbs) != (*arm, size) or dict(choice.knobs) != setting:
                return
            size = max(size + 1, int(size * LEAN_STEP))

    def _knob_tuner(self, stage: int, offload: str, mbs: int) -> StageTuner:
        """An arm's tuner for the sampler's search, at size ``mbs`` and the arm's next best sizes
        (``num_tuning_micro_batch_sizes`` in all)."""
        scores: dict[int, list[float]] = {}
        for o in self.observations():
            if o.status is Status.OK and o.arm == (stage, offload) and not o.knobs:
                scores.setdefault(o.mbs, []).append(float(o.score or 0.0))
        ranked = sorted(scores, key=lambda m: -sum(scores[m]) / len(scores[m]))
        sizes = [mbs] + [m for m in ranked if m != mbs]
        noise = self.decision.noise if self.decision is not None else None
        return self._tuners[stage].with_knobs(KnobSearch.FULL, sizes=tuple(sizes[: max(1, self._ctx.num_tuning)]), offload=offload,
                                              min_improvement=noise or 0.0)

    def _knob_slot(self, *tuners: StageTuner) -> None:
        """One slot's share of the knob searches run side by side (the close arms' recommended
        settings, or the chosen arm's search). The slots share each tuner, which has them decide
        one at a time; a slot passes over a tuner with nothing to start, and waits only when none
        has one (until one of ours ends, or a while, for those running elsewhere)."""
        pending = list(tuners)
        while pending:
            ran = False
            for tuner in list(pending):
                lease = self._pool.acquire(self._stop, on_wait=self._log)
                if lease is None:
                    return  # stopped
                try:
                    step = tuner.step_knobs(lease)
                finally:
                    self._pool.release(lease)
                if self._stop.is_set():
                    return
                if step is Step.DONE:
                    pending.remove(tuner)
                ran |= step is Step.RAN
            if ran:
                with self._lock:
                    self._changed.notify_all()
                self._yield_slot()
            elif pending:
                with self._lock:
                    self._changed.wait(_KNOB_WAIT_SECONDS)
