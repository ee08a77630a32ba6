"""optuna-ds's own tuning of a simulated job, in this process: the benchmarks' one path to figures.

:func:`tune` runs what ``optuna-ds tune -q --deepspeed-bin benchmarks/simulated_deepspeed.py
--num_gpus N train.py --deepspeed_config ds_config.json`` runs -- the CLI's options parsed by
its own click command, then ``optuna_ds._tune.tune`` with everything it builds (the profile run,
the user's config, the arms, the knob candidates, the coordinator's slots, leases, claims and
polls, the headline's runs measured alike, the SQLite storage, the output files) -- with two
things simulated:

- each experiment's launcher: the job's answer (``simulated_deepspeed.answer``, what that script
  does as a process, the same draws: its ledger numbers the launches; or benchmarks/fake_deepspeed.py's
  for a :class:`FixedJob`) writes the run's files and output, then the launch waits the job's
  simulated seconds and exits through a real trivial process;
- the clock (benchmarks/virtual_time.py): threads take turns and time jumps when all wait, so a
  tuning of simulated hours takes seconds, and every wait the product makes is charged.

With ``processes=N`` the tuning is ``tune`` and N-1 ``optuna-ds worker`` processes
(``optuna_ds._tune.work``, the CLI's worker options) on one SQLite storage, each a thread of the
same world posing as a node of its own, as benchmarks/parallel.py's processes do: its own
``LOCAL_SIZE`` (``slots`` experiments' GPUs) and GPU lock folder, set as that simulated process's
own environment variables (virtual_time.Thread's ``environ``). SQLite serves them: each process
opens its own engine, and only one thread runs at a time, none waiting for its turn inside a
transaction.

A decision (the coordinator's ``_decide``: the storage read, the knob candidates, the planner)
costs its measured seconds on this machine unless ``decision_s`` fixes it (a deterministic
figure for comparisons); the other costs of a real process that the simulation does not have
(its start, each launcher's start, its last steps) are :class:`Costs`' figures, calibrated
against real processes by ``--calibrate`` (:func:`calibrate`). Only the choice read back from
``ds_config_optimal.json`` counts, as for the CLI.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import io
import json
import os
import pkgutil
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from collections.abc import Sequence
from pathlib import Path
from typing import IO
from typing import Any
from typing import Protocol

import fake_deepspeed
import search
import simulated_deepspeed
import surfaces
import virtual_time

import optuna_ds

HERE = Path(__file__).resolve().parent

SIMULATOR = HERE / "simulated_deepspeed.py"
FAKE_LAUNCHER = HERE / "fake_deepspeed.py"
STUDY = "optuna-ds"  # the CLI's default tuning name
_TRUE, _FALSE = shutil.which("true") or "/bin/true", shutil.which("false") or "/bin/false"


@dataclasses.dataclass(frozen=True)
class Costs:
    """What the simulated world charges beyond the job's own seconds: a real process's costs that
    an in-process simulation has not.

    ``decision_s``: a decision's seconds (``None``: as measured here, on this thread's CPU clock,
    times ``decision_factor``: a real process's decision also waits on its storage and shares
    its cores with the others; measured, decisions of heavier plans cost more, and the processes
    of a tuning do not decide in lockstep).
    ``launch_s``: each launch's own start (the launcher's Python process) before the job's clock starts.
    ``start_s``: a process's start before it tunes (the interpreter, the imports, the storage's connection).
    ``finish_s``: tune's last steps once its tuning ended (the outputs, the report) before it exits.
    """

    decision_s: float | None = None
    decision_factor: float = 1.0
    launch_s: float = 0.0
    start_s: float = 0.0
    finish_s: float = 0.0


# Fitted (:func:`fit`) to 4 real runs of 1 slot of benchmarks/parallel.py's scenario "4" on this
# project's 2-core machine, shared, load 2.5-4.8; with them the simulated walls of those runs and
# of 4 of tune + a worker of 2 slots came within 5% of the real medians. The runs and both
# comparisons: benchmarks/product_calibration.json
# (`python benchmarks/product.py --calibrate --fit --real-from benchmarks/product_calibration.json`).
CALIBRATED = Costs(decision_factor=3.21, launch_s=0.197, start_s=4.232, finish_s=2.052)


class Job(Protocol):
    """What a simulated tuning tunes: the launcher its command line names, the user's DeepSpeed
    config, and each launch's answer."""

    @property
    def name(self) -> str: ...

    @property
    def num_gpus(self) -> int: ...

    @property
    def launcher(self) -> Path: ...

    def user_config(self) -> dict[str, Any]: ...

    def answer(self, argv: list[str], *, ledger: Path) -> tuple[int, float]:
        """The launch of DeepSpeed's command line ``argv``: its files written, its output printed
        (to ``sys.stdout``/``sys.stderr``), a line appended to ``ledger``; returns its exit status
        and the simulated seconds it took."""
        ...


@dataclasses.dataclass(frozen=True)
class SurfaceJob:
    """A job of the benchmarks' physics (benchmarks/surfaces.py), answered by simulated_deepspeed."""

    surface: surfaces.Surface
    fast: bool = True
    tuner_type: str = "model_based"

    @property
    def name(self) -> str:
        return self.surface.name

    @property
    def num_gpus(self) -> int:
        return self.surface.num_gpus

    @property
    def launcher(self) -> Path:
        return SIMULATOR

    def user_config(self) -> dict[str, Any]:
        return search.user_config(fast=self.fast, tuner_type=self.tuner_type, surface=self.surface)

    def answer(self, argv: list[str], *, ledger: Path) -> tuple[int, float]:
        return simulated_deepspeed.answer(argv, surface=self.surface, ledger=str(ledger))


@dataclasses.dataclass(frozen=True)
class FixedJob:
    """A job of the tests' fake launcher (benchmarks/fake_deepspeed.py, its surface a dict as in
    ``FAKE_DS_SURFACE``): every experiment that runs takes the surface's ``duration`` seconds,
    a profile run or a failure none, as that launcher sleeps."""

    name: str
    surface: dict[str, Any]
    config: dict[str, Any]
    num_gpus: int = 1

    @property
    def launcher(self) -> Path:
        return FAKE_LAUNCHER

    def user_config(self) -> dict[str, Any]:
        return self.config

    def answer(self, argv: list[str], *, ledger: Path) -> tuple[int, float]:
        launch = fake_deepspeed.parse(argv)
        code = fake_deepspeed.answer({**self.surface, "duration": 0.0, "duration_at": {}}, launch)
        ran = code == 0 and not launch.profile and not launch.training
        seconds = float(self.surface.get("duration_at", {}).get(str(launch.mbs), self.surface.get("duration", 0.0))) if ran else 0.0
        fake_deepspeed.append_line(str(ledger), {"name": launch.name, "profile": launch.profile, "outcome": "ok" if code == 0 else "failed",
                                                 "seconds": seconds, "gpus": launch.gpus})
        return code, seconds


def scenario_four(duration: float = 2.0, grid: int = 4) -> FixedJob:
    """benchmarks/parallel.py's scenario "4": a knob grid search over a fixed micro-batch list,
    ``duration`` seconds per experiment, one GPU each."""
    import parallel

    return FixedJob(name="parallel-4", surface=parallel.surface(duration), config=parallel.config(grid))


def surface_config(surface: surfaces.Surface, config: Any) -> surfaces.Config:
    """The job's config of an optuna-ds ``Config`` (the planner's choice), its zero knobs those the
    job's generator reads."""
    keys = surfaces.spaces_of(surface)[1]
    knobs = tuple(sorted((k, float(v) if type(v) is int else v) for k, v in config.knob_dict.items() if k in keys))
    return surfaces.Config(stage=config.stage, mbs=config.micro_batch, gas=config.accumulation, knobs=knobs,
                           offload_optimizer=bool(config.offload), offload_param=config.offload == "offload-opt-param")


@functools.cache
def _import_all() -> None:
    """Every module of optuna-ds imported now, so that virtual_time.install() reaches them all,
    and DeepSpeed's CPU accelerator, whose device count each simulated node reads as its own."""
    for info in pkgutil.walk_packages(optuna_ds.__path__, "optuna_ds."):
        if not info.name.startswith("optuna_ds.cli") and not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    importlib.import_module("deepspeed.accelerator.cpu_accelerator")


class _SimulatedRun:
    """A simulated launch as the runner sees a process (``pid``, ``poll``, ``wait``): its
    engine's step lines written to its stdout as the virtual clock reaches each, its metrics
    file and exit status at its end; ended by its process group (``os.killpg`` through
    :data:`virtual_time.PROCESSES`) as a real launch is, then it writes nothing more and
    ``entry`` (its line in the launches) ends then, with the seconds it saved."""

    _next_pid = 1 << 23  # above any real pid (Linux's pid_max is at most 2**22)

    def __init__(self, *, world: virtual_time.World, lines: list[tuple[float, bytes]], end: float, code: int,
                 metrics: tuple[str, bytes] | None, stdout: IO[bytes], entry: dict[str, Any]) -> None:
        _SimulatedRun._next_pid += 1
        self.pid = self.args = _SimulatedRun._next_pid
        self.returncode: int | None = None
        self._world, self._lines, self._end, self._code = world, lines, end, code
        self._metrics, self._stdout, self._entry = metrics, stdout, entry
        virtual_time.PROCESSES[self.pid] = self

    def _exit(self, code: int) -> None:
        self.returncode = code
        virtual_time.PROCESSES.pop(self.pid, None)

    def signal(self, sig: int) -> None:
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)
        if sig:
            self._entry["saved_s"] = self._end - self._world.now
            self._entry["end"] = self._world.now
            self._exit(-sig)

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        now = self._world.now
        while self._lines and self._lines[0][0] <= now + 1e-9:
            self._stdout.write(self._lines.pop(0)[1])
            self._stdout.flush()
        if now + 1e-9 >= self._end:
            if self._metrics is not None:
                Path(self._metrics[0]).write_bytes(self._metrics[1])
            self._exit(self._code)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else self._world.now + timeout
        while self.poll() is None:
            due = min([self._end, *(t for t, _ in self._lines[:1])])
            if deadline is not None:
                if self._world.now >= deadline:
                    raise subprocess.TimeoutExpired(str(self.args), timeout or 0.0)
                due = min(due, deadline)
            self._world.sleep(max(0.0, due - self._world.now))
        assert self.returncode is not None
        return self.returncode


class _Launches:
    """One simulated process's launcher: the job answering in-process, the job's seconds waited
    on the virtual clock; each launch noted in ``launched`` with the process's ``node``."""

    def __init__(self, job: Job, *, ledger: Path, world: virtual_time.World, costs: Costs, node: str,
                 launched: list[dict[str, Any]]) -> None:
        self._job = job
        self._ledger = ledger
        self._world = world
        self._costs = costs
        self._node = node
        self._launched = launched

    def __call__(self, launched: list[str], *, stdout: IO[bytes], stderr: IO[bytes], env: dict[str, str],
                 pass_fds: Sequence[int]) -> subprocess.Popen:
        argv = launched[launched.index(str(self._job.launcher)) + 1:]
        launch = fake_deepspeed.parse(argv)
        self._world.sleep(self._costs.launch_s)
        start = self._world.now
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code, seconds = self._job.answer(argv, ledger=self._ledger)
        stderr.write(err.getvalue().encode())
        stderr.flush()
        entry = {"name": launch.name, "node": self._node, "include": launch.include, "profile": launch.profile,
                 "start": start, "end": start + seconds, "code": code, "gpus": launch.gpus}
        self._launched.append(entry)
        lines = out.getvalue().encode().splitlines(keepends=True)
        timed = [k for k, line in enumerate(lines) if b"time (ms) |" in line]
        if code == 0 and timed and not launch.profile:
            # The engine's step lines as they come: after the job's start-up, one per step, the
            # exit step (the metrics file) last.
            startup = min(float(getattr(getattr(self._job, "surface", None), "startup_s", 0.0)), seconds)
            every = (seconds - startup) / (len(timed) + 1)
            seen = [sum(1 for t in timed if t <= k) for k in range(len(lines))]  # the step lines up to each line
            at = [start + startup + every * n if n else start for n in seen]
            try:
                metrics: tuple[str, bytes] | None = (launch.metric_path, Path(launch.metric_path).read_bytes())
                os.remove(launch.metric_path)
            except OSError:
                metrics = None
            stdout.write(b"".join(line for k, line in enumerate(lines) if at[k] <= start))
            stdout.flush()
            return _SimulatedRun(world=self._world, lines=[(at[k], line) for k, line in enumerate(lines) if at[k] > start],
                                 end=start + seconds, code=code, metrics=metrics, stdout=stdout, entry=entry)  # type: ignore[return-value]
        stdout.write(out.getvalue().encode())
        stdout.flush()
        self._world.sleep(seconds)
        return subprocess.Popen([_TRUE if code == 0 else _FALSE], stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                start_new_session=True, pass_fds=tuple(pass_fds))


@contextlib.contextmanager
def _environment(work: Path) -> Iterator[None]:
    """As benchmarks/search.py's CLI process has it: the CPU accelerator and the working
    directory of the job's own (every simulated process's: a worker moves to the plan's, the same)."""
    saved, cwd = os.environ.get("DS_ACCELERATOR"), os.getcwd()
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.chdir(work)
    try:
        yield
    finally:
        os.chdir(cwd)
        if saved is None:
            os.environ.pop("DS_ACCELERATOR", None)
        else:
            os.environ["DS_ACCELERATOR"] = saved


def _node(work: Path, job: Job, slots: int, index: int) -> dict[str, str]:
    """The environment variables of simulated node ``index``: ``slots`` experiments' GPUs, its own GPU locks."""
    return {"LOCAL_SIZE": str(job.num_gpus * slots), "OPTUNA_DS_LOCK_DIR": str(work / f"locks{index}")}


def cli_options(job: Job, *, extra: Sequence[str] = ()) -> Any:
    """The TuneOptions the CLI builds from ``optuna-ds tune -q --deepspeed-bin LAUNCHER --num_gpus N
    EXTRA train.py --deepspeed_config ds_config.json``."""
    from optuna_ds.cli import _main as cli
    from optuna_ds._tune import TuneOptions

    args = ["-q", "--deepspeed-bin", str(job.launcher), "--num_gpus", str(job.num_gpus), *extra,
            "train.py", "--deepspeed_config", "ds_config.json"]
    with cli.tune.make_context("tune", args) as ctx:
        kwargs = dict(ctx.params)
    script, script_args = kwargs.pop("script"), kwargs.pop("script_args")
    kwargs.pop("quiet"), kwargs.pop("verbose")
    return TuneOptions(script=script, script_args=list(script_args), launcher_options=cli._launcher_options_of(kwargs), **kwargs)


def worker_options(args: Sequence[str]) -> Any:
    """The WorkerOptions the CLI builds from ``optuna-ds worker -q ARGS``."""
    from optuna_ds.cli import _main as cli
    from optuna_ds._tune import WorkerOptions

    with cli.worker.make_context("worker", ["-q", *args]) as ctx:
        kwargs = dict(ctx.params)
    named = {k: kwargs.pop(k) for k in ("storage", "study_name", "deepspeed_bin", "wait")}
    kwargs.pop("quiet"), kwargs.pop("verbose")
    return WorkerOptions(**named, launcher_options=cli._launcher_options_of(kwargs))


@dataclasses.dataclass(frozen=True)
class Simulation:
    """A simulated tuning: its wall seconds (from the processes' start to the last one's exit),
    the job's ledger lines, every launch (``name``, ``node``, ``include``: its GPUs, ``profile``,
    ``start``, ``end``, ``code``; simulated seconds), each decision's measured seconds, each launch's decision time as
    the tuning tells it (from its slot becoming free; what benchmarks/parallel.py reports), the
    planner's choice after each decision (launches so far, its config), and the optimal config
    the tuning wrote (``None``: none)."""

    wall_s: float
    ledger: list[dict[str, Any]]
    launches: list[dict[str, Any]]
    decision_s: list[float]
    decided_s: list[float]
    curve: list[tuple[int, Any]]
    optimal: dict[str, Any] | None
    whys: list[str] = dataclasses.field(default_factory=list)
    noise: Any = None
    summary: str = ""

    @property
    def experiments(self) -> list[dict[str, Any]]:
        """The launches but the profile run."""
        return [e for e in self.launches if not e["profile"]]

    @property
    def saved_gpu_s(self) -> float:
        """The device-seconds the launches the pruner ended did not run."""
        return sum(e.get("saved_s", 0.0) * e["gpus"] for e in self.launches)

    @property
    def duplicates(self) -> int:
        """Launches of an experiment already launched (by its name: a repeat has a name of its own)."""
        names = [e["name"] for e in self.experiments]
        return len(names) - len(set(names))


# The trial timeout the simulated tunings run under unless a run's timeout is asked for: none a
# job's run reaches. The runner now sees a simulated run's pace (its step lines as they come), so
# a run past the trial timeout the product derives from the profile run would be ended, as a real
# one is; the simulator's runs never were, and the benchmarks' figures judge the planner alone.
NO_TIMEOUT = ("--trial-timeout", "1e9")


def simulate(job: Job, *, processes: int = 1, slots: int = 1, costs: Costs = Costs(), study: str = STUDY,
             keep: Path | None = None, train_samples: int | None = None, timeouts: bool = False) -> Simulation:
    """optuna-ds's tuning of ``job``: ``tune`` and ``processes - 1`` workers, each a node of its
    own with ``slots`` experiments at once, all started together on one SQLite storage, in one
    virtual world; with ``timeouts``, under the trial timeout the product derives (else
    :data:`NO_TIMEOUT`). ``study``: the tuning's name (the knob search's seed derives from it; so does
    the seed of the draws the processes make from ``random``, such as a slot's pause for the
    other processes). ``train_samples``: the training's length, as ``--train-samples`` gives it.
    A process that fails fails the simulation, once every one has ended."""
    from optuna_ds._tune import tune as run_tuning
    from optuna_ds._tune import work as join_tuning
    from optuna_ds.cli import _main as cli
    from optuna_ds.reporting import Progress
    from optuna_ds.studies import _coordinator

    if processes < 1 or slots < 1:
        raise ValueError(f"processes and slots must be at least 1, got {processes} and {slots}")
    _import_all()
    cli._quiet_optuna()
    decisions: list[float] = []
    decided: list[float] = []
    whys: list[str] = []
    curve: list[tuple[int, Any]] = []  # (launches so far, the planner's choice then)
    launched: list[dict[str, Any]] = []

    class Observer(Progress):
        def decided(self, *, stage: int, number: int, name: str, seconds: float) -> None:
            decided.append(seconds)

        def started(self, *, stage: int, number: int, name: str, slot: str, why: str = "") -> None:
            whys.append(why)
            super().started(stage=stage, number=number, name=name, slot=slot, why=why)

    with tempfile.TemporaryDirectory(prefix=f"product-{job.name}-") as tmp:
        work = Path(tmp)
        ledger = work / "ledger.jsonl"
        (work / "train.py").write_text("print('a simulated training script')\n")
        (work / "ds_config.json").write_text(json.dumps(job.user_config()))
        storage = ["--storage", f"sqlite:///{work / 'tuning.db'}", "--study-name", study]
        real_decide = _coordinator.Coordinator._decide
        failures: list[BaseException] = []

        draws = random.getstate()
        random.seed(f"{study}/{processes}x{slots}")
        with _environment(work), virtual_time.install() as world:
            def decide(self: Any, *args: Any, **kwargs: Any) -> Any:
                t0 = time.thread_time()
                decision = real_decide(self, *args, **kwargs)
                spent = time.thread_time() - t0
                decisions.append(spent)
                curve.append((sum(1 for e in launched if not e["profile"]),
                              decision.choice.config if decision.choice is not None else None))
                world.sleep(costs.decision_s if costs.decision_s is not None else spent * costs.decision_factor)
                return decision

            def launcher(index: int) -> _Launches:
                return _Launches(job, ledger=ledger, world=world, costs=costs, node=f"node{index}", launched=launched)

            def worker(index: int) -> None:
                try:
                    world.sleep(costs.start_s)
                    join_tuning(worker_options(storage), observer=Observer(quiet=True, verbose=False), spawn=launcher(index))
                except BaseException as e:  # noqa: BLE001 - re-raised by the main thread once every process ended
                    failures.append(e)

            _coordinator.Coordinator._decide = decide
            world.current().environ = _node(work, job, slots, 0)
            workers = [virtual_time.Thread(target=worker, args=(i,), name=f"worker{i}", environ=_node(work, job, slots, i), daemon=True)
                       for i in range(1, processes)]
            try:
                for w in workers:
                    w.start()
                world.sleep(costs.start_s)
                train = ["--train-samples", str(train_samples)] if train_samples else []
                limit = [] if timeouts else list(NO_TIMEOUT)
                outcome = run_tuning(cli_options(job, extra=[*train, *limit, *(storage if processes > 1 else ["--study-name", study])]),
                                     observer=Observer(quiet=True, verbose=False), spawn=launcher(0))
                world.sleep(costs.finish_s)
            finally:
                for w in workers:
                    w.join()
                _coordinator.Coordinator._decide = real_decide
                random.setstate(draws)
            wall = world.now
        if failures:
            raise failures[0]
        optimal = json.loads(Path(outcome.optimal_config_path).read_text()) if outcome.optimal_config_path else None
        lines = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
        if keep is not None:
            shutil.copytree(work, keep / job.name, dirs_exist_ok=True, ignore=shutil.ignore_patterns("locks*"))
    return Simulation(wall_s=wall, ledger=lines, launches=launched, decision_s=decisions, decided_s=decided, curve=curve,
                      optimal=optimal, whys=whys, noise=outcome.result.noise, summary=outcome.summary)


def tune(surface: surfaces.Surface, *, fast: bool = True, tuner_type: str = "model_based", slots: int = 1, processes: int = 1,
         costs: Costs = Costs(), keep: Path | None = None, train_samples: int | None = None) -> dict[str, Any]:
    """optuna-ds's tuning of ``surface`` by ``processes`` processes (tune, then workers) of ``slots``
    experiments at once each, a node each: the choice, its true throughput, launches (the
    profile counted), GPU-hours, simulated wall seconds, the ledger, each decision's measured
    seconds, the choice after each decision, and every launch (:attr:`Simulation.launches`)."""
    run = simulate(SurfaceJob(surface, fast=fast, tuner_type=tuner_type), processes=processes, slots=slots, costs=costs, keep=keep,
                   train_samples=train_samples)
    chosen = surfaces.Config.from_ds_config(run.optimal, keys=surfaces.spaces_of(surface)[1]) if run.optimal else None
    return {
        "launches": len(run.ledger),
        "oom": sum(1 for e in run.ledger if e["outcome"] == "oom"),
        # A run the runner ended (pruned, timed out: its line in the launches says what it saved) ran that much less.
        "gpu_hours": (sum(e["seconds"] * e["gpus"] for e in run.ledger) - run.saved_gpu_s) / 3600.0,
        "saved_s": sum(e.get("saved_s", 0.0) for e in run.launches),
        "ended_early": sum(1 for e in run.launches if "saved_s" in e),  # by the pruner or the trial timeout
        "chosen": chosen,
        "true": surface.evaluate(chosen).throughput if chosen else 0.0,
        "wall_s": run.wall_s,
        "ledger": run.ledger,
        "decision_s": run.decision_s,
        "curve": [(n, surface.evaluate(surface_config(surface, c)).throughput if c is not None else 0.0) for n, c in run.curve],
        "experiments": run.launches,
        "whys": run.whys,
        "spans": [(e["start"], e["end"]) for e in run.experiments],
        "noise": run.noise,
        "summary": run.summary,
    }


# -- calibration against real processes ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Figures:
    """One tuning's times, real or simulated, in seconds from its processes' start: the wall (to
    the last one's exit), the first experiment's start, the span of the experiments, the tail (the
    last one's end to the exit), experiments launched, the median slot-free -> next-start gap
    on a (node, GPU), the median decision time as the tuning tells it."""

    wall: float
    first: float
    span: float
    tail: float
    experiments: int
    gap: float
    decided: float

    @classmethod
    def of_real(cls, row: dict[str, Any]) -> Figures:
        """From benchmarks/parallel.py's ``run_tuning``."""
        return cls(wall=row["wall"], first=row["first"], span=row["span"], tail=row["wall"] - row["first"] - row["span"],
                   experiments=row["experiments"], gap=row["gaps"][0], decided=row["decisions"][0])

    @classmethod
    def of_simulation(cls, run: Simulation) -> Figures:
        experiments = run.experiments
        first, last = min(e["start"] for e in experiments), max(e["end"] for e in experiments)
        by_gpu: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for e in experiments:
            host, ids = e["include"].split(":")
            for gpu in ids.split(","):
                by_gpu.setdefault((e["node"], f"{host}:{gpu}"), []).append(e)
        gaps = [b["start"] - a["end"] for runs in by_gpu.values() for a, b in zip(runs, runs[1:])]
        return cls(wall=run.wall_s, first=first, span=last - first, tail=run.wall_s - last, experiments=len(experiments),
                   gap=statistics.median(gaps) if gaps else float("nan"),
                   decided=statistics.median(run.decided_s) if run.decided_s else float("nan"))


def _median(figures: Sequence[Figures]) -> Figures:
    """Each figure's median over runs."""
    return Figures(**{f.name: statistics.median(getattr(x, f.name) for x in figures) for f in dataclasses.fields(Figures)})


@dataclasses.dataclass(frozen=True)
class RealRun:
    """benchmarks/parallel.py's tuning of ``processes`` processes of ``slots`` slots, named
    ``study`` (its knob search's seed), its figures, and the machine's 1-minute load average
    once it ended (the machine may be shared)."""

    processes: int
    slots: int
    study: str
    figures: Figures
    load: float


def real_runs(*, rounds: int = 2, duration: float = 2.0, storage: str | None = None,
              runs: Sequence[tuple[int, int]] = ((1, 1), (2, 2)), log: Any = print) -> list[RealRun]:
    """benchmarks/parallel.py's scenario "4" as real processes, each run ``rounds`` times, the runs
    taking turns (the machine's load drifts); ``storage`` its default (the local PostgreSQL)."""
    import parallel

    scenario = parallel.scenarios(duration, quick=False)["4"]
    done = []
    for _ in range(rounds):
        for processes, slots in runs:
            row = parallel.run_tuning(scenario, parallel.Run(processes, slots), storage=storage or parallel.STORAGE, timeout=600)
            done.append(RealRun(processes=processes, slots=slots, study=row["study"], figures=Figures.of_real(row), load=os.getloadavg()[0]))
            log(f"real {processes} x {slots}: wall {done[-1].figures.wall:.1f} s, {done[-1].figures.experiments} experiments, "
                f"load {done[-1].load:.1f}")
    return done


def fit(real: Sequence[RealRun], *, job: Job) -> Costs:
    """The costs that make ``real``'s runs of one process of one slot simulate as they ran (their
    medians): a decision as measured here, scaled to what the tuning told there; a launch the
    rest of a slot's gap; then the start (before the profile run's launch and the first
    experiment's) and the last steps what the simulation of the same tunings (their names) with
    those still lacks."""
    ones = [r for r in real if (r.processes, r.slots) == (1, 1)]
    measured = _median([r.figures for r in ones])

    def bare(costs: Costs) -> Figures:
        return _median([Figures.of_simulation(simulate(job, costs=costs, study=r.study)) for r in ones])

    factor = measured.decided / bare(Costs()).decided
    scaled = bare(Costs(decision_factor=factor))
    launch_s = max(0.0, measured.gap - scaled.gap)
    return Costs(decision_factor=round(factor, 2), launch_s=round(launch_s, 3),
                 start_s=round(max(0.0, measured.first - scaled.first - 2 * launch_s), 3),
                 finish_s=round(max(0.0, measured.tail - scaled.tail), 3))


TOLERANCE = 0.15  # the simulated wall within this share of the real one


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Real runs of benchmarks/parallel.py's scenario "4", each beside its simulation with
    ``costs`` (the same processes, slots and tuning name)."""

    costs: Costs
    pairs: list[tuple[RealRun, Figures]]

    def runs(self) -> list[tuple[int, int]]:
        return list(dict.fromkeys((r.processes, r.slots) for r, _ in self.pairs))

    def _of(self, run: tuple[int, int]) -> tuple[Figures, Figures]:
        """The real and the simulated medians of ``run``."""
        pairs = [(r.figures, s) for r, s in self.pairs if (r.processes, r.slots) == run]
        return _median([r for r, _ in pairs]), _median([s for _, s in pairs])

    def ratio(self, run: tuple[int, int]) -> float:
        """The simulated median wall / the real median wall."""
        real, simulated = self._of(run)
        return simulated.wall / real.wall

    @property
    def ok(self) -> bool:
        return all(abs(self.ratio(run) - 1.0) <= TOLERANCE for run in self.runs())

    def table(self) -> str:
        def label(run: tuple[int, int]) -> str:
            return f"{run[0]} x {run[1]}" if run[0] > 1 else f"{run[1]} slot"

        lines = [f"costs: {self.costs}",
                 "| run | real wall s (each run; load) | simulated wall s (each) | ratio | real / simulated: first start s | span s "
                 "| tail s | experiments | gap p50 s | decision p50 ms |",
                 "| --- | --- | --- | ---: | --- | --- | --- | --- | --- | --- |"]
        for run in self.runs():
            real, sim = self._of(run)
            mine = [(r, s) for r, s in self.pairs if (r.processes, r.slots) == run]
            walls = ", ".join(f"{r.figures.wall:.1f}; {r.load:.1f}" for r, _ in mine)
            simulated = ", ".join(f"{s.wall:.1f}" for _, s in mine)
            lines.append(f"| {label(run)} | {real.wall:.1f} ({walls}) | {sim.wall:.1f} ({simulated}) | {self.ratio(run):.2f} "
                         f"| {real.first:.1f} / {sim.first:.1f} | {real.span:.1f} / {sim.span:.1f} | {real.tail:.1f} / {sim.tail:.1f} "
                         f"| {real.experiments:g} / {sim.experiments:g} | {real.gap:.2f} / {sim.gap:.2f} "
                         f"| {real.decided * 1e3:.0f} / {sim.decided * 1e3:.0f} |")
        lines.append(f"simulated walls within {TOLERANCE:.0%} of the real: {'yes' if self.ok else 'NO'}")
        return "\n".join(lines)


def saved_real_runs(path: Path) -> list[RealRun]:
    """The real runs a ``--json`` file of :func:`main` holds."""
    return [RealRun(**{**pair["real"], "figures": Figures(**pair["real"]["figures"])}) for pair in json.loads(path.read_text())[0]["pairs"]]


def calibrate(real: Sequence[RealRun], *, costs: Costs = CALIBRATED, duration: float = 2.0) -> Calibration:
    """Each of ``real`` (:func:`real_runs`) beside its simulation with ``costs``."""
    job = scenario_four(duration)
    return Calibration(costs=costs, pairs=[(r, Figures.of_simulation(simulate(job, processes=r.processes, slots=r.slots, costs=costs,
                                                                              study=r.study))) for r in real])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibrate", action="store_true",
                        help="run benchmarks/parallel.py's scenario '4' as real processes (1 slot; tune + 1 worker of 2 slots each) "
                             "and as simulated ones with the calibrated costs, and compare their walls (exit 1 if off by more than 15%%)")
    parser.add_argument("--fit", action="store_true", help="with --calibrate: also fit the costs to the real 1-slot runs and compare with those")
    parser.add_argument("--rounds", type=int, default=2, help="real runs of each configuration (default 2)")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per experiment (default 2, as the scenario's)")
    parser.add_argument("--storage", default=None, help="the real runs' shared storage (default: benchmarks/parallel.py's, the local PostgreSQL)")
    parser.add_argument("--json", type=Path, default=None, help="write the real and simulated figures there")
    parser.add_argument("--real-from", type=Path, default=None, help="the real runs a --json file holds, instead of running them again")
    args = parser.parse_args()
    if not args.calibrate:
        parser.error("nothing to do: give --calibrate")
    if args.real_from is not None:
        real = saved_real_runs(args.real_from)
    else:
        real = real_runs(rounds=args.rounds, duration=args.duration, storage=args.storage)
    results = [calibrate(real, costs=CALIBRATED, duration=args.duration)]
    if args.fit:
        results.append(calibrate(real, costs=fit(real, job=scenario_four(args.duration)), duration=args.duration))
    for result in results:
        print(result.table() + "\n")
    if args.json is not None:
        args.json.write_text(json.dumps([{"costs": dataclasses.asdict(r.costs),
                                          "pairs": [{"real": dataclasses.asdict(real), "simulated": dataclasses.asdict(sim)}
                                                    for real, sim in r.pairs]} for r in results], indent=1))
    sys.exit(0 if results[0].ok else 1)


if __name__ == "__main__":
    main()
