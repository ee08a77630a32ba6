"""benchmarks/product.py's simulated world: optuna-ds's own tune and worker as simulated
processes, each a node of its own, on one storage and one virtual clock."""
from __future__ import annotations

import parallel
import product


# A knob grid of 2 x 2 bucket sizes at the best of 2 micro-batch sizes, experiments of 2 s.
TINY = product.FixedJob(name="tiny", surface=parallel.surface(2.0), config={
    **parallel.config(2), "train_micro_batch_size_per_gpu": [16, 24]})
COSTS = product.Costs(decision_s=0.1, launch_s=0.2)


def test_tune_and_a_worker_share_a_tuning_each_on_its_own_gpus() -> None:
    narrow = product.simulate(TINY, costs=COSTS)
    wide = product.simulate(TINY, processes=2, slots=2, costs=COSTS)
    for run in (narrow, wide):
        assert run.optimal is not None and run.optimal["train_micro_batch_size_per_gpu"] == 24
        names = [e["name"] for e in run.ledger if not e["profile"]]
        assert len(names) == len(set(names)) >= 4, "no experiment launched twice"
        assert run.duplicates == 0
    assert {e["node"] for e in wide.experiments} == {"node0", "node1"}, "the worker ran experiments too"
    assert {e["include"] for e in wide.experiments} == {"localhost:0", "localhost:1"}, "each node's own 2 GPUs"
    # No GPU of a node held two experiments at once.
    by_gpu: dict[tuple[str, str], list[dict]] = {}
    for e in wide.experiments:
        by_gpu.setdefault((e["node"], e["include"]), []).append(e)
    for runs in by_gpu.values():
        runs.sort(key=lambda e: e["start"])
        assert all(b["start"] >= a["end"] for a, b in zip(runs, runs[1:]))
    assert wide.wall_s < 0.75 * narrow.wall_s, "4 slots on 2 nodes finish sooner than 1"
