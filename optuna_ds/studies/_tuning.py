from __future__ import annotations

import math
import time
from typing import Any

import optuna

from optuna_ds._errors import OptunaDSError
from optuna_ds.config import UserConfig
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import Resources
from optuna_ds.space import MemoryEstimate
from optuna_ds.space import MicroBatchSearch
from optuna_ds.space import build_knob_space
from optuna_ds.space import estimate_memory
from optuna_ds.storage import TuningPlan
from optuna_ds.storage import open_root_study
from optuna_ds.storage import stage_study_name
from optuna_ds.studies._builder import ExperimentBuilder
from optuna_ds.studies._observer import TuningObserver
from optuna_ds.studies._results import StageResult
from optuna_ds.studies._results import TuningResult
from optuna_ds.studies._results import stage_result
from optuna_ds.studies._stage import StageContext
from optuna_ds.studies._stage import StageTuner

_MIN_TIMEOUT = 300.0
_TIMEOUT_PER_PROFILE = 20.0
_TIMEOUT_WITHOUT_PROFILE = 3600.0


class ProfileError(OptunaDSError):
    """The model-info profile run failed: the script does not run with DeepSpeed as given."""

    exit_code = 1


def _humanize(n: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.3g}{unit}"
        n /= 1000
    return f"{n:.3g}P"


class Tuning:
    """One tuning: the profile run, then one study per ZeRO stage in DeepSpeed's order.

    Stages that cannot fit are skipped with the reason. With ``"stage": "all"`` DeepSpeed's
    stop heuristics apply: a stage is skipped when its memory allows no larger micro-batch
    than a lower stage already ran, and exploration stops at a stage no better than the one
    below it. Stages the user lists explicitly are each tuned if they fit.
    """

    def __init__(
        self,
        *,
        plan: TuningPlan,
        user: UserConfig,
        storage: optuna.storages.BaseStorage,
        resources: Resources,
        runner: ExperimentRunner,
        observer: TuningObserver,
        seed: int | None = None,
    ) -> None:
        self._plan = plan
        self._user = user
        self._storage = storage
        self._resources = resources
        self._runner = runner
        self._observer = observer
        self._log = observer.log
        self._seed = seed
        self._builder = ExperimentBuilder(user=user, results_dir=plan.results_dir, total_gpus=resources.total_gpus)
        self._root = open_root_study(storage, plan, direction=user.autotuning.direction)

    @property
    def root(self) -> optuna.Study:
        return self._root

    def _model_info(self) -> dict[str, Any]:
        given = self._user.autotuning.model_info or {}
        if given.get("num_params"):
            return {k: v for k, v in given.items() if k != "profile"}
        stored = self._root.user_attrs.get("model_info")
        if stored:
            return {**given, **stored}
        experiment = self._builder.build_profile()
        self._log(f"profile run: measuring the model ({experiment.result_dir})")
        timeout = self._plan.trial_timeout or _TIMEOUT_WITHOUT_PROFILE
        result = self._runner.run(experiment, slot=self._resources.slots()[0], timeout=timeout)
        if not result.ok:
            cause = result.stderr_tail.strip().splitlines()[-1] if result.stderr_tail.strip() else result.detail
            raise ProfileError(
                f"the profile run failed ({result.reason.value if result.reason else 'error'}: {result.detail}): "
                f"{cause} -- see {experiment.result_dir}/stderr.log"
            )
        # What the user gave (hidden_size, num_layers) stays; the profile adds what it measured.
        info = {**{k: v for k, v in given.items() if k != "profile" and v is not None},
                **{k: v for k, v in result.metrics.items() if k != "rank"}}
        self._root.set_user_attr("model_info", info)
        self._root.set_user_attr("profile_duration", round(result.duration, 3))
        return info

    def _timeout(self) -> float:
        if self._plan.trial_timeout:
            return self._plan.trial_timeout
        profile = self._root.user_attrs.get("profile_duration")
        if profile is None:
            return _TIMEOUT_WITHOUT_PROFILE
        return max(_MIN_TIMEOUT, _TIMEOUT_PER_PROFILE * float(profile))

    def _estimates(self, info: dict[str, Any]) -> dict[int, MemoryEstimate]:
        a = self._user.autotuning
        out = {}
        for stage in self._user.stages:
            out[stage] = estimate_memory(
                stage=stage,
                num_params=int(info["num_params"]),
                trainable_params=info.get("trainable_num_params"),
                activation_per_sample=info.get("activation_mem_per_gpu"),
                device_memory=self._resources.device_memory,
                num_gpus=self._resources.total_gpus,
                mp_size=a.mp_size,
                precision=self._user.precision,
                adam_type=self._user.adam_type_optimizer,
                zero=self._user.zero_section(),
            )
        return out

    def _mbs_cap(self, estimate: MemoryEstimate) -> int:
        a = self._user.autotuning
        cap = min(estimate.max_micro_batch_size, a.max_train_micro_batch_size_per_gpu)
        bound = self._builder.max_batch_per_gpu()
        return min(cap, bound) if bound else cap

    def _expected(self, stage: int, estimate: MemoryEstimate, info: dict[str, Any]) -> int:
        """A rough count of the experiments a stage will take, for the progress display."""
        if not estimate.fits:
            return 0
        a = self._user.autotuning
        if self._user.micro_batch_sizes:
            count = len(self._user.micro_batch_sizes)
        else:
            cap = self._mbs_cap(estimate)
            count = 2 + math.ceil(math.log2(max(1.0, cap / max(1, self._user.min_micro_batch_size)))) // 2 + a.num_tuning_micro_batch_sizes + 1
        space = build_knob_space(stage, self._user.zero_section(), fast=a.fast, hidden_size=info.get("hidden_size"))
        if space.tuned:
            count += min(a.tuner_num_trials, space.size * a.num_tuning_micro_batch_sizes)
        return count

    def _context(self) -> StageContext:
        a = self._user.autotuning
        bound = self._builder.max_batch_per_gpu() or 1
        mbs_high = max([a.max_train_micro_batch_size_per_gpu, self._user.min_micro_batch_size, *(self._user.micro_batch_sizes or [])])
        return StageContext(
            storage=self._storage,
            builder=self._builder,
            runner=self._runner,
            slot=self._resources.slots()[0],
            metric_key=a.metric_key,
            direction=a.direction,
            tuner_type=a.tuner_type,
            fast=a.fast,
            num_tuning=a.num_tuning_micro_batch_sizes,
            early_stopping=a.tuner_early_stopping,
            num_trials=a.tuner_num_trials,
            mbs_high=mbs_high,
            gas_high=max(self._user.gradient_accumulation_steps, bound),
            timeout=self._timeout(),
            observer=self._observer,
            seed=self._seed,
        )

    def _record_stage(self, stage: int, status: str, reason: str = "", **extra: Any) -> None:
        stages = dict(self._root.user_attrs.get("stages", {}))
        stages[f"z{stage}"] = {"status": status, "reason": reason, **extra}
        self._root.set_user_attr("stages", stages)

    def _skip(self, stage: int, reason: str, estimate: MemoryEstimate) -> None:
        self._log(f"[z{stage}] skipped: {reason}")
        self._record_stage(stage, "skipped", reason, memory=estimate.to_dict())

    def result(self) -> TuningResult:
        """The tuning as the storage records it: what finished, whatever interrupted the rest."""
        return load_result(self._storage, self._plan, self._user)

    def run(self) -> TuningResult:
        """Explore the stages, then return :meth:`result`. Interrupted, it still counts the time
        spent, and the storage keeps every finished experiment."""
        start = time.monotonic()
        try:
            self._explore()
        finally:
            # Time spent across every run of this tuning, resumed ones included.
            elapsed = float(self._root.user_attrs.get("elapsed", 0.0)) + time.monotonic() - start
            self._root.set_user_attr("elapsed", round(elapsed, 3))
        return self.result()

    def _explore(self) -> None:
        a = self._user.autotuning
        info = self._model_info()
        self._log(
            f"model: {_humanize(info['num_params'])} parameters; "
            f"{_humanize(self._resources.device_memory)}B memory per GPU; "
            f"{self._resources.total_gpus} GPU(s) per experiment; metric {a.metric} ({a.direction})"
        )
        estimates = self._estimates(info)
        self._root.set_user_attr("memory", {f"z{s}": e.to_dict() for s, e in estimates.items()})
        ctx = self._context()
        prev: StageResult | None = None  # the best stage so far
        prev_edge = 0

        def better_than(a_value: float, b_value: float) -> bool:
            return a_value > b_value if a.direction == "maximize" else a_value < b_value

        for stage in self._user.stages:
            later = self._user.stages[self._user.stages.index(stage) :]
            self._observer.plan(sum(self._expected(s, estimates[s], info) for s in later), maximize=a.direction == "maximize")
            estimate = estimates[stage]
            if not estimate.fits:
                self._skip(stage, (
                    f"needs {_humanize(estimate.instantiation)}B per GPU for parameters, gradients and optimizer "
                    f"states, more than the {_humanize(estimate.device_memory)}B available"
                ), estimate)
                continue
            cap = self._mbs_cap(estimate)
            if self._user.all_stages and prev is not None and prev.best is not None and cap <= prev_edge:
                self._skip(stage, f"fits no micro-batch larger than the {prev_edge} that z{prev.stage} already runs", estimate)
                continue
            space = build_knob_space(stage, self._user.zero_section(), fast=a.fast, hidden_size=info.get("hidden_size"))
            search = MicroBatchSearch(
                min_mbs=self._user.min_micro_batch_size,
                floor_mbs=a.min_train_micro_batch_size_per_gpu,
                cap=cap,
                num_tuning=a.num_tuning_micro_batch_sizes,
                user_list=tuple(self._user.micro_batch_sizes) if self._user.micro_batch_sizes else None,
            )
            self._log(f"[z{stage}] tuning: micro-batch {self._user.min_micro_batch_size}..{cap}" + ("" if a.fast else f", {len(space.tuned)} ZeRO knob(s)"))
            tuner = StageTuner(ctx=ctx, study_name=stage_study_name(self._plan.study_name, stage), stage=stage, space=space, search=search)
            tuner.study.set_user_attr("memory", estimate.to_dict())
            tuner.study.set_user_attr("model_info", info)
            tuner.study.set_user_attr("knob_space", space.to_dict())
            tuner.study.set_metric_names([a.metric])
            self._record_stage(stage, "running", memory=estimate.to_dict())
            tuner.run()
            edge = search.edge(tuner.observations())
            result = stage_result(tuner.study, stage)
            self._record_stage(stage, "tuned", memory=estimate.to_dict(), max_runnable_micro_batch_size=edge)
            if result.best is not None:
                self._log(f"[z{stage}] best: {result.best.name} {a.metric}={result.best.value:.4g} after {result.num_experiments} experiment(s)")
            if self._user.all_stages and prev is not None and prev.best is not None and result.best is not None:
                if not better_than(result.best.value, prev.best.value):
                    for later in self._user.stages[self._user.stages.index(stage) + 1 :]:
                        self._skip(later, f"z{stage} was no better than z{prev.stage}", estimates[later])
                    return
            prev_edge = max(prev_edge, edge)
            if result.best is not None and (prev is None or prev.best is None or better_than(result.best.value, prev.best.value)):
                prev = result


def load_result(storage: optuna.storages.BaseStorage, plan: TuningPlan, user: UserConfig) -> TuningResult:
    """Rebuild a tuning's result from the storage alone (``optuna-ds report`` does this)."""
    a = user.autotuning
    root = optuna.load_study(study_name=plan.study_name, storage=storage)
    recorded = root.user_attrs.get("stages", {})
    results = []
    for stage in user.stages:
        entry = recorded.get(f"z{stage}", {})
        try:
            study: optuna.Study | None = optuna.load_study(study_name=stage_study_name(plan.study_name, stage), storage=storage)
        except KeyError:
            study = None
        if entry.get("status") == "skipped":
            results.append(StageResult(stage=stage, status="skipped", reason=entry.get("reason", "")))
        elif study is not None:
            result = stage_result(study, stage)
            if result.best is None:
                result = stage_result(study, stage, reason="no experiment ran successfully")
            results.append(result)
        else:
            results.append(StageResult(stage=stage, status="pending", reason="not reached yet"))
    return TuningResult(
        metric=a.metric,
        direction=a.direction,
        stages=results,
        duration=float(root.user_attrs.get("elapsed", 0.0)),
        model_info=root.user_attrs.get("model_info", {}),
    )
