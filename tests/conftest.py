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
FAKE_LAUNCHER = str(TESTS / "fake_deepspeed.py")
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
