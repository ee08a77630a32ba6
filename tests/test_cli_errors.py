"""Bad input: one line naming the problem, exit status 2, never a traceback."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import FAKE_LAUNCHER
from conftest import LAUNCHER_OPTION
from conftest import Workspace
from conftest import assert_one_line_error

GOOD = {"train_micro_batch_size_per_gpu": 2, "autotuning": {"enabled": True}}


@pytest.mark.parametrize(
    ("config", "needles"),
    [
        ({"autotuning": {"enabled": True, "tuner_typ": "random"}}, ("tuner_typ", "did you mean 'tuner_type'")),
        ({"autotuning": {"enabled": True, "metric": "speed"}}, ("autotuning.metric",)),
        ({"autotuning": {"enabled": True, "start_profile_step": 9}}, ("end_profile_step (5) must not be before",)),
        ({"train_micro_batch_size_per_gpu": -4, "autotuning": {"enabled": True}}, ("train_micro_batch_size_per_gpu must be",)),
        ({"train_micro_batch_size_per_gpu": 2}, ("autotuning is not enabled",)),
        ({"train_micro_batch_size_per_gpu": 2, "autotuning": {"enabled": False}}, ("autotuning is not enabled",)),
        ({**GOOD, "zero_optimization": {"stage": 7}}, ("zero_optimization.stage",)),
        # A cap below the user's own micro-batch was ignored ("your config is the optimum").
        ({"train_micro_batch_size_per_gpu": 8, "autotuning": {"enabled": True, "max_train_batch_size": 4}},
         ("autotuning.max_train_batch_size (4) is below the 8 samples a step of your config", "raise it to at least 8")),
    ],
)
def test_invalid_configs(ws: Workspace, config: dict, needles: tuple[str, ...]) -> None:
    ws.config(config)
    assert_one_line_error(ws.tune(), *needles)


def test_invalid_json_names_line_and_column(ws: Workspace) -> None:
    (ws.root / "ds_config.json").write_text('{\n "autotuning": {"enabled": true,}\n}')
    assert_one_line_error(ws.tune(), "ds_config.json is not valid JSON", "line 2 column")


def test_missing_config_script_and_launcher(ws: Workspace) -> None:
    assert_one_line_error(ws.tune("absent.json"), "absent.json not found")
    ws.config(GOOD)
    assert_one_line_error(ws.cli("tune", LAUNCHER_OPTION, FAKE_LAUNCHER, "nope.py", "--deepspeed", "ds_config.json"), "training script nope.py not found")
    assert_one_line_error(ws.cli("tune", LAUNCHER_OPTION, "/no/such/deepspeed", "train.py", "--deepspeed", "ds_config.json"), "--deepspeed-bin /no/such/deepspeed not found")
    assert_one_line_error(ws.cli("tune", LAUNCHER_OPTION, FAKE_LAUNCHER, "train.py", "--lr", "1"), "no DeepSpeed config in the script arguments")


def test_unknown_option_and_bad_storage(ws: Workspace) -> None:
    ws.config(GOOD)
    assert_one_line_error(ws.cli("tune", "--num_gpus", "two", "train.py", "--deepspeed", "ds_config.json"), "--num_gpus")
    p = ws.tune("ds_config.json", "--storage", "postgresql+psycopg://user:s3cret@127.0.0.1:1/db")
    assert_one_line_error(p, "127.0.0.1:1")
    assert "s3cret" not in p.stderr + p.stdout
    assert_one_line_error(ws.tune("ds_config.json", "--storage", "not a url"), "invalid storage URL")
    p = ws.tune("ds_config.json", "--storage", "postgresql+psycopg://user@127.0.0.1:1/db", env=ws.env(OPTUNA_DS_CONNECT_PATIENCE="soon"))
    assert_one_line_error(p, "OPTUNA_DS_CONNECT_PATIENCE must be a number of seconds", "'soon'")


def test_hostfile_errors(ws: Workspace) -> None:
    ws.config(GOOD)
    assert_one_line_error(ws.tune("ds_config.json", "--hostfile", "missing-hostfile"), "hostfile missing-hostfile not found")
    (ws.root / "hostfile").write_text("worker-0 slots=2\nworker-0 slots=2\n")
    assert_one_line_error(ws.tune("ds_config.json", "--hostfile", "hostfile"), "multiple entries for worker-0")
    assert_one_line_error(ws.tune("ds_config.json", "--num_gpus", "8"), "--num_gpus 8 but a node has only 1",
                          "on DeepSpeed's CPU accelerator a node's devices are its NUMA nodes, or LOCAL_SIZE", "LOCAL_SIZE=8 runs 8")


def test_a_different_plan_under_the_same_study_name(ws: Workspace) -> None:
    ws.config(GOOD)
    assert ws.tune().returncode == 0
    ws.config({**GOOD, "train_micro_batch_size_per_gpu": 3})
    p = ws.tune()
    assert_one_line_error(p, "already holds a tuning of ", "whose config differs in train_micro_batch_size_per_gpu", "--overwrite")
    assert p.stdout.strip() == ""  # the refusal alone, no line of the tuning it refused before it


@pytest.mark.parametrize("url, hint", [
    ("postgres://user@127.0.0.1:1/db", "SQLAlchemy knows no database 'postgres'; use postgresql+psycopg://"),
    ("mysql://user@127.0.0.1:1/db", "; use mysql+pymysql://"),
])
def test_a_storage_url_of_another_spelling_names_the_one_that_works(ws: Workspace, url: str, hint: str) -> None:
    ws.config(GOOD)
    assert_one_line_error(ws.tune("ds_config.json", "--storage", url), hint)


def test_a_sqlite_url_with_two_slashes_gets_the_three_slash_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 49: sqlite://tmp/x opened x in the current folder ("tmp" read as a host), or failed unexplained.
    from optuna_ds._errors import OptunaDSError
    from optuna_ds.storage import create_storage

    monkeypatch.chdir(tmp_path)
    with pytest.raises(OptunaDSError) as e:
        create_storage("sqlite://tmp/x.db")
    assert str(e.value) == ("storage sqlite://tmp/x.db: a SQLite URL names no host ('tmp'): write sqlite:///tmp/x.db for "
                            "tmp/x.db under the current folder, or sqlite:////tmp/x.db for /tmp/x.db")
    assert e.value.exit_code == 2 and not (tmp_path / "x.db").exists()


def test_an_option_of_ours_after_the_script_gets_a_hint_when_it_fails_there() -> None:
    # Issue 49: `optuna-ds tune train.py ... --num_gpus 2` passes --num_gpus to the script, which refuses it.
    from optuna_ds.cli._main import misplaced_option_hint

    failed = ("z1_gas1_tmbspg2 failed whatever its config (exit status 2: train.py: error: unrecognized arguments: "
              "--num_gpus 2): every experiment would")
    options = {"--num_gpus", "--storage", "--overwrite"}
    args = ("--deepspeed_config", "ds.json", "--num_gpus", "2")
    assert misplaced_option_hint(failed, script="train.py", script_args=args, options=options) == (
        "--num_gpus is an optuna-ds option, but it came after train.py, so it went to the script: put it before train.py")
    assert misplaced_option_hint("a failure of its own", script="train.py", script_args=args, options=options) == ""
    assert misplaced_option_hint(failed, script="train.py", script_args=("--deepspeed_config", "ds.json"), options=options) == ""
