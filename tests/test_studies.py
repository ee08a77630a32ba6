"""The ready-made study specs stay valid and mean what their notes say."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from optuna_ds.config import parse_user_config
from optuna_ds.space import build_knob_space

SPECS = sorted((Path(__file__).parent.parent / "studies").glob("*.json"))
HF_ARGS = ["--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1", "--fp16"]


def test_every_model_of_deepspeeds_hf_results_has_a_spec() -> None:
    names = {p.stem for p in SPECS}
    assert names == {"distilbert", "bert-base", "bert-large", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "deberta"}
    readme = (SPECS[0].parent / "README.md").read_text()
    assert all(f"`{n}.json`" in readme for n in names)


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_spec_is_a_valid_trainer_config(spec: Path) -> None:
    raw = json.loads(spec.read_text())
    user = parse_user_config(raw, path=str(spec), script_args=["--deepspeed", str(spec), *HF_ARGS])
    assert user.autotuning.enabled and user.all_stages and user.precision == "fp16"
    assert user.min_micro_batch_size == 2  # from the Trainer's flag
    assert user.arg_mappings["train_micro_batch_size_per_gpu"] == "--per_device_train_batch_size"
    hidden = user.autotuning.model_info["hidden_size"]
    z3 = build_knob_space(3, user.zero_section(), fast=False, hidden_size=hidden)
    assert any(v == pytest.approx(0.9 * hidden**2) for v in z3.tuned["stage3_prefetch_bucket_size"])
