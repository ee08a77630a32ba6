"""optuna-ds's own tuning of a simulated job, in this process: the benchmarks' one path to figures.

:func:`tune` runs what ``optuna-ds tune -q --deepspeed-bin benchmarks/simulated_deepspeed.py
--num_gpus N train.py --deepspeed_config ds_config.json`` runs -- the CLI's options parsed by
its own click command, then ``optuna_ds._tune.tune`` with everything it builds (the profile run,
the user's config, the arms, the knob candidates, the coordinator's slots, leases, claims and
polls, the headline's runs measured alike, the SQLite storage, the output files) -- with two
things simulated:

- each experiment's launcher: ``simulated_deepspeed.answer`` (what that script does as a
  process, the same draws: its ledger numbers the launches) writes the run's files and output,
  then the launch waits the job's simulated seconds and exits through a real trivial process;
- the clock (benchmarks/virtual_time.py): threads take turns and time jumps when all wait, so a
  tuning of simulated hours takes seconds, and every wait the product makes is charged.

A decision (the coordinator's ``_decide``: the storage read, the knob candidates, the planner)
costs its measured seconds on this machine unless ``decision_s`` fixes it (a deterministic
figure for comparisons); ``launch_s`` is the launcher's own start before the job's clock starts.
Only the choice read back from ``ds_config_optimal.json`` counts, as for the CLI.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import os
import pkgutil
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from collections.abc import Sequence
from pathlib import Path
from typing import IO
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import search  # noqa: E402
import simulated_deepspeed  # noqa: E402
import surfaces  # noqa: E402
import virtual_time  # noqa: E402

import optuna_ds  # noqa: E402

SIMULATOR = HERE / "simulated_deepspeed.py"
_TRUE, _FALSE = shutil.which("true") or "/bin/true", shutil.which("false") or "/bin/false"


@dataclasses.dataclass(frozen=True)
class Costs:
    """What the simulated world charges beyond the job's own seconds: a decision's seconds
    (``None``: as measured here, on this thread's CPU clock) and the launcher's start."""

    decision_s: float | None = None
    launch_s: float = 0.0


def surface_config(surface: surfaces.Surface, config: Any) -> surfaces.Config:
    """The job's config of an optuna-ds ``Config`` (the planner's choice), its zero knobs those the
    job's generator reads."""
    keys = surfaces.spaces_of(surface)[1]
    knobs = tuple(sorted((k, float(v) if type(v) is int else v) for k, v in config.knob_dict.items() if k in keys))
    return surfaces.Config(stage=config.stage, mbs=config.micro_batch, gas=config.accumulation, knobs=knobs,
                           offload_optimizer=bool(config.offload), offload_param=config.offload == "offload-opt-param")


def _import_all() -> None:
    """Every module of optuna-ds imported now, so that virtual_time.install() reaches them all."""
    for info in pkgutil.walk_packages(optuna_ds.__path__, "optuna_ds."):
        if not info.name.startswith("optuna_ds.cli") and not info.name.endswith("__main__"):
            importlib.import_module(info.name)


class _Launches:
    """The experiments' launcher: simulated_deepspeed answering in-process, the job's seconds
    waited on the virtual clock."""

    def __init__(self, surface: surfaces.Surface, ledger: Path, world: virtual_time.World, costs: Costs) -> None:
        self._surface = surface
        self._ledger = str(ledger)
        self._world = world
        self._costs = costs
        self.spans: list[tuple[float, float]] = []  # each experiment's (start, end), simulated seconds

    def __call__(self, launched: list[str], *, stdout: IO[bytes], stderr: IO[bytes], env: dict[str, str],
                 pass_fds: Sequence[int]) -> subprocess.Popen:
        argv = launched[launched.index(str(SIMULATOR)) + 1:]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code, seconds = simulated_deepspeed.answer(argv, surface=self._surface, ledger=self._ledger)
        stdout.write(out.getvalue().encode())
        stderr.write(err.getvalue().encode())
        stdout.flush()
        stderr.flush()
        start = self._world.now
        self._world.sleep(self._costs.launch_s + seconds)
        if "profile" not in json.loads(Path(self._ledger).read_text().splitlines()[-1]):
            self.spans.append((start, self._world.now))
        return subprocess.Popen([_TRUE if code == 0 else _FALSE], stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                start_new_session=True, pass_fds=tuple(pass_fds))


def _observer(whys: list[str]) -> Any:
    """The CLI's progress display, quiet as ``-q`` makes it, keeping each started experiment's reason."""
    from optuna_ds.reporting import Progress

    class Recording(Progress):
        def started(self, *, stage: int, number: int, name: str, slot: str, why: str = "") -> None:
            whys.append(why)
            super().started(stage=stage, number=number, name=name, slot=slot, why=why)

    return Recording(quiet=True, verbose=False)


@contextlib.contextmanager
def _environment(work: Path, surface: surfaces.Surface, slots: int) -> Iterator[None]:
    """As benchmarks/search.py's CLI process has it: the CPU accelerator, ``slots`` experiments'
    GPUs on this node, GPU locks and the working directory of the job's own."""
    saved, cwd = dict(os.environ), os.getcwd()
    os.environ.update(DS_ACCELERATOR="cpu", LOCAL_SIZE=str(surface.num_gpus * slots), OPTUNA_DS_LOCK_DIR=str(work / "locks"))
    os.chdir(work)
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


def cli_options(surface: surfaces.Surface, *, extra: Sequence[str] = ()) -> Any:
    """The TuneOptions the CLI builds from the command line benchmarks/search.py runs."""
    from optuna_ds.cli import _main as cli

    args = ["-q", "--deepspeed-bin", str(SIMULATOR), "--num_gpus", str(surface.num_gpus), *extra,
            "train.py", "--deepspeed_config", "ds_config.json"]
    with cli.tune.make_context("tune", args) as ctx:
        kwargs = dict(ctx.params)
    script, script_args = kwargs.pop("script"), kwargs.pop("script_args")
    kwargs.pop("quiet"), kwargs.pop("verbose")
    from optuna_ds._tune import TuneOptions

    return TuneOptions(script=script, script_args=list(script_args), launcher_options=cli._launcher_options_of(kwargs), **kwargs)


def tune(surface: surfaces.Surface, *, fast: bool = True, tuner_type: str = "model_based", slots: int = 1,
         costs: Costs = Costs(), keep: Path | None = None) -> dict[str, Any]:
    """optuna-ds's tuning of ``surface`` with ``slots`` experiments at once on its node: the
    choice, its true throughput, launches (the profile counted) and the ledger of them, GPU-hours,
    simulated wall seconds, the choice after each decision with the launches by then, each
    decision's measured seconds, each started experiment's reason and (start, end), the noise
    and summary the user is shown."""
    from optuna_ds._tune import tune as run_tuning
    from optuna_ds.cli import _main as cli
    from optuna_ds.studies import _coordinator

    _import_all()
    cli._quiet_optuna()
    decisions: list[float] = []
    whys: list[str] = []
    curve: list[tuple[int, float]] = []  # (launches so far, the true throughput of the planner's choice then)
    with tempfile.TemporaryDirectory(prefix=f"product-{surface.name}-") as tmp:
        work = Path(tmp)
        ledger = work / "ledger.jsonl"
        (work / "train.py").write_text("print('a simulated training script')\n")
        (work / "ds_config.json").write_text(json.dumps(search.user_config(fast=fast, tuner_type=tuner_type, surface=surface)))
        real_decide = _coordinator.Coordinator._decide

        with _environment(work, surface, slots), virtual_time.install() as world:
            def decide(self: Any) -> Any:
                t0 = time.thread_time()
                decision = real_decide(self)
                spent = time.thread_time() - t0
                decisions.append(spent)
                launched = sum(1 for _ in open(ledger)) if ledger.exists() else 0
                choice = decision.choice
                curve.append((launched, surface.evaluate(surface_config(surface, choice.config)).throughput if choice else 0.0))
                world.sleep(costs.decision_s if costs.decision_s is not None else spent)
                return decision

            _coordinator.Coordinator._decide = decide
            try:
                options = cli_options(surface)
                launcher = _Launches(surface, ledger, world, costs)
                outcome = run_tuning(options, observer=_observer(whys), spawn=launcher)
            finally:
                _coordinator.Coordinator._decide = real_decide
            wall = world.now
        launches = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
        chosen = None
        if outcome.optimal_config_path:
            chosen = surfaces.Config.from_ds_config(json.loads(Path(outcome.optimal_config_path).read_text()),
                                                    keys=surfaces.spaces_of(surface)[1])
        if keep is not None:
            shutil.copytree(work, keep / surface.name, dirs_exist_ok=True, ignore=shutil.ignore_patterns("locks"))
    return {
        "launches": len(launches),
        "oom": sum(1 for e in launches if e["outcome"] == "oom"),
        "gpu_hours": sum(e["seconds"] * e["gpus"] for e in launches) / 3600.0,
        "chosen": chosen,
        "true": surface.evaluate(chosen).throughput if chosen else 0.0,
        "wall_s": wall,
        "ledger": launches,
        "decision_s": decisions,
        "curve": curve,
        "whys": whys,
        "spans": launcher.spans,
        "noise": outcome.result.noise,
        "summary": outcome.summary,
    }
