"""optuna-ds's own tuning of a simulated job, in this process: the benchmarks' one path to figures.

:func:`tune` runs what ``optuna-ds tune -q --deepspeed-bin benchmarks/simulated_deepspeed.py
--num_gpus N train.py --deepspeed_config ds_config.json`` runs -- the CLI's options parsed by
its own click command, then ``optuna_ds._tune.tune`` with everything it builds (the profile run,
the user's config, the arms, the knob candidates, the coordinator's slots, leases, claims and
polls, the headline's runs measured alike, the SQLite storage, the output files) -- with two
things simulated:

- each experiment's launcher: the job's answer (``simulated_deepspeed.answer``, what that script
  does as a process, the same draws: its ledger numbers the launches; or tests/fake_deepspeed.py's
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
import importlib
import io
import json
import os
import pkgutil
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

import fake_deepspeed  # noqa: E402
import search  # noqa: E402
import simulated_deepspeed  # noqa: E402
import surfaces  # noqa: E402
import virtual_time  # noqa: E402

import optuna_ds  # noqa: E402

SIMULATOR = HERE / "simulated_deepspeed.py"
FAKE_LAUNCHER = HERE.parent / "tests" / "fake_deepspeed.py"
STUDY = "product"
_TRUE, _FALSE = shutil.which("true") or "/bin/true", shutil.which("false") or "/bin/false"


@dataclasses.dataclass(frozen=True)
class Costs:
    """What the simulated world charges beyond the job's own seconds: a real process's costs that
    an in-process simulation has not.

    ``decision_s``: a decision's seconds (``None``: as measured here, on this thread's CPU clock).
    ``launch_s``: each launch's own start (the launcher's Python process) before the job's clock starts.
    ``start_s``: a process's start before it tunes (the interpreter, the imports, the storage's connection).
    ``finish_s``: tune's last steps once its tuning ended (the outputs, the report) before it exits.
    """

    decision_s: float | None = None
    launch_s: float = 0.0
    start_s: float = 0.0
    finish_s: float = 0.0


# Calibrated against benchmarks/parallel.py's scenario "4" on this project's 2-core machine
# (`python benchmarks/product.py --calibrate`): each a median of its real runs' figures.
CALIBRATED = Costs(decision_s=0.1, launch_s=0.2, start_s=3.0, finish_s=1.5)


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
    """A job of the tests' fake launcher (tests/fake_deepspeed.py, its surface a dict as in
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


def _import_all() -> None:
    """Every module of optuna-ds imported now, so that virtual_time.install() reaches them all,
    and DeepSpeed's CPU accelerator, whose device count each simulated node reads as its own."""
    for info in pkgutil.walk_packages(optuna_ds.__path__, "optuna_ds."):
        if not info.name.startswith("optuna_ds.cli") and not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    importlib.import_module("deepspeed.accelerator.cpu_accelerator")


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
        stdout.write(out.getvalue().encode())
        stderr.write(err.getvalue().encode())
        stdout.flush()
        stderr.flush()
        self._launched.append({"name": launch.name, "node": self._node, "profile": launch.profile, "start": start,
                               "end": start + seconds, "code": code})
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
    the job's ledger lines, every launch (``name``, ``node``, ``profile``, ``start``, ``end``,
    ``code``; simulated seconds), each decision's measured seconds, each launch's decision time as
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

    @property
    def experiments(self) -> list[dict[str, Any]]:
        """The launches but the profile run."""
        return [e for e in self.launches if not e["profile"]]

    @property
    def duplicates(self) -> int:
        """Launches of an experiment already launched (by its name: a repeat has a name of its own)."""
        names = [e["name"] for e in self.experiments]
        return len(names) - len(set(names))


def simulate(job: Job, *, processes: int = 1, slots: int = 1, costs: Costs = Costs(), keep: Path | None = None) -> Simulation:
    """optuna-ds's tuning of ``job``: ``tune`` and ``processes - 1`` workers, each a node of its
    own with ``slots`` experiments at once, all started together on one SQLite storage, in one
    virtual world. A process that fails fails the simulation, once every one has ended."""
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
    curve: list[tuple[int, Any]] = []  # (launches so far, the planner's choice then)
    launched: list[dict[str, Any]] = []

    class Observer(Progress):
        def decided(self, *, stage: int, number: int, name: str, seconds: float) -> None:
            decided.append(seconds)

    with tempfile.TemporaryDirectory(prefix=f"product-{job.name}-") as tmp:
        work = Path(tmp)
        ledger = work / "ledger.jsonl"
        (work / "train.py").write_text("print('a simulated training script')\n")
        (work / "ds_config.json").write_text(json.dumps(job.user_config()))
        storage = ["--storage", f"sqlite:///{work / 'tuning.db'}", "--study-name", STUDY]
        real_decide = _coordinator.Coordinator._decide
        failures: list[BaseException] = []

        with _environment(work), virtual_time.install() as world:
            def decide(self: Any) -> Any:
                t0 = time.thread_time()
                decision = real_decide(self)
                spent = time.thread_time() - t0
                decisions.append(spent)
                curve.append((sum(1 for e in launched if not e["profile"]),
                              decision.choice.config if decision.choice is not None else None))
                world.sleep(costs.decision_s if costs.decision_s is not None else spent)
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
                outcome = run_tuning(cli_options(job, extra=storage if processes > 1 else ()),
                                     observer=Observer(quiet=True, verbose=False), spawn=launcher(0))
                world.sleep(costs.finish_s)
            finally:
                for w in workers:
                    w.join()
                _coordinator.Coordinator._decide = real_decide
            wall = world.now
        if failures:
            raise failures[0]
        optimal = json.loads(Path(outcome.optimal_config_path).read_text()) if outcome.optimal_config_path else None
        lines = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
        if keep is not None:
            shutil.copytree(work, keep / job.name, dirs_exist_ok=True, ignore=shutil.ignore_patterns("locks*"))
    return Simulation(wall_s=wall, ledger=lines, launches=launched, decision_s=decisions, decided_s=decided, curve=curve,
                      optimal=optimal)


def tune(surface: surfaces.Surface, *, fast: bool = True, tuner_type: str = "model_based", slots: int = 1, processes: int = 1,
         costs: Costs = Costs(), keep: Path | None = None) -> dict[str, Any]:
    """optuna-ds's tuning of ``surface`` by ``processes`` processes (tune, then workers) of ``slots``
    experiments at once each, a node each: the choice, its true throughput, launches (the
    profile counted), GPU-hours, simulated wall seconds, the ledger, each decision's measured
    seconds, the choice after each decision, and every launch (:attr:`Simulation.launches`)."""
    run = simulate(SurfaceJob(surface, fast=fast, tuner_type=tuner_type), processes=processes, slots=slots, costs=costs, keep=keep)
    chosen = surfaces.Config.from_ds_config(run.optimal, keys=surfaces.spaces_of(surface)[1]) if run.optimal else None
    return {
        "launches": len(run.ledger),
        "oom": sum(1 for e in run.ledger if e["outcome"] == "oom"),
        "gpu_hours": sum(e["seconds"] * e["gpus"] for e in run.ledger) / 3600.0,
        "chosen": chosen,
        "true": surface.evaluate(chosen).throughput if chosen else 0.0,
        "wall_s": run.wall_s,
        "ledger": run.ledger,
        "decision_s": run.decision_s,
        "curve": run.curve,
        "experiments": run.launches,
    }
