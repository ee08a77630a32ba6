"""The Hugging Face Trainer example tuned end to end on CPU (select with `pytest -k hf`)."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from conftest import EXAMPLES

pytest.importorskip("transformers", reason="transformers is not installed (pip install optuna-ds[hf])")
pytestmark = pytest.mark.e2e


def test_hf_trainer_example_is_tuned_with_auto_values(tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / "hf" / "run_clm.py", tmp_path / "run_clm.py")
    config = json.loads((EXAMPLES / "hf" / "ds_config.json").read_text())
    config["zero_optimization"] = {"stage": 1}
    config["autotuning"].update({"max_train_micro_batch_size_per_gpu": 2, "start_profile_step": 1, "end_profile_step": 2})
    (tmp_path / "ds_config.json").write_text(json.dumps(config))
    args = ["tune", "--num_gpus", "1", "--master_port", "29680", "run_clm.py", "--deepspeed", "ds_config.json",
            "--output_dir", "out", "--per_device_train_batch_size", "2", "--max_steps", "8", "--report_to", "none",
            "--save_strategy", "no", "--learning_rate", "2e-5"]
    p = subprocess.run([sys.executable, "-m", "optuna_ds", *args], cwd=tmp_path, env=dict(os.environ, DS_ACCELERATOR="cpu", OPTUNA_DS_LOCK_DIR=str(tmp_path / "locks"), OMP_NUM_THREADS="1"),
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr

    storage = f"sqlite:///{tmp_path / 'autotuning_results' / 'optuna-ds.db'}"
    trials = optuna.load_study(study_name="optuna-ds-z1", storage=storage).get_trials()
    assert trials and all(t.state == TrialState.COMPLETE for t in trials), [t.user_attrs.get("stderr_tail") for t in trials]
    # The script's own batch size runs first; the sizes stay within the bounds (a chosen size is
    # bracketed, so 1 may run too).
    first = min(trials, key=lambda t: t.number)
    assert first.user_attrs["micro_batch_size"] == 2
    assert {t.user_attrs["micro_batch_size"] for t in trials} <= {1, 2}
    for t in trials:
        mbs, gas = t.user_attrs["micro_batch_size"], t.user_attrs["gradient_accumulation_steps"]
        cmd = t.user_attrs["cmd"]
        assert cmd[cmd.index("--per_device_train_batch_size") + 1] == str(mbs)
        assert cmd[cmd.index("--gradient_accumulation_steps") + 1] == str(gas)
        metrics = t.user_attrs["metrics"]
        # The engine measured the batch it ran: throughput = train_batch_size / latency.
        assert metrics["throughput"] * metrics["latency"] / 1e6 == pytest.approx(mbs * gas, rel=1e-6)
        ds = t.user_attrs["ds_config"]
        assert ds["optimizer"]["params"]["lr"] == "auto" and ds["train_batch_size"] == "auto"

    optimal = json.loads((tmp_path / "autotuning_results" / "ds_config_optimal.json").read_text())
    cmd = shlex.split((tmp_path / "autotuning_results" / "cmd_optimal.txt").read_text())
    assert cmd[cmd.index("--per_device_train_batch_size") + 1] == str(optimal["train_micro_batch_size_per_gpu"])
    assert cmd[cmd.index("--deepspeed") + 1].endswith("ds_config_optimal.json")
