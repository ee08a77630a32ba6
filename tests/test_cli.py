"""The command line's habits: grouped help, the notice before DeepSpeed builds its CPU ops,
what `make example` says next."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from optuna_ds.launcher import cpu_ops_to_build
from optuna_ds.cli import cli

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize("command", ["tune", "run", "worker"])
def test_help_shows_the_tuners_options_first_then_the_launchers_in_their_group(command: str) -> None:
    text = CliRunner().invoke(cli, [command, "-h"], terminal_width=100).output
    ours, launcher = text.split("\nOptions:\n", 1)[1].split("\nDeepSpeed launcher options:\n")
    assert "--storage" in ours and "--seed" not in ours and "--hostfile" not in ours and "--num_gpus" not in ours
    assert "--hostfile" in launcher and "--num_gpus" in launcher and "--storage" not in launcher
    assert "SCRIPT" not in ours  # arguments are in the usage line


def test_the_cpu_ops_notice_only_while_the_build_folder_lacks_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        pytest.skip("DeepSpeed builds CPU ops on the CPU accelerator only")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    missing = cpu_ops_to_build()
    assert missing and "deepspeed_shm_comm" in missing
    for name in missing:
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.so").touch()
    assert cpu_ops_to_build() == []


def test_make_example_says_how_to_run_it_yourself() -> None:
    out = subprocess.run(["make", "-n", "example"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lines = out[out.index("next:"):]
    assert "source .venv/bin/activate" in lines and "cd examples && optuna-ds tune " in lines
