from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Set

EDGE_TOLERANCE = 0.05  # the OOM edge is known well enough within 5%
FLAT = 0.01  # scores within 1% are as good as each other: no refinement between them
REFINE_TOLERANCE = 0.1  # near a sweet spot, sizes 10% apart perform within about 1%
PLATEAU_ELASTICITY = 0.1  # growing the size by x% gained under 0.1x%: larger sizes do not pay
NEAR_EDGE = 0.15  # a best size this close under the OOM edge may sit in memory pressure
PRESSURE_SHARE = 0.5  # activations filling this share of the free memory: a memory-pressure sweet spot
COMPETITIVE = 0.05  # a carried stage more than 5% behind the best so far is not pursued
PROFILE_UNDERESTIMATE = 1.1  # the engine's activation figure is low (seen: 23 estimated, 20 ran on an H100)
MAX_PROBES = 12
_MAX_CRASHES = 2


@dataclasses.dataclass(frozen=True)
class Observation:
    """What one finished experiment says about a micro-batch size.

    ``score`` is the metric oriented so that higher is better (latency negated); ``None``
    when the experiment failed. ``oom`` marks a memory failure.
    """

    mbs: int
    score: float | None
    oom: bool = False

    @property
    def ok(self) -> bool:
        return self.score is not None


@dataclasses.dataclass(frozen=True)
class MemoryModel:
    """The real memory of one sample, learned from runs.

    Memory is modelled as ``instantiation + mbs * per_sample``: a size that ran bounds
    ``per_sample`` from above by ``free / mbs``, an OOM bounds it from below (``free`` is the
    device memory less the stage's estimated instantiation memory). Runs of earlier stages are
    ``carried`` as ``(free, mbs, oom)``, so a later stage knows its edge before its first run.
    Where the bounds contradict each other (a memory cliff, a wrong estimate) the carried runs
    are dropped, then the model gives up and the search bisects.
    """

    free: float
    prior: float | None = None  # the profile's activation memory of one sample
    carried: tuple[tuple[float, int, bool], ...] = ()

    def bounds(self, obs: Mapping[int, Observation], *, carry: bool = True) -> tuple[float, float] | None:
        """``(lo, hi)``: per-sample memory is above ``lo`` and at most ``hi``; ``None`` if
        the runs contradict each other."""
        lo, hi = 0.0, math.inf
        points = [(self.free, o.mbs, o.oom) for o in obs.values() if o.ok or o.oom]
        if carry:
            points += list(self.carried)
        for free, mbs, oom in points:
            if oom:
                lo = max(lo, free / mbs)
            else:
                hi = min(hi, free / mbs)
        if lo >= hi:
            return self.bounds(obs, carry=False) if carry and self.carried else None
        return lo, hi

    def per_sample(self, obs: Mapping[int, Observation]) -> float | None:
        bounds = self.bounds(obs)
        if bounds is None:
            return None
        lo, hi = bounds
        prior = self.prior * PROFILE_UNDERESTIMATE if self.prior else None
        if lo > 0 and math.isfinite(hi):
            return (lo + hi) / 2
        if lo > 0:
            # Each OOM without a run below it was a worse guess: step down faster.
            ooms = sum(1 for o in obs.values() if o.oom)
            return max(lo * 1.1 * 1.5 ** max(0, ooms - 1), prior or 0.0)
        if math.isfinite(hi):
            # Only runs that fit: 10% more than the largest of them, unless the profile says more.
            return prior if prior and prior < hi * 0.9 else hi * 0.9
        return prior

    def edge(self, obs: Mapping[int, Observation]) -> int | None:
        """The predicted largest size that fits; ``None`` when unknown."""
        a = self.per_sample(obs)
        if not a or self.free <= 0:
            return None
        return max(1, int(self.free // a))

    def equivalent(self, mbs: int, free: float) -> int | None:
        """The size here that leaves the memory free that ``mbs`` left at a stage with ``free``."""
        a = self.per_sample({})
        if not a:
            return None
        return max(1, int(mbs + (self.free - free) // a))


def carried_start(previous: Mapping[int, Observation], best: int, *, memory: MemoryModel, free: float) -> int | None:
    """Where a later stage starts, given an earlier stage's runs and its best size ``best``
    (``free``: that stage's free memory); ``None`` when that best was the largest size that ran,
    so the later stage searches from its own predicted edge.

    An interior best whose samples fill most of the free memory is a memory-pressure sweet spot:
    it moves with the memory a higher stage saves, so the start leaves as much memory free. An
    interior best with memory to spare is the throughput curve's own peak: the same size.
    """
    if not any(o.ok and m > best for m, o in previous.items()):
        return None
    per_sample = memory.per_sample({})
    if per_sample and best * per_sample >= PRESSURE_SHARE * free:
        return memory.equivalent(best, free)
    return best


class _Blocked(Exception):
    """Every useful next size is waiting for a running experiment."""


@dataclasses.dataclass(frozen=True)
class MicroBatchSearch:
    """The micro-batch search of one ZeRO stage.

    It looks for the best size, not the whole curve. The first size is the memory model's
    predicted OOM edge (or, at a later stage, the size that leaves as much memory free as the
    best size of the earlier stages did); from there:

    - up, while throughput still grows and no OOM is within 5%, to the edge the model predicts
      from the runs so far (bisecting where it cannot predict);
    - down once, when the best size sits within 15% under the OOM edge or a larger size ran
      worse (memory pressure often makes a slightly smaller size faster);
    - halfway to a neighbour that is more than 1% worse, until the sizes are 10% apart.

    A later stage starts from what the earlier ones learned: if their best size was an interior
    sweet spot, this stage runs the size :func:`carried_start` says (``start``) and goes on
    (``local`` steps) only if that beats the best so far (``to_beat``); otherwise it searches
    from its predicted edge and stops as soon as it is more than 5% behind. The user's own micro-batch size, when given, runs
    first as the baseline.

    The next size is a pure function of the observations, so a resumed or shared tuning
    continues where it stopped. Sizes running elsewhere (``pending``) are not asked for twice:
    the search then splits the widest open interval instead, so k experiments run at once.
    """

    min_mbs: int
    floor_mbs: int
    cap: int
    user_list: tuple[int, ...] | None = None
    memory: MemoryModel | None = None
    start: int | None = None
    to_beat: float | None = None
    local: bool = False
    probe_min: bool = True

    def next_mbs(self, observations: Mapping[int, Observation], pending: Set[int] = frozenset()) -> int | None:
        """The next size to run; ``None`` when the search is over or waits for ``pending``."""
        try:
            return self._next(observations, pending)
        except _Blocked:
            return None

    def edge(self, observations: Mapping[int, Observation]) -> int:
        """The largest micro-batch size known to run (0 if none)."""
        return max((m for m, o in observations.items() if o.ok), default=0)

    def best(self, observations: Mapping[int, Observation], n: int = 1) -> list[int]:
        """The ``n`` best micro-batch sizes by score."""
        ok = sorted((o for o in observations.values() if o.ok), key=lambda o: (-(o.score or 0.0), o.mbs))
        return [o.mbs for o in ok[:n]]

    def predicted_edge(self) -> int:
        """The largest size expected to fit before this stage has run anything."""
        guess = self._edge_guess({})
        return guess if guess is not None else self.cap

    def _edge_guess(self, obs: Mapping[int, Observation]) -> int | None:
        """The memory model's edge within the configured maximum; ``None`` when it has none."""
        guess = self.memory.edge(obs) if self.memory else None
        return min(guess, self.cap) if guess is not None else None

    # -- the state machine -----------------------------------------------------------------

    def _next(self, obs: Mapping[int, Observation], pending: Set[int]) -> int | None:
        if self.user_list:
            todo = [m for m in self.user_list if m not in obs]
            free = [m for m in todo if m not in pending]
            return free[0] if free else None
        cap = max(self.cap, 1)
        lo = min(self.floor_mbs, cap)
        if self.probe_min:
            user = min(self.min_mbs, cap)
            for size in (user, lo) if lo < user else (user,):
                if size not in obs:
                    return self._want(size, pending)
                if obs[size].ok:
                    break
            else:
                return None
        if len(obs) >= MAX_PROBES:
            return None
        ok = sorted(m for m, o in obs.items() if o.ok)
        if not ok:
            if sum(1 for o in obs.values() if not o.ok and not o.oom) >= _MAX_CRASHES:
                return None  # it crashes, and not for memory: no size will help
            fail_min = min(obs, default=cap + 1)
            if fail_min <= lo:
                return None
            return self._between(lo - 1, fail_min, self._first(obs), obs, pending)

        best = self.best(obs)[0]
        score = obs[best].score
        assert score is not None
        if self.to_beat is not None:
            if self.local and score <= self.to_beat:
                return None  # its curve is the earlier stage's, shifted: its best is no better
            if score < self.to_beat - COMPETITIVE * abs(self.to_beat):
                return None
        moves = self._local_moves(obs, best, cap) if self.local else self._moves(obs, pending, best, ok, cap)
        for size in moves:
            if size not in obs and size not in pending:
                return size
        if any(m in pending for m in moves):
            raise _Blocked
        return None

    def _first(self, obs: Mapping[int, Observation]) -> int:
        if self.start is not None and self.start not in obs:
            return self.start
        guess = self._edge_guess(obs)
        return guess if guess is not None else self.cap

    def _want(self, size: int, pending: Set[int]) -> int:
        if size in pending:
            raise _Blocked
        return size

    def _between(self, a: int, b: int, preferred: int | None, obs: Mapping[int, Observation], pending: Set[int]) -> int | None:
        """A size strictly between ``a`` and ``b``: ``preferred`` if it is free, else the middle
        of the widest gap left by the sizes running elsewhere."""
        if b - a <= 1:
            return None
        if preferred is not None and a < preferred < b and preferred not in pending and preferred not in obs:
            return preferred
        points = [a, *sorted(m for m in pending if a < m < b), b]
        width, x, y = max((y - x, x, y) for x, y in zip(points, points[1:]))
        if width <= 1:
            raise _Blocked
        return (x + y) // 2

    def _moves(self, obs: Mapping[int, Observation], pending: Set[int], best: int, ok: list[int], cap: int) -> list[int]:
        """The sizes worth running next around ``best``, most useful first."""
        moves: list[int] = []
        top = ok[-1]
        fail_above = min((m for m, o in obs.items() if not o.ok and m > top), default=None)
        ceiling = fail_above if fail_above is not None else cap + 1
        below = [m for m in ok if m < best]
        # Down first when the best is just under the OOM edge (memory pressure) or larger sizes
        # ran worse: the sweet spot may be lower still.
        near_edge = fail_above is not None and fail_above - best <= max(1, NEAR_EDGE * best) + 1
        if not below and best > self.floor_mbs and (near_edge or best < top):
            moves.append(max(self.floor_mbs, int(round(best * (1 - NEAR_EDGE)))))
        # Up: the best is the largest size that ran and larger ones may still pay.
        plateau = best == top and self._plateau(obs, below, top)
        if best == top and ceiling - top > max(1, int(EDGE_TOLERANCE * top)) and not plateau:
            guess = self._edge_guess(obs)
            if guess is None or not top < guess < ceiling:
                guess = (top + ceiling) // 2 if fail_above is not None else min(cap, top * 2)
            try:
                up = self._between(top, ceiling, guess, obs, pending)  # with k running: k-ary
            except _Blocked:
                up = guess  # pending: waited for unless another move is free
            if up is not None:
                moves.append(up)
        return moves + self._refinements(obs, best, flattened=plateau)

    def _local_moves(self, obs: Mapping[int, Observation], best: int, cap: int) -> list[int]:
        """A step of 10% each way from the best, then halfway to a worse neighbour."""
        step = max(1, int(round(0.1 * best)))
        fail_above = min((m for m, o in obs.items() if not o.ok and m > best), default=cap + 1)
        moves = []
        if not any(best < m <= best + step for m in obs) and best + step < fail_above:
            moves.append(min(best + step, cap))
        if not any(best - step <= m < best for m in obs) and best - step >= self.floor_mbs:
            moves.append(best - step)
        return [m for m in moves if m != best] + self._refinements(obs, best)

    def _refinements(self, obs: Mapping[int, Observation], best: int, *, flattened: bool = False) -> list[int]:
        """Halfway between the best and a neighbour that is worse by more than FLAT, once a
        larger size ran worse or the scores ``flattened`` (while they still rise with the size,
        the way is up)."""
        ok = sorted(m for m, o in obs.items() if o.ok)
        if ok[-1] == best and not flattened:
            return []
        score = lambda m: obs[m].score or 0.0  # noqa: E731
        neighbours = [max(m for m in ok if m < best)] if ok[0] < best else []
        if ok[-1] > best:
            neighbours.append(min(m for m in ok if m > best))
        return [(n + best) // 2 for n in neighbours
                if abs(n - best) > max(1, round(REFINE_TOLERANCE * best)) and score(n) < score(best) - FLAT * abs(score(best))]

    @staticmethod
    def _plateau(obs: Mapping[int, Observation], below: list[int], top: int) -> bool:
        """Growing the size stopped paying: from the next smaller size to ``top`` the score grew
        by under a tenth of the size's growth."""
        if not below:
            return False
        prev = max(below)
        s_top, s_prev = obs[top].score, obs[prev].score
        assert s_top is not None and s_prev is not None
        gain = (s_top - s_prev) / abs(s_prev) if s_prev else math.inf
        return gain < PLATEAU_ELASTICITY * (top / prev - 1)
