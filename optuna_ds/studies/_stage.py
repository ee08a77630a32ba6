from __future__ import annotations

import dataclasses
import os
import shlex
import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_ds.config import GAS_KEY
from optuna_ds.config import MBS_KEY
from optuna_ds.launcher import Experiment
from optuna_ds.launcher import ExperimentResult
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import FailureReason
from optuna_ds.launcher import Phase
from optuna_ds.launcher import Slot
from optuna_ds.pruners import TunerEarlyStoppingPruner
from optuna_ds.samplers import create_sampler
from optuna_ds.space import KnobSpace
from optuna_ds.space import MicroBatchSearch
from optuna_ds.space import Observation
from optuna_ds.studies._builder import ExperimentBuilder
from optuna_ds.studies._observer import TuningObserver
from optuna_ds.studies._owner import OWNER_ATTR
from optuna_ds.studies._owner import PROCESS_ATTR
from optuna_ds.studies._owner import fail_orphaned_trials
from optuna_ds.studies._owner import process_identity
from optuna_ds.studies._owner import this_process
from optuna_ds.studies._results import is_finished_experiment

_MAX_CONSECUTIVE_DUPLICATES = 50
_POLL_SECONDS = 0.5


class ExperimentFailed(Exception):
    """Raised by the objective so that Optuna records the trial as failed; the reason is in
    the trial's user attrs."""

    def __init__(self, result: ExperimentResult) -> None:
        super().__init__(f"{result.reason.value if result.reason else 'failed'}: {result.detail}")
        self.result = result


@dataclasses.dataclass(frozen=True)
class StageContext:
    """What every stage of one tuning shares."""

    storage: optuna.storages.BaseStorage
    builder: ExperimentBuilder
    runner: ExperimentRunner
    slot: Slot
    metric_key: str
    direction: str
    tuner_type: str
    fast: bool
    num_tuning: int
    early_stopping: int
    num_trials: int
    mbs_high: int
    gas_high: int
    timeout: float | None
    observer: TuningObserver
    seed: int | None = None


def record_result(trial: optuna.Trial, experiment: Experiment, result: ExperimentResult) -> None:
    """Store on the trial what users look for: the metrics, the config, the command, the
    result folder, and for a failure its reason and the last lines of stderr."""
    attrs: dict[str, Any] = {
        "metrics": result.metrics,
        "cmd": result.cmd,
        "duration": round(result.duration, 3),
        "returncode": result.returncode,
    }
    if result.reason is not None:
        attrs["reason"] = result.reason.value
        attrs["detail"] = result.detail
        attrs["stderr_tail"] = result.stderr_tail
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


class StageTuner:
    """Tunes one ZeRO stage in its own Optuna study, one trial per experiment.

    First the micro-batch search (enqueued trials, decided by :class:`MicroBatchSearch` from
    the finished ones); then, unless in fast mode, the ZeRO knobs with the ``tuner_type``
    sampler over the best micro-batch sizes, until :class:`TunerEarlyStoppingPruner` says
    stop or the space is exhausted. Everything is read back from the storage, so a rerun
    continues and never pays for a finished experiment again.
    """

    def __init__(self, *, ctx: StageContext, study_name: str, stage: int, space: KnobSpace, search: MicroBatchSearch) -> None:
        self._ctx = ctx
        self._study_name = study_name
        self._stage = stage
        self._space = space
        self._search = search
        self.study = optuna.create_study(
            storage=ctx.storage, study_name=study_name, direction=ctx.direction, load_if_exists=True
        )
        for number in fail_orphaned_trials(self.study):
            ctx.observer.log(f"[z{stage}] trial {number}: its process died; its experiment will run again")

    # -- reading the study ------------------------------------------------------------------

    def _trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    def _finished_by_name(self) -> dict[str, FrozenTrial]:
        return {t.user_attrs["exp_name"]: t for t in self._trials() if "exp_name" in t.user_attrs and is_finished_experiment(t)}

    def observations(self) -> dict[int, Observation]:
        sign = 1.0 if self._ctx.direction == "maximize" else -1.0
        obs: dict[int, Observation] = {}
        for t in self._trials():
            if t.user_attrs.get("phase") != Phase.MICRO_BATCH.value or not is_finished_experiment(t):
                continue
            mbs = int(t.user_attrs["micro_batch_size"])
            if t.state == TrialState.COMPLETE and t.value is not None:
                obs[mbs] = Observation(mbs=mbs, score=sign * t.value)
            else:
                obs[mbs] = Observation(mbs=mbs, score=None, oom=t.user_attrs.get("reason") == FailureReason.OOM.value)
        return obs

    def _running(self, name: str) -> bool:
        return any(t.state == TrialState.RUNNING and t.user_attrs.get("exp_name") == name for t in self._trials())

    # -- running trials ---------------------------------------------------------------------

    def _objective(self, phase: Phase, tuning_list: list[int]) -> Callable[[optuna.Trial], float]:
        ctx = self._ctx

        def objective(trial: optuna.Trial) -> float:
            trial.set_user_attr(OWNER_ATTR, this_process())
            if phase is Phase.MICRO_BATCH:
                mbs = trial.suggest_int(MBS_KEY, 1, ctx.mbs_high)
                knobs: dict[str, Any] = {}
            else:
                mbs = trial.suggest_int(MBS_KEY, min(tuning_list), max(tuning_list))
                knobs = {k: trial.suggest_categorical(k, choices) for k, choices in self._space.tuned.items()}
            gas = ctx.builder.gas_for(mbs)
            if phase is Phase.KNOBS:
                trial.suggest_int(GAS_KEY, gas, gas)  # derived from mbs: recorded, not sampled
            else:
                trial.suggest_int(GAS_KEY, 1, ctx.gas_high)
            experiment = ctx.builder.build(stage=self._stage, phase=phase, mbs=mbs, gas=gas, space=self._space, knobs=knobs)
            for key, value in {
                "phase": phase.value,
                "exp_name": experiment.name,
                "micro_batch_size": mbs,
                "gradient_accumulation_steps": gas,
                "train_batch_size": experiment.ds_config.get("train_batch_size"),
                "ds_config": experiment.ds_config,
                "result_dir": experiment.result_dir,
                "slot": ctx.slot.include,
            }.items():
                trial.set_user_attr(key, value)
            previous = self._finished_by_name().get(experiment.name)
            if previous is not None:
                trial.set_user_attr("duplicate_of", previous.number)
                raise optuna.TrialPruned(f"{experiment.name} already ran as trial {previous.number}")
            ctx.observer.started(stage=self._stage, number=trial.number, name=experiment.name, slot=ctx.slot.include)
            ctx.observer.detail(f"  cd {os.getcwd()} && {shlex.join(ctx.runner.command(experiment, os.path.join(experiment.result_dir, 'ds_config.json'), slot=ctx.slot, port=ctx.runner.master_port))}")
            try:
                result = ctx.runner.run(
                    experiment,
                    slot=ctx.slot,
                    timeout=ctx.timeout,
                    on_start=lambda pid: trial.set_user_attr(PROCESS_ATTR, process_identity(pid)),
                )
            except BaseException:
                trial.set_user_attr("reason", FailureReason.INTERRUPTED.value)
                raise
            record_result(trial, experiment, result)
            if not result.ok:
                assert result.reason is not None
                ctx.observer.finished(stage=self._stage, number=trial.number, name=experiment.name, value=None,
                                      duration=result.duration, outcome=f"failed ({result.reason.value}: {result.detail})")
                if result.stderr_tail:
                    ctx.observer.detail("\n".join("  | " + line for line in result.stderr_tail.splitlines()[-5:]))
                raise ExperimentFailed(result)
            value = float(result.metrics[ctx.metric_key])
            ctx.observer.finished(stage=self._stage, number=trial.number, name=experiment.name, value=value,
                                  duration=result.duration, outcome=f"{ctx.metric_key}={value:.4g}")
            return value

        return objective

    def _optimize_one(self, study: optuna.Study, phase: Phase, tuning_list: list[int]) -> None:
        study.optimize(
            self._objective(phase, tuning_list), n_trials=1, catch=(ExperimentFailed,), gc_after_trial=False
        )

    def _wait_for(self, name: str) -> None:
        """Another process is running this experiment: wait for its result, or for its trial
        to go stale (its worker died) so that the experiment can run again here."""
        self._ctx.observer.log(f"[z{self._stage}] waiting for {name}, running in another process")
        while self._running(name):
            fail_orphaned_trials(self.study)
            optuna.storages.fail_stale_trials(self.study)
            time.sleep(_POLL_SECONDS)

    # -- the two phases ---------------------------------------------------------------------

    def tune_micro_batch(self) -> None:
        ctx = self._ctx
        while True:
            mbs = self._search.next_mbs(self.observations())
            if mbs is None:
                return
            gas = ctx.builder.gas_for(mbs)
            name = ctx.builder.build(stage=self._stage, phase=Phase.MICRO_BATCH, mbs=mbs, gas=gas, space=self._space).name
            if self._running(name):
                self._wait_for(name)
                continue
            params = {MBS_KEY: mbs, GAS_KEY: gas}
            waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            if not any(t.system_attrs.get("fixed_params") == params for t in waiting):
                self.study.enqueue_trial(params, user_attrs={"phase": Phase.MICRO_BATCH.value})
            self._optimize_one(self.study, Phase.MICRO_BATCH, [mbs])

    def tune_knobs(self) -> None:
        ctx = self._ctx
        if ctx.fast or not self._space.tuned:
            return
        tuning_list = sorted(self._search.best(self.observations(), n=ctx.num_tuning))
        if not tuning_list:
            return
        search_space: dict[str, list[Any]] = {**self._space.tuned, MBS_KEY: tuning_list}
        pruner = TunerEarlyStoppingPruner(ctx.early_stopping, max_trials=ctx.num_trials, phase=Phase.KNOBS.value)
        study = optuna.load_study(
            storage=ctx.storage,
            study_name=self._study_name,
            sampler=create_sampler(ctx.tuner_type, search_space, seed=ctx.seed),
            pruner=pruner,
        )
        size = self._space.size * len(tuning_list)
        ctx.observer.log(f"[z{self._stage}] knob search: {len(self._space.tuned)} knob(s) x {len(tuning_list)} micro-batch size(s) = {size} configs, sampler {ctx.tuner_type}")
        duplicates = 0
        while not pruner.exhausted(study) and duplicates < _MAX_CONSECUTIVE_DUPLICATES:
            knob_trials = [t for t in self._trials() if t.user_attrs.get("phase") == Phase.KNOBS.value and is_finished_experiment(t)]
            if len({t.user_attrs["exp_name"] for t in knob_trials}) >= size:
                return
            before = len(self._trials())
            self._optimize_one(study, Phase.KNOBS, tuning_list)
            last = self._trials()[before:] if len(self._trials()) > before else []
            duplicates = duplicates + 1 if last and last[-1].state == TrialState.PRUNED else 0

    def run(self) -> None:
        self.tune_micro_batch()
        self.tune_knobs()
