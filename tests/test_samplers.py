"""The xgboost cost-model sampler: Optuna's own sampler test cases, then what it is for."""
from __future__ import annotations

import itertools
from collections.abc import Callable

import optuna
import pytest
from optuna.testing.pytest_samplers import BasicSamplerTestCase
from optuna.testing.pytest_samplers import SingleOnlySamplerTestCase
from optuna.trial import TrialState

from optuna.study import StudyDirection

from optuna_ds.samplers import XGBoostSampler
from optuna_ds.samplers import knob_candidates

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {
    "train_micro_batch_size_per_gpu": [4, 8, 16, 32],
    "reduce_bucket_size": [5e7, 5e8, 1e9],
    "overlap_comm": [True, False],
}


class TestOptunaSamplerCases(BasicSamplerTestCase, SingleOnlySamplerTestCase):
    """Optuna's cases for any sampler: parameters outside the finite space (these tests'
    ``x``, ``y``...) are sampled at random within their distributions."""

    @pytest.fixture
    def sampler(self) -> Callable[[], optuna.samplers.BaseSampler]:
        return lambda: XGBoostSampler(SPACE, seed=0)


def _throughput(p: dict) -> float:
    """A surface: throughput grows with the micro-batch size, 1e9 buckets and overlap help."""
    return p["train_micro_batch_size_per_gpu"] * (1.1 if p["overlap_comm"] else 1.0) * {5e7: 0.9, 5e8: 1.0, 1e9: 1.05}[p["reduce_bucket_size"]]


def _objective(trial: optuna.Trial) -> float:
    p = {k: trial.suggest_categorical(k, v) for k, v in SPACE.items()}
    if p["train_micro_batch_size_per_gpu"] == 32:
        trial.set_user_attr("reason", "oom")
        raise RuntimeError("out of memory")
    return _throughput(p)


def _run(sampler: optuna.samplers.BaseSampler, n: int, storage: str | None = None) -> optuna.Study:
    study = optuna.create_study(direction="maximize", sampler=sampler, storage=storage)
    study.optimize(_objective, n_trials=n, catch=(RuntimeError,))
    return study


def _configs(study: optuna.Study) -> list[tuple]:
    return [tuple(sorted(t.params.items())) for t in study.trials if t.state != TrialState.RUNNING]


def test_never_repeats_a_config_and_uses_the_model() -> None:
    study = _run(XGBoostSampler(SPACE, n_startup_trials=3, exploration=0.0, seed=1), 12)
    configs = _configs(study)
    assert len(configs) == len(set(configs)), "a config ran twice"
    best = max(_throughput(dict(c)) for c in configs if dict(c)["train_micro_batch_size_per_gpu"] < 32)
    assert study.best_value == best
    # The optimum that runs (16, overlap, 1e9 buckets) is found well before the space (24) is used up.
    assert study.best_value == pytest.approx(16 * 1.1 * 1.05)


def test_out_of_memory_failures_steer_it_away() -> None:
    """Failures are information: once mbs 32 has failed, the classifier predicts its other
    configs fail too, and the model does not keep proposing them (a regressor on the completed
    trials alone ranks 32 first: throughput grows with the size)."""
    sampler = XGBoostSampler(SPACE, n_startup_trials=4, exploration=0.0, seed=3)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for params, value in [({"train_micro_batch_size_per_gpu": 8, "reduce_bucket_size": 5e8, "overlap_comm": False}, 8.0),
                          ({"train_micro_batch_size_per_gpu": 16, "reduce_bucket_size": 5e8, "overlap_comm": False}, 16.0),
                          ({"train_micro_batch_size_per_gpu": 4, "reduce_bucket_size": 5e8, "overlap_comm": True}, 4.4)]:
        study.enqueue_trial(params)
        study.optimize(_objective, n_trials=1)
    failed = {"train_micro_batch_size_per_gpu": 32, "reduce_bucket_size": 5e8, "overlap_comm": False}
    study.enqueue_trial(failed)
    study.optimize(_objective, n_trials=1, catch=(RuntimeError,))
    study.optimize(_objective, n_trials=4, catch=(RuntimeError,))
    later = [t.params for t in study.trials[4:]]
    assert all(p["train_micro_batch_size_per_gpu"] != 32 for p in later), later


def test_seeded_runs_repeat() -> None:
    first = _configs(_run(XGBoostSampler(SPACE, seed=7), 8))
    second = _configs(_run(XGBoostSampler(SPACE, seed=7), 8))
    assert first == second


def test_stateless_across_sampler_instances(tmp_path) -> None:
    """Rebuilt from the storage at every trial: a new sampler (a new worker) continues the
    study without repeating what finished."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    study = optuna.create_study(direction="maximize", storage=url, study_name="s")
    for seed in range(6):
        s = optuna.load_study(study_name="s", storage=url, sampler=XGBoostSampler(SPACE, n_startup_trials=2, seed=seed))
        s.optimize(_objective, n_trials=2, catch=(RuntimeError,))
    assert len(set(_configs(study))) == 12


def test_features_log_scale_and_one_hot() -> None:
    from optuna_ds.samplers._xgboost import _encode_column

    assert [c[0] for c in _encode_column("reduce_bucket_size", [5e7, 5e8, 1e9])] == pytest.approx([7.69897, 8.69897, 9.0])
    assert _encode_column("train_micro_batch_size_per_gpu", [1, 64]) == [[1.0], [64.0]]
    assert _encode_column("overlap_comm", [True, False]) == [[1.0], [0.0]]
    assert _encode_column("device", ["cpu", "nvme", "cpu"]) == [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="n_startup_trials"):
        XGBoostSampler(SPACE, n_startup_trials=0)
    with pytest.raises(ValueError, match="exploration"):
        XGBoostSampler(SPACE, exploration=1.5)


def test_full_space_is_covered_then_repeats_are_allowed() -> None:
    space = {"a": [1, 2], "b": [True, False]}
    study = optuna.create_study(sampler=XGBoostSampler(space, n_startup_trials=1, seed=0))
    study.optimize(lambda t: t.suggest_categorical("a", [1, 2]) + t.suggest_categorical("b", [True, False]), n_trials=5)
    first_four = {tuple(sorted(t.params.items())) for t in study.trials[:4]}
    assert first_four == {tuple(sorted(zip(space, c))) for c in itertools.product(*space.values())}


def _finished(params: dict, value: float | None) -> optuna.trial.FrozenTrial:
    distributions = {k: optuna.distributions.CategoricalDistribution(v) for k, v in KNOBS.items()}
    if value is None:
        return optuna.trial.create_trial(params=params, distributions=distributions, state=TrialState.FAIL, user_attrs={"reason": "error"})
    return optuna.trial.create_trial(params=params, distributions=distributions, value=value)


KNOBS = {"reduce_bucket_size": [5e7, 5e8, 1e9], "overlap_comm": [True, False], "contiguous_gradients": [True, False]}
_POINTS = [dict(zip(KNOBS, p)) for p in itertools.product(*KNOBS.values())]


def _gain(p: dict) -> float:
    return (1.1 if p["overlap_comm"] else 1.0) * {5e7: 0.9, 5e8: 1.0, 1e9: 1.05}[p["reduce_bucket_size"]]


def test_the_grid_proposes_every_point_not_run_yet() -> None:
    ran = [_finished(_POINTS[0], 1.0), _finished(_POINTS[5], None)]
    got = knob_candidates("gridsearch", KNOBS, ran, direction=StudyDirection.MAXIMIZE, seed=0, limit=len(_POINTS))
    key = lambda p: tuple(sorted(p.items()))  # noqa: E731
    assert sorted(map(key, got)) == sorted(key(p) for i, p in enumerate(_POINTS) if i not in (0, 5))


@pytest.mark.parametrize("tuner_type", ["random", "model_based"])
def test_a_sampler_proposes_distinct_new_settings_the_same_in_every_process(tuner_type: str) -> None:
    ran = [_finished(p, _gain(p)) for p in _POINTS[:4]]
    got = knob_candidates(tuner_type, KNOBS, ran, direction=StudyDirection.MAXIMIZE, seed=3, limit=5)
    again = knob_candidates(tuner_type, KNOBS, ran, direction=StudyDirection.MAXIMIZE, seed=3, limit=5)
    keys = [tuple(sorted(p.items())) for p in got]
    assert got == again and len(keys) == len(set(keys)) == 5
    assert not set(keys) & {tuple(sorted(p.items())) for p in _POINTS[:4]}
    assert all(set(p) == set(KNOBS) and all(v in KNOBS[k] for k, v in p.items()) for p in got)


def test_the_model_based_sampler_proposes_what_its_model_predicts_best_first() -> None:
    # After a few runs the xgboost model has learned that overlap and large buckets pay: its
    # first proposal is the best of the settings not run yet.
    ran = [_finished(p, _gain(p)) for p in _POINTS if not (p["overlap_comm"] and p["reduce_bucket_size"] == 1e9)]
    got = knob_candidates("model_based", KNOBS, ran, direction=StudyDirection.MAXIMIZE, seed=0, limit=1)
    assert got[0]["overlap_comm"] is True and got[0]["reduce_bucket_size"] == 1e9
