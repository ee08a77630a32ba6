"""Who decides a tuning's experiments: one process at a time, for every slot of every process.

The root study's system attrs hold a record per process of the tuning (its slots and a beat
counter it raises every :data:`BEAT_SECONDS`) and the decider's record (whose, its beat, whether
its search is done). A reader judges a beat by its own clock (how long since the counter last
changed), never by another host's, so clocks that disagree do not matter. ``tune`` takes the
decision when its search starts; a worker takes it where the holder is gone (a process of this
host that died, or a beat unchanged for :data:`LAPSE_SECONDS`, or a record saying it ended).
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import uuid
from typing import Any

import optuna

from optuna_ds._optuna_compat import storage_of
from optuna_ds._optuna_compat import study_id
from optuna_ds.studies._owner import dead
from optuna_ds.studies._owner import this_process

BEAT_SECONDS = 2.0
LAPSE_SECONDS = 30.0
_DECIDER = "optuna_ds:decider"
_PROCESS = "optuna_ds:process:"


@dataclasses.dataclass(frozen=True)
class Look:
    """The tuning's processes as read once: whether this process decides, whether a live
    decider said its search is done, and the slots of the live processes together;
    ``members``: each live process's key and slots, this one's first; ``gone``: the keys of
    processes known gone (ended, dead, or a beat unchanged for :data:`LAPSE_SECONDS`): what
    was handed to one of them is anyone's."""

    deciding: bool
    done: bool
    slots: int
    holder: dict[str, Any] | None
    members: tuple[tuple[str, int], ...] = ()
    gone: frozenset[str] = frozenset()


class Peers:
    """This process among the processes of the tuning of ``root``, with ``slots`` slots;
    ``lead``: whether it takes the decision at once (``tune``) or only from a holder that is gone;
    ``me``: its identity (``{"host", "pid", "started"}``), this process's by default;
    ``gpus``: the GPUs its slots lease (their lock files, :attr:`SlotPool.gpus`, each slot's
    alike in number), so that processes of one machine sharing GPUs count them once, not once each.
    """

    def __init__(self, root: optuna.Study, *, slots: int, lead: bool, me: dict[str, Any] | None = None,
                 gpus: tuple[str, ...] = ()) -> None:
        self._root = root
        # A token of its own: two coordinators of one process (a simulation's) are two peers.
        self._me = {**(me or this_process()), "token": uuid.uuid4().hex[:12]}
        self._key = f"{_PROCESS}{self._me['host']}:{self._me['pid']}:{self._me['token']}"
        self._slots = slots
        # The GPU locks are this machine's: a GPU is one wherever its process's host is one.
        self._gpus = sorted(f"{self._me['host']}|{gpu}" for gpu in gpus)
        self._per = max(1, len(self._gpus) // slots) if slots and self._gpus else 1
        self._lead = lead
        self._leads = lead  # tune's record says so: a worker waits for a live tune to take the decision
        self._beat = 0
        self._seen: dict[str, tuple[Any, float]] = {}  # a record's key: its beat, since when (our clock)
        self._holding = False
        self._done = False
        self._started = time.monotonic()
        self._left = threading.Event()

    @property
    def identity(self) -> dict[str, Any]:
        return dict(self._me)

    @property
    def key(self) -> str:
        """This process's record's key: what the decider hands its experiments to."""
        return self._key

    @property
    def deciding(self) -> bool:
        """Whether this process holds the decision, as last looked."""
        return self._holding

    def _write(self, key: str, value: dict[str, Any]) -> None:
        storage_of(self._root).set_study_system_attr(study_id(self._root), key, value)

    def _mine(self, record: Any) -> bool:
        return isinstance(record, dict) and record.get("token") == self._me["token"]

    def _lapsed(self, key: str, record: Any, now: float) -> bool:
        if not isinstance(record, dict) or record.get("ended"):
            return True
        if dead(record):
            return True
        beat = record.get("beat")
        seen = self._seen.get(key)
        if seen is None or seen[0] != beat:
            self._seen[key] = (beat, now)
            return False
        return now - seen[1] >= LAPSE_SECONDS

    def keep_beating(self) -> None:
        """Beat on a thread of its own until :meth:`leave`: a process busy elsewhere (tune's
        profile run, a worker waiting for it) stays live, so no other takes its decision."""
        def beat() -> None:
            while not self._left.wait(BEAT_SECONDS):
                with contextlib.suppress(Exception):  # a database away for a beat: the next one tells
                    self.beat()

        self.beat()
        threading.Thread(target=beat, name="optuna-ds-peer-beat", daemon=True).start()

    def beat(self) -> None:
        """Raise this process's beat, and the decider's where it holds the decision."""
        self._beat += 1
        self._write(self._key, {**self._me, "slots": self._slots, "gpus": self._gpus, "beat": self._beat,
                                "lead": self._leads})
        if self._holding:
            self._write(_DECIDER, {**self._me, "beat": self._beat, "done": self._done})

    def take(self) -> None:
        """Take the decision (read back at the next :meth:`look`: of two takers, the last holds it)."""
        self._holding, self._done = True, False
        self._write(_DECIDER, {**self._me, "beat": self._beat, "done": False})

    def finish(self) -> None:
        """Say the search this process decides is done: the others' slots stop."""
        self._done = True
        self._write(_DECIDER, {**self._me, "beat": self._beat, "done": True})

    def leave(self) -> None:
        """This process ends: its slots count no more, its decision passes at once."""
        self._left.set()
        self._write(self._key, {**self._me, "slots": 0, "beat": self._beat, "ended": True})
        if self._holding and not self._done:
            self._write(_DECIDER, {**self._me, "beat": self._beat, "done": False, "ended": True})
        self._holding = False

    def look(self) -> Look:
        """Read the records once; a worker takes the decision here where its holder is gone."""
        now = time.monotonic()
        attrs = storage_of(self._root).get_study_system_attrs(study_id(self._root))
        holder = attrs.get(_DECIDER)
        if self._holding and not self._mine(holder):
            self._holding = False  # another took it (tune resumed, or two took it at once)
        if not self._holding:
            if holder is None:
                # None took it yet: tune does when its search starts; a worker only where no live
                # tune registered (tune gone before its search) and after a beat's grace.
                tune = any(r.get("lead") and not self._lapsed(k, r, now) for k, r in attrs.items()
                           if k.startswith(_PROCESS) and k != self._key and isinstance(r, dict))
                gone = not tune and now - self._started >= LAPSE_SECONDS
            else:
                gone = self._lapsed(_DECIDER, holder, now)
            if self._lead or gone:
                self._lead = False  # tune takes it once; taken back from it, it follows
                self.take()
                holder = {**self._me}
        processes = {k: r for k, r in attrs.items() if k.startswith(_PROCESS) and k != self._key}
        left = frozenset(k for k, r in processes.items() if self._lapsed(k, r, now))
        live = {k: r for k, r in processes.items() if k not in left}
        slots = _slots([{"slots": self._slots, "gpus": self._gpus}] + list(live.values()), per=self._per)
        members = ((self._key, self._slots), *((k, int(r.get("slots") or 0)) for k, r in sorted(live.items())))
        done = not self._holding and isinstance(holder, dict) and bool(holder.get("done"))
        return Look(deciding=self._holding, done=done, slots=slots, holder=holder if isinstance(holder, dict) else None,
                    members=members, gone=left)

def _slots(records: list[dict[str, Any]], *, per: int) -> int:
    """The experiments the processes of ``records`` can run at once: their slots, except that
    processes sharing GPUs (tune and workers of one machine) have as many as their GPUs
    together hold, ``per`` GPUs each; a record without its GPUs counts its slots."""
    gpus: set[str] = set()
    slots = shared = 0
    for r in records:
        mine = [g for g in r.get("gpus") or () if isinstance(g, str)]
        n = int(r.get("slots") or 0)
        if mine and n:
            gpus.update(mine)
            shared += n
        else:
            slots += n
    return slots + min(shared, len(gpus) // per)
