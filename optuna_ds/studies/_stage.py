from __future__ import annotations


from collections.abc import Mapping

import optuna
from optuna.distributions import BaseDistribution

from optuna_ds.domain import Config
from optuna_ds.launcher import Lease
from optuna_ds.space import KnobSpace
from optuna_ds.storage import TrialCache
from optuna_ds.storage import open_stage_study
from optuna_ds.studies._claims import Reaper
from optuna_ds.studies._context import StageContext
from optuna_ds.studies._experiments import StageExperiments


class StageTuner:
    """Runs the experiments of one ZeRO stage in its own Optuna study, one trial per experiment.

    The planner decides every experiment, knob settings included (:meth:`run_config`, trials with
    fixed params: :class:`StageExperiments`). Everything is read back from the storage, so a
    rerun continues where it stopped and any number of slots (of this process, of workers
    elsewhere) can run the same stage: a trial claims its experiment by name (:mod:`._claims`).

    Every study of a stage this process opens shares :attr:`study`'s storage cache, which reads
    again only the trials that are new or still running: a step reads little however many trials
    the study has.
    """

    def __init__(self, *, ctx: StageContext, tuning: str, stage: int, space: KnobSpace,
                 distributions: Mapping[str, BaseDistribution]) -> None:
        self._ctx = ctx
        self._tuning = tuning
        self._stage = stage
        self._space = space
        storage = TrialCache(ctx.storage) if isinstance(ctx.storage, optuna.storages.RDBStorage) else ctx.storage
        self.study = study = open_stage_study(storage, tuning=tuning, stage=stage, direction=ctx.metric.direction)
        self._reaper = Reaper(study, stage=stage, metric=ctx.metric, observer=ctx.observer)
        self._experiments = StageExperiments(ctx=ctx, stage=stage, study=study, space=space, reaper=self._reaper,
                                             distributions=distributions)
        self.reap(force=True)

    @property
    def stage(self) -> int:
        return self._stage

    @property
    def space(self) -> KnobSpace:
        return self._space

    def reap(self, *, force: bool = False) -> None:
        """Fail the trials of dead workers so that their experiments run again (:meth:`Reaper.reap`)."""
        self._reaper.reap(force=force)

    def run_config(self, config: Config, lease: Lease, *, free_since: float, repeat: int = 0, why: str = "") -> bool:
        """Run the planner's experiment of ``config`` on ``lease`` (:meth:`StageExperiments.run`);
        whether it launched."""
        return self._experiments.run(config, lease, free_since=free_since, repeat=repeat, why=why)
