from __future__ import annotations

import dataclasses

import pytest

from optuna_ds._errors import ConfigError
from optuna_ds.space import KnobSpace
from optuna_ds.space import MemoryModel
from optuna_ds.space import MicroBatchSearch
from optuna_ds.space import Observation
from optuna_ds.space import build_knob_space
from optuna_ds.space import carried_start
from optuna_ds.space import default_tuning_space
from optuna_ds.space import estimate_memory
from optuna_ds.space import experiment_name
from optuna_ds.space import recommended_knobs
from optuna_ds.space import user_offloads
from optuna_ds.space._micro_batch import MAX_PROBES


def test_default_spaces_come_from_deepspeed() -> None:
    from deepspeed.autotuning import constants

    z1 = default_tuning_space(1)
    assert z1 == {k: v for k, v in constants.DEFAULT_TUNING_SPACE_ZERO_1["zero_optimization"].items() if k != "stage"}
    assert default_tuning_space(0) == {}


def test_stage3_space_tunes_stage3_knobs_not_ignored_ones() -> None:
    z3 = default_tuning_space(3, hidden_size=1024)
    assert "allgather_bucket_size" not in z3 and "reduce_scatter" not in z3
    assert 0.9 * 1024 * 1024 in z3["stage3_prefetch_bucket_size"]
    assert 10240.0 in z3["stage3_param_persistence_threshold"]
    assert "stage3_max_live_parameters" in z3


def test_user_value_fixes_a_knob_and_list_tunes_it() -> None:
    user = {"stage": 1, "reduce_bucket_size": [5e7, 5e8], "allgather_bucket_size": 5e8, "offload_optimizer": {"device": "cpu"}}
    space = build_knob_space(1, user, fast=False)
    assert space.tuned == {"reduce_bucket_size": [5e7, 5e8]}
    assert space.fixed == {"allgather_bucket_size": 5e8, "offload_optimizer": {"device": "cpu"}}
    assert space.size == 2


def test_fast_mode_tunes_no_knobs_but_keeps_fixed_sections() -> None:
    space = build_knob_space(2, {"overlap_comm": [True, False], "offload_optimizer": {"device": "cpu"}}, fast=True)
    assert space.tuned == {}
    assert space.fixed == {"offload_optimizer": {"device": "cpu"}}


def test_stage3_only_overrides_skip_lower_stages() -> None:
    user = {"stage3_prefetch_bucket_size": [1e6, 1e7], "offload_param": {"device": "cpu"}}
    assert "stage3_prefetch_bucket_size" not in build_knob_space(1, user, fast=False).tuned
    assert "offload_param" not in build_knob_space(2, user, fast=False).fixed
    z3 = build_knob_space(3, user, fast=False)
    assert z3.tuned["stage3_prefetch_bucket_size"] == [1e6, 1e7] and z3.fixed["offload_param"] == {"device": "cpu"}


def test_empty_list_is_an_error() -> None:
    with pytest.raises(ConfigError, match="zero_optimization.overlap_comm must not be an empty list"):
        build_knob_space(2, {"overlap_comm": []}, fast=False)


def test_names_are_deepspeed_style_and_identify_configs() -> None:
    assert experiment_name(stage=1, mbs=3, gas=1) == "z1_gas1_tmbspg3"
    name = experiment_name(stage=2, mbs=8, gas=2, knobs={"overlap_comm": True, "reduce_bucket_size": 5e8})
    assert name == "z2_gas2_tmbspg8_ocT_rbs5e8"
    assert experiment_name(stage=2, mbs=8, gas=2, knobs={"reduce_bucket_size": 5e7}) != experiment_name(stage=2, mbs=8, gas=2, knobs={"reduce_bucket_size": 5e8})
    # Colliding acronyms fall back to the full keys.
    collide = experiment_name(stage=1, mbs=1, gas=1, knobs={"a_b": 1, "ab_bb": 2})
    assert "a_b1" in collide and "ab_bb2" in collide


def test_memory_estimate_partitions_by_stage() -> None:
    kw = dict(num_params=1_000_000_000, trainable_params=None, activation_per_sample=1e9, device_memory=80e9, num_gpus=8, precision="fp16")
    z0, z1, z2, z3 = (estimate_memory(stage=s, **kw) for s in range(4))
    assert z0.instantiation == pytest.approx(2e9 + 2e9 + 12e9)
    assert z1.optimizer == pytest.approx(12e9 / 8) and z1.gradients == pytest.approx(2e9)
    assert z2.gradients == pytest.approx(2e9 / 8)
    assert z3.params == pytest.approx(2e9 / 8)
    assert z0.max_micro_batch_size == int((80e9 - 16e9) // 1e9)
    assert z0.max_micro_batch_size < z1.max_micro_batch_size < z2.max_micro_batch_size < z3.max_micro_batch_size


def test_memory_estimate_frozen_params_offload_and_misfit() -> None:
    base = dict(num_params=1_000_000_000, activation_per_sample=1e8, device_memory=16e9, num_gpus=1, precision="fp32")
    full = estimate_memory(stage=0, trainable_params=None, **base)
    assert not full.fits  # 4 + 4 + 8 bytes per parameter: 16 GB
    peft = estimate_memory(stage=0, trainable_params=10_000_000, **base)
    assert peft.fits and peft.gradients == pytest.approx(4e7)
    offload = estimate_memory(stage=3, trainable_params=None, zero={"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}, **base)
    assert offload.params == 0 and offload.optimizer == 0 and offload.fits


def _drive(search: MicroBatchSearch, surface, limit: int = 100, start: dict[int, Observation] | None = None) -> dict[int, Observation]:
    """Run the search against a synthetic surface: score(mbs) or None (OOM)."""
    obs: dict[int, Observation] = dict(start or {})
    for _ in range(limit):
        mbs = search.next_mbs(obs)
        if mbs is None:
            return obs
        assert mbs not in obs, "the search asked for an experiment twice"
        score = surface(mbs)
        obs[mbs] = Observation(mbs=mbs, score=score, oom=score is None)
    raise AssertionError("the search did not end")


def test_search_finds_the_oom_edge_and_stays_below_it() -> None:
    edge = 37
    search = MicroBatchSearch(min_mbs=2, floor_mbs=1, cap=128)
    obs = _drive(search, lambda m: float(m) if m <= edge else None)
    assert search.edge(obs) >= int(edge * 0.95)
    assert search.best(obs)[0] == search.edge(obs)
    assert len(obs) <= 14


def test_search_finds_a_sweet_spot_below_the_edge() -> None:
    search = MicroBatchSearch(min_mbs=1, floor_mbs=1, cap=64)
    obs = _drive(search, lambda m: m / (1 + (m / 40) ** 2))
    best = search.best(obs)[0]
    assert 32 <= best <= 48
    assert search.edge(obs) == 64


def test_search_falls_back_to_the_floor_when_the_minimum_fails() -> None:
    search = MicroBatchSearch(min_mbs=8, floor_mbs=1, cap=64)
    obs = _drive(search, lambda m: float(m) if m <= 4 else None)
    assert obs[8].oom and obs[1].ok
    assert search.edge(obs) == 4


def test_search_gives_up_when_nothing_runs() -> None:
    search = MicroBatchSearch(min_mbs=1, floor_mbs=1, cap=64)
    obs = _drive(search, lambda m: None)
    assert list(obs) == [1]


def test_user_list_is_run_exactly() -> None:
    search = MicroBatchSearch(min_mbs=1, floor_mbs=1, cap=64, user_list=(1, 4, 16))
    assert sorted(_drive(search, float)) == [1, 4, 16]


def test_search_is_a_replay_of_the_observations() -> None:
    """Given the same observations, the same next experiment: a resumed or shared tuning
    continues exactly where it stopped."""
    search = MicroBatchSearch(min_mbs=1, floor_mbs=1, cap=256)
    surface = lambda m: float(m) if m <= 100 else None  # noqa: E731
    full = _drive(search, surface)
    order = list(full)
    partial = {m: full[m] for m in order[: len(order) // 2]}
    assert search.next_mbs(partial) == order[len(partial)]
    resumed = _drive(search, surface, start=partial)
    assert list(resumed) == order


def _drive_parallel(search: MicroBatchSearch, surface, k: int) -> tuple[dict[int, Observation], int]:
    """Run the search with k experiments at once (each finishing in launch order); returns the
    observations and the number of rounds in which several ran together."""
    obs: dict[int, Observation] = {}
    running: list[int] = []
    together = 0
    for _ in range(200):
        while len(running) < k:
            mbs = search.next_mbs(obs, set(running))
            if mbs is None:
                break
            assert mbs not in obs and mbs not in running, "asked for a size twice"
            running.append(mbs)
        if not running:
            return obs, together
        together += len(running) > 1
        mbs = running.pop(0)
        score = surface(mbs)
        obs[mbs] = Observation(mbs=mbs, score=score, oom=score is None)
    raise AssertionError("the search did not end")


@pytest.mark.parametrize("k", [2, 4])
def test_search_with_pending_sizes_runs_several_at_once_and_still_finds_the_edge(k: int) -> None:
    edge = 37
    search = MicroBatchSearch(min_mbs=2, floor_mbs=1, cap=128)
    obs, together = _drive_parallel(search, lambda m: float(m) if m <= edge else None, k)
    assert search.edge(obs) >= int(edge * 0.95)
    assert search.best(obs)[0] == search.edge(obs)
    assert together >= 3, "the k-ary search never ran sizes together"


def test_a_pending_minimum_blocks_the_search() -> None:
    search = MicroBatchSearch(min_mbs=2, floor_mbs=1, cap=128)
    assert search.next_mbs({}, {2}) is None  # nothing is known until the minimum has run
    ok = {2: Observation(mbs=2, score=2.0)}
    first = search.next_mbs(ok)
    second = search.next_mbs(ok, {first})
    assert first == 4  # without a memory model, up by doubling
    assert second is not None and 4 < second <= 128  # with that running, the rest of the range is split


# -- memory-aware search ------------------------------------------------------------------------

GB = 1e9


def _memory_surface(*, free: float, per_sample: float, cliff: tuple[int, float] | None = None, sweet: float | None = None):
    """Throughput rising with the size; OOM once ``mbs * per_sample`` (+ a cliff's extra) exceeds
    ``free``; with ``sweet``, memory pressure makes sizes above that share of memory slower."""
    def score(mbs: int) -> float | None:
        used = mbs * per_sample + (cliff[1] if cliff and mbs >= cliff[0] else 0.0)
        if used > free:
            return None
        value = 100 * mbs / (mbs + 4)
        if sweet is not None and used > sweet * free:
            value *= 1 - 2.0 * (used / free - sweet)
        return value
    return score


def test_memory_model_bounds_per_sample_memory_from_runs() -> None:
    model = MemoryModel(free=60 * GB, prior=2 * GB)
    obs = {20: Observation(mbs=20, score=1.0), 25: Observation(mbs=25, score=None, oom=True)}
    lo, hi = model.bounds(obs)
    assert lo == pytest.approx(60 * GB / 25) and hi == pytest.approx(60 * GB / 20)
    assert 20 <= model.edge(obs) < 25
    assert model.edge({}) == int(60 / 2.2)  # the profile's figure, raised by its usual underestimate
    # Runs that contradict each other (a cliff): the model says it does not know.
    assert model.bounds({10: Observation(mbs=10, score=None, oom=True), 20: Observation(mbs=20, score=1.0)}) is None


def test_memory_model_carries_an_earlier_stage_edge_to_the_next() -> None:
    # Stage A (50 GB free after its states) ran 16 and ran out of memory at 17: 3 GB < per sample <= 3.125 GB.
    carried = ((50 * GB, 16, False), (50 * GB, 17, True))
    later = MemoryModel(free=62 * GB, prior=1 * GB, carried=carried)
    assert later.edge({}) in (19, 20)  # truly 62 / 3.05 = 20
    # Contradicted by this stage's own runs (the earlier stage had a cliff): carried runs are dropped.
    own = {30: Observation(mbs=30, score=1.0)}
    assert later.bounds(own) == (0.0, pytest.approx(62 * GB / 30))


def test_search_with_a_memory_model_finds_the_edge_in_few_runs() -> None:
    true_edge = 37
    score = _memory_surface(free=74 * GB, per_sample=2 * GB)  # the profile said 1.8 GB: 10% low
    search = MicroBatchSearch(min_mbs=1, floor_mbs=1, cap=1024, memory=MemoryModel(free=74 * GB, prior=1.8 * GB), probe_min=False)
    obs = _drive(search, score)
    assert search.best(obs)[0] >= int(true_edge * 0.9)
    assert sum(o.oom for o in obs.values()) <= 2
    assert len(obs) <= 5, sorted(obs)


def test_search_finds_the_memory_pressure_sweet_spot() -> None:
    score = _memory_surface(free=74 * GB, per_sample=2 * GB, sweet=0.8)
    search = MicroBatchSearch(min_mbs=1, floor_mbs=1, cap=1024, memory=MemoryModel(free=74 * GB, prior=2 * GB), probe_min=False)
    obs = _drive(search, score)
    best_possible = max(score(m) or 0.0 for m in range(1, 40))
    assert (obs[search.best(obs)[0]].score or 0) >= 0.99 * best_possible
    assert len(obs) <= 7, sorted(obs)


def test_search_survives_a_memory_cliff() -> None:
    """A workspace switch at 24 needs 20 GB more: the linear model's guesses fail, the search
    still finds the largest size that runs."""
    score = _memory_surface(free=74 * GB, per_sample=1.5 * GB, cliff=(24, 20 * GB))
    search = MicroBatchSearch(min_mbs=1, floor_mbs=1, cap=1024, memory=MemoryModel(free=74 * GB, prior=1.5 * GB), probe_min=False)
    obs = _drive(search, score)
    assert search.edge(obs) >= 21 and search.best(obs)[0] >= 21
    assert len(obs) <= MAX_PROBES


def test_a_carried_stage_runs_once_when_it_cannot_win_and_searches_on_when_it_can() -> None:
    memory = MemoryModel(free=74 * GB, prior=2 * GB)
    losing = MicroBatchSearch(min_mbs=1, floor_mbs=1, cap=1024, memory=memory, start=30, to_beat=200.0, local=True, probe_min=False)
    obs = _drive(losing, lambda m: float(m))
    assert list(obs) == [30]
    winning = dataclasses.replace(losing, to_beat=20.0)
    obs = _drive(winning, lambda m: 100.0 - abs(m - 27))
    assert obs[30].ok and 26 <= winning.best(obs)[0] <= 28 and len(obs) <= 6


def test_a_crashing_stage_is_given_up_after_two_non_memory_failures() -> None:
    search = MicroBatchSearch(min_mbs=1, floor_mbs=1, cap=64, memory=MemoryModel(free=64 * GB, prior=1 * GB), probe_min=False)
    first = search.next_mbs({})
    crash = {first: Observation(mbs=first, score=None)}
    second = search.next_mbs(crash)
    assert second is not None and second < first  # one crash may be the size's fault
    crash[second] = Observation(mbs=second, score=None)
    assert search.next_mbs(crash) is None  # two: the stage crashes whatever the size


def test_offload_variants_and_recommended_knobs() -> None:
    space = build_knob_space(3, {}, fast=False, hidden_size=1024)
    offloaded = space.with_offload("offload-opt")
    assert offloaded.fixed["offload_optimizer"]["device"] == "cpu" and "offload_param" not in offloaded.fixed
    assert KnobSpace.from_dict(offloaded.to_dict()) == offloaded
    assert user_offloads({"offload_param": {"device": "nvme"}}) and not user_offloads({"stage": 3})
    # Stage 2's recommended first knob experiment overlaps communication; stage 1's is its default config.
    assert recommended_knobs(build_knob_space(2, {}, fast=False))["overlap_comm"] is True
    assert recommended_knobs(build_knob_space(1, {}, fast=False)) is None


def test_the_first_size_is_the_predicted_edge_within_the_cap() -> None:
    roomy = MemoryModel(free=64 * GB, prior=0.01 * GB, carried=((60 * GB, 128, False),))
    search = MicroBatchSearch(min_mbs=1, floor_mbs=1, cap=128, memory=roomy, probe_min=False)
    assert search.next_mbs({}) == 128  # memory allows far more: the configured maximum, not a bisection
    tight = MemoryModel(free=64 * GB, prior=2 * GB)
    assert dataclasses.replace(search, memory=tight).next_mbs({}) == int(64 / 2.2)


def test_a_later_stage_starts_where_the_earlier_sweet_spot_says() -> None:
    # The earlier stage (50 GB free) ran 20 and ran out of memory at 22: about 2.4 GB a sample.
    memory = MemoryModel(free=70 * GB, prior=2 * GB, carried=((50 * GB, 20, False), (50 * GB, 22, True)))
    ok = lambda m, s: Observation(mbs=m, score=s)  # noqa: E731
    # Best 18 fills 86% of the free memory: memory pressure, so start leaving as much free (+8 or so).
    pressure = {16: ok(16, 9.0), 18: ok(18, 10.0), 20: ok(20, 9.5), 22: Observation(mbs=22, score=None, oom=True)}
    assert 24 <= carried_start(pressure, 18, memory=memory, free=50 * GB) <= 28
    # Best 8 fills 38%: the curve's own peak, the same size.
    peak = {4: ok(4, 9.0), 8: ok(8, 10.0), 16: ok(16, 8.0), 22: Observation(mbs=22, score=None, oom=True)}
    assert carried_start(peak, 8, memory=memory, free=50 * GB) == 8
    # Best at the largest size that ran: nothing to carry, the stage searches from its own edge.
    assert carried_start({16: ok(16, 9.0), 20: ok(20, 10.0)}, 20, memory=memory, free=50 * GB) is None
