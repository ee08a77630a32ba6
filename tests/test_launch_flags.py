"""DeepSpeed's launcher flags: accepted as DeepSpeed spells them, and read by DeepSpeed's own
parsers from every command optuna-ds builds (experiments, the fast start, the optimal command)."""
from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import FAKE_LAUNCHER
from conftest import LAUNCHER_OPTION
from conftest import Workspace
from conftest import assert_one_line_error
from conftest import run_in_process
from optuna_ds._errors import ResourceError
from optuna_ds.launcher import CommandBuilder
from optuna_ds.launcher import LauncherOptions
from optuna_ds.launcher import Slot
from optuna_ds.launcher import discover_resources
from optuna_ds.launcher._commands import local_launch_command

runner = pytest.importorskip("deepspeed.launcher.runner")

SCRIPT_ARGS = ("--deepspeed_config", "user.json", "--rbs", "1", "--note", "a b; $(touch pwned) 'q' \"dq\"")
CONFIG = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2, "reduce_bucket_size": 500000000}}
MAPPINGS = {"train_micro_batch_size_per_gpu": "--mbs", "reduce_bucket_size": "--rbs"}

# Each pass-through flag, as the user gives it, and what DeepSpeed's parser must read back.
PASS_THROUGH = [
    (LauncherOptions(launcher="slurm"), {"launcher": "slurm"}),
    (LauncherOptions(launcher_args="--exclusive -p 'gpu q'"), {"launcher_args": "--exclusive -p 'gpu q'"}),
    (LauncherOptions(module=True), {"module": True}),
    (LauncherOptions(no_python=True), {"no_python": True}),
    (LauncherOptions(no_local_rank=True), {"no_local_rank": True}),
    (LauncherOptions(no_ssh_check=True), {"no_ssh_check": True}),
    (LauncherOptions(force_multi=True), {"force_multi": True}),
    (LauncherOptions(bind_cores_to_rank=True), {"bind_cores_to_rank": True}),
    (LauncherOptions(bind_core_list="0,2-3"), {"bind_core_list": "0,2-3"}),
    (LauncherOptions(ssh_port=2222), {"ssh_port": 2222}),
    (LauncherOptions(venv_script=__file__), {"venv_script": __file__}),
    (LauncherOptions(log_level="warning"), {"log_level": "warning"}),
    (LauncherOptions(master_addr="10.0.0.1"), {"master_addr": "10.0.0.1"}),
    (LauncherOptions(enable_each_rank_log="/tmp/ranks"), {"enable_each_rank_log": "/tmp/ranks/z2_exp"}),
]


def _builder(options: LauncherOptions, hostfile: str | None = None) -> CommandBuilder:
    return CommandBuilder(deepspeed_bin=("/usr/bin/deepspeed",), script="/p/train.py", script_args=SCRIPT_ARGS,
                          arg_mappings=MAPPINGS, options=options, hostfile=hostfile)


def _expected_user_args(config_path: str) -> list[str]:
    return ["--deepspeed_config", config_path, "--rbs", "500000000", "--note", SCRIPT_ARGS[-1], "--mbs", "8"]


@pytest.mark.parametrize(("options", "expected"), PASS_THROUGH, ids=[str(e) for _, e in PASS_THROUGH])
def test_each_flag_reaches_the_experiment_as_deepspeed_reads_it(options: LauncherOptions, expected: dict) -> None:
    slot = Slot({"localhost": [2, 3]})
    cmd = _builder(options).experiment(name="z2_exp", config=CONFIG, config_path="/r/z2_exp/ds_config.json", slot=slot, port=29501)
    assert cmd[0] == "/usr/bin/deepspeed"
    args = runner.parse_args(cmd[1:])
    for key, value in expected.items():
        assert getattr(args, key) == value, key
    # The slot's GPUs and port, nothing that contradicts them, and the script's arguments intact.
    assert (args.include, args.exclude, args.num_gpus, args.num_nodes, args.master_port) == ("localhost:2,3", "", -1, -1, 29501)
    assert args.user_script == "/p/train.py"
    assert args.user_args == _expected_user_args("/r/z2_exp/ds_config.json")


@pytest.mark.parametrize(("options", "expected"), PASS_THROUGH, ids=[str(e) for _, e in PASS_THROUGH])
def test_each_flag_reaches_the_optimal_command_as_given(options: LauncherOptions, expected: dict) -> None:
    cmd = _builder(options).training(config=CONFIG, config_path="/r/ds_config_optimal.json")
    args = runner.parse_args(cmd[1:])
    expected = dict(expected, enable_each_rank_log=options.enable_each_rank_log)
    for key, value in expected.items():
        assert getattr(args, key) == value, key
    assert args.master_port == 29500 and "--master_port" not in cmd  # no fixed port: DeepSpeed's default
    assert args.user_args == _expected_user_args("/r/ds_config_optimal.json")


def test_the_optimal_command_keeps_the_users_selection_and_port() -> None:
    options = LauncherOptions(hostfile="/h", include="w1:0,1@w2", master_port=31000, save_pid=True)
    args = runner.parse_args(_builder(options).training(config=CONFIG, config_path="/c.json")[1:])
    assert (args.hostfile, args.include, args.master_port, args.save_pid) == ("/h", "w1:0,1@w2", 31000, True)
    args = runner.parse_args(_builder(LauncherOptions(num_gpus=2, num_nodes=3, exclude="")).training(config=CONFIG, config_path="/c.json")[1:])
    assert (args.num_gpus, args.num_nodes) == (2, 3)


def test_multi_node_experiments_name_the_hostfile_and_the_slot() -> None:
    cmd = _builder(LauncherOptions(launcher="pdsh"), hostfile="/job/hf").experiment(
        name="e", config=CONFIG, config_path="/c.json", slot=Slot({"w1": [0, 1], "w2": [0, 1]}), port=29600)
    args = runner.parse_args(cmd[1:])
    assert (args.hostfile, args.include, args.master_port) == ("/job/hf", "w1:0,1@w2:0,1", 29600)
    # Backends that refuse any selection get none: the slot is the whole hostfile (checked at discovery).
    cmd = _builder(LauncherOptions(launcher="openmpi"), hostfile="/job/hf").experiment(
        name="e", config=CONFIG, config_path="/c.json", slot=Slot({"w1": [0, 1], "w2": [0, 1]}), port=29600)
    args = runner.parse_args(cmd[1:])
    assert (args.launcher, args.include) == ("openmpi", "")


def _runner_spawn(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> list[str]:
    """The per-node launcher command DeepSpeed's runner would spawn for ``deepspeed argv``."""
    spawned: list[list[str]] = []

    class Capture:
        returncode = 0

        def __init__(self, cmd: list[str], env: dict | None = None) -> None:
            spawned.append(cmd)

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(runner.subprocess, "Popen", Capture)
    runner.main(argv)
    assert len(spawned) == 1
    return spawned[0]


@pytest.mark.parametrize(
    "options",
    [
        LauncherOptions(),
        LauncherOptions(no_python=True, no_local_rank=True, log_level="error"),
        LauncherOptions(module=True, bind_cores_to_rank=True, bind_core_list="0-1"),
        LauncherOptions(enable_each_rank_log="/tmp/rank-logs", master_addr="127.0.0.2"),
    ],
    ids=["plain", "no-python", "module-bind", "rank-logs"],
)
@pytest.mark.parametrize("gpus", [[0], [1], [0, 2]])
def test_the_fast_start_is_what_deepspeeds_runner_would_spawn(monkeypatch: pytest.MonkeyPatch, options: LauncherOptions, gpus: list[int]) -> None:
    monkeypatch.setenv("LOCAL_SIZE", "4")  # the CPU accelerator's device count
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    builder = _builder(options)
    slot = Slot({"localhost": gpus})
    assert builder.is_local(slot)
    experiment = builder.experiment(name="z2_exp", config=CONFIG, config_path="/c.json", slot=slot, port=29777)
    ours = local_launch_command(builder.local_launch(name="z2_exp", config=CONFIG, config_path="/c.json", slot=slot, port=29777))
    assert ours == _runner_spawn(monkeypatch, experiment[1:])


def test_force_multi_keeps_the_runner() -> None:
    assert not _builder(LauncherOptions(force_multi=True)).is_local(Slot({"localhost": [0]}))
    assert not _builder(LauncherOptions()).is_local(Slot({"a": [0], "b": [0]}))


# -- the GPUs: hostfile, --include, --exclude, --num_gpus, --num_nodes ----------------------------

HOSTFILE = "worker-0 slots=4\nworker-1 slots=4\nworker-2 slots=2\n"


@pytest.mark.parametrize(
    ("hostfile", "options", "slots"),
    [
        (None, LauncherOptions(), ["localhost:0,1,2,3"]),
        (None, LauncherOptions(num_gpus=1), ["localhost:0", "localhost:1", "localhost:2", "localhost:3"]),
        (None, LauncherOptions(num_gpus=2), ["localhost:0,1", "localhost:2,3"]),
        (None, LauncherOptions(include="localhost:1,3"), ["localhost:1,3"]),
        (None, LauncherOptions(exclude="localhost:0"), ["localhost:1,2,3"]),
        (HOSTFILE, LauncherOptions(), ["worker-0:0,1@worker-1:0,1@worker-2:0,1"]),
        # Without --num_gpus a slot takes as many GPUs as the smallest node has.
        (HOSTFILE, LauncherOptions(num_nodes=1), ["worker-0:0,1", "worker-0:2,3", "worker-1:0,1", "worker-1:2,3", "worker-2:0,1"]),
        (HOSTFILE, LauncherOptions(num_nodes=1, num_gpus=2), ["worker-0:0,1", "worker-0:2,3", "worker-1:0,1", "worker-1:2,3", "worker-2:0,1"]),
        (HOSTFILE, LauncherOptions(num_nodes=2, num_gpus=1), ["worker-0:0@worker-1:0"]),
        (HOSTFILE, LauncherOptions(include="worker-1:2,3"), ["worker-1:2,3"]),
        (HOSTFILE, LauncherOptions(include="worker-0@worker-2"), ["worker-0:0,1@worker-2:0,1"]),
        (HOSTFILE, LauncherOptions(exclude="worker-2"), ["worker-0:0,1,2,3@worker-1:0,1,2,3"]),
        (HOSTFILE, LauncherOptions(exclude="worker-0:0,1@worker-2"), ["worker-0:2,3@worker-1:0,1"]),
    ],
)
def test_gpu_selection_matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hostfile: str | None, options: LauncherOptions, slots: list[str]) -> None:
    monkeypatch.setenv("LOCAL_SIZE", "4")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if hostfile is not None:
        (tmp_path / "hostfile").write_text(hostfile)
        options = dataclasses.replace(options, hostfile=str(tmp_path / "hostfile"))
    resources = discover_resources(options)
    assert [s.include for s in resources.slots()] == slots
    # Every slot lies within what DeepSpeed's runner resolves from the same flags.
    pool = runner._parse_hostfile(hostfile.splitlines()) if hostfile else {"localhost": 4}
    active = runner.parse_inclusion_exclusion(pool, options.include, options.exclude)
    for slot in resources.slots():
        for host, ids in slot.hosts.items():
            assert set(ids) <= set(active[host])


@pytest.mark.parametrize(
    ("hostfile", "options", "needle"),
    [
        (None, LauncherOptions(include="localhost:7"), "No slot '7'"),
        (None, LauncherOptions(num_gpus=5), "--num_gpus 5 but a node has only 4"),
        (None, LauncherOptions(include="localhost:0", num_gpus=1), "cannot be combined"),
        (None, LauncherOptions(include="localhost:0", exclude="localhost:1"), "mutually exclusive"),
        (HOSTFILE, LauncherOptions(num_nodes=4), "--num_nodes 4 but only 3"),
        (HOSTFILE, LauncherOptions(include="worker-9"), "worker-9"),
        (HOSTFILE, LauncherOptions(launcher="openmpi", num_nodes=2), "--launcher openmpi cannot select GPUs"),
        (HOSTFILE, LauncherOptions(launcher="slurm", include="worker-0:1,2@worker-1:1,2"), "slurm backend cannot select specific device ids"),
        (None, LauncherOptions(num_gpus=-3), "--num_gpus must be a positive"),
        (None, LauncherOptions(master_port=99999), "--master_port must be a port number"),
        (None, LauncherOptions(launcher="ssh"), "--launcher must be one of"),
    ],
)
def test_gpu_selections_deepspeed_refuses_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hostfile: str | None, options: LauncherOptions, needle: str) -> None:
    monkeypatch.setenv("LOCAL_SIZE", "4")
    if hostfile is not None:
        (tmp_path / "hostfile").write_text(hostfile)
        options = dataclasses.replace(options, hostfile=str(tmp_path / "hostfile"))
    with pytest.raises(ResourceError, match=None) as e:
        discover_resources(options)
    assert needle in str(e.value)


def test_cuda_visible_devices_select_the_gpus_as_deepspeed_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_SIZE", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert [s.include for s in discover_resources(LauncherOptions(num_gpus=-1)).slots()] == ["localhost:2,3"]


# -- the CLI ---------------------------------------------------------------------------------------

GOOD = {"train_micro_batch_size_per_gpu": [2, 4], "autotuning": {"enabled": True, "model_info": {"num_params": 1000}}}


def test_deepspeeds_short_flags_and_pass_through_flags_reach_every_launch(ws: Workspace) -> None:
    ws.config(GOOD)
    p = ws.tune("ds_config.json", "-i", "localhost:1", "--no_local_rank", "--log_level", "warning", "--launcher", "pdsh",
                "--launcher_args", "-f 4", "--bind_core_list", "0-1", env=ws.env(LOCAL_SIZE="2", OPTUNA_DS_LOCK_DIR=str(ws.root / "locks")))
    assert p.returncode == 0, p.stdout + p.stderr
    launches = ws.launches()
    assert sorted({launch["mbs"] for launch in launches}) == [2, 4]  # both sizes; a re-run only where worth its launch
    for launch in launches:
        args = runner.parse_args(launch["argv"])
        assert (args.include, args.no_local_rank, args.log_level, args.launcher_args, args.bind_core_list) == ("localhost:1", True, "warning", "-f 4", "0-1")
    optimal = shlex.split((ws.results / "cmd_optimal.txt").read_text())
    args = runner.parse_args(optimal[2:])  # python fake_deepspeed.py ...
    assert (args.include, args.no_local_rank, args.master_port) == ("localhost:1", True, 29500)
    assert "--master_port" not in optimal


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--num_gpus", "-3"], "--num_gpus must be a positive"),
        (["--master_port", "99999"], "--master_port must be a port number in 1..65535, got 99999"),
        (["--num_gpus", "two"], "'two' is not a valid integer"),
        (["--launcher", "/usr/bin/deepspeed"], "--launcher must be one of pdsh"),
        (["--log_level", "loud"], "--log_level must be one of"),
        (["--no_ssh"], "--no_ssh cannot be honoured"),
        (["--node_rank", "1"], "--node_rank cannot be honoured"),
        (["--autotuning", "tune"], "--autotuning cannot be honoured"),
        (["--elastic_training"], "No such option '--elastic_training'"),
        (["--module", "--no_python"], "--module and --no_python cannot be used together"),
    ],
)
def test_launcher_flags_that_cannot_work_are_one_line(ws: Workspace, argv: list[str], needle: str) -> None:
    ws.config(GOOD)
    p = ws.tune("ds_config.json", *argv)
    assert_one_line_error(p, needle)
    assert not ws.launches()


# -- quoting -----------------------------------------------------------------------------------------

# No flag an ambiguous abbreviation of DeepSpeed's launcher's (`--s`: --save_pid or --ssh_port?):
# its parser refuses those even after the script.
HOSTILE = ["--note", "a b", "--q", "it's \"quoted\"", "--d", "$HOME $(touch pwned) `touch pwned2`", "--sh", "x; touch pwned3 #", "--empty", ""]


def test_written_commands_run_exactly_their_argv(ws: Workspace) -> None:
    ws.config({**GOOD, "train_micro_batch_size_per_gpu": [2]})
    p = ws.cli("tune", LAUNCHER_OPTION, FAKE_LAUNCHER, "train.py", "--deepspeed_config", "ds_config.json", *HOSTILE)
    assert p.returncode == 0, p.stdout + p.stderr
    (launch,) = ws.launches()
    ran_args = launch["args"]
    assert ran_args[2:] == HOSTILE
    exp_dir = ws.results / "z0_gas1_tmbspg2"
    for written, expected in ((exp_dir / "cmd.txt", ran_args), (ws.results / "cmd_optimal.txt", None)):
        ws.launch_log.unlink()
        line = written.read_text().strip()
        assert "\n" not in line
        q = subprocess.run(["bash", "-c", line], cwd=ws.root, env=ws.env(), capture_output=True, text=True, timeout=60)
        assert q.returncode == 0, q.stderr
        (again,) = ws.launches()
        if expected is not None:
            assert again["args"] == expected
        else:
            assert again["args"][2:] == HOSTILE and again.get("training")
    assert not any((ws.root / name).exists() for name in ("pwned", "pwned2", "pwned3"))


def test_nested_arg_mappings_and_integer_sizes_reach_the_optimal_files(ws: Workspace) -> None:
    ws.config({"train_micro_batch_size_per_gpu": [2], "zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8},
               "autotuning": {"enabled": True, "model_info": {"num_params": 1000}, "arg_mappings": {"reduce_bucket_size": "--rbs"}}})
    p = ws.tune()
    assert p.returncode == 0, p.stdout + p.stderr
    (launch,) = ws.launches()
    assert launch["args"][-2:] == ["--rbs", "500000000"]
    optimal = shlex.split((ws.results / "cmd_optimal.txt").read_text())
    assert optimal[-2:] == ["--rbs", "500000000"]
    for path in (ws.results / "ds_config_optimal.json", ws.results / "z1_gas1_tmbspg2" / "ds_config.json"):
        text = path.read_text()
        assert '"reduce_bucket_size": 500000000' in text and "500000000.0" not in text, text
        assert json.loads(text)["zero_optimization"]["reduce_bucket_size"] == 500000000


def test_help_lists_deepspeeds_flags(tmp_path: Path) -> None:
    p = run_in_process(["tune", "--help"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    for flag in ("-H, --hostfile", "-i, --include", "-e, --exclude", "--num_accelerators", "--launcher TEXT", "--launcher_args",
                 "--no_local_rank", "--bind_cores_to_rank", "--venv_script", "--deepspeed-bin"):
        assert flag in p.stdout, flag
