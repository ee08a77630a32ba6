"""A run that failed for a reason that is not its config's runs again on resume: the machine
failed it (the disk full, a folder read-only, a node lost), or it timed out under a shorter
--trial-timeout than the resumed tuning's."""

from __future__ import annotations

import json

import optuna

from conftest import Workspace

CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "zero_optimization": {"stage": [1, 2]},
    "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 16, "model_info": {"num_params": 1000}},
}
# ZeRO-2 the fastest, ZeRO-1 about 11% slower.
SURFACE = {"base": {"1": 117, "2": 130}, "peak": 8}


def _z2_launches(ws: Workspace) -> list[dict]:
    return [e for e in ws.launches() if e.get("stage") == 2 and not e.get("profile") and not e.get("training")]


def test_a_machine_failure_never_rules_out_a_stage_and_runs_again_on_resume(ws: Workspace) -> None:
    """Issue 50 row 1: the disk filled while a ZeRO-2 run wrote its metrics ("exit status 1"),
    and on resume ZeRO-2 never launched again. The machine's failure stops the tuning in one line
    that says it is no failure of the config; the resume runs ZeRO-2 again and can choose it."""
    ws.config(CONFIG)
    full = "Traceback (most recent call last):\nOSError: [Errno 28] No space left on device: '/results/metrics.json'"
    first = ws.tune(surface={**SURFACE, "stderr_fail": {"2": full}})
    lines = first.stderr.strip().splitlines()
    assert first.returncode == 2 and "Traceback" not in first.stderr, first.stderr[-3000:]
    assert "No space left on device" in lines[-1] and "not its config" in lines[-1] and "run the same command again" in lines[-1], lines[-1]
    failed = [t for t in optuna.load_study(study_name="optuna-ds-z2", storage=ws.storage).get_trials() if t.state.name == "FAIL"]
    assert [t.user_attrs.get("reason") for t in failed] == ["machine"]
    tried = len(_z2_launches(ws))
    again = ws.tune(surface=SURFACE)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(_z2_launches(ws)) > tried
    assert json.loads((ws.results / "ds_config_optimal.json").read_text())["zero_optimization"]["stage"] == 2


def test_a_longer_trial_timeout_on_resume_runs_again_what_timed_out_under_the_shorter(ws: Workspace) -> None:
    """Issue 50 row 4: a resume with a longer --trial-timeout never ran again the runs that had
    timed out, and nothing said so. The timeout a run ran under is its record's; under the same
    or a shorter one it stays a timeout, under a longer one it runs again, told in one line."""
    ws.config({**CONFIG, "train_micro_batch_size_per_gpu": [2, 4], "zero_optimization": {"stage": 1}})
    surface = {"duration_at": {"4": 8}}  # micro-batch 4, the faster, takes 8 s

    def runs_of_4() -> list[dict]:
        return [e for e in ws.launches() if e.get("mbs") == 4 and not e.get("profile") and not e.get("training")]

    def optimum() -> int:
        return json.loads((ws.results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"]

    first = ws.tune("ds_config.json", "--trial-timeout", "5", surface=surface)
    assert first.returncode == 0, first.stderr[-3000:]
    (timed_out,) = [t for t in optuna.load_study(study_name="optuna-ds-z1", storage=ws.storage).get_trials()
                    if t.user_attrs.get("exp_name") == "z1_gas1_tmbspg4"]
    assert timed_out.user_attrs["reason"] == "timeout" and timed_out.user_attrs["timeout"] == 5
    assert "of 5 s" in timed_out.user_attrs["detail"]
    tried = len(runs_of_4())  # with its optimizer offloaded too, which times out alike
    assert optimum() == 2
    for same_or_shorter in ("5", "3"):
        again = ws.tune("ds_config.json", "--trial-timeout", same_or_shorter, surface=surface)
        assert again.returncode == 0, again.stderr[-3000:]
        assert len(runs_of_4()) == tried and "may run again" not in again.stdout + again.stderr
    longer = ws.tune("ds_config.json", "--trial-timeout", "60", surface=surface)
    assert longer.returncode == 0, longer.stderr[-3000:]
    told = [line for line in (longer.stdout + longer.stderr).splitlines() if "timed out under a shorter trial timeout" in line]
    assert len(told) == 1 and "z1_gas1_tmbspg4" in told[0] and "60 s" in told[0], longer.stdout
    assert len(runs_of_4()) > tried and optimum() == 4
