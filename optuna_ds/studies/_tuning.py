from __future__ import annotations

import dataclasses
import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

import optuna

from optuna_ds._errors import OptunaDSError
from optuna_ds._errors import ResourceError
from optuna_ds.config import Metric
from optuna_ds.config import UserConfig
from optuna_ds.launcher import ExperimentInterrupted
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import SlotPool
from optuna_ds.launcher import deferred_signals
from optuna_ds.launcher import gpu_memory_support
from optuna_ds.launcher import Resources
from optuna_ds.space import MemoryEstimate
from optuna_ds.space import MemoryModel
from optuna_ds.space import OFFLOAD_VARIANTS
from optuna_ds.space import MicroBatchSearch
from optuna_ds.space import Observation
from optuna_ds.space import build_knob_space
from optuna_ds.space import carried_start
from optuna_ds.space import estimate_memory
from optuna_ds.space import offload_sections
from optuna_ds.space import user_offloads
from optuna_ds.storage import TuningPlan
from optuna_ds.storage import claim_stage_study
from optuna_ds.storage import open_root_study
from optuna_ds.storage import stage_study_name
from optuna_ds.studies._builder import ExperimentBuilder
from optuna_ds.studies._observer import ExperimentsOnly
from optuna_ds.studies._observer import LockedObserver
from optuna_ds.studies._observer import TuningObserver
from optuna_ds.studies._results import StageResult
from optuna_ds.studies._results import TuningResult
from optuna_ds.studies._results import find_baseline
from optuna_ds.studies._results import measurement_noise
from optuna_ds.studies._results import stage_result
from optuna_ds.studies._results import tuning_spend
from optuna_ds.studies._stage import KnobSearch
from optuna_ds.studies._stage import LocalClaims
from optuna_ds.studies._stage import StageContext
from optuna_ds.studies._stage import StageTuner
from optuna_ds.studies._stage import Stopped

STAGE_ATTR_PREFIX = "stage:"
_MIN_TIMEOUT = 300.0
_TIMEOUT_PER_PROFILE = 20.0
_TIMEOUT_WITHOUT_PROFILE = 3600.0
KNOB_STAGE_MARGIN = 0.05


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

    Stages that cannot fit are skipped with the reason; stage 3 that fits one sample at most
    is tried with offload to CPU. Each stage's micro-batch search starts from what the earlier
    ones learned (their runs bound the memory of a sample; their best size says where this
    stage's sweet spot should be). With ``"stage": "all"`` DeepSpeed's stop heuristics apply: a
    stage is skipped when its memory allows no larger micro-batch than a lower stage already
    ran, and exploration stops at a stage no better than the one below it. Stages the user
    lists explicitly are each tuned if they fit. The knob search (``"fast": false``) comes last.
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
        worker: bool = False,
    ) -> None:
        self._plan = plan
        self._user = user
        self._storage = storage
        self._resources = resources
        self._runner = runner
        self._observer = observer
        self._log = observer.log
        self._seed = seed
        self._worker = worker
        self._pool = SlotPool(resources)
        self._stop = threading.Event()
        self._local = LocalClaims()
        self._builder = ExperimentBuilder(user=user, results_dir=plan.results_dir, total_gpus=resources.total_gpus)
        self._root = open_root_study(storage, plan, direction=user.autotuning.tuned_metric.direction)
        self._recorded_memory: float | None = None
        self._check_resources()

    def _check_resources(self) -> None:
        """Every process of a tuning runs experiments of one size on one kind of GPU: the
        batch sizes and the memory estimates depend on it. The first process records them."""
        recorded = self._root.user_attrs.get("resources")
        mine = {"gpus_per_experiment": self._resources.total_gpus, "device_memory": self._resources.device_memory,
                "gpu_memory": gpu_memory_support()}
        if recorded is None:
            if not self._worker:
                self._root.set_user_attr("resources", mine)
            return
        if int(recorded["gpus_per_experiment"]) != mine["gpus_per_experiment"]:
            raise ResourceError(
                f"this tuning runs experiments on {recorded['gpus_per_experiment']} GPU(s), but the launcher options "
                f"here give {mine['gpus_per_experiment']}: pass --num_gpus/--num_nodes to match"
            )

    @property
    def _device_memory(self) -> float:
        """The first process's figure, read from the storage until it is there, then kept."""
        if self._recorded_memory is None:
            recorded = self._root.user_attrs.get("resources")
            if not recorded:
                return self._resources.device_memory
            self._recorded_memory = float(recorded["device_memory"])
        return self._recorded_memory

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
        if self._worker:
            return {**given, **self._wait_for_model_info()}
        experiment = self._builder.build_profile()
        lease = self._pool.acquire(self._stop, on_wait=self._log)
        assert lease is not None
        self._log(f"profile run: measuring the model ({experiment.result_dir})")
        timeout = self._plan.trial_timeout or _TIMEOUT_WITHOUT_PROFILE
        try:
            result = self._runner.run(experiment, slot=lease.slot, slot_index=lease.index, timeout=timeout, pass_fds=lease.fds)
        finally:
            self._pool.release(lease)
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
        self._root.set_user_attr("profile_end", datetime.datetime.now().isoformat())  # for the report's timeline
        return info

    def _wait_for_model_info(self) -> dict[str, Any]:
        """A worker started before the profile run finished waits for its result."""
        self._log("waiting for the profile run of the tuning's first process")
        while True:
            stored = optuna.load_study(study_name=self._plan.study_name, storage=self._storage).user_attrs.get("model_info")
            if stored:
                return dict(stored)
            time.sleep(1.0)

    def _timeout(self) -> float:
        if self._plan.trial_timeout:
            return self._plan.trial_timeout
        profile = self._root.user_attrs.get("profile_duration")
        if profile is None:
            return _TIMEOUT_WITHOUT_PROFILE
        return max(_MIN_TIMEOUT, _TIMEOUT_PER_PROFILE * float(profile))

    def _estimate(self, stage: int, info: dict[str, Any], zero: dict[str, Any]) -> MemoryEstimate:
        a = self._user.autotuning
        return estimate_memory(
            stage=stage,
            num_params=int(info["num_params"]),
            trainable_params=info.get("trainable_num_params"),
            activation_per_sample=info.get("activation_mem_per_gpu"),
            device_memory=self._device_memory,
            num_gpus=self._resources.total_gpus,
            mp_size=a.mp_size,
            precision=self._user.precision,
            adam_type=self._user.adam_type_optimizer,
            zero=zero,
        )

    def _estimates(self, info: dict[str, Any]) -> dict[int, MemoryEstimate]:
        return {stage: self._estimate(stage, info, self._user.zero_section()) for stage in self._user.stages}

    def _offload(self, estimate: MemoryEstimate, info: dict[str, Any], carried: list[tuple[float, int, bool]]) -> tuple[MemoryEstimate, str]:
        """Stage 3's estimate, with the offload variant it needs: none if it fits more than one
        sample, else the cheapest variant that does (or the last one that fits at all). The
        user's own offload sections are kept and nothing else is tried."""
        zero = self._user.zero_section()
        if user_offloads(zero):
            return estimate, ""

        def roomy(e: MemoryEstimate) -> bool:
            edge = self._memory_model(e, info, carried).edge({})
            return e.fits and (edge is None or edge > 1)

        if roomy(estimate):
            return estimate, ""
        fallback: tuple[MemoryEstimate, str] = (estimate, "")
        for label in OFFLOAD_VARIANTS:
            offloaded = self._estimate(3, info, {**zero, **offload_sections(label)})
            if roomy(offloaded):
                return offloaded, label
            if offloaded.fits and not fallback[0].fits:
                fallback = (offloaded, label)
        return fallback

    @staticmethod
    def _memory_model(estimate: MemoryEstimate, info: dict[str, Any], carried: list[tuple[float, int, bool]]) -> MemoryModel:
        prior = info.get("activation_mem_per_gpu")
        return MemoryModel(free=estimate.device_memory - estimate.instantiation, prior=float(prior) if prior else None,
                           carried=tuple(carried))

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
            count = 4  # the predicted edge, a correction, one size down, one refinement
        space = build_knob_space(stage, self._user.zero_section(), fast=a.fast, hidden_size=info.get("hidden_size"))
        if space.tuned:
            count += min(a.tuner_num_trials, space.size * a.num_tuning_micro_batch_sizes, 1 + 2 * a.tuner_early_stopping)
        return count

    def _context(self, observer: TuningObserver) -> StageContext:
        a = self._user.autotuning
        bound = self._builder.max_batch_per_gpu() or 1
        mbs_high = max([a.max_train_micro_batch_size_per_gpu, self._user.min_micro_batch_size, *(self._user.micro_batch_sizes or [])])
        return StageContext(
            storage=self._storage,
            builder=self._builder,
            runner=self._runner,
            pool=self._pool,
            stop=self._stop,
            metric=a.tuned_metric,
            tuner_type=a.tuner_type,
            fast=a.fast,
            num_tuning=a.num_tuning_micro_batch_sizes,
            early_stopping=a.tuner_early_stopping,
            num_trials=a.tuner_num_trials,
            mbs_high=mbs_high,
            gas_high=max(self._user.gradient_accumulation_steps, bound),
            timeout=self._timeout(),
            observer=observer,
            local=self._local,
            seed=self._seed,
        )

    def _record_stage(self, stage: int, status: str, reason: str = "", **extra: Any) -> None:
        # One attr per stage: several drivers write them, a shared dict would lose updates.
        self._root.set_user_attr(f"{STAGE_ATTR_PREFIX}z{stage}", {"status": status, "reason": reason, **extra})

    def _skip(self, stage: int, reason: str, estimate: MemoryEstimate, log: Callable[[str], None]) -> None:
        log(f"[z{stage}] skipped: {reason}")
        self._record_stage(stage, "skipped", reason, memory=estimate.to_dict())

    def result(self) -> TuningResult:
        """The tuning as the storage records it: what finished, whatever interrupted the rest."""
        return load_result(self._storage, self._plan, self._user)

    def run(self) -> TuningResult:
        """Explore the stages, then return :meth:`result`. Interrupted, it still counts the time
        spent, and the storage keeps every finished experiment."""
        start = time.monotonic()
        try:
            info = self._model_info()
            self._run_drivers(info)
        finally:
            if not self._worker:
                # Wall time of the tuning across its resumed runs; workers only help within it.
                elapsed = float(self._root.user_attrs.get("elapsed", 0.0)) + time.monotonic() - start
                self._root.set_user_attr("elapsed", round(elapsed, 3))
        return self.result()

    def _run_drivers(self, info: dict[str, Any]) -> None:
        """One driver thread per GPU slot of this process, each stepping the stages in order.

        A driver leases a slot for each step, so drivers of several processes on one node share
        its GPUs. Ctrl-C or SIGTERM (in the main thread) stops every driver: each ends its
        running experiment by process group and marks its trial ``interrupted``.
        """
        a = self._user.autotuning
        self._log(
            f"model: {_humanize(info['num_params'])} parameters; "
            f"{_humanize(self._device_memory)}B memory per GPU; "
            f"{self._resources.total_gpus} GPU(s) per experiment, {self._pool.size} at once; metric {a.metric} ({a.tuned_metric.direction})"
        )
        estimates = self._estimates(info)
        if not self._worker:
            self._root.set_user_attr("memory", {f"z{s}": e.to_dict() for s, e in estimates.items()})
        shared = LockedObserver(self._observer)
        errors: list[BaseException] = []

        finished = [threading.Event() for _ in range(self._pool.size)]

        def drive(index: int) -> None:
            try:
                lead = index == 0
                self._explore(info, estimates, self._context(shared if lead else ExperimentsOnly(shared)), lead=lead)
            except (Stopped, ExperimentInterrupted):
                pass
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                errors.append(e)
                self._stop.set()
            finally:
                finished[index].set()

        for i in range(self._pool.size):
            threading.Thread(target=drive, args=(i,), name=f"optuna-ds-driver-{i}", daemon=True).start()
        # Events, not Thread.join: an interrupted join marks a running thread as stopped.
        try:
            for done in finished:
                while not done.wait(0.1):
                    pass
        except BaseException:
            self._stop.set()
            with deferred_signals():
                for done in finished:
                    done.wait()
            raise
        if errors:
            raise errors[0]

    def _explore(self, info: dict[str, Any], estimates: dict[int, MemoryEstimate], ctx: StageContext, *, lead: bool) -> None:
        a = self._user.autotuning
        log = ctx.observer.log
        metric = ctx.metric
        prev: StageResult | None = None  # the best stage so far
        prev_free = 0.0
        prev_obs: dict[int, Observation] = {}
        prev_edge = 0
        carried: list[tuple[float, int, bool]] = []  # what earlier stages' runs say of memory
        tuned: list[StageTuner] = []

        for stage in self._user.stages:
            later = self._user.stages[self._user.stages.index(stage) :]
            if lead:
                ctx.observer.plan(sum(self._expected(s, estimates[s], info) for s in later), metric=metric)
            estimate = estimates[stage]
            offload = ""
            if stage == 3:
                estimate, offload = self._offload(estimate, info, carried)
            if not estimate.fits:
                self._skip(stage, (
                    f"needs {_humanize(estimate.instantiation)}B per GPU for parameters, gradients and optimizer "
                    f"states, more than the {_humanize(estimate.device_memory)}B available"
                ), estimate, log)
                continue
            memory = self._memory_model(estimate, info, carried)
            free = memory.free
            cap = self._mbs_cap(estimate)
            search = MicroBatchSearch(
                min_mbs=self._user.min_micro_batch_size,
                floor_mbs=a.min_train_micro_batch_size_per_gpu,
                cap=cap,
                user_list=tuple(self._user.micro_batch_sizes) if self._user.micro_batch_sizes else None,
                memory=memory,
                # The user's own size runs first: the baseline of the headline, even at the floor.
                probe_min=(self._user.baseline_micro_batch_size is not None
                           or self._user.min_micro_batch_size != a.min_train_micro_batch_size_per_gpu),
            )
            predicted = search.predicted_edge()
            if self._user.all_stages and prev is not None and prev.best is not None and predicted <= prev_edge:
                self._skip(stage, f"fits no micro-batch larger than the {prev_edge} that z{prev.stage} already runs", estimate, log)
                continue
            if prev is not None and prev.best is not None and not self._user.micro_batch_sizes:
                best_mbs = prev.best.micro_batch_size
                search = dataclasses.replace(search, to_beat=metric.oriented(prev.best.value), probe_min=False)
                start = carried_start(prev_obs, best_mbs, memory=memory, free=prev_free)
                if start:
                    search = dataclasses.replace(search, start=min(cap, start), local=True)
            space = build_knob_space(stage, self._user.zero_section(), fast=a.fast, hidden_size=info.get("hidden_size"))
            if offload:
                space = space.with_offload(offload)
                log(f"[z{stage}] {offload}: without offload to CPU it fits {'only one sample' if estimates[stage].fits else 'nothing'}")
            log(f"[z{stage}] tuning: micro-batch up to {cap}" + (f", edge predicted at {predicted}" if predicted < cap else "")
                + ("" if a.fast else f", {len(space.tuned)} ZeRO knob(s)"))
            tuner = StageTuner(ctx=ctx, study_name=stage_study_name(self._plan.study_name, stage), stage=stage, space=space,
                               search=search, knobs=KnobSearch.NONE)
            claim_stage_study(tuner.study, self._plan.study_name)
            tuner.study.set_user_attr("memory", estimate.to_dict())
            tuner.study.set_user_attr("model_info", info)
            tuner.study.set_user_attr("knob_space", space.to_dict())
            tuner.study.set_metric_names([a.metric])
            self._record_stage(stage, "running", memory=estimate.to_dict(), offload=offload)
            tuner.run()
            tuned.append(tuner)
            observations = tuner.observations()
            carried += [(free, o.mbs, o.oom) for o in observations.values() if o.ok or o.oom]
            edge = search.edge(observations)
            result = stage_result(tuner.study, stage)
            self._record_stage(stage, "tuned", memory=estimate.to_dict(), max_runnable_micro_batch_size=edge, offload=offload)
            if result.best is not None:
                log(f"[z{stage}] best: {result.best.name} {a.metric}={result.best.value:.4g} after {result.num_experiments} experiment(s)")
            if self._user.all_stages and prev is not None and prev.best is not None and result.best is not None:
                if not metric.better(result.best.value, prev.best.value):
                    for later in self._user.stages[self._user.stages.index(stage) + 1 :]:
                        self._skip(later, f"z{stage} was no better than z{prev.stage}", estimates[later], log)
                    break
            prev_edge = max(prev_edge, edge)
            if result.best is not None and (prev is None or prev.best is None or metric.better(result.best.value, prev.best.value)):
                prev = result
                prev_free = free
                prev_obs = observations
        if not a.fast and prev is not None and prev.best is not None:
            self._tune_knobs(tuned, metric, log)

    def _tune_knobs(self, tuned: list[StageTuner], metric: Metric, log: Callable[[str], None]) -> None:
        """The knob search, after every stage's micro-batch search. With ``"stage": "all"`` only
        the stages whose best is within 5% of the best of all take part (knobs rarely pay more):
        each runs DeepSpeed's recommended setting once, then the sampler searches at the best of
        them. Stages the user listed each get the whole search."""
        def ranked(margin: float | None) -> list[StageTuner]:
            """The stages with knobs to tune, best first, within ``margin`` of the best of all."""
            scored = [(metric.oriented(r.best.value), t) for t in tuned if (r := stage_result(t.study, t.stage)).best is not None]
            top = max((score for score, _ in scored), default=0.0)
            close = [(score, t) for score, t in scored
                     if t.space.tuned and (margin is None or score >= top - margin * abs(top))]
            return [t for _, t in sorted(close, key=lambda c: (-c[0], c[1].stage))]

        searched: list[StageTuner] = []

        def run(tuner: StageTuner, knobs: KnobSearch) -> None:
            tuner.with_knobs(knobs).run()
            searched.append(tuner)

        if not self._user.all_stages:
            for tuner in ranked(None):
                run(tuner, KnobSearch.FULL)
        else:
            for tuner in ranked(KNOB_STAGE_MARGIN):
                run(tuner, KnobSearch.RECOMMENDED)
            for tuner in ranked(KNOB_STAGE_MARGIN)[:1]:  # ranked again: the recommended settings may reorder
                run(tuner, KnobSearch.FULL)
        for tuner in dict.fromkeys(searched):
            result = stage_result(tuner.study, tuner.stage)
            if result.best is not None:
                log(f"[z{tuner.stage}] best with knobs: {result.best.name} {self._user.autotuning.metric}={result.best.value:.4g}")


def recorded_stages(root: optuna.Study) -> dict[str, dict[str, Any]]:
    """What the drivers recorded of each stage, by ``z<stage>``."""
    n = len(STAGE_ATTR_PREFIX)
    return {k[n:]: v for k, v in root.user_attrs.items() if k.startswith(STAGE_ATTR_PREFIX)}


def load_result(storage: optuna.storages.BaseStorage, plan: TuningPlan, user: UserConfig) -> TuningResult:
    """Rebuild a tuning's result from the storage alone (``optuna-ds report`` does this)."""
    a = user.autotuning
    root = optuna.load_study(study_name=plan.study_name, storage=storage)
    recorded = recorded_stages(root)
    results = []
    trials: dict[int, list[optuna.trial.FrozenTrial]] = {}
    for stage in user.stages:
        entry = recorded.get(f"z{stage}", {})
        try:
            study: optuna.Study | None = optuna.load_study(study_name=stage_study_name(plan.study_name, stage), storage=storage)
        except KeyError:
            study = None
        if study is not None:
            trials[stage] = study.get_trials(deepcopy=False)
        if entry.get("status") == "skipped":
            results.append(StageResult(stage=stage, status="skipped", reason=entry.get("reason", "")))
        elif study is not None:
            result = stage_result(study, stage)
            if result.best is None:
                result = stage_result(study, stage, reason="no experiment ran successfully")
            results.append(result)
        else:
            results.append(StageResult(stage=stage, status="pending", reason="not reached yet"))
    every = [t for ts in trials.values() for t in ts]
    profile = root.user_attrs.get("profile_duration")
    gpus = int((root.user_attrs.get("resources") or {}).get("gpus_per_experiment", 1))
    noise, noise_configs = measurement_noise(every)
    return TuningResult(
        metric=a.tuned_metric,
        stages=results,
        duration=float(root.user_attrs.get("elapsed", 0.0)),
        model_info=root.user_attrs.get("model_info", {}),
        baseline=find_baseline(stages=trials, order=list(user.stages),
                               skipped={r.stage: r.reason for r in results if r.status == "skipped"},
                               micro_batch_size=user.baseline_micro_batch_size, user_list=bool(user.micro_batch_sizes)),
        spend=tuning_spend(every, profile_seconds=float(profile) if profile is not None else None, gpus_per_experiment=gpus),
        noise=noise,
        noise_configs=noise_configs,
    )
