"""A knob's value is one identity from the config to the record: written as DeepSpeed's docs
write it or as JSON's short form, it is one experiment; two values are two experiments, both
measured, whatever their names' short forms share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from invariants import Hostile
from invariants import base_config
from invariants import hws  # noqa: F401


@pytest.mark.timeout(300)  # a loop that never launches fails the test here
@pytest.mark.parametrize("sizes", [[500000000, 200000000], [1000000, 1048576]], ids=["integers", "one-short-form"])
def test_listed_knob_values_are_each_measured_and_the_tuning_ends(hws: Hostile, sizes: list[int]) -> None:
    """Rows 2 and 3 of issue 34: a full-mode tuning with ``reduce_bucket_size`` written as
    integers (5e8 is the default's form) proposed one experiment hundreds of times a second for
    ever; ``[1000000, 1048576]`` named both ``..._rbs1e6``, the second stood down as a duplicate
    of the first, and the tuning exited 2, with no optimal config, on every rerun."""
    hws.config(base_config(train_micro_batch_size_per_gpu="auto", zero_optimization={"stage": 1, "reduce_bucket_size": sizes},
                           autotuning={"enabled": True, "fast": False, "model_info": {"num_params": 1000000}}))
    proc = hws.tune()
    assert proc.returncode == 0, proc.stderr[-2000:]
    configs = [json.loads(Path(e["args"][e["args"].index("--deepspeed_config") + 1]).read_text()) for e in hws.launches()]
    # A config at DeepSpeed's default (5e8) leaves the key out.
    assert set(sizes) <= {c["zero_optimization"].get("reduce_bucket_size", 500000000) for c in configs}
    assert json.loads((hws.results / "ds_config_optimal.json").read_text())["zero_optimization"]["reduce_bucket_size"] in sizes
    again = hws.tune()
    assert again.returncode == 0 and len(hws.launches()) == len(configs), again.stderr[-2000:]  # resumed: nothing launched again
    hws.assert_untouched()
