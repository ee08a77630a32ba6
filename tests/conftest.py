from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

# A suite started as a background job of a non-interactive shell inherits SIGINT ignored, and so
# would every tuning it starts (an ignored signal stays ignored across exec): the Ctrl-C tests
# need it delivered as a terminal would. A handled signal is reset to the default on exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TESTS = Path(__file__).parent
FAKE_LAUNCHER = str(TESTS.parent / "benchmarks" / "fake_deepspeed.py")
# Our option naming the deepspeed executable (DeepSpeed's own --launcher names its multi-node backend).
LAUNCHER_OPTION = "--deepspeed-bin"
EXAMPLES = TESTS.parent / "examples"


# The modules of the real-DeepSpeed tests (marked e2e). Under `make test` (`pytest -n 2`) one
# worker runs them one after another, the rest spread over the workers beside them: they share
# rendezvous ports and the node's GPU leases, and each one's ranks take every core. (xdist's own
# `xdist_group` mark no longer groups anything on pytest 9.2: pytest-dev/pytest-xdist#1386.)
DEEPSPEED_MODULES = frozenset({"test_e2e_deepspeed.py", "test_hf.py"})


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("e2e") and _module(item.nodeid) not in DEEPSPEED_MODULES:
            raise pytest.UsageError(f"{item.nodeid} is marked e2e: add its module to DEEPSPEED_MODULES in tests/conftest.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n N`` (``--dist load``): xdist's load scheduling, with DEEPSPEED_MODULES as one unit
    of work; being the largest, it starts first."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class DeepSpeedApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "deepspeed" if _module(nodeid) in DEEPSPEED_MODULES else nodeid

    return DeepSpeedApart(config, log)


def reachable(port: int) -> bool:
    """A database server answers on 127.0.0.1 at ``port``: its tests run, else they skip."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def run_in_process(args: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m optuna_ds ARGS`` in this process: the same ``main``, its exit status, stdout
    and stderr, without a new interpreter importing optuna, torch and DeepSpeed each time.

    ``env`` replaces the environment for the run (the launches it starts inherit it), as a
    child's would be. A thread the run leaves behind fails the test: a process would hang on
    it at exit or end it unfinished; here it would run on into the next test."""
    import optuna

    from optuna_ds.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_hook = dict(os.environ), os.getcwd(), threading.excepthook
    saved_verbosity = optuna.logging.get_verbosity()
    threads = set(threading.enumerate())
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        threading.excepthook = saved_hook
        optuna.logging.set_verbosity(saved_verbosity)
    left = [t for t in threading.enumerate() if t not in threads]
    for t in left:
        t.join(timeout=10)
    left = [t.name for t in left if t.is_alive()]
    assert not left, f"threads left running after `optuna-ds {' '.join(args)}`: {left}"
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    """Refused as bad input is refused everywhere: exit status 2, one line on stderr that starts
    ``optuna-ds: error`` and holds each of ``words``, no traceback. Returns the line."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("optuna-ds: error"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def safe_component(name: str) -> bool:
    """``name`` is one path component: no climbing, no separator, within a file name's length."""
    return name not in ("", ".", "..") and os.sep not in name and "\0" not in name and len(name.encode()) <= 255


def assert_tuned_or_refused(raw: Any, *, script_args: Sequence[str], gpus: int) -> None:
    """Any config is either tuned -- each stage's experiment builds, named safely inside the
    results folder, with the stage and size it was built for -- or refused with one line (a
    ``ConfigError``: the CLI's exit status 2, see :func:`assert_one_line_error`), never a crash."""
    import math

    from optuna_ds._errors import ConfigError
    from optuna_ds.config import check_gpus
    from optuna_ds.config import check_with_deepspeed
    from optuna_ds.config import parse_user_config
    from optuna_ds.domain import Config
    from optuna_ds.domain import Phase
    from optuna_ds.space import build_knob_space
    from optuna_ds.studies import ExperimentBuilder

    def one_line(error: ConfigError) -> None:
        assert str(error) and "\n" not in str(error), str(error)

    try:
        user = parse_user_config(raw, path="ds_config.json", script_args=list(script_args))
        check_gpus(user, total_gpus=gpus)
        check_with_deepspeed(user)
    except ConfigError as e:
        one_line(e)
        return
    builder = ExperimentBuilder(user=user, results_dir="/results", total_gpus=gpus)
    for stage in user.stages:
        assert type(stage) is int and stage in (0, 1, 2, 3)
        try:
            space = build_knob_space(stage, user.zero_section(), fast=user.autotuning.fast)
        except ConfigError as e:
            one_line(e)
            continue
        mbs = user.min_micro_batch_size
        experiment = builder.build(Config(stage=stage, micro_batch=mbs, knobs={k: v[0] for k, v in space.tuned.items()}),
                                   phase=Phase.KNOBS, space=space)
        assert os.path.dirname(experiment.result_dir) == "/results" and safe_component(experiment.name), experiment.result_dir
        json.dumps(experiment.ds_config)
        assert experiment.ds_config["zero_optimization"]["stage"] == stage
        assert experiment.ds_config["train_micro_batch_size_per_gpu"] == mbs
    assert math.isfinite(user.autotuning.max_train_micro_batch_size_per_gpu)


class Workspace:
    """A temporary project: a training script, its DeepSpeed config, and the CLI to run on them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.script = root / "train.py"
        self.script.write_text("print('a training script')\n")
        self.launch_log = root / "launches.jsonl"

    def config(self, data: dict[str, Any], name: str = "ds_config.json") -> str:
        path = self.root / name
        path.write_text(json.dumps(data))
        return name

    def env(self, surface: dict[str, Any] | None = None, **extra: str) -> dict[str, str]:
        # Its own GPU leases: a test must not wait on a GPU another test run on this machine holds.
        env = dict(os.environ, DS_ACCELERATOR="cpu", FAKE_DS_LOG=str(self.launch_log), OPTUNA_DS_LOCK_DIR=str(self.root / "locks"))
        env["FAKE_DS_SURFACE"] = json.dumps(surface or {})
        env.update(extra)
        return env

    def cli(self, *args: str, surface: dict[str, Any] | None = None, timeout: float = 300, env: dict[str, str] | None = None,
            process: bool = False) -> subprocess.CompletedProcess[str]:
        """The CLI on this workspace, in this process (:func:`run_in_process`), or with
        ``process`` in a new one, killed after ``timeout``: where only a process shows it (its
        exit status as a training's, what outlives it, the database connections it holds)."""
        if not process:
            return run_in_process(args, cwd=self.root, env=env or self.env(surface))
        return subprocess.run(
            [sys.executable, "-m", "optuna_ds", *args],
            cwd=self.root,
            env=env or self.env(surface),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def tune(self, config: str = "ds_config.json", *extra: str, surface: dict[str, Any] | None = None, command: str = "tune", **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.cli(command, LAUNCHER_OPTION, FAKE_LAUNCHER, *extra, "train.py", "--deepspeed_config", config, surface=surface, **kw)

    def launches(self) -> list[dict[str, Any]]:
        if not self.launch_log.exists():
            return []
        return [json.loads(line) for line in self.launch_log.read_text().splitlines()]

    @property
    def results(self) -> Path:
        return self.root / "autotuning_results"

    @property
    def storage(self) -> str:
        return f"sqlite:///{self.results / 'optuna-ds.db'}"


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


def plan_one_at_a_time(problem: Any, run: Any) -> tuple[list[Any], Any]:
    """The planner's tuning of ``problem`` on one slot, each experiment answered by
    ``run(config, repeat)`` (an :class:`~optuna_ds.planner.Observation`), to the end: the
    observations and the config chosen. In-process: the planner's own tests."""
    from optuna_ds.planner import plan

    observations: list[Any] = []
    decision = None
    for _ in range(problem.max_experiments):
        decision = plan(problem, observations)
        if not decision.proposals:
            break
        p = decision.proposals[0]
        observations.append(run(p.config, p.repeat))
    assert decision is not None and decision.done and decision.choice is not None
    return observations, decision.choice.config
