from __future__ import annotations

import datetime
import functools
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState
from threadpoolctl import threadpool_limits

from optuna_ds._errors import OptunaDSError
from optuna_ds._errors import ResourceError
from optuna_ds._optuna_compat import study_id
from optuna_ds.config import UserConfig
from optuna_ds.domain import AUTOTP_KNOB
from optuna_ds.domain import ChoiceRecord
from optuna_ds.domain import Config
from optuna_ds.domain import ExperimentRecord
from optuna_ds.domain import Knobs
from optuna_ds.domain import RecordedResources
from optuna_ds.domain import RootRecord
from optuna_ds.domain import StageRecord
from optuna_ds.domain import is_finished_experiment
from optuna_ds.domain import restart_unmeasured
from optuna_ds.domain import timed_out_sooner
from optuna_ds.launcher import ExperimentRunner
from optuna_ds.launcher import Resources
from optuna_ds.launcher import SlotPool
from optuna_ds.launcher import device_kind
from optuna_ds.launcher import gpu_memory_support
from optuna_ds.launcher import telling_line
from optuna_ds.planner import Arm
from optuna_ds.planner import Decision
from optuna_ds.planner import Problem
from optuna_ds.planner import Proposal
from optuna_ds.planner import Status
from optuna_ds.space import AUTOTP_STAGES
from optuna_ds.space import OFFLOAD_VARIANTS
from optuna_ds.space import KnobSpace
from optuna_ds.space import MemoryEstimate
from optuna_ds.space import build_knob_space
from optuna_ds.space import estimate_memory
from optuna_ds.space import knob_defaults
from optuna_ds.space import offload_sections
from optuna_ds.space import user_offloads
from optuna_ds.storage import TuningPlan
from optuna_ds.storage import ending
from optuna_ds.storage import set_verdict
from optuna_ds.storage import open_root_study
from optuna_ds.storage import set_ending
from optuna_ds.studies._builder import ExperimentBuilder
from optuna_ds.studies._context import StageContext
from optuna_ds.studies._coordinator import Coordinator
from optuna_ds.studies._coordinator import observation_of
from optuna_ds.studies._curves import record_model_curves
from optuna_ds.studies._decider import Peers
from optuna_ds.studies._handout import handed
from optuna_ds.studies._observer import TuningObserver
from optuna_ds.studies._owner import dead
from optuna_ds.studies._owner import this_process
from optuna_ds.studies._results import Spend
from optuna_ds.studies._results import TuningResult
from optuna_ds.studies._results import load_result
from optuna_ds.studies._experiments import StageExperiments
from optuna_ds.studies._experiments import stage_distributions
from optuna_ds.studies._knob_search import KnobCandidates

_MIN_TIMEOUT = 300.0
_TIMEOUT_PER_PROFILE = 20.0
_TIMEOUT_WITHOUT_PROFILE = 3600.0
_PROFILE_POLL_SECONDS = 0.2  # a worker waiting for the profile run reads the root study this often
# The headline's configs run alternately until each ran this often, with at most this many launches.
_ALIKE_RUNS = 2
_ALIKE_LAUNCHES = 4
_ALIKE_ROUNDS = 2  # choices measured so, at most (the planner may change its mind on their runs)
_MAX_EXPERIMENTS = 40  # the planner's launches in fast mode, at most (its search ends long before, as a rule)


class TuningDeleted(OptunaDSError):
    """Another process deleted the tuning (``--overwrite``) while this one ran it."""

    exit_code = 1


class ProfileError(OptunaDSError):
    """The model-info profile run failed: the script does not run with DeepSpeed as given."""

    exit_code = 1


def _live_ending(root: optuna.Study) -> dict[str, Any] | None:
    """The tune process ending the tuning of ``root``, unless it is known gone (a tune that died
    while ending it: its search is open to workers again)."""
    owner = ending(root)
    return owner if owner and not dead(owner) else None


def _humanize(n: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.3g}{unit}"
        n /= 1000
    return f"{n:.3g}P"


class Tuning:
    """One tuning: the profile run, then the planner's search (:mod:`optuna_ds.planner`) over
    the ZeRO stages, their offload variants, micro-batch sizes and, unless in fast mode, the
    knob settings the ``tuner_type`` sampler proposes; one study per stage.

    Stages whose model states fit in no variant are skipped with the reason. The planner is a
    function of the storage, so a resumed tuning and every worker continue the same search.
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
        worker: bool = False,
        wait: float | None = None,
    ) -> None:
        self._plan = plan
        self._user = user
        self._storage = storage
        self._resources = resources
        self._runner = runner
        self._observer = observer
        self._log = observer.log
        self._worker = worker
        self._wait = wait  # a worker's limit on its wait for the profile run, in seconds
        self._pool = SlotPool(resources, device=device_kind())
        self._stop = threading.Event()
        self._builder = ExperimentBuilder(user=user, results_dir=plan.results_dir, total_gpus=resources.total_gpus)
        self._root = open_root_study(storage, plan, direction=user.autotuning.tuned_metric.direction,
                                     replaceable=restart_unmeasured)
        self._recorded_memory: float | None = None
        self._measured_alike: set[Config] = set()  # the choices measured alike with the user's config
        self._check_resources()
        # Its slots counted by the decider from now: a worker's are while it waits for the profile.
        self._peers = Peers(self._root, slots=self._pool.size, lead=not worker, gpus=self._pool.gpus)
        self._peers.keep_beating()

    def _check_resources(self) -> None:
        """Every process of a tuning runs experiments of one size on one kind of GPU: the
        batch sizes and the memory estimates depend on it. The first process records them."""
        recorded = self._recorded().resources
        mine = RecordedResources(gpus_per_experiment=self._resources.total_gpus, device_memory=self._resources.device_memory,
                                 gpu_memory=gpu_memory_support(), device=device_kind())
        if recorded is None:
            if not self._worker:
                RootRecord(resources=mine).write(self._root.set_user_attr)
            return
        if recorded.gpus_per_experiment != mine.gpus_per_experiment:
            raise ResourceError(
                f"this tuning runs experiments on {recorded.gpus_per_experiment} GPU(s), but the launcher options "
                f"here give {mine.gpus_per_experiment}: pass --num_gpus/--num_nodes to match"
            )

    def _recorded(self) -> RootRecord:
        """The root study's record, read now."""
        return RootRecord.from_attrs(self._root.user_attrs)

    @property
    def _device_memory(self) -> float:
        """The first process's figure, read from the storage until it is there, then kept."""
        if self._recorded_memory is None:
            recorded = self._recorded().resources
            if recorded is None:
                return self._resources.device_memory
            self._recorded_memory = float(recorded.device_memory)
        return self._recorded_memory

    @property
    def root(self) -> optuna.Study:
        return self._root

    def _model_info(self) -> dict[str, Any]:
        given = self._user.autotuning.model_info or {}
        if given.get("num_params"):
            return {k: v for k, v in given.items() if k != "profile"}
        stored = self._recorded().model_info
        if stored:
            return {**given, **stored}
        if self._worker:
            return {**given, **self._wait_for_model_info()}
        experiment = self._builder.build_profile()
        lease = self._pool.acquire(self._stop, on_wait=self._log)
        assert lease is not None
        self._log(f"profile run: measuring the model ({experiment.result_dir})")
        timeout = self._plan.trial_timeout or _TIMEOUT_WITHOUT_PROFILE
        RootRecord(profile_run={"state": "running", **this_process()}).write(self._root.set_user_attr)
        try:
            result = self._runner.run(experiment, slot=lease.slot, slot_index=lease.index, timeout=timeout, pass_fds=lease.fds,
                                      on_retry=self._log)
        except BaseException as e:  # noqa: BLE001 - re-raised: workers waiting for the profile are told it ended
            RootRecord(profile_run={"state": "interrupted", "why": type(e).__name__}).write(self._root.set_user_attr)
            raise
        finally:
            self._pool.release(lease)
        if not result.ok:
            # The detail quotes the telling line where it has it (a script's failure): said once.
            cause = telling_line(result.stderr_tail)
            why = result.detail if not cause or cause[:200] in result.detail else f"{result.detail}: {cause}"
            error = ProfileError(
                f"the profile run failed ({result.reason.value if result.reason else 'error'}): {why} "
                f"-- see {experiment.result_dir}/stderr.log"
            )
            RootRecord(profile_run={"state": "failed", "why": str(error)}).write(self._root.set_user_attr)
            raise error
        # What the user gave (hidden_size, num_layers) stays; the profile adds what it measured.
        info = {**{k: v for k, v in given.items() if k != "profile" and v is not None},
                **{k: v for k, v in result.metrics.items() if k != "rank"}}
        RootRecord(model_info=info, profile_duration=round(result.duration, 3),
                   profile_end=datetime.datetime.now().isoformat(),
                   profile_run={"state": "finished"}).write(self._root.set_user_attr)
        return info

    def _wait_for_model_info(self) -> dict[str, Any]:
        """A worker started before the profile run finished waits for its result, at most
        ``wait`` seconds; a profile run stored as failed or interrupted, or whose process died
        on this host, ends the wait at once."""
        assert self._wait is not None  # a worker's
        self._log(f"waiting up to {self._wait:g} s for the profile run of the tuning's first process")
        deadline = time.monotonic() + self._wait
        while True:
            record = RootRecord.from_attrs(optuna.load_study(study_name=self._plan.study_name, storage=self._storage).user_attrs)
            if record.model_info:
                return dict(record.model_info)
            run, again = record.profile_run or {}, "run `optuna-ds tune` again, then this worker"
            if run.get("state") == "failed":
                raise ProfileError(f"tuning '{self._plan.study_name}': {run.get('why') or 'its profile run failed'}; {again}")
            ended = ("was interrupted" if run.get("state") == "interrupted"
                     else "was abandoned: its process died" if run.get("state") == "running" and dead(run) else None)
            if ended is not None:
                raise ProfileError(f"the profile run of tuning '{self._plan.study_name}' {ended}; {again}")
            if time.monotonic() >= deadline:
                raise ProfileError(f"the profile run of tuning '{self._plan.study_name}' has not ended after {self._wait:g} s: "
                                   "start the worker again once it has, or give a longer --wait")
            time.sleep(_PROFILE_POLL_SECONDS)

    def _timeout(self) -> float:
        if self._plan.trial_timeout:
            return self._plan.trial_timeout
        profile = self._recorded().profile_duration
        if profile is None:
            return _TIMEOUT_WITHOUT_PROFILE
        return max(_MIN_TIMEOUT, _TIMEOUT_PER_PROFILE * float(profile))

    def _estimate(self, stage: int, info: dict[str, Any], zero: dict[str, Any], *, autotp: int | None = None) -> MemoryEstimate:
        """The memory estimate of ``stage`` with ``zero``, AutoTP ``autotp`` (``None``: the user's
        own size): AutoTP splits the model states as model parallelism does, over fewer
        data-parallel ranks; of a sample's activations, the profile's (the whole model's), a
        tried size keeps from ``1/autotp`` up: whether one fits is the planner's to learn."""
        a = self._user.autotuning
        activation = info.get("activation_mem_per_gpu")
        return estimate_memory(
            stage=stage,
            num_params=int(info["num_params"]),
            trainable_params=info.get("trainable_num_params"),
            activation_per_sample=activation / autotp if activation and autotp else activation,
            device_memory=self._device_memory,
            num_gpus=self._resources.total_gpus,
            mp_size=a.mp_size * (self._builder.autotp.fixed_size if autotp is None else autotp),
            precision=self._user.precision,
            adam_type=self._user.adam_type_optimizer,
            zero=zero,
        )

    def _estimates(self, info: dict[str, Any]) -> dict[int, MemoryEstimate]:
        return {stage: self._estimate(stage, info, self._user.zero_section()) for stage in self._user.stages}

    def _mbs_cap(self, autotp: int | None = None) -> int:
        """The largest micro-batch size the config allows (with AutoTP ``autotp``: fewer
        data-parallel ranks take the global batch); what memory allows is the planner's."""
        cap = self._user.autotuning.max_train_micro_batch_size_per_gpu
        bound = self._builder.max_batch_per_gpu(autotp)
        return max(1, min(cap, bound) if bound else cap)

    def _context(self, observer: TuningObserver) -> StageContext:
        a = self._user.autotuning
        return StageContext(
            memory_limit=self._device_memory * (1.0 - self._plan.memory_margin),
            storage=self._storage,
            builder=self._builder,
            runner=self._runner,
            pool=self._pool,
            stop=self._stop,
            metric=a.tuned_metric,
            tuner_type=a.tuner_type,
            fast=a.fast,
            early_stopping=a.tuner_early_stopping,
            num_trials=a.tuner_num_trials,
            timeout=self._timeout(),
            observer=observer,
            ending_tune=(lambda: _live_ending(self._root)) if self._worker else (lambda: None),
            protected=lambda config: config.micro_batch == self._user.baseline_micro_batch_size,
        )

    def _distributions(self, stage: int, space: KnobSpace) -> dict[str, BaseDistribution]:
        """The params of ``stage``'s study, one distribution each for the whole study: every size
        and accumulation the tuning may run, every offload variant the stage may take."""
        a = self._user.autotuning
        bounds = [(self._builder.max_batch_per_gpu() or 1, self._builder.min_batch_per_gpu()),
                  *((high or 1, low) for _, high, low in self._builder.batch_bounds())]
        mbs_high = max([a.max_train_micro_batch_size_per_gpu, self._user.min_micro_batch_size, *(self._user.micro_batch_sizes or [])])
        gas_high = max(self._user.gradient_accumulation_steps, *(n for pair in bounds for n in pair))
        offloads = [""] + ([label for label in OFFLOAD_VARIANTS if stage == 3 or "param" not in label]
                           if stage >= 1 and not user_offloads(self._user.zero_section()) else [])
        sizes = self._builder.autotp.sizes if stage in AUTOTP_STAGES else ()
        return stage_distributions(mbs_high=mbs_high, gas_high=gas_high, offloads=offloads, space=space,
                                   checkpointing={**self._builder.checkpointing.tuned, **({AUTOTP_KNOB: list(sizes)} if sizes else {})})

    def _record_stage(self, stage: int, record: StageRecord) -> None:
        RootRecord(stages={stage: record}).write(self._root.set_user_attr)

    def _skip(self, stage: int, reason: str, estimate: MemoryEstimate, log: Callable[[str], None]) -> None:
        log(f"[z{stage}] skipped: {reason}")
        self._record_stage(stage, StageRecord(status="skipped", reason=reason, memory=estimate.to_dict()))

    def result(self) -> TuningResult:
        """The tuning as the storage records it: what finished, whatever interrupted the rest."""
        return load_result(self._storage, self._plan, self._user)

    def run(self) -> TuningResult:
        """Explore the stages, then return :meth:`result`. Interrupted, it still counts the time
        spent, and the storage keeps every finished experiment."""
        start = time.monotonic()
        try:
            try:
                info = self._model_info()
                # The planner's matrices have tens of rows: BLAS threads only contend with the
                # experiments for the cores (a fit took 76 ms instead of 2 ms on a loaded
                # machine). This process only: the experiments' own threads are theirs.
                with threadpool_limits(limits=1, user_api="blas"):
                    self._run_drivers(info)
            finally:
                self._peers.leave()
                if not self._worker:
                    # Wall time of the tuning across its resumed runs; workers only help within it.
                    elapsed = (self._recorded().elapsed or 0.0) + time.monotonic() - start
                    RootRecord(elapsed=round(elapsed, 3)).write(self._root.set_user_attr)
        except Exception:
            if self._deleted():
                raise TuningDeleted(f"tuning '{self._plan.study_name}' was deleted while this process ran it (`optuna-ds tune "
                                    "--overwrite` elsewhere?)") from None
            raise
        return self.result()

    def _say_timeouts_retried(self, stages: Mapping[int, StageExperiments], *, timeout: float | None) -> None:
        """Tell in one line which experiments that timed out under a shorter trial timeout than
        ``timeout`` (a resume with a longer --trial-timeout) may run again under it: the planner
        sees them as not run (:func:`~optuna_ds.domain.timed_out_sooner`)."""
        again: list[str] = []
        for experiments in stages.values():
            trials = experiments.study.get_trials(deepcopy=False)
            settled = {r.exp_name for t in trials if is_finished_experiment(t, timeout=timeout) and (r := ExperimentRecord.from_trial(t)).exp_name}
            again += sorted({name for t in trials if timed_out_sooner(t, timeout=timeout)
                             and (name := ExperimentRecord.from_trial(t).exp_name) and name not in settled})
        if again and timeout is not None:
            shown = ", ".join(again[:5]) + (f" and {len(again) - 5} more" if len(again) > 5 else "")
            self._log(f"{len(again)} experiment(s) that timed out under a shorter trial timeout may run again under "
                      f"{timeout:g} s: {shown}")

    def _deleted(self) -> bool:
        """Whether the tuning's root study is gone, or is another now (deleted, then started afresh)."""
        try:
            return self._storage.get_study_id_from_name(self._plan.study_name) != study_id(self._root)
        except KeyError:
            return True

    def _arms(self, info: dict[str, Any], estimates: dict[int, MemoryEstimate], spaces: dict[int, KnobSpace]) -> list[Arm]:
        """What the planner may explore: every listed stage that fits one sample by the
        profile's estimate, and where the user's config has no offload of its own, the optimizer
        offloaded to CPU (stages 1-3) and the parameters too (stage 3). Where the estimate leaves
        room for no sample anywhere, every variant whose model states fit (the estimate can be off
        by a factor; each is tried once, at the smallest size). A stage left out is recorded as
        skipped, with why."""
        zero = self._user.zero_section()
        variants: list[tuple[int, str, MemoryEstimate]] = []
        for stage in self._user.stages:
            variants.append((stage, "", estimates[stage]))
            if stage >= 1 and not user_offloads(zero):
                variants += [(stage, label, self._estimate(stage, info, {**zero, **offload_sections(label)}))
                             for label in OFFLOAD_VARIANTS if stage == 3 or "param" not in label]
        # AutoTP at the stages it is made for, without offload: the model states of each size.
        split = {(stage, ""): [(t, self._estimate(stage, info, zero, autotp=t)) for t in self._builder.autotp.sizes]
                 for stage in self._user.stages if stage in AUTOTP_STAGES}
        chosen = ([v for v in variants if v[2].fits or any(e.fits for _, e in split.get(v[:2], ()))]
                  or [v for v in variants if v[2].states_fit or any(e.states_fit for _, e in split.get(v[:2], ()))])
        for stage in self._user.stages:
            if any(s == stage for s, _, _ in chosen):
                continue
            e = estimates[stage]
            if any(s == stage and v.states_fit for s, _, v in variants):
                reason = (f"one sample's activations ({_humanize(e.activation_per_sample)}B by the profile) leave no room "
                          f"beside its {_humanize(e.instantiation)}B of model states")
            else:
                reason = (f"needs {_humanize(e.instantiation)}B per GPU for parameters, gradients and optimizer "
                          f"states, more than the {_humanize(e.device_memory)}B available")
            self._skip(stage, reason, e, self._log)
        return [Arm(stage=stage, offload=label, free=e.device_memory - e.instantiation, cap=self._mbs_cap(), buffers=e.buffers,
                    knobs=tuple((k, tuple(v)) for k, v in sorted(spaces[stage].with_offload(label).tuned.items())),
                    knob_defaults=Knobs(knob_defaults(spaces[stage].with_offload(label))),
                    autotp=tuple((t, x.device_memory - x.instantiation, self._mbs_cap(t))
                                 for t, x in split.get((stage, label), ()) if x.states_fit))
                for stage, label, e in chosen]

    def _problem(self, info: dict[str, Any], arms: list[Arm]) -> Problem:
        a = self._user.autotuning
        per_sample = info.get("activation_mem_per_gpu")
        return Problem(
            arms=tuple(arms),
            device_memory=self._device_memory,
            floor=a.min_train_micro_batch_size_per_gpu,
            sizes=tuple(self._user.micro_batch_sizes) if self._user.micro_batch_sizes else None,
            baseline=self._user.baseline_micro_batch_size,
            per_sample=float(per_sample) if per_sample else None,
            # "all" lists every stage, as DeepSpeed's: on one rank, where the planner would
            # expect nothing of a stage that partitions nothing, each is measured as if listed.
            explicit=not self._user.all_stages or self._builder.data_parallel_size == 1,
            max_batch=self._builder.max_batch_per_gpu(),
            min_batch=self._builder.min_batch_per_gpu(),
            accumulation=self._user.gradient_accumulation_steps,
            gpus=self._builder.data_parallel_size,
            knob_sizes=a.num_tuning_micro_batch_sizes,
            nodes=self._resources.nodes_per_experiment,
            params=float(info.get("num_params") or 0.0),
            checkpointing=tuple(self._builder.checkpointing.settings()),
            autotp=tuple(self._builder.autotp.settings()),
            autotp_batch=self._builder.batch_bounds(),
            hidden=int(info.get("hidden_size") or 0),
            # A training's length prices a launch in its time: the tuned metric must be its speed.
            train_samples=self._plan.train_samples if a.tuned_metric.name == "throughput" else None,
            # The knob search's trials come on top of the micro-batch search's.
            max_experiments=_MAX_EXPERIMENTS + (0 if a.fast else a.tuner_num_trials),
        )

    def _run_drivers(self, info: dict[str, Any]) -> None:
        """The planner's search on every GPU slot of this process (:class:`Coordinator`): slots
        lease their GPUs for each experiment, so the processes of one node share them."""
        a = self._user.autotuning
        device = Spend(device=device_kind()).noun
        self._log(
            f"model: {_humanize(info['num_params'])} parameters; "
            f"{_humanize(self._device_memory)}B memory per {device}; "
            f"{self._resources.total_gpus} {device}(s) per experiment, {self._pool.size} at once; metric {a.metric} ({a.tuned_metric.direction})"
        )
        estimates = self._estimates(info)
        spaces = {stage: build_knob_space(stage, self._user.zero_section(), fast=a.fast, hidden_size=info.get("hidden_size"),
                                          ranks=self._builder.data_parallel_size, ranks_per_node=self._resources.gpus_per_node)
                  for stage in self._user.stages}
        arms = self._arms(info, estimates, spaces)
        ctx = self._context(self._observer)
        stages: dict[int, StageExperiments] = {}
        for stage in dict.fromkeys(arm.stage for arm in arms):
            space = spaces[stage]
            experiments = StageExperiments(ctx=ctx, tuning=self._plan.study_name, stage=stage, space=space,
                                           distributions=self._distributions(stage, space))
            experiments.study.set_user_attr("memory", estimates[stage].to_dict())
            experiments.study.set_user_attr("model_info", info)
            experiments.study.set_user_attr("knob_space", space.to_dict())
            experiments.study.set_metric_names([a.metric])
            stages[stage] = experiments
        if not arms:
            return
        if not self._worker:
            set_ending(self._root, {})  # a resumed tune's search is open again
            RootRecord.reopen_choice(self._root.set_user_attr)
        zero = self._user.zero_section()

        def buffers(stage: int, offload: str, knobs: Mapping[str, Any]) -> float:
            return self._estimate(stage, info, {**zero, **(offload_sections(offload) if offload else {}), **knobs}).buffers

        knob_search = None if a.fast else KnobCandidates(ctx=ctx, spaces=spaces, buffers=buffers)
        coordinator = Coordinator(problem=self._problem(info, arms), stages=stages, ctx=ctx, root=self._root, knobs=knob_search,
                                  peers=self._peers, finishing=None if self._worker else functools.partial(self._alike_runs, stages=stages))
        for stage, experiments in stages.items():
            for t in experiments.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
                name = ExperimentRecord.from_trial(t).exp_name
                if t.value is not None and name is not None:
                    ctx.observer.resumed(stage=stage, name=name, value=t.value, metric=a.tuned_metric)
        self._say_timeouts_retried(stages, timeout=ctx.timeout)
        ended = False
        try:
            coordinator.run()
            if not self._worker and coordinator.decision is not None and coordinator.decision.done:
                # Tune ends the tuning (a claim of a worker that thought it decided stands down:
                # StageContext.ending_tune), so its choice and files are the last word.
                set_ending(self._root, this_process())
            ended = True
        finally:
            self._record_outcome(coordinator, stages, estimates, ended=ended)

    def _alike_runs(self, decision: Decision, stages: dict[int, StageExperiments], *, spare: int = 0) -> list[Proposal]:
        """The headline's two configs, the user's and the planner's choice, run side by side in
        pairs (on free slots at once; on one slot alternately) until each ran at least twice,
        their runs interleaved (the headline's rule for a factor, on one slot as on many): its
        figures must not rest on one run of the user's config taken first (cold, or beside other
        experiments) against the optimum's repeats taken otherwise. Once the planner is
        done; or, with ``spare`` slots (at least two) the search leaves free, beside the search,
        for its choice so far (a choice that changes gets a pair of its own at the end). Not the
        planner's decision: the choice stands; the decider queues them, and a resumed tuning
        finds these runs in the storage like any other. Returns none where none is needed."""
        if decision.choice is None or not (decision.done or spare >= 2) or self._stop.is_set():
            return []
        base = self.result().baseline
        if base is None or not base.name or base.stage is None or base.stage not in stages or base.status != "complete":
            return []
        base_config = next((r.config for t in stages[base.stage].study.get_trials(deepcopy=False)
                            if (r := ExperimentRecord.from_trial(t)).exp_name == base.name), None)
        chosen = decision.choice.config
        if base_config is None or base_config == chosen:
            return []

        def runs(config: Config) -> tuple[int, int]:
            """Its completed runs, and its launches and runs handed out (each names the next one's ``_r<n>``)."""
            trials = [t for t in stages[config.stage].study.get_trials(deepcopy=False)
                      if t.state != TrialState.PRUNED and ((r := ExperimentRecord.from_trial(t)).claimed and r.config == config
                                                           or not r.claimed and (h := handed(t)) is not None and h.config == config)]
            return sum(t.state == TrialState.COMPLETE for t in trials), len(trials)

        def under_way(config: Config) -> bool:
            return any(t.state in (TrialState.RUNNING, TrialState.WAITING) and (
                ExperimentRecord.from_trial(t).config == config or (h := handed(t)) is not None and h.config == config)
                for t in stages[config.stage].study.get_trials(deepcopy=False))

        claimed = [t for stage in stages.values() for t in stage.study.get_trials(deepcopy=False)
                   if t.datetime_start is not None and ExperimentRecord.from_trial(t).claimed]

        def starts(config: Config) -> list[datetime.datetime]:
            return [t.datetime_start for t in claimed if t.state == TrialState.COMPLETE and t.datetime_start is not None
                    and ExperimentRecord.from_trial(t).config == config]

        mine, its = starts(base_config), starts(chosen)
        alike = min(len(mine), len(its)) >= _ALIKE_RUNS and min(mine) < max(its) and min(its) < max(mine)
        # Each round adds a launch of the user's config: the storage bounds the rounds, so a
        # finished tuning run again launches nothing; a planner that changes its mind on these
        # runs gets its new choice measured alike too, and a run that fails is not tried for ever.
        if alike or chosen in self._measured_alike or runs(base_config)[1] > _ALIKE_ROUNDS \
                or {base_config, chosen} & {p.config for p in decision.proposals} or under_way(base_config) or under_way(chosen):
            return []
        self._measured_alike.add(chosen)
        pairs = max(1, _ALIKE_RUNS - min(len(mine), len(its)))
        if not decision.done:
            pairs = min(pairs, spare // 2)
        # The search over, the optimum's last run the tuning's last launch (its noise replicate,
        # say) and its second at least: a run of yours next is taken alike with it, and needs no
        # run of the optimum again.
        last = max(claimed, key=lambda t: t.datetime_start or datetime.datetime.min, default=None)
        adjacent = decision.done and len(its) >= _ALIKE_RUNS and len(mine) == _ALIKE_RUNS - 1 and last is not None \
            and last.state == TrialState.COMPLETE and ExperimentRecord.from_trial(last).config == chosen
        (_, base_launched), (_, chosen_launched) = runs(base_config), runs(chosen)
        if adjacent:
            self._log("measuring your config and the optimum alike: one run of yours after the optimum's last, for the headline")
            return [Proposal(config=base_config, repeat=base_launched, why="your config, measured alike with the optimum")]
        self._log(f"measuring your config and the optimum alike: side by side, {pairs} run(s) each, for the headline")
        proposals: list[Proposal] = []
        for i in range(min(pairs, _ALIKE_LAUNCHES // 2)):
            proposals += [Proposal(config=base_config, repeat=base_launched + i, why="your config, measured alike with the optimum"),
                          Proposal(config=chosen, repeat=chosen_launched + i, why="the optimum, measured alike with your config")]
        return proposals

    def _record_outcome(self, coordinator: Coordinator, stages: dict[int, StageExperiments],
                        estimates: dict[int, MemoryEstimate], *, ended: bool) -> None:
        """Each stage's status, the chosen config and the noise, on the root study. A stage left
        out and the choice are the planner's verdicts once its search ``ended``; interrupted,
        an unexplored stage is only not reached yet (unless a process whose search ended said more)."""
        observations = coordinator.observations()
        recorded = self._recorded().stages
        for stage in stages:
            mine = [o for o in observations if o.stage == stage]
            memory = estimates[stage].to_dict()
            if not mine:
                if ended:
                    why = "the planner expected no gain from it"
                    self._record_stage(stage, StageRecord(status="skipped", reason=why, memory=memory))
                elif stage not in recorded:
                    self._record_stage(stage, StageRecord(status="pending", reason="not reached yet", memory=memory))
                continue
            edge = max((o.mbs for o in mine if o.status is Status.OK and not o.knobs), default=0)
            offloads = tuple(sorted({o.config.offload for o in mine if o.offload}))
            self._record_stage(stage, StageRecord(status="tuned", memory=memory, max_runnable_micro_batch_size=edge,
                                                  offload=offloads))
        decision = coordinator.decision
        # The choice is tune's: a worker's decision may predate a later launch of tune's.
        if self._worker or not ended or decision is None or decision.choice is None or not decision.done:
            return
        c = decision.choice
        metric = self._user.autotuning.tuned_metric
        trials = [t for t in stages[c.stage].study.get_trials(deepcopy=False)
                  if t.state == TrialState.COMPLETE and t.value is not None
                  and (o := observation_of(t, metric=metric, dead={})) is not None and o.config == c.config]
        if not trials:
            return
        estimate = metric.rate(c.estimate)  # a rate back to the metric: its own inverse
        RootRecord(choice=ChoiceRecord(stage=c.stage, trial=trials[0].number, estimate=estimate,
                                       config=c.config, regret=decision.regret, level=metric.rate(c.measured))
                   ).write(self._root.set_user_attr)
        # Which configs a run cannot tell from the choice: what every view calls equivalent,
        # by the planner's one rule.
        equivalent = [e.name for e in decision.equivalent if e != c.config]
        set_verdict(self._root, equivalent=equivalent, noise=decision.noise)
        record_model_curves(self._root, coordinator.problem, observations)  # the report's model curve
        result = self.result()
        if result.best is not None:
            self._log(f"chosen: {result.best.name}: {result.best.figure(metric)}; {result.noise.phrase}")

