"""The knob settings the planner scores: at each arm, what the ``tuner_type`` sampler proposes
after the arm's knob trials, until ``tuner_early_stopping`` (a budget checked here, before the
planner is handed any setting) ends the stage's knob search.

Everything is read from the storage, so every process hands the planner the same settings."""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.domain import Config
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import Knobs
from optuna_ds.domain import Phase
from optuna_ds.planner import Arm
from optuna_ds.planner import KnobSetting
from optuna_ds.pruners import TunerEarlyStopping
from optuna_ds.samplers import knob_candidates
from optuna_ds.space import KnobSpace
from optuna_ds.studies._context import StageContext

# Settings a random or model-based sampler proposes at a time (a grid proposes all it has left,
# up to _GRID_LIMIT: Optuna compares every choice list at each ask, so asking a grid of thousands
# of settings took seconds at every decision): the planner scores each at an arm's best sizes.
_LIMIT = 12
_GRID_LIMIT = 256

Buffers = Callable[[int, str, Mapping[str, Any]], float]  # (stage, offload, knobs) -> bytes of buckets per GPU


class KnobCandidates:
    """The knob settings of each arm for :func:`~optuna_ds.planner.plan` to score, none once a
    stage's knob search is over (``tuner_early_stopping``, ``tuner_num_trials``).

    ``buffers`` says what a setting's communication buckets take of a GPU (DeepSpeed's figures),
    so the planner can try a setting that frees memory at a larger micro-batch size.
    """

    def __init__(self, *, ctx: StageContext, spaces: Mapping[int, KnobSpace], buffers: Buffers) -> None:
        self._ctx = ctx
        self._spaces = spaces
        self._buffers = buffers
        self._cache: dict[tuple[Any, ...], list[KnobSetting]] = {}

    def _budget(self, noise: float | None) -> TunerEarlyStopping:
        """``tuner_early_stopping`` over a stage study's knob trials; a gain within ``noise`` (one
        run's) is no improvement."""
        ctx = self._ctx
        return TunerEarlyStopping(ctx.early_stopping, max_trials=ctx.num_trials, phase=Phase.KNOBS, min_improvement=noise or 0.0)

    def __call__(self, arms: Sequence[Arm], studies: Mapping[int, optuna.Study], noise: float | None,
                 pending: Sequence[Config] = ()) -> dict[tuple[int, str], list[KnobSetting]]:
        """The settings of each arm whose stage's knob search is not over; ``pending`` are the
        configs this process handed to slots that are not trials yet: its knob settings count
        against ``tuner_num_trials`` already, else k slots would overshoot it by k - 1."""
        if self._ctx.fast:
            return {}
        out: dict[tuple[int, str], list[KnobSetting]] = {}
        for arm in arms:
            stage_space = self._spaces.get(arm.stage)
            study = studies.get(arm.stage)
            if stage_space is None or study is None:
                continue
            space = stage_space.with_offload(arm.offload)  # an offload variant tunes its own knobs too
            if not space.tuned:
                continue
            trials = study.get_trials(deepcopy=False)
            handed = sum(1 for c in pending if c.stage == arm.stage and c.knobs.zero)
            if self._budget(noise).exhausted(study, pending=handed):
                continue
            mine = [t for t in trials if _knob_trial(t, space, arm.offload)]
            key = (arm.key, tuple((t.number, t.state) for t in mine))
            if key not in self._cache:
                grid = self._ctx.tuner_type == "gridsearch"
                limit = min(space.size, _GRID_LIMIT) if grid else _LIMIT
                settings = knob_candidates(self._ctx.tuner_type, space.tuned, mine, direction=study.direction,
                                           seed=_seed(study.study_name, arm.offload), limit=limit)
                # The settings already run stay candidates: the planner may run them at another size.
                ran = [dict(_knobs(t)) for t in mine]
                self._cache[key] = [KnobSetting(knobs=s, buffers=self._buffers(arm.stage, arm.offload, s.as_dict()))
                                    for s in _unique(ran + settings)]
            out[arm.key] = self._cache[key]
        return out


def _seed(*parts: str) -> int:
    """A seed every process of the tuning derives alike (a worker's own seed differs by worker)."""
    return int.from_bytes(hashlib.sha256("|".join(parts).encode()).digest()[:4], "big")


def _knobs(trial: FrozenTrial) -> Knobs:
    config = ExperimentRecord.from_trial(trial).config
    return config.knobs if config is not None else Knobs()


def _knob_trial(trial: FrozenTrial, space: KnobSpace, offload: str) -> bool:
    """A finished first run of a knob setting of ``space`` at the arm of ``offload``."""
    if trial.state not in (TrialState.COMPLETE, TrialState.FAIL):
        return False
    record = ExperimentRecord.from_trial(trial)
    if record.phase is not Phase.KNOBS or record.repeat or record.config is None or record.config.offload != offload:
        return False
    if trial.state == TrialState.FAIL and (record.reason is None or not record.reason.judges_config):
        return False  # interrupted: it says nothing of its setting
    knobs = dict(record.config.knobs)
    return knobs.keys() == space.tuned.keys() and all(v in space.tuned[k] for k, v in knobs.items())


def _unique(settings: list[dict[str, Any]]) -> list[Knobs]:
    return list(dict.fromkeys(Knobs(s) for s in settings))
