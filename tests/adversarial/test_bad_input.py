"""Bad input of every kind: one line naming the problem, exit status 2, nothing launched,
nothing written outside the tuning's own folders."""

from __future__ import annotations

import socket
import sys

import pytest

from conftest import assert_one_line_error
from invariants import Hostile
from invariants import base_config
from invariants import hws  # noqa: F401


def _zero(**zero: object) -> dict:
    return base_config(zero_optimization={"stage": 1, **zero})


@pytest.mark.parametrize("config, words", [
    (_zero(reduce_bucket_size="big"), ["reduce_bucket_size"]),
    (_zero(overlap_comm="yes"), ["overlap_comm"]),
    (_zero(offload_optimizer="cpu"), ["offload_optimizer"]),
    (_zero(offload_param={"device": "gpu"}), ["offload_param.device"]),
    (base_config(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=2, train_batch_size=7), ["train_batch_size"]),
    (base_config(autotuning={"enabled": True, "mp_size": 2, "model_info": {"num_params": 1000}}), ["mp_size"]),
    # What DeepSpeed's own config models refuse, found before the first launch (issue #26).
    (_zero(overlap_com=True), ["zero_optimization.overlap_com", "did you mean 'overlap_comm'"]),
    (_zero(offload_param={"device": "nvme", "nvme_pth": "/x"}), ["zero_optimization.offload_param.nvme_pth", "'nvme_path'"]),
    (_zero(reduce_bucket_size=[5e8, 0.5]), ["zero_optimization.reduce_bucket_size = 0.5"]),
    (base_config(fp16={"enabled": True, "loss_scale_windw": 100}), ["fp16.loss_scale_windw", "'loss_scale_window'"]),
    (base_config(fp16={"enabled": True}, bf16={"enabled": True}), ["bfloat16 and fp16"]),
    (base_config(tensorboard={"enabled": True, "output_pth": "tb"}), ["tensorboard.output_pth"]),
    # A top-level key DeepSpeed never reads: it would ignore it and every experiment run its default (issue #35).
    (base_config(train_micro_batch_size_per_gp=4), ["train_micro_batch_size_per_gp", "did you mean 'train_micro_batch_size_per_gpu'"]),
    # The checkpointing switch mapped to the micro-batch flag: the dimension would silently vanish (issue #50).
    (base_config(autotuning={"enabled": True, "model_info": {"num_params": 1000000},
                             "arg_mappings": {"gradient_checkpointing": "--per_device_train_batch_size"}}),
     ["arg_mappings maps gradient_checkpointing to --per_device_train_batch_size", "the flag of train_micro_batch_size_per_gpu"]),
    (base_config(autotuning={"enabled": True, "model_info": {"num_params": 1000000},
                             "arg_mappings": {"gradient_accumulation_steps": "--accum", "gradient_checkpointing": "--accum"}}),
     ["maps gradient_checkpointing to --accum", "the flag of gradient_accumulation_steps"]),
])
def test_bad_config_values(hws: Hostile, config: dict, words: list[str]) -> None:
    hws.config(config)
    proc = hws.main()
    assert_one_line_error(proc, *words)
    assert hws.events() == []
    hws.assert_untouched()


def test_the_model_based_sampler_without_xgboost_names_the_extra(hws: Hostile, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xgboost", None)  # not installed
    hws.config(base_config(autotuning={"enabled": True, "fast": False, "model_info": {"num_params": 1000000}}))
    assert_one_line_error(hws.main(), "model_based", "pip install 'optuna-ds[xgboost]'")
    assert hws.events() == []
    hws.assert_untouched()


def test_config_nested_100000_deep(hws: Hostile) -> None:
    (hws.root / "ds_config.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert_one_line_error(hws.main(), "nested")
    assert hws.events() == []


@pytest.mark.parametrize("extra, words", [
    (["--trial-timeout", "nan"], ["--trial-timeout"]),
    (["--trial-timeout", "inf"], ["--trial-timeout"]),
    (["--study-name", "x" * 600], ["--study-name"]),
    (["--study-name", "gpt2-z1"], ["--study-name"]),
])
def test_bad_options(hws: Hostile, extra: list[str], words: list[str]) -> None:
    hws.config(base_config())
    assert_one_line_error(hws.main(*extra), *words)
    assert hws.events() == []
    hws.assert_untouched()


@pytest.mark.parametrize("args, words", [
    (["tune", "--num_gpu", "1", "train.py"], ["'--num_gpu'", "Did you mean '--num_gpus'?"]),
    (["run", "--master-prot=29501", "train.py"], ["'--master-prot'", "'--master-port'"]),
])
def test_a_mistyped_option_gets_a_suggestion(hws: Hostile, args: list[str], words: list[str]) -> None:
    assert_one_line_error(hws.main(*args, config=None), *words)
    hws.assert_untouched()


@pytest.mark.parametrize("which", ["--results-dir", "--exps-dir"])
def test_output_folder_is_a_file_found_before_the_profile_run(hws: Hostile, which: str) -> None:
    (hws.root / "taken").write_text("a file\n")
    hws.own.remove(hws.root / "autotuning_results") if which == "--results-dir" else None
    config = base_config(autotuning={"enabled": True})  # no model_info: a profile run would come first
    hws.config(config)
    assert_one_line_error(hws.main(which, "taken"), "taken")
    assert hws.events() == []  # not even the profile run


def test_report_on_a_mistyped_sqlite_path_creates_nothing(hws: Hostile) -> None:
    proc = hws.main("report", "--storage", f"sqlite:///{hws.root}/typo/optuna-ds.db", "-o", str(hws.root / "r.html"), config=None)
    assert_one_line_error(proc, "typo")
    assert not (hws.root / "typo").exists()
    hws.assert_untouched()


def test_report_and_dashboard_errors(hws: Hostile) -> None:
    hws.config(base_config())
    assert hws.hostile().returncode == 0
    # In a new interpreter: Optuna's ExperimentalWarning must not come before the one line.
    proc = hws.cli("report", "--storage", hws.storage, "-o", str(hws.root / "missing" / "r.html"))
    assert_one_line_error(proc, "missing")
    assert not (hws.root / "missing").exists()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = hws.main("dashboard", "--storage", hws.storage, "--port", str(port), config=None)
    assert_one_line_error(proc, str(port))
    assert "Listening" not in proc.stdout + proc.stderr
    proc = hws.main("dashboard", "--storage", hws.storage, "--host", "no such host!", "--port", "8099", config=None)
    assert_one_line_error(proc, "no such host!")
    hws.assert_untouched()


def test_worker_on_a_tuning_that_does_not_exist_names_those_there_and_creates_nothing(hws: Hostile) -> None:
    missing = hws.root / "none.db"
    proc = hws.main("worker", "--storage", f"sqlite:///{missing}", "--study-name", "zz", "--wait", "0.3", config=None)
    assert_one_line_error(proc, "'zz'", "no database there yet")
    assert not missing.exists()
    hws.config(base_config())
    assert hws.hostile().returncode == 0
    files = lambda: sorted(p.name for p in hws.results.iterdir() if not p.name.endswith(("-shm", "-wal")))  # noqa: E731 - SQLite's own
    before = files()
    proc = hws.main("worker", "--storage", hws.storage, "--study-name", "zz", "--wait", "0.3", config=None)
    assert_one_line_error(proc, "'zz'", "it holds 'optuna-ds'")
    assert files() == before
    hws.assert_untouched()


def test_a_master_port_whose_slots_pass_65535_is_refused(hws: Hostile, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two slots from 65535: the second's port would be 65536, which DeepSpeed fails on, and the
    # tuning took those failures for its configs' (issue 34, row 10).
    monkeypatch.setenv("LOCAL_SIZE", "2")
    hws.config(base_config())
    assert_one_line_error(hws.main("--num_gpus", "1", "--master_port", "65535"), "--master_port 65535", "65534")
    assert hws.events() == []
    hws.assert_untouched()


def test_a_build_lock_an_interrupted_build_left_is_one_line_and_a_held_one_is_not(hws: Hostile) -> None:
    """An interrupted DeepSpeed CPU-op build (Ctrl-C during the first run) leaves torch's lock
    file: every later experiment waited on it until its trial timed out."""
    import subprocess

    extensions = hws.base / "extensions"
    lock = extensions / "fused_adam" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    hws.own.append(extensions)
    hws.config(base_config())
    env = hws.env(TORCH_EXTENSIONS_DIR=str(extensions))
    proc = hws.cli("tune", *hws.hostile_args(), env=env)
    assert_one_line_error(proc, str(lock), "interrupted build", "remove it")
    assert hws.events() == []
    # A build under way holds its lock open: not refused (its experiment waits for it, as torch does).
    holder = subprocess.Popen([sys.executable, "-c", f"import os, sys; fd = os.open({str(lock)!r}, os.O_RDONLY); print('held', flush=True); "
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        proc = hws.cli("tune", *hws.hostile_args(), env=env)
        assert proc.returncode == 0, proc.stderr
    finally:
        holder.communicate("")
    hws.assert_untouched()
