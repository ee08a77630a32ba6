"""Lists no tuning can search (issue 50 row 7): refused in one line with the limit, before
anything runs; every list within it checked a value once and searched at a bounded cost."""

from __future__ import annotations

import json
from typing import Any

import optuna
import pytest

from conftest import assert_one_line_error
from invariants import Hostile
from invariants import base_config
from invariants import hws  # noqa: F401


def _zero(**zero: Any) -> dict[str, Any]:
    return base_config(zero_optimization=zero)


@pytest.mark.parametrize("raw, name", [
    (_zero(stage=1, reduce_bucket_size=[float(5e7 + i) for i in range(1_000)]),
     "zero_optimization.reduce_bucket_size lists 1000 values"),
    (_zero(stage=3, offload_optimizer={"device": "cpu", "pin_memory": [True, False] * 5_000}),
     "zero_optimization.offload_optimizer.pin_memory lists 10000 values"),
    (base_config(activation_checkpointing={"cpu_checkpointing": [False] * 101}),
     "activation_checkpointing.cpu_checkpointing lists 101"),
    (base_config(train_micro_batch_size_per_gpu=list(range(1, 1_025))),
     "train_micro_batch_size_per_gpu lists 1024 values"),
    (base_config(tensor_parallel={"autotp_size": [1, 2] * 100}),
     "tensor_parallel.autotp_size lists 200 values"),
])
def test_a_list_longer_than_a_tuning_searches_is_refused_in_one_line(hws: Hostile, raw: dict,
                                                                     name: str) -> None:
    """A knob list of 1,000 values took 183 s and 1.4 GB, one of 10,000 never started a knob
    experiment; each list is refused with the limit, before any of its values is read."""
    from optuna_ds._errors import ConfigError
    from optuna_ds.config import parse_user_config

    with pytest.raises(ConfigError, match="list at most 100"):
        parse_user_config(raw, path="ds_config.json", script_args=[])
    hws.config(raw)
    assert_one_line_error(hws.main("-q"), name, "more than the 100 a tuning searches")
    assert hws.events() == []
    hws.assert_untouched()


def test_knob_lists_whose_settings_no_search_can_choose_from_are_refused_before_a_launch(
        hws: Hostile) -> None:
    """Two lists of 60 values each, within the limit of a list, make 28,800 settings at ZeRO-2
    with DeepSpeed's other knobs: the model-based sampler would score every one of them, a grid
    ask for each. Refused before the first launch."""
    from optuna_ds._errors import ConfigError
    from optuna_ds.space import build_knob_space

    sizes = [float(10**6 + i) for i in range(60)]
    zero = {"stage": 2, "reduce_bucket_size": sizes, "allgather_bucket_size": sizes}
    with pytest.raises(ConfigError, match="28,800 knob settings at ZeRO stage 2, more than the"):
        build_knob_space(2, zero, fast=False)
    searched = {"enabled": True, "fast": False, "model_info": {"num_params": 1000000}}
    hws.config(base_config(zero_optimization=zero, autotuning=searched))
    assert_one_line_error(hws.main(), "make 28,800 knob settings at ZeRO stage 2")
    assert hws.events() == []


def test_each_listed_value_is_checked_by_deepspeed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A list of 100 entries holding two values: DeepSpeed's parser reads each value once per
    stage (a 50 MB config held 2.6 GB as the whole ZeRO section was copied for every entry)."""
    import deepspeed.runtime.config

    from optuna_ds.config import check_with_deepspeed
    from optuna_ds.config import parse_user_config

    parsed: list[dict[str, Any]] = []
    initialize = deepspeed.runtime.config.DeepSpeedConfig._initialize_params

    def counted(self: Any, param_dict: dict[str, Any]) -> Any:
        parsed.append(json.loads(json.dumps(param_dict)))
        return initialize(self, param_dict)

    monkeypatch.setattr(deepspeed.runtime.config.DeepSpeedConfig, "_initialize_params", counted)
    raw = base_config(zero_optimization={"stage": [1, 2], "reduce_bucket_size": [5e7, 5e8] * 50},
                      activation_checkpointing={"partition_activations": [False, True] * 50})
    check_with_deepspeed(parse_user_config(raw, path="ds_config.json", script_args=[]))
    seen = [(c["zero_optimization"]["stage"], c["zero_optimization"]["reduce_bucket_size"],
             c["activation_checkpointing"]["partition_activations"]) for c in parsed]
    values = ((5e7, False), (5e8, False), (5e7, True))  # each list's first, and each other value
    assert sorted(seen) == sorted({(s, r, p) for s in (1, 2) for r, p in values}), seen


def test_a_grid_of_thousands_of_settings_asks_the_sampler_a_bounded_number_of_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Optuna compares every choice list at each ask: a grid asked for each of its 2,400 settings
    at every decision took seconds each (the 10,000-value list never reached a knob experiment).
    The planner is handed at most 256 settings of a grid at a time."""
    from types import SimpleNamespace

    from optuna_ds.planner import Arm
    from optuna_ds.space import build_knob_space
    from optuna_ds.space import knob_defaults
    from optuna_ds.studies._knob_search import KnobCandidates

    sizes = [float(10**6 + i) for i in range(100)]
    space = build_knob_space(2, {"stage": 2, "reduce_bucket_size": sizes}, fast=False)
    assert space.size == 2_400
    asks = []
    ask = optuna.Study.ask
    monkeypatch.setattr(optuna.Study, "ask", lambda s, *a, **k: asks.append(1) or ask(s, *a, **k))
    ctx = SimpleNamespace(fast=False, early_stopping=5, num_trials=50, tuner_type="gridsearch")
    arm = Arm(stage=2, free=60e9, cap=64, buffers=1e9,
              knobs=tuple((k, tuple(v)) for k, v in sorted(space.tuned.items())),
              knob_defaults=tuple(sorted(knob_defaults(space).items())))
    study = optuna.create_study(direction="maximize")
    knobs = KnobCandidates(ctx=ctx, spaces={2: space},  # type: ignore[arg-type]
                           buffers=lambda stage, offload, knobs: 1e9)
    settings = knobs([arm], {2: study}, None)[arm.key]
    assert len(settings) == 256 and len(asks) == 256
    assert len(set(settings)) == 256
    assert all(dict(s.knobs).keys() == space.tuned.keys() for s in settings)
