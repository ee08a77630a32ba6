from __future__ import annotations

from typing import Any

import optuna

from optuna_ds.domain import Config
from optuna_ds.launcher import Lease
from optuna_ds.space import KnobSpace
from optuna_ds.storage import TrialCache
from optuna_ds.storage import open_stage_study
from optuna_ds.studies._claims import Reaper
from optuna_ds.studies._context import StageContext
from optuna_ds.studies._experiments import StageExperiments
from optuna_ds.studies._knob_search import KnobSearch
from optuna_ds.studies._knob_search import KnobSearcher
from optuna_ds.studies._knob_search import Step


class StageTuner:
    """Runs the experiments of one ZeRO stage in its own Optuna study, one trial per experiment.

    The planner decides the micro-batch experiments (:meth:`run_config`, trials with fixed
    params: :class:`StageExperiments`); the knob search (:meth:`step_knobs`, unless in fast mode:
    :class:`KnobSearcher`) runs DeepSpeed's recommended setting at the best size, then the
    sampler over the best sizes. Everything is read back from the storage at every step, so a
    rerun continues where it stopped and any number of slots (of this process, of workers
    elsewhere) can run the same stage: a trial claims its experiment by name (:mod:`._claims`).

    Every study of a stage this process opens shares :attr:`study`'s storage cache, which reads
    again only the trials that are new or still running: a step reads little however many trials
    the study has.
    """

    def __init__(self, *, ctx: StageContext, tuning: str, stage: int, space: KnobSpace,
                 knobs: KnobSearch = KnobSearch.NONE, sizes: tuple[int, ...] = (),
                 setting: dict[str, Any] | None = None, study: optuna.Study | None = None,
                 min_improvement: float = 0.0) -> None:
        self._ctx = ctx
        self._tuning = tuning
        self._stage = stage
        self._space = space
        if study is None:
            storage = TrialCache(ctx.storage) if isinstance(ctx.storage, optuna.storages.RDBStorage) else ctx.storage
            study = open_stage_study(storage, tuning=tuning, stage=stage, direction=ctx.metric.direction)
        self.study = study
        self._reaper = Reaper(study, stage=stage, metric=ctx.metric, observer=ctx.observer)
        self._experiments = StageExperiments(ctx=ctx, stage=stage, study=study, space=space, reaper=self._reaper)
        self._knob_search = KnobSearcher(ctx=ctx, stage=stage, study=study, space=space, experiments=self._experiments,
                                         reaper=self._reaper, knobs=knobs, sizes=sizes, setting=setting,
                                         min_improvement=min_improvement)
        self.reap(force=True)

    @property
    def stage(self) -> int:
        return self._stage

    @property
    def space(self) -> KnobSpace:
        return self._space

    def with_knobs(self, knobs: KnobSearch, *, sizes: tuple[int, ...], offload: str = "",
                   setting: dict[str, Any] | None = None, min_improvement: float = 0.0) -> StageTuner:
        """This stage's tuner searching as much of the knob space as ``knobs`` says, at the
        micro-batch ``sizes`` (best first) and with the offload variant the choice has;
        ``setting``: the one setting of :attr:`KnobSearch.ONE`, if not DeepSpeed's recommended;
        ``min_improvement``: what early stopping counts as an improvement (the noise)."""
        space = self._space.with_offload(offload) if offload else self._space
        return StageTuner(ctx=self._ctx, tuning=self._tuning, stage=self._stage, space=space,
                          knobs=knobs, sizes=sizes, setting=setting, study=self.study, min_improvement=min_improvement)

    def reap(self, *, force: bool = False) -> None:
        """Fail the trials of dead workers so that their experiments run again (:meth:`Reaper.reap`)."""
        self._reaper.reap(force=force)

    def run_config(self, config: Config, lease: Lease, *, free_since: float, repeat: int = 0, why: str = "") -> None:
        """Run the planner's experiment of ``config`` on ``lease`` (:meth:`StageExperiments.run_config`)."""
        self._experiments.run_config(config, lease, free_since=free_since, repeat=repeat, why=why)

    def step_knobs(self, lease: Lease) -> Step:
        """Run the knob search's next trial on ``lease``, or say why there is none (:meth:`KnobSearcher.step`)."""
        return self._knob_search.step(lease)
