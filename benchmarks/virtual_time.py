"""Virtual time for running optuna-ds's own tuning in-process (benchmarks/product.py).

The product runs unchanged: its threads (the slots, the heartbeats, the main thread) take turns,
one at a time, and the clock jumps forward only when every one of them waits -- on a lock, a
condition, an event, a sleep, or a simulated experiment. What a wait costs in a real run (a
slot's 2-second look-again, the 0.5-second idle gate, a claim's 50-ms polls) it costs here in
simulated seconds, at no wall time; a run of the same job gives the same times, whatever the
machine's load.

:func:`install` replaces ``time``, ``datetime`` and ``threading`` in optuna-ds's modules (and
the clock Optuna's storages stamp trials with) by this module's; :class:`World` is the clock and
the turn-taking. Nothing outside those modules sees virtual time.

Several simulated processes (``optuna-ds tune`` and its workers, each a node of its own) may
live in one world: each is a :class:`Thread` given the environment variables that are its own
(``Thread(environ=...)``: its ``LOCAL_SIZE``, its GPU lock folder), which the threads it starts
inherit. ``os.environ`` as optuna-ds's modules and DeepSpeed's CPU accelerator read it is the
real one with the reading thread's process's variables on top.
"""
from __future__ import annotations

import _thread
import collections
import contextlib
import datetime as _datetime
import heapq
import itertools
import os as _os
import sys
import threading as _threading
import time as _time
import types
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import MutableMapping
from typing import Any

EPOCH = 1.8e9  # the virtual clock's wall-clock reading at its start (2027-01-15)


class Deadlock(RuntimeError):
    """Every thread waits for another with no deadline: the simulated tuning would hang for ever."""


class _Task:
    __slots__ = ("name", "gate", "parked", "timed_out", "version", "environ")

    def __init__(self, name: str, environ: dict[str, str] | None = None) -> None:
        self.name = name
        self.environ = environ if environ is not None else {}  # its simulated process's own variables
        self.gate = _thread.allocate_lock()
        self.gate.acquire()  # held: the task waits for its turn; released: its turn
        self.parked = False
        self.timed_out = False
        self.version = 0


class World:
    """The virtual clock and the turn-taking of the threads that live in it."""

    def __init__(self) -> None:
        self.now = 0.0
        self._mutex = _thread.allocate_lock()
        self._ready: collections.deque[_Task] = collections.deque()
        self._timed: list[tuple[float, int, int, _Task]] = []
        self._seq = itertools.count()
        self._tasks: dict[int, _Task] = {}
        self.switches = 0

    # -- the clock ---------------------------------------------------------------------------------

    def monotonic(self) -> float:
        return 1e6 + self.now

    def time(self) -> float:
        return EPOCH + self.now

    def sleep(self, seconds: float) -> None:
        task = self.current()
        if seconds <= 0:
            with self._mutex:
                self._ready.append(task)
                self._hand_over()
            task.gate.acquire()
            return
        self.park(task, self.now + seconds)

    # -- the turns ---------------------------------------------------------------------------------

    def current(self) -> _Task:
        try:
            return self._tasks[_thread.get_ident()]
        except KeyError:
            raise RuntimeError(f"thread {_threading.current_thread().name} is not in the virtual world") from None

    def enter(self, name: str = "main") -> _Task:
        """The calling thread joins the world holding the turn (the first one: the main thread)."""
        task = _Task(name)
        self._tasks[_thread.get_ident()] = task
        return task

    def leave(self) -> None:
        """The calling thread leaves the world; the turn goes to the next."""
        with self._mutex:
            del self._tasks[_thread.get_ident()]
            if self._tasks:
                self._hand_over()

    def adopt(self, name: str, environ: dict[str, str] | None = None) -> _Task:
        """A task for a thread about to start: ready, it runs when its turn comes. It lives in
        the simulated process of the thread that starts it, unless given ``environ``: the
        variables of a process of its own."""
        task = _Task(name, environ if environ is not None else self.current().environ)
        with self._mutex:
            self._ready.append(task)
        return task

    def bind(self, task: _Task) -> None:
        """Called by a new thread first: it becomes ``task`` and waits for its turn."""
        self._tasks[_thread.get_ident()] = task
        task.gate.acquire()

    def park(self, task: _Task, deadline: float | None) -> bool:
        """``task`` (the caller) waits until woken or, with a ``deadline``, until the clock
        reaches it; returns whether it timed out."""
        with self._mutex:
            task.parked, task.timed_out = True, False
            task.version += 1
            if deadline is not None:
                heapq.heappush(self._timed, (max(deadline, self.now), next(self._seq), task.version, task))
            self._hand_over()
        task.gate.acquire()
        return task.timed_out

    def wake(self, task: _Task) -> None:
        """Make a parked ``task`` ready (it runs when its turn comes)."""
        with self._mutex:
            if task.parked:
                task.parked = False
                task.version += 1
                self._ready.append(task)

    def _hand_over(self) -> None:
        """The turn to the next ready task, or, with none, to the earliest deadline (the clock
        jumps to it). Called with the mutex held."""
        self.switches += 1
        if self._ready:
            self._ready.popleft().gate.release()
            return
        while self._timed:
            deadline, _, version, task = heapq.heappop(self._timed)
            if task.parked and task.version == version:
                self.now = max(self.now, deadline)
                task.parked, task.timed_out = False, True
                task.version += 1
                task.gate.release()
                return
        names = ", ".join(t.name for t in self._tasks.values())
        raise Deadlock(f"every thread waits with no deadline ({names})")


WORLD: World | None = None


def _world() -> World:
    assert WORLD is not None, "virtual_time.install() first"
    return WORLD


# -- the primitives, as threading's --------------------------------------------------------------


class Lock:
    def __init__(self) -> None:
        self._owner: _Task | None = None
        self._waiters: collections.deque[_Task] = collections.deque()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        world = _world()
        task = world.current()
        if self._owner is None:
            self._owner = task
            return True
        if not blocking:
            return False
        self._waiters.append(task)
        world.park(task, world.now + timeout if timeout >= 0 else None)
        if self._owner is task:
            return True
        self._waiters.remove(task)
        return False

    def release(self) -> None:
        if self._owner is None:
            raise RuntimeError("release unlocked lock")
        if self._waiters:
            self._owner = self._waiters.popleft()
            _world().wake(self._owner)
        else:
            self._owner = None

    def locked(self) -> bool:
        return self._owner is not None

    def _release_save(self) -> Any:
        self.release()
        return None

    def _acquire_restore(self, state: Any) -> None:
        self.acquire()

    def _is_owned(self) -> bool:
        return self._owner is _world().current()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


class RLock(Lock):
    def __init__(self) -> None:
        super().__init__()
        self._count = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._owner is not None and self._owner is _world().current():
            self._count += 1
            return True
        if super().acquire(blocking, timeout):
            self._count = 1
            return True
        return False

    def release(self) -> None:
        self._count -= 1
        if self._count == 0:
            super().release()
            if self._owner is not None:
                self._count = 1  # handed to a waiter: its first hold

    def _release_save(self) -> Any:
        count, self._count = self._count, 1
        self.release()
        return count

    def _acquire_restore(self, state: Any) -> None:
        self.acquire()
        self._count = state

    __enter__ = acquire


class Condition:
    def __init__(self, lock: Lock | None = None) -> None:
        self._lock = lock if lock is not None else RLock()
        self._waiters: collections.deque[_Task] = collections.deque()
        self.acquire, self.release = self._lock.acquire, self._lock.release

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        world = _world()
        task = world.current()
        saved = self._lock._release_save()
        self._waiters.append(task)
        world.park(task, None if timeout is None else world.now + timeout)
        notified = task not in self._waiters
        if not notified:
            self._waiters.remove(task)
        self._lock._acquire_restore(saved)
        return notified

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        world = _world()
        end = None if timeout is None else world.now + timeout
        result = predicate()
        while not result:
            left = None if end is None else end - world.now
            if left is not None and left <= 0:
                break
            self.wait(left)
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        for _ in range(min(n, len(self._waiters))):
            _world().wake(self._waiters.popleft())

    def notify_all(self) -> None:
        self.notify(len(self._waiters))


class Event:
    def __init__(self) -> None:
        self._flag = False
        self._waiters: list[_Task] = []

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        waiters, self._waiters = self._waiters, []
        for task in waiters:
            _world().wake(task)

    def clear(self) -> None:
        self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        world = _world()
        task = world.current()
        self._waiters.append(task)
        world.park(task, None if timeout is None else world.now + timeout)
        if task in self._waiters:
            self._waiters.remove(task)
        return self._flag


class Thread(_threading.Thread):
    """A real thread that lives in the virtual world: it runs in its turn. With ``environ``, it
    is a simulated process of its own: those variables are its own, on top of the real ones."""

    def __init__(self, *args: Any, environ: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._environ = dict(environ) if environ is not None else None

    def start(self) -> None:
        self._task = _world().adopt(self.name, self._environ)
        self._ended = Event()
        super().start()

    def run(self) -> None:
        world = _world()
        world.bind(self._task)
        try:
            super().run()
        finally:
            self._ended.set()
            world.leave()

    def join(self, timeout: float | None = None) -> None:
        if self._ended.wait(timeout):
            super().join()  # it has left the world: only its thread's last steps remain


# -- the environment, per simulated process -------------------------------------------------------


class _Environ(MutableMapping[str, str]):
    """``os.environ`` as the calling thread's simulated process sees it: its own variables, then
    the real ones. A thread outside the world sees the real ones only; writes go to the
    process's own variables where it has that one, else to the real environment."""

    def _own(self) -> dict[str, str]:
        world = WORLD
        task = world._tasks.get(_thread.get_ident()) if world is not None else None
        return task.environ if task is not None else {}

    def __getitem__(self, key: str) -> str:
        own = self._own()
        return own[key] if key in own else _os.environ[key]

    def __setitem__(self, key: str, value: str) -> None:
        own = self._own()
        if key in own:
            own[key] = value
        else:
            _os.environ[key] = value

    def __delitem__(self, key: str) -> None:
        own = self._own()
        if key in own:
            del own[key]
        else:
            del _os.environ[key]

    def __iter__(self) -> Iterator[str]:
        own = self._own()
        return iter([*own, *(k for k in _os.environ if k not in own)])

    def __len__(self) -> int:
        return len({*self._own(), *_os.environ})

    def copy(self) -> dict[str, str]:
        return dict(self)


_ENVIRON = _Environ()


def _getenv(key: str, default: str | None = None) -> str | None:
    return _ENVIRON.get(key, default)


# -- the modules optuna-ds sees ------------------------------------------------------------------


class _Module(types.ModuleType):
    """A module whose listed names are virtual and every other one the real module's."""

    def __init__(self, real: types.ModuleType, names: dict[str, Any]) -> None:
        super().__init__(real.__name__)
        self.__dict__.update(names)
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _Datetime(_datetime.datetime):
    @classmethod
    def now(cls, tz: _datetime.tzinfo | None = None) -> _datetime.datetime:  # type: ignore[override]
        return _datetime.datetime.fromtimestamp(_world().time(), tz)

    @classmethod
    def utcnow(cls) -> _datetime.datetime:  # type: ignore[override]
        return _datetime.datetime.fromtimestamp(_world().time(), _datetime.timezone.utc).replace(tzinfo=None)


_TIME = _Module(_time, {"monotonic": lambda: _world().monotonic(), "time": lambda: _world().time(),
                        "sleep": lambda s: _world().sleep(s)})
_DATETIME = _Module(_datetime, {"datetime": _Datetime})
_THREADING = _Module(_threading, {"Lock": Lock, "RLock": RLock, "Condition": Condition, "Event": Event, "Thread": Thread})
# Simulated processes (benchmarks/product.py's launches that run on the virtual clock), by the
# process group id made up for each: optuna-ds's ``os.killpg`` ends them as it would a real
# group, and its ``os.pidfd_open`` has none for them (the runner then polls them, on this clock).
PROCESSES: dict[int, Any] = {}


def _killpg(pgid: int, sig: int) -> None:
    simulated = PROCESSES.get(pgid)
    if simulated is None:
        _os.killpg(pgid, sig)
    else:
        simulated.signal(sig)


def _pidfd_open(pid: int, flags: int = 0) -> int:
    if pid in PROCESSES:
        raise OSError(f"process {pid} is simulated: no pidfd")
    return _os.pidfd_open(pid, flags)


_OS = _Module(_os, {"environ": _ENVIRON, "getenv": _getenv, "killpg": _killpg, "pidfd_open": _pidfd_open})
# DeepSpeed's CPU accelerator counts its devices from LOCAL_SIZE: each simulated node's own.
_ENVIRON_READERS = ("deepspeed.accelerator.cpu_accelerator",)
# Optuna's storages stamp a trial's start and end (``from datetime import datetime``).
_OPTUNA_CLOCKS = ("optuna.storages._rdb.storage", "optuna.storages._in_memory", "optuna.storages._cached_storage",
                  "optuna.storages._rdb.models")


@contextlib.contextmanager
def install() -> Iterator[World]:
    """Virtual time for optuna-ds (every module of it imported by now) while the block runs, the
    calling thread in the world (a simulated process whose own variables are none yet: set
    ``world.current().environ``); the real modules back afterwards."""
    global WORLD
    import optuna.storages  # noqa: F401 - its clocks are replaced below

    world = WORLD = World()
    replaced: list[tuple[types.ModuleType, str, Any]] = []
    for name, module in list(sys.modules.items()):
        if module is None:
            continue
        if name == "optuna_ds" or name.startswith("optuna_ds."):
            for attr, real, virtual in (("time", _time, _TIME), ("datetime", _datetime, _DATETIME), ("threading", _threading, _THREADING),
                                        ("os", _os, _OS)):
                if module.__dict__.get(attr) is real:
                    replaced.append((module, attr, real))
                    setattr(module, attr, virtual)
        elif name in _ENVIRON_READERS and module.__dict__.get("os") is _os:
            replaced.append((module, "os", _os))
            module.os = _OS
        elif name in _OPTUNA_CLOCKS and module.__dict__.get("datetime") is _datetime.datetime:
            replaced.append((module, "datetime", _datetime.datetime))
            module.datetime = _Datetime
    world.enter()
    try:
        yield world
    finally:
        try:
            # Threads still in the world (a heartbeat told to stop) end in their turns.
            for _ in range(100):
                if len(world._tasks) <= 1:
                    break
                world.sleep(1.0)
            world.leave()
        finally:
            for module, attr, real in replaced:
                setattr(module, attr, real)
            WORLD = None
