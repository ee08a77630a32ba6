from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Set

PLATEAU = 0.05  # DeepSpeed's METRIC_PERCENT_DIFF_CONST: under 5% better counts as no better.


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


class _Need(Exception):
    def __init__(self, mbs: int) -> None:
        self.mbs = mbs


class _Blocked(Exception):
    """Every useful next size is waiting for a running experiment."""


@dataclasses.dataclass(frozen=True)
class MicroBatchSearch:
    """The micro-batch search of one ZeRO stage, as DeepSpeed's README describes it.

    1. The minimum: the user's micro-batch size, else ``min_train_micro_batch_size_per_gpu``.
    2. The OOM edge: the memory estimate's bound is tried, then bisected against the real
       failures until the edge is known to 5% or throughput plateaus.
    3. The sweet spot: ``num_tuning`` sizes between half the edge and the edge, then one
       size halfway to each neighbour of the best of them.

    The search is a pure function of the observations: :meth:`next_mbs` replays it over what
    has finished and returns the first size it lacks. A resumed or shared tuning therefore
    continues exactly where it stopped. Sizes running elsewhere (``pending``) are not asked
    for twice: the edge search then splits the widest open interval instead (a k-ary search
    with k experiments at once) and the sweet spot takes its next grid size.
    """

    min_mbs: int
    floor_mbs: int
    cap: int
    num_tuning: int
    user_list: tuple[int, ...] | None = None

    def next_mbs(self, observations: Mapping[int, Observation], pending: Set[int] = frozenset()) -> int | None:
        """The next size to run; ``None`` when the search is over or waits for ``pending``."""
        try:
            self._walk(observations, pending)
        except _Need as need:
            return need.mbs
        except _Blocked:
            return None
        return None

    def edge(self, observations: Mapping[int, Observation]) -> int:
        """The largest micro-batch size known to run (0 if none)."""
        ok = [m for m, o in observations.items() if o.ok]
        return max(ok, default=0)

    def best(self, observations: Mapping[int, Observation], n: int = 1) -> list[int]:
        """The ``n`` best micro-batch sizes by score."""
        ok = sorted((o for o in observations.values() if o.ok), key=lambda o: (-(o.score or 0.0), o.mbs))
        return [o.mbs for o in ok[:n]]

    def _walk(self, obs: Mapping[int, Observation], pending: Set[int]) -> None:
        def run(mbs: int) -> Observation:
            if mbs in obs:
                return obs[mbs]
            if mbs in pending:
                raise _Blocked
            raise _Need(mbs)

        if self.user_list:
            for mbs in self.user_list:
                if mbs not in pending:
                    run(mbs)
            return

        cap = max(self.cap, 1)
        lo = min(self.min_mbs, cap)
        if not run(lo).ok:
            if self.floor_mbs >= lo:
                return
            lo = self.floor_mbs
            if not run(lo).ok:
                return

        ok_max = self._edge_search(run, obs, pending, lo, cap)
        self._sweet_spot(run, obs, pending, lo, ok_max)

    def _edge_search(
        self, run: Callable[[int], Observation], obs: Mapping[int, Observation], pending: Set[int], lo: int, cap: int
    ) -> int:
        if cap > lo and cap not in pending:
            run(cap)
        while True:
            ok_max = max(m for m, o in obs.items() if o.ok and m <= cap)
            fails = [m for m, o in obs.items() if not o.ok and m > ok_max]
            fail_min = min(fails, default=cap + 1)
            if fail_min - ok_max <= max(1, int(PLATEAU * ok_max)):
                return ok_max
            if self._plateaued(obs, ok_max):
                return ok_max
            inside = sorted(m for m in pending if ok_max < m < fail_min)
            points = [ok_max, *inside, fail_min]
            width, a, b = max((b - a, a, b) for a, b in zip(points, points[1:]))
            if inside and width <= max(1, int(PLATEAU * a)):
                raise _Blocked
            run((a + b) // 2)

    @staticmethod
    def _plateaued(obs: Mapping[int, Observation], ok_max: int) -> bool:
        """Larger sizes stopped paying: the edge so far is under 5% better than the next smaller
        size that ran."""
        ok = sorted(m for m, o in obs.items() if o.ok and m < ok_max)
        if not ok:
            return False
        top, below = obs[ok_max].score, obs[ok[-1]].score
        assert top is not None and below is not None
        return top - below < PLATEAU * abs(below)

    def _sweet_spot(
        self, run: Callable[[int], Observation], obs: Mapping[int, Observation], pending: Set[int], lo: int, edge: int
    ) -> None:
        start = max(lo, edge // 2)
        planned = {lo, edge}
        if edge > start and self.num_tuning > 1:
            stride = max(1, (edge - start) // (self.num_tuning - 1))
            for mbs in range(start, edge, stride):
                if mbs not in pending:
                    run(mbs)
                planned.add(mbs)
        if planned & set(pending):
            raise _Blocked
        # One refinement on each side of the planned sizes' best, halfway to its neighbour.
        # Judged on the planned sizes only, so measurement noise cannot drag it on.
        grid = {m: o for m, o in obs.items() if m in planned}
        best = self.best(grid)[0]
        tried = sorted(grid)
        i = tried.index(best)
        for neighbour in (tried[i - 1] if i > 0 else None, tried[i + 1] if i + 1 < len(tried) else None):
            if neighbour is not None and abs(neighbour - best) > max(1, int(PLATEAU * best)):
                run((best + neighbour) // 2)
