"""The adversarial suite's workspace and the invariants every scenario asserts (fixtures: import them)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import LAUNCHER_OPTION
from conftest import Workspace
from conftest import run_in_process

HOSTILE = str(Path(__file__).parent / "hostile_deepspeed.py")


def base_config(**overrides: Any) -> dict[str, Any]:
    """A small fast-mode tuning: two micro-batch sizes at stage 1, no profile run."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": [2, 4],
        "zero_optimization": {"stage": 1},
        "autotuning": {"enabled": True, "model_info": {"num_params": 1000000}},
    }
    config.update(overrides)
    return config


class Hostile(Workspace):
    """A workspace inside a sentinel tree: files beside it, above it and in it that no tuning
    may touch, and the hostile launcher driven by a behaviour table."""

    def __init__(self, base: Path) -> None:
        self.base = base
        (base / "outside").mkdir()
        (base / "outside" / "precious.txt").write_text("a user's file\n")
        (base / "ws").mkdir()
        super().__init__(base / "ws")
        (self.root / "notes.txt").write_text("the user's notes\n")
        self.own = [self.results, self.root / "autotuning_exps", self.launch_log, base / "locks"]
        self._before = self.snapshot()

    def env(self, surface: dict[str, Any] | None = None, **extra: str) -> dict[str, str]:  # type: ignore[override]
        # GPU leases of this workspace only: the node's are shared with every other tuning here.
        return super().env(surface, **{"OPTUNA_DS_LOCK_DIR": str(self.base / "locks"), **extra})

    def hostile(self, config: str = "ds_config.json", *extra: str, table: dict[str, Any] | None = None,
                command: str = "tune", timeout: float = 120, env: dict[str, str] | None = None,
                process: bool = False) -> subprocess.CompletedProcess[str]:
        env = env or self.env(HOSTILE_DS_TABLE=json.dumps(table or {}))
        return self.cli(command, LAUNCHER_OPTION, HOSTILE, *extra, "train.py", "--deepspeed_config", config, env=env, timeout=timeout,
                        process=process)

    def popen(self, *args: str, table: dict[str, Any] | None = None, **extra_env: str) -> subprocess.Popen[str]:
        env = self.env(HOSTILE_DS_TABLE=json.dumps(table or {}), **extra_env)
        return subprocess.Popen([sys.executable, "-m", "optuna_ds", *args], cwd=self.root, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def main(self, *args: str, config: str | None = "ds_config.json") -> subprocess.CompletedProcess[str]:
        """``tune ARGS`` (or any command when ``config`` is None) in this process, with this
        workspace's launch log and GPU leases (those of the node are any tuning's on it)."""
        argv = list(args) if config is None else ["tune", *self.hostile_args(*args, config=config)]
        return run_in_process(argv, cwd=self.root, env=self.env())

    def hostile_args(self, *extra: str, config: str = "ds_config.json") -> list[str]:
        return [LAUNCHER_OPTION, HOSTILE, *extra, "train.py", "--deepspeed_config", config]

    def snapshot(self) -> dict[str, str]:
        """Every file and folder of the sentinel tree but the tuning's own, with a digest."""
        seen: dict[str, str] = {}
        for folder, dirs, files in os.walk(self.base):
            here = Path(folder)
            dirs[:] = [d for d in dirs if here / d not in self.own]
            for d in dirs:
                seen[str(here / d)] = "dir"
            for f in files:
                path = here / f
                if path in self.own or path.name.startswith("ds_config") and path.parent == self.root:
                    continue
                seen[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "other"
        return seen

    def assert_untouched(self) -> None:
        """Nothing outside the results, exps and storage locations was written or deleted."""
        after = self.snapshot()
        assert after == self._before, {k: (self._before.get(k), after.get(k)) for k in set(after) | set(self._before)
                                       if after.get(k) != self._before.get(k)}

    def events(self) -> list[dict[str, Any]]:
        if not self.launch_log.exists():
            return []
        return [json.loads(line) for line in self.launch_log.read_text().splitlines() if line.strip()]

    def experiments(self) -> list[dict[str, Any]]:
        """The experiments launched (not the profile run, not training)."""
        return [e for e in self.events() if e["event"] == "start" and not e["profile"] and not e["training"]]

    def assert_finished_once(self) -> None:
        """No experiment that wrote its metrics was launched again."""
        finished: set[str] = set()
        again = []
        for e in self.events():
            if e["profile"] or e["training"]:
                continue
            if e["event"] == "start" and e["name"] in finished:
                again.append(e["name"])
            if e["event"] == "end" and e["metrics"]:
                finished.add(e["name"])
        assert not again, f"finished experiments launched again: {again}"

    def assert_nothing_left(self) -> None:
        """Every process the launcher started, its escaped children included, is gone."""
        pids = {e["pid"] for e in self.events()} | {c for e in self.events() for c in e.get("children", [])}
        alive = [pid for pid in pids if _alive(pid)]
        for pid in alive:
            os.kill(pid, 9)
        assert not alive, f"processes left behind: {alive}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def assert_no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert "internal error" not in proc.stderr, proc.stderr


def assert_no_secret(secret: str, *places: Any) -> None:
    """``secret`` appears in no output and in no file under the given folders."""
    for place in places:
        if isinstance(place, Path):
            for folder, _, files in os.walk(place):
                for f in files:
                    data = (Path(folder) / f).read_bytes()
                    assert secret.encode() not in data, f"{secret!r} written in {Path(folder) / f}"
        else:
            assert secret not in place, place


@pytest.fixture
def hws(tmp_path: Path) -> Hostile:
    return Hostile(tmp_path)


@pytest.fixture
def shared_tree() -> Iterator[Path]:
    """A sentinel tree another user can read but not write (for the permission tests, run as nobody)."""
    base = Path(tempfile.mkdtemp(prefix="optuna-ds-perm-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
