"""`make bench-planner`: the planner alone, on hundreds of simulated jobs, in seconds.

Each job of benchmarks/surfaces.py and the four generators (jobs.py, physical_jobs.py,
blind_jobs.py, and blind4_jobs.py, held out: never tuned against) is tuned by calling the planner (optuna_ds.planner.plan) and answering its
proposals from the surface -- no launcher, no storage -- with ``--slots`` experiments at once
(a finished one frees its slot in simulated time order). It prints the share of the optimum
the chosen config reaches (mean, 5th percentile, worst, share of jobs within 1%), launches and
GPU-hours against DeepSpeed's autotuner (its cached figures in benchmarks/deepspeed_figures.json,
those whose fingerprint still matches the job), and the planner's decision time. ``--replays``
adds the jobs of recorded real runs (benchmarks/replays.py): each is judged by whether its
choice is within the measured noise of the best recorded config. `make bench` measures the same
through the real CLI.
"""
from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

# The planner's matrices have tens of rows: BLAS threads only contend for the cores, and on a
# loaded machine they multiply a decision's time 5-30x. One thread each, unless set.
for _threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import physical_jobs  # noqa: E402
import replays  # noqa: E402
import search  # noqa: E402
import surfaces  # noqa: E402

import optuna  # noqa: E402
from optuna.study import StudyDirection  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from optuna_ds.planner import Arm  # noqa: E402
from optuna_ds.planner import Decision  # noqa: E402
from optuna_ds.planner import KnobSetting  # noqa: E402
from optuna_ds.planner import Observation  # noqa: E402
from optuna_ds.planner import PlannerSettings  # noqa: E402
from optuna_ds.planner import Priors  # noqa: E402
from optuna_ds.planner import Problem  # noqa: E402
from optuna_ds.planner import Proposal  # noqa: E402
from optuna_ds.planner import Status  # noqa: E402
from optuna_ds.planner import plan  # noqa: E402
from optuna_ds import samplers  # noqa: E402
from optuna_ds.config import AutotuningConfig  # noqa: E402
from optuna_ds.domain import Config  # noqa: E402
from optuna_ds.domain import Knobs  # noqa: E402
from optuna_ds.space import estimate_memory  # noqa: E402

GB = surfaces.GB
MAX_MBS = 1024
PROFILE_STEPS_S = 10.0


AUTOTUNING = AutotuningConfig()  # optuna-ds's defaults: tuner_early_stopping, tuner_num_trials, tuner_type


def knob_space(stage: int, *, spaces: dict = surfaces.SPACES) -> tuple[tuple[str, tuple], ...]:
    return tuple((k, tuple(v)) for k, v in sorted(spaces[stage].items()))


def knob_defaults(stage: int, *, spaces: dict = surfaces.SPACES, defaults: dict = surfaces.DEFAULTS) -> tuple[tuple[str, object], ...]:
    return tuple((k, True if stage == 3 and k == "overlap_comm" else defaults[k]) for k, _ in knob_space(stage, spaces=spaces))


def buffers_of(surface: surfaces.Surface, arm: Arm, knobs: tuple) -> float:
    """The setting's buffers as optuna-ds estimates them (DeepSpeed's docs), not as the job has them."""
    zero = dict(knobs)
    if arm.offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    return estimate_memory(stage=arm.stage, num_params=int(surface.params_b * GB), trainable_params=None,
                           activation_per_sample=surface.act_gb * GB, device_memory=surface.device_gb * GB,
                           num_gpus=surface.num_gpus, precision="fp16", adam_type=True, zero=zero).buffers


def problem_of(surface: surfaces.Surface, *, full: bool = False) -> Problem:
    """What optuna-ds would know of the job after its profile run; in full mode each arm with
    its knob space (the job's generator's: surfaces.spaces_of). A replayed job
    (benchmarks/replays.py) has the arms it recorded, and its batch cap bounds their sizes and
    sets their accumulation."""
    device = surface.device_gb * GB
    cap = getattr(surface, "max_mbs", None)
    recorded = getattr(surface, "recorded_arms", None)
    spaces, defaults = surfaces.spaces_of(surface)
    arms, states_fit = [], []
    variants = [(s, "", {}) for s in range(4)] + [(s, "offload-opt", {"offload_optimizer": {"device": "cpu"}}) for s in (1, 2, 3)] + [
        (3, "offload-opt-param", {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}),
    ]
    # A job whose script runs AutoTP and whose config lists its sizes (physical_jobs.AutotpJob):
    # at stages 0-2 without offload, each size's model states as optuna-ds estimates them.
    sizes = tuple(surface.sizes) if getattr(surface, "listed", False) else ()

    def estimate(stage: int, zero: dict, mp: int = 1):
        # As optuna-ds estimates a split config: the states split, a sample's activations from 1/mp up.
        return estimate_memory(stage=stage, num_params=int(surface.params_b * GB), trainable_params=None,
                               activation_per_sample=surface.act_gb * GB / mp, device_memory=device, num_gpus=surface.num_gpus,
                               mp_size=mp, precision="fp16", adam_type=True, zero=zero)

    for stage, label, zero in variants:
        if recorded is not None and (stage, bool(label), label == "offload-opt-param") not in recorded:
            continue
        e = estimate(stage, zero)
        split = [(t, estimate(stage, zero, t)) for t in sizes] if stage <= 2 and not label else []
        arm = Arm(stage=stage, offload=label, free=device - e.instantiation, cap=cap or MAX_MBS, buffers=e.buffers,
                  knobs=knob_space(stage, spaces=spaces) if full else (),
                  knob_defaults=knob_defaults(stage, spaces=spaces, defaults=defaults) if full else (),
                  autotp=tuple((t, device - x.instantiation, cap or MAX_MBS) for t, x in split if x.states_fit))
        if e.fits or any(x.fits for _, x in split):
            arms.append(arm)
        if e.states_fit or any(x.states_fit for _, x in split):
            states_fit.append(arm)
    # As optuna-ds does: where the profile's activation estimate leaves room nowhere, every
    # variant whose states fit.
    # A job whose script takes the checkpointing switch (physical_jobs.CheckpointJob): mapped, it is proposed.
    checkpointing = (Knobs({physical_jobs.CKPT: True}),) if getattr(surface, "switch", False) else ()
    return Problem(arms=tuple(arms or states_fit), device_memory=device, per_sample=surface.act_gb * GB, gpus=surface.num_gpus,
                   max_experiments=200 if full else 40, max_batch=cap, nodes=getattr(surface, "nodes", 1),
                   params=surface.params_b * GB, checkpointing=checkpointing,
                   autotp=tuple(Knobs({physical_jobs.AUTOTP: t}) for t in sizes), autotp_batch=tuple((t, cap, 1) for t in sizes))


def config_of(stage: int, offload: str, mbs: int, knobs: tuple = ()) -> surfaces.Config:
    """The surface's config of a planner's: its sizes written as its spaces write them (``5e8``, a
    float; the planner's are ints), since a surface seeds its noise with its config's text."""
    knobs = tuple((k, float(v) if type(v) is int else v) for k, v in knobs)
    return surfaces.Config(stage=stage, mbs=mbs, knobs=knobs, offload_optimizer=bool(offload),
                           offload_param=offload == "offload-opt-param")


def knob_candidates(surface: surfaces.Surface, problem: Problem, observations: list[Observation], noise: float | None,
                   tuner: str) -> dict:
    """What optuna-ds hands the planner: at each arm whose knob search is not over, the settings
    the ``tuner`` sampler proposes after the arm's knob runs (optuna_ds.samplers.knob_candidates)
    and those that ran. ``tuner_early_stopping`` knob runs in a row that did not beat the
    stage's best by the noise, or ``tuner_num_trials`` of them, end a stage's search (as
    optuna-ds's pruner does)."""
    out = {}
    for arm in problem.arms:
        space = dict(arm.knobs)
        if not space:
            continue
        runs = [o for o in observations if o.stage == arm.stage and o.status is not Status.RUNNING]
        best, since, trials = None, 0, 0
        for o in runs:
            value = o.score if o.status is Status.OK else None
            if o.knobs and not o.repeat:
                trials += 1
                since = 0 if value is not None and (best is None or value > best * (1.0 + (noise or 0.0))) else since + 1
            if value is not None and (best is None or value > best):
                best = value
        if since >= AUTOTUNING.tuner_early_stopping or trials >= AUTOTUNING.tuner_num_trials:
            continue
        mine = [o for o in runs if o.arm == arm.key and o.knobs and not o.repeat]
        distributions = {k: optuna.distributions.CategoricalDistribution(list(v)) for k, v in space.items()}
        frozen = [optuna.trial.create_trial(params=dict(o.knobs), distributions=distributions,
                                            value=o.score if o.status is Status.OK else None,
                                            state=TrialState.COMPLETE if o.status is Status.OK else TrialState.FAIL,
                                            user_attrs={} if o.status is Status.OK else {"reason": "oom" if o.status is Status.OOM else "error"})
                  for o in mine]
        size = math.prod(len(v) for v in space.values())
        proposed = samplers.knob_candidates(tuner, space, frozen, direction=StudyDirection.MAXIMIZE, seed=arm.stage,
                                            limit=size if tuner == "gridsearch" else 12)
        settings = list(dict.fromkeys([o.knobs for o in mine] + [tuple(sorted(p.items())) for p in proposed]))
        out[arm.key] = [KnobSetting(knobs, buffers_of(surface, arm, knobs)) for knobs in settings]
    return out


def peak_memory(surface: surfaces.Surface, config: surfaces.Config, nonce: int) -> float:
    """What NVML would report as a run's peak: the memory it needs, and up to 2% more that the
    caching allocator reserves."""
    if hasattr(surface, "peak_memory_gb"):
        return surface.peak_memory_gb(config, nonce) * GB
    rng = random.Random(f"{surface.name}|{config}|{nonce}|memory")
    return surface.memory_gb(config) * GB * (1.0 + rng.uniform(0.0, 0.02))


def tune(surface: surfaces.Surface, *, slots: int, processes: int = 0, trace: bool = False, memory: bool = False,
         settings: PlannerSettings = PlannerSettings(), full: bool = False, tuner: str = AUTOTUNING.tuner_type) -> dict:
    """The planner's tuning of ``surface`` with ``slots`` experiments at once; with ``memory``,
    each run reports its peak memory, as runs on NVIDIA GPUs do; with ``full``, the knobs too.

    With ``processes``, that many optuna-ds processes of ``slots`` slots each, sharing one storage
    as ``tune`` and its workers do (optuna_ds/studies/_coordinator.py): each free slot asks the
    planner for one experiment (``free_slots=1``), seeing every process's experiments under way
    and its own process's proposals not yet claimed. Processes with a slot free at one instant
    decide at once, none seeing the others' proposals of that instant; of two claims of one
    experiment the first (in process order) runs and the other stands down, its slot deciding
    again once the claim is in the storage. A slot with nothing to start decides again when an
    experiment ends anywhere (a Coordinator polls within seconds). Without ``processes``, one
    decision fills every free slot (``free_slots``)."""
    problem = problem_of(surface, full=full)
    noise = None
    observations: list[Observation] = []
    running: list[tuple[float, int, Observation, int]] = []  # (end time, tie, observation when done, process)
    now, launches, oom, gpu_s, decisions = 0.0, 1, 0, (surface.startup_s + PROFILE_STEPS_S) * surface.num_gpus, []
    nonce = knob_launches = lever_launches = checkpointing_launches = autotp_launches = stood_down = 0
    curve: list[tuple[int, float]] = []  # (launches so far, true throughput of the choice then)
    held: list[tuple[float, float]] = []  # (simulated seconds, true throughput of the choice then)
    kinds: list[tuple[str, str]] = []  # each launch's kind (launch_kind) and outcome
    configs: list[surfaces.Config] = []  # each launch's config, in launch order
    spans: list[tuple[float, float]] = []  # each launch's (start, end), simulated seconds
    owners: list[int] = []  # each launch's process
    claimed: set[tuple[Config, int]] = set()  # (config, repeat) of every experiment launched

    def decide(seen: list[Observation], free: int) -> Decision:
        nonlocal noise
        t0 = time.perf_counter()
        candidates = knob_candidates(surface, problem, observations, noise, tuner) if full else None
        decision = plan(problem, seen, free_slots=free, settings=settings, knob_candidates=candidates)
        noise = decision.noise
        decisions.append(time.perf_counter() - t0)
        if decision.choice is not None:
            c = decision.choice
            curve.append((launches, surface.evaluate(config_of(c.stage, c.offload, c.mbs, c.knobs)).throughput))
            held.append((now, curve[-1][1]))
        return decision

    def launch(p: Proposal, process: int, decision: Decision) -> None:
        nonlocal nonce, launches, knob_launches, checkpointing_launches, autotp_launches, lever_launches, oom, gpu_s
        assert (p.config, p.repeat) not in claimed, f"{p.config} (repeat {p.repeat}) launched twice"
        claimed.add((p.config, p.repeat))
        config = config_of(p.stage, p.offload, p.mbs, p.knobs)
        outcome = surface.evaluate(config)
        nonce += 1
        status = {"ok": Status.OK, "oom": Status.OOM, "crash": Status.FAILED}[outcome.kind]
        score = surface.measure(config, nonce) if status is Status.OK else None
        peak = peak_memory(surface, config, nonce) if memory and status is Status.OK else None
        # DeepSpeed's step timers, where the job simulates them (physical_jobs): what a lever can save.
        timers = tuple(surface.timers_ms(config).items()) if status is Status.OK and hasattr(surface, "timers_ms") else ()
        done = Observation(config=p.config, status=status, score=score, seconds=outcome.seconds, memory=peak, repeat=p.repeat,
                           timers=timers)
        if trace:
            print(f"  {now / 60:6.1f} min {p.stage}{p.offload[:12]:>12} mbs {p.mbs:5d} {_knobs(p.knobs)} -> {status.value:6} {score or 0:9.3f} true "
                  f"{outcome.throughput:9.3f}  ({p.why}; noise {decision.noise}){f'  [process {process}]' if processes > 1 else ''}")
        kinds.append((launch_kind(p, observations + [r[2] for r in running]), status.value))
        configs.append(config)
        owners.append(process)
        heapq.heappush(running, (now + outcome.seconds, nonce, done, process))
        spans.append((now, now + outcome.seconds))
        launches += 1
        knob_launches += bool(p.knobs.zero)
        checkpointing_launches += bool(p.knobs.checkpointing)
        autotp_launches += p.knobs.autotp > 1
        lever_launches += any(k in physical_jobs.LEVER_DEFAULTS and v != physical_jobs.LEVER_DEFAULTS[k] for k, v in p.knobs)
        oom += status is Status.OOM
        gpu_s += outcome.seconds * surface.num_gpus

    while True:
        if not processes:
            decision = decide(observations + running_view(running, now), slots - len(running))
            for p in decision.proposals:
                launch(p, 0, decision)
        else:
            while True:
                # The storage as every process reads it at this instant; each decides for its own free slots.
                stored = observations + running_view(running, now)
                asked: list[tuple[int, Proposal, Decision]] = []
                # The planner is a pure function: processes that hold the same proposals decide alike (computed once).
                alike: dict[tuple[tuple[Config, int], ...], Decision] = {}
                for process in range(processes):
                    handed: list[Observation] = []
                    for _ in range(slots - sum(r[3] == process for r in running)):
                        key = tuple((o.config, o.repeat) for o in handed)
                        decision = alike[key] if key in alike else alike.setdefault(key, decide(stored + handed, 1))
                        if not decision.proposals:
                            break
                        p = decision.proposals[0]
                        handed.append(Observation(config=p.config, status=Status.RUNNING, repeat=p.repeat, seconds=0.0))
                        asked.append((process, p, decision))
                lost = 0
                for process, p, decision in asked:
                    if (p.config, p.repeat) in claimed:
                        lost += 1  # another process claimed it first: this one stands down
                    else:
                        launch(p, process, decision)
                stood_down += lost
                if not lost:
                    break
        if not running:
            break
        end, _, done, _ = heapq.heappop(running)
        now = end
        observations.append(done)
    choice = decision.choice
    chosen = config_of(choice.stage, choice.offload, choice.mbs, choice.knobs) if choice else None
    # The best config that ran, by its true throughput: what a choice among the runs could reach.
    ran = {o.config for o in observations if o.status is Status.OK}
    best_ran = max((surface.evaluate(config_of(c.stage, c.offload, c.micro_batch, c.knobs)).throughput for c in ran), default=0.0)
    return {"launches": launches, "knob_launches": knob_launches, "lever_launches": lever_launches,
            "checkpointing_launches": checkpointing_launches, "autotp_launches": autotp_launches, "oom": oom, "gpu_hours": gpu_s / 3600, "wall_s": now,
            "true": surface.evaluate(chosen).throughput if chosen else 0.0, "chosen": chosen,
            "noise": decision.noise if decision.noise_runs else None, "noise_dof": decision.noise_runs, "decision_s": decisions, "curve": curve,
            "kinds": kinds, "configs": configs, "observations": observations, "best_ran": best_ran, "spans": spans,
            "owners": owners, "stood_down": stood_down, "held": held}


KINDS = ("first run", "size", "knobs", "checkpointing", "autotp", "noise replicate", "re-measure", "fallback", "listed", "pending", "batch")


def launch_kind(p, before: list[Observation]) -> str:
    """What a proposal is, by its ``why`` and what ran before it: an arm's first run, another
    size of an arm, a knob setting, the noise replicate, a re-measurement of a finalist, a
    size or stage the user listed, a fallback (a first run again while nothing ran), one while the
    first results are pending, a batch member."""
    if p.why.startswith("a slot free"):
        return "batch"
    if p.why.startswith("measure again: the run-to-run noise"):
        return "noise replicate"
    if p.repeat or p.why.startswith("measure again"):
        return "re-measure"
    if p.why.startswith(("a stage you listed", "a size you listed", "your micro-batch")):
        return "listed"
    if p.why.startswith("while the first"):
        return "pending"
    if p.why.startswith("the size expected to run fastest") and before:
        return "fallback"
    if p.knobs.checkpointing:
        return "checkpointing"
    if p.knobs.autotp > 1:
        return "autotp"
    if p.knobs:
        return "knobs"
    return "size" if any(o.arm == p.arm for o in before) else "first run"


def _knobs(knobs: tuple) -> str:
    return ",".join(f"{''.join(w[0] for w in k.split('_'))}={v:g}" if type(v) in (int, float) else f"{''.join(w[0] for w in k.split('_'))}={v}"
                    for k, v in knobs)


def running_view(running: list[tuple[float, int, Observation, int]], now: float) -> list[Observation]:
    """The experiments under way as the planner sees them: running, for so many seconds."""
    return [Observation(config=o.config, status=Status.RUNNING, repeat=o.repeat, seconds=now - (e - (o.seconds or 0.0)))
            for e, _, o, _ in running]


def _within_half_to_twice(dof: int) -> float:
    """The chance that a standard deviation estimated with ``dof`` degrees of freedom lies within
    0.5x-2x of the truth: ``dof * s**2 / sigma**2`` is chi-square with ``dof`` degrees."""
    if dof <= 0:
        return 0.0
    from scipy.stats import chi2

    return float(chi2.cdf(4.0 * dof, dof) - chi2.cdf(0.25 * dof, dof))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--random", type=int, default=200, metavar="N")
    parser.add_argument("--first", type=int, default=0, metavar="SEED", help="the first random job's seed")
    parser.add_argument("--physical", type=int, default=0, metavar="N",
                        help="also N jobs of the second, independent generator (benchmarks/physical_jobs.py), and its hand-made ones")
    parser.add_argument("--replays", action="store_true", help="also the jobs of recorded real runs (benchmarks/replays.py)")
    parser.add_argument("--blind", type=int, default=0, metavar="N",
                        help="also N jobs of the third, blind generator (benchmarks/blind_jobs.py)")
    parser.add_argument("--blind4", type=int, default=0, metavar="N",
                        help="also N jobs of the fourth, blind generator (benchmarks/blind4_jobs.py): the held-out set")
    parser.add_argument("--checkpointing", type=int, default=0, metavar="N",
                        help="only the checkpointing table: N jobs of each family (physical_jobs.checkpoint_job), fast mode, "
                             "the switch off, on, and on without the gate")
    parser.add_argument("--levers", type=int, default=0, metavar="N",
                        help="only the lever table: N jobs of each ZeRO++ family (physical_jobs.lever_job), full mode, levers on and off")
    parser.add_argument("--autotp", type=int, default=0, metavar="N",
                        help="only the AutoTP table: N jobs of each family (physical_jobs.autotp_job), fast mode, "
                             "AutoTP unlisted, listed, and listed without the gate")
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--processes", type=int, default=0, metavar="N",
                        help="N optuna-ds processes of --slots slots each on one storage, as tune and its workers: each "
                             "free slot asks the planner for one experiment; processes free at one instant decide at once "
                             "and a config two of them claim runs once (see tune())")
    parser.add_argument("--versus", type=int, default=0, metavar="SLOTS",
                        help="also tune each job with SLOTS slots in one process: the simulated wall time to the stop with "
                             "them over --slots' (the speed-up), and their share of the optimum")
    parser.add_argument("--jobs", nargs="*", help="only these jobs")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--full", action="store_true", help="full mode: the knobs too")
    parser.add_argument("--tuner", default=AUTOTUNING.tuner_type, choices=["gridsearch", "random", "model_based"],
                        help="full mode's tuner_type: where the knob settings come from")
    parser.add_argument("--memory", action="store_true", help="runs report their peak memory, as on NVIDIA GPUs (NVML)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a field of optuna_ds.planner.PlannerSettings (min_gain, noise_after, max_remeasures, ...) "
                             "or of its priors (priors.knob_cause, priors.pressure_losses=0.1,0.3, ...) for a what-if")
    parser.add_argument("--audit", action="store_true",
                        help="where the launches go: per job and group, by kind and outcome; whether a config within 1%% ran "
                             "and was chosen; the costliest and worst jobs; with --full, the regret split between the arm "
                             "chosen and the knobs and size within it, and the jobs whose best arm wins only with its knobs")
    parser.add_argument("--curve", action="store_true",
                        help="the share of the optimum after each number of launches, and per generator within each budget of "
                             "DeepSpeed's launches of the job (BUDGETS); with --set min_gain=0: never stopping")
    args = parser.parse_args()
    settings = PlannerSettings()
    for item in args.set:
        name, _, value = item.partition("=")
        group, _, field = name.rpartition(".")
        owner: PlannerSettings | Priors | None = {"": settings, "priors": settings.priors}.get(group)
        current = getattr(owner, field, None)
        if owner is None or not isinstance(current, (int, float, tuple)):
            parser.error(f"--set: optuna_ds.planner.PlannerSettings has no number or tuple of numbers {name}")
        try:
            new = _setting(current, value)
        except (TypeError, ValueError):
            parser.error(f"--set {name}: not {'numbers' if isinstance(current, tuple) else 'a number'}: {value}")
        changed = dataclasses.replace(owner, **{field: new})
        settings = changed if isinstance(changed, PlannerSettings) else dataclasses.replace(settings, priors=changed)
    if args.checkpointing:
        _checkpointing_table(args.checkpointing, slots=args.slots, memory=args.memory, settings=settings)
        return
    if args.levers:
        _lever_table(args.levers, slots=args.slots, memory=args.memory, settings=settings, tuner=args.tuner)
        return
    if args.autotp:
        _autotp_table(args.autotp, slots=args.slots, memory=args.memory, settings=settings)
        return
    names = args.jobs or ([s.name for s in surfaces.SURFACES] + [f"random-{i}" for i in range(args.first, args.first + args.random)]
                          + ([j.name for j in physical_jobs.PHYSICAL_JOBS] if args.physical else [])
                          + [f"phys-{i}" for i in range(args.first, args.first + args.physical)]
                          + [f"blind-{i}" for i in range(args.first, args.first + args.blind)]
                          + [f"blind4-{i}" for i in range(args.first, args.first + args.blind4)]
                          + ([job.name for job in replays.replays()] if args.replays else []))
    mode = "full" if args.full else "fast"
    ds = deepspeed_figures(names, fast=not args.full)
    rows = []
    for name in names:
        surface = surfaces.by_name(name)
        arms = surface.arm_optima(fast=not args.full, offload=True)
        best, optimum = surfaces.optimum_of(arms)
        if not optimum:
            continue
        r = tune(surface, slots=args.slots, processes=args.processes, trace=args.trace, memory=args.memory, settings=settings,
                 full=args.full, tuner=args.tuner)
        r["optimum"] = optimum
        if args.audit and args.full:
            r["arm_optima"], r["default_optima"] = arms, surface.arm_optima(fast=True, offload=True)
            r["num_gpus"] = surface.num_gpus
        r["true_noise"] = surface.noise
        gap = surfaces.closest_arm_gap(arms)
        r["ceiling"] = surfaces.within_1pc_ceiling(gap, surface.noise, r["launches"])
        if name in ds:
            r["ceiling_ds"] = {k: surfaces.within_1pc_ceiling(gap, surface.noise, int(k * ds[name]["launches"])) for k in (0.35, 0.5, 1.0)}
        share = r["true"] / optimum
        if args.versus:
            other = tune(surface, slots=args.versus, processes=1 if args.processes else 0, memory=args.memory, settings=settings,
                         full=args.full, tuner=args.tuner)
            r["versus"] = {"wall_s": other["wall_s"], "share": other["true"] / optimum, "launches": other["launches"],
                           "spans": other["spans"]}
        rows.append((name, share, r))
        if args.verbose or share < 0.99:
            print(f"{name}: {share:.3f} launches {r['launches']} (ds {ds.get(name, {}).get('launches', '?')}) "
                  f"chose {r['chosen']} optimum {best}", flush=True)
    if args.curve:
        _curve([r for n, _, r in rows if n.startswith("random")])
        _budget_curve(rows, ds)
    if args.audit:
        _audit(rows, ds)
    hand = {s.name for s in surfaces.SURFACES}
    physical_hand = {j.name for j in physical_jobs.PHYSICAL_JOBS}
    replayed = [r for r in rows if r[0].startswith(replays.PREFIX)]
    if replayed:
        _replay_summary(replayed, ds, mode)
    for label, group in (("hand-made", [r for r in rows if r[0] in hand]),
                         ("random", [r for r in rows if r[0].startswith("random-")]),
                         ("physical hand-made", [r for r in rows if r[0] in physical_hand]),
                         ("physical", [r for r in rows if r[0].startswith("phys-") and r[0] not in physical_hand]),
                         ("blind", [r for r in rows if r[0].startswith("blind-")]),
                         ("blind4 (held out)", [r for r in rows if r[0].startswith("blind4-")])):
        if group:
            _summary(label, group, ds, args.slots)
            if args.versus:
                _speedup(group, slots=args.slots, versus=args.versus, processes=args.processes)


def _lever_table(n: int, *, slots: int, memory: bool, settings: PlannerSettings, tuner: str) -> None:
    """What the levers buy and cost: each job of the ZeRO++ families tuned in full mode with
    DeepSpeed's autotuner's space (levers off), with the space optuna-ds proposes (on), and with
    it but no physical prior (each lever a bucket knob's like: what the priors save); each
    choice's share of the larger space's optimum, its launches and those that set a lever."""
    from unittest import mock

    import optuna_ds.planner._state as planner_state

    print("family     levers      jobs  larger/smaller optimum  share of the larger: mean  within 1%  launches  knob  lever")
    for family in physical_jobs.LEVER_FAMILIES:
        jobs = [physical_jobs.lever_job(family, i) for i in range(n)]
        larger = [job.optimum(fast=False, offload=True)[1] for job in jobs]
        smaller = [physical_jobs.lever_job(family, i, levers=False).optimum(fast=False, offload=True)[1] for i in range(n)]
        worth = statistics.mean(a / b for a, b in zip(larger, smaller))
        for label in ("off", "on", "on, flat"):
            flat = mock.patch.object(planner_state, "lever_effects", lambda *a, **k: {}) if label == "on, flat" else mock.MagicMock()
            with flat:
                runs = [tune(job if label != "off" else physical_jobs.lever_job(family, i, levers=False), slots=slots, memory=memory,
                             settings=settings, full=True, tuner=tuner) for i, job in enumerate(jobs)]
            shares = [r["true"] / best for r, best in zip(runs, larger)]
            print(f"{family:10} {label:10} {n:5d}  {worth:22.3f}  {statistics.mean(shares):25.4f} {sum(x >= 0.99 for x in shares) / n:10.0%}"
                  f"  {statistics.mean(r['launches'] for r in runs):8.1f} {statistics.mean(r['knob_launches'] for r in runs):5.1f} "
                  f"{statistics.mean(r['lever_launches'] for r in runs):6.1f}")


def _checkpointing_table(n: int, *, slots: int, memory: bool, settings: PlannerSettings) -> None:
    """What activation checkpointing buys and costs: each job of the checkpointing families
    tuned in fast mode without the switch (DeepSpeed's autotuner's space), with it (the switch
    mapped: optuna-ds proposes it), and with it but no gate (tried wherever memory binds,
    whatever the curve's rise: what the gate saves); each choice's share of the larger space's
    optimum, its launches and those that set it, and how often the larger optimum checkpoints."""
    _room_table(n, slots=slots, memory=memory, settings=settings, dimension="checkpointing", families=physical_jobs.CHECKPOINT_FAMILIES,
                job=lambda family, i, on: physical_jobs.checkpoint_job(family, i, switch=on), labels=("off", "on", "on, no gate"),
                widths=(11, 13, 5))


def _autotp_table(n: int, *, slots: int, memory: bool, settings: PlannerSettings) -> None:
    """What AutoTP buys and costs: each job of the AutoTP families tuned in fast mode without it
    (DeepSpeed's autotuner's space), with its sizes listed (the planner prices each), and listed
    but without the gate (tried wherever memory binds, whatever the curve's rise: what the gate
    saves); each choice's share of the larger space's optimum, its launches and those with
    AutoTP, and how often the larger optimum splits its layers."""
    _room_table(n, slots=slots, memory=memory, settings=settings, dimension="autotp", families=physical_jobs.AUTOTP_FAMILIES,
                job=lambda family, i, on: physical_jobs.autotp_job(family, i, listed=on), labels=("off", "listed", "listed, no gate"),
                widths=(10, 15, 4))


def _room_table(n: int, *, slots: int, memory: bool, settings: PlannerSettings, dimension: str, families: Sequence[str],
                job: Callable[[str, int, bool], surfaces.Surface], labels: tuple[str, str, str], widths: tuple[int, int, int]) -> None:
    """The table of a setting that buys room (checkpointing, AutoTP): each family's jobs tuned
    without it (``labels[0]``), with it (``labels[1]``), and with it but no gate (``labels[2]``:
    :func:`~optuna_ds.planner._checkpointing.may_pay` always true); ``widths`` of the family,
    label and jobs columns; launches that set it counted by ``tune()``'s ``{dimension}_launches``."""
    from unittest import mock

    import optuna_ds.planner._state as planner_state

    family_w, label_w, jobs_w = widths
    print(f"{'family':{family_w}} {dimension:{family_w + 2}}  jobs  it wins  larger/smaller optimum  share of the larger: mean  min  within 1%  "
          "launches  with it")
    for family in families:
        jobs = [job(family, i, True) for i in range(n)]
        optima = [j.optimum(fast=True, offload=True) for j in jobs]
        plain = [job(family, i, False) for i in range(n)]
        smaller = [j.optimum(fast=True, offload=True)[1] for j in plain]
        wins = sum(bool(c is not None and c.knobs) for c, _ in optima)
        worth = statistics.mean(a / b if b else float("inf") for (_, a), b in zip(optima, smaller))
        worth_text = f"{worth:22.3f}" if math.isfinite(worth) else f"{'inf (some fit only so)':>22}"
        for label in labels:
            gate = mock.patch.object(planner_state, "may_pay", lambda *a, **k: True) if label == labels[2] else mock.MagicMock()
            with gate:
                runs = [tune(j if label != labels[0] else plain[i], slots=slots, memory=memory, settings=settings)
                        for i, j in enumerate(jobs)]
            shares = [r["true"] / best for r, (_, best) in zip(runs, optima)]
            print(f"{family:{family_w}} {label:{label_w}} {n:{jobs_w}d} {wins:8d}  {worth_text}  {statistics.mean(shares):25.4f} "
                  f"{min(shares):5.3f} {sum(x >= 0.99 for x in shares) / n:10.0%}  {statistics.mean(r['launches'] for r in runs):8.1f}"
                  f" {statistics.mean(r[f'{dimension}_launches'] for r in runs):8.1f}")


def deepspeed_figures(names: list[str], *, fast: bool, path: Path = search.DS_CACHE) -> dict[str, dict]:
    """DeepSpeed's cached figures of these jobs in this mode, those whose fingerprint
    (search.fingerprint) still matches the job; it says how many were refused as stale."""
    mode = "fast" if fast else "full"
    cached: dict[str, dict[str, dict]] = {}
    for key, figures in json.loads(path.read_text()).items():
        name, entry_mode, stamp = key.split("|")
        if entry_mode == mode:
            cached.setdefault(name, {})[stamp] = figures
    figures, stale = {}, 0
    for name in names:
        if name not in cached:
            continue
        current = cached[name].get(search.fingerprint(surfaces.by_name(name), fast=fast))
        if current is None:
            stale += 1
        else:
            figures[name] = current
    print(f"DeepSpeed's figures ({mode}): {len(figures)} of {len(names)} jobs cached; {stale} stale entries refused "
          "(the job changed since they ran: `benchmarks/search.py --only-deepspeed` runs them again)")
    return figures


def _replay_summary(rows: list[tuple[str, float, dict]], ds: dict, mode: str) -> None:
    """The jobs of recorded real runs: a line each, then the group's (the targets' figures:
    median launches per job, profile included; the share of jobs whose choice is within one
    run's noise of the best recorded config), DeepSpeed's on the same jobs beside them."""
    ours, theirs = [], []
    for name, share, r in rows:
        job = replays.by_name(name)
        ok = job.within_noise(r["true"])
        ours.append((r["launches"], ok, share))
        reported = "none" if r["noise"] is None else f"{r['noise']:.1%}"
        line = (f"  {name}: {r['launches']} launches, {r['wall_s'] / 60:.1f} min, chose {search.describe(r['chosen'])} "
                f"{share:.3f} of the best ({'within' if ok else 'outside'} its noise {job.noise:.1%}, reported {reported}; "
                f"start-up {job.startup_s:.0f} s)")
        if name in ds and ds[name].get("chosen"):
            d = ds[name]
            d_ok = job.within_noise(d["true"])
            theirs.append((name, d["launches"], d_ok, d["true"] / r["optimum"], r["launches"]))
            line += f"; DeepSpeed {d['launches']} launches, {d['true'] / r['optimum']:.3f} ({'within' if d_ok else 'outside'})"
        print(line)
    print(f"replay jobs {len(rows)} ({mode}): median {statistics.median(n for n, _, _ in ours):g} launches per job (profile included), "
          f"within noise of the best recorded config on {sum(ok for _, ok, _ in ours) / len(ours):.0%}, "
          f"mean {statistics.mean(s for _, _, s in ours):.4f} of the best; noise reported within 0.5x-2x of the measured on "
          f"{sum(r['noise'] is not None and 0.5 <= r['noise'] / r['true_noise'] <= 2.0 for _, _, r in rows) / len(rows):.0%}", end="")
    if theirs:
        print(f"; DeepSpeed on {len(theirs)} of them: median {statistics.median(n for _, n, _, _, _ in theirs):g} launches, "
              f"within noise on {sum(ok for _, _, ok, _, _ in theirs) / len(theirs):.0%}, mean {statistics.mean(s for *_, s, _ in theirs):.4f}; "
              f"launches {sum(o for *_, o in theirs) / sum(n for _, n, _, _, _ in theirs):.2f}x of DeepSpeed's", end="")
    print()


def _setting(current: object, value: str) -> object:
    """``value`` as the type of the setting it replaces; a tuple comma-separated, each value of
    the type of the one it replaces (``pressure_onset=0.6,0.98,13``), floats where the length
    changes (``pressure_losses=0.1,0.3``)."""
    if not isinstance(current, tuple):
        return type(current)(value)
    parts = value.split(",")
    if not all(isinstance(v, (int, float)) for v in current):
        raise TypeError(value)
    return tuple(type(v)(x) for v, x in zip(current, parts)) if len(parts) == len(current) else tuple(float(x) for x in parts)


def _audit(rows: list[tuple[str, float, dict]], ds: dict) -> None:
    """Launches per job by kind (launch_kind) and by outcome, per group; then the jobs that spend
    most beside DeepSpeed and the worst chosen, each with its launches by kind."""
    groups = {"random": "random-", "physical": "phys-", "blind": "blind-", "blind4": "blind4-", "replays": replays.PREFIX}
    hand = {j.name for j in physical_jobs.PHYSICAL_JOBS}  # the generated jobs only, as the summaries count them
    print("launches per job  " + " ".join(f"{k:>9.9}" for k in ("profile",) + KINDS) + "      oom    crash    total")
    for label, prefix in groups.items():
        group = [r for n, _, r in rows if n.startswith(prefix) and n not in hand]
        if not group:
            continue
        by = {k: statistics.mean(sum(kind == k for kind, _ in r["kinds"]) for r in group) for k in KINDS}
        oom = statistics.mean(sum(s == "oom" for _, s in r["kinds"]) for r in group)
        crash = statistics.mean(sum(s == "failed" for _, s in r["kinds"]) for r in group)
        total = statistics.mean(r["launches"] for r in group)
        print(f"{label:17} " + " ".join(f"{v:9.2f}" for v in [1.0] + list(by.values())) + f" {oom:8.2f} {crash:8.2f} {total:8.2f}")
        # Of the first runs and sizes, the share that ran out of memory.
        for k in ("first run", "size"):
            n = sum(kind == k for r in group for kind, _ in r["kinds"])
            o = sum(kind == k and s == "oom" for r in group for kind, s in r["kinds"])
            print(f"  {k}: {o} of {n} ran out of memory", end="")
        print()
        # The search against the choice: a config within 1% that ran, against one chosen.
        ran = sum(r["best_ran"] >= 0.99 * r["optimum"] for r in group) / len(group)
        chose = sum(r["true"] >= 0.99 * r["optimum"] for r in group) / len(group)
        print(f"  within 1%: a config that ran on {ran:.1%} of jobs, the one chosen on {chose:.1%}")

    _full_regret(rows)

    def breakdown(r: dict) -> str:
        counts = {}
        for kind, status in r["kinds"]:
            key = kind + ("/oom" if status == "oom" else "/crash" if status == "failed" else "")
            counts[key] = counts.get(key, 0) + 1
        return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))

    for label, prefix in groups.items():
        group = [(n, s, r) for n, s, r in rows if n.startswith(prefix) and n not in hand]
        spend = sorted((r["launches"] / ds[n]["launches"], n, s, r) for n, s, r in group if n in ds and ds[n].get("launches"))
        print(f"{label}: most launches beside DeepSpeed")
        for ratio, n, s, r in spend[::-1][:5]:
            print(f"  {n}: {r['launches']} / {ds[n]['launches']} = {ratio:.2f}x, share {s:.3f}: {breakdown(r)}")
        print(f"{label}: worst chosen")
        for n, s, r in sorted(group, key=lambda x: x[1])[:5]:
            print(f"  {n}: share {s:.3f}, {r['launches']} launches (DeepSpeed {ds.get(n, {}).get('launches', '?')}): {breakdown(r)}")


def _arm_key(config: surfaces.Config) -> tuple[int, bool, bool]:
    return config.stage, config.offload_optimizer, config.offload_param


def _full_regret(rows: list[tuple[str, float, dict]]) -> None:
    """Full mode (``--full --audit``): where the regret (one less the mean share) goes, per
    group: the chosen arm's (stage, offload) best config with its best knobs below the optimum
    (the arm), and the choice below its arm's best (its knobs and size); the part of jobs on one
    GPU apart (the partitioning arms are not explored there). Then the jobs whose optimum's arm
    wins only with its knobs (at the default knobs another arm is faster): on how many that arm
    ran, ran a knob setting, was chosen, and what the knob settings cost in launches."""
    groups = {"random": "random-", "physical": "phys-", "blind": "blind-", "blind4": "blind4-"}
    hand = {j.name for j in physical_jobs.PHYSICAL_JOBS}
    for label, prefix in groups.items():
        group = [r for n, _, r in rows if n.startswith(prefix) and n not in hand and "arm_optima" in r]
        if not group:
            continue
        regret = arm = one_gpu = 0.0
        only, ran, tried, chosen, knob_runs = 0, 0, 0, 0, []
        for r in group:
            best = max(r["arm_optima"], key=lambda k: r["arm_optima"][k][1])
            mine = r["arm_optima"].get(_arm_key(r["chosen"]), (None, 0.0))[1] if r["chosen"] else 0.0
            regret += 1.0 - r["true"] / r["optimum"]
            arm += 1.0 - mine / r["optimum"]
            one_gpu += (1.0 - r["true"] / r["optimum"]) if r["num_gpus"] == 1 else 0.0
            if max(r["default_optima"], key=lambda k: r["default_optima"][k][1]) != best:
                only += 1
                at = [o for o in r["observations"] if (o.stage, bool(o.offload), o.offload == "offload-opt-param") == best]
                ran += bool(at)
                tried += any(o.knobs.zero for o in at)
                chosen += bool(r["chosen"]) and _arm_key(r["chosen"]) == best
                knob_runs.append(sum(bool(o.knobs.zero) for o in at))
        n = len(group)
        print(f"{label} full-mode regret {regret / n:.4f}: the arm {arm / n:.4f}, within the arm (knobs, size) {(regret - arm) / n:.4f}; "
              f"jobs on one GPU {one_gpu / n:.4f}; knob launches {statistics.mean(r['knob_launches'] for r in group):.1f} "
              f"of {statistics.mean(r['launches'] for r in group):.1f}")
        if only:
            print(f"  {only} jobs whose optimum's arm wins only with its knobs: it ran on {ran}, with a knob setting on {tried} "
                  f"({statistics.mean(knob_runs):.1f} knob runs), chosen on {chosen}")


def _curve(runs: list[dict]) -> None:
    """What a launch budget buys: for each number of launches (the profile run counted), the
    share of the optimum of the choice made by then, over the generated jobs."""
    longest = max((r["launches"] for r in runs), default=0)
    for k in range(2, longest + 1):
        shares = []
        for r in runs:
            before = [t for n, t in r["curve"] if n <= k]
            shares.append(before[-1] / r["optimum"] if before else 0.0)
        print(f"after {k:2d} launches: mean {statistics.mean(shares):.4f} p5 {_percentile(shares, 0.05):.4f} "
              f"within 1% {sum(s >= 0.99 for s in shares) / len(shares):.0%}")


BUDGETS = (0.25, 0.35, 0.4, 0.5)


def _budget_curve(rows: list[tuple[str, float, dict]], ds: dict) -> None:
    """What a budget of DeepSpeed's launches buys: per group, over the jobs with its figures,
    the share of the optimum of the choice made once ``f`` times DeepSpeed's launches of the job
    ran (the profile counted on both sides; the final choice where the tuning stopped sooner,
    none where no run had finished), for each ``f`` of ``BUDGETS``."""
    groups = {"random": "random-", "physical": "phys-", "blind": "blind-", "blind4": "blind4-"}
    hand = {j.name for j in physical_jobs.PHYSICAL_JOBS}
    for label, prefix in groups.items():
        group = [(n, r) for n, _, r in rows if n.startswith(prefix) and n not in hand and ds.get(n, {}).get("launches")]
        if not group:
            continue
        for f in BUDGETS:
            shares = []
            for n, r in group:
                budget = max(2, math.floor(f * ds[n]["launches"]))
                before = [t for k, t in r["curve"] if k <= budget]
                shares.append(before[-1] / r["optimum"] if before else 0.0)
            print(f"{label} at {f:g}x DeepSpeed's launches ({len(group)} jobs): mean {statistics.mean(shares):.4f} "
                  f"p5 {_percentile(shares, 0.05):.4f} within 1% {sum(s >= 0.99 for s in shares) / len(shares):.1%}")


def _speedup(rows: list[tuple[str, float, dict]], *, slots: int, versus: int, processes: int = 0) -> None:
    """The simulated wall time to the stop with ``versus`` slots over that with ``slots`` (in
    ``processes`` processes): of the group's total (its mean per job) and the median of the jobs'
    own; the quality of each beside it; the mean busy slots of each (experiment-seconds over the
    wall); the rounds of each (the wall in runs of the job's median length: a speed-up of k needs
    a k-th of the rounds), and with processes the claims that stood down (no experiment runs
    twice: tune asserts it)."""
    theirs = [r["versus"] for _, _, r in rows]
    ratios = [t["wall_s"] / r["wall_s"] for (_, _, r), t in zip(rows, theirs) if r["wall_s"] > 0]
    shares = [t["share"] for t in theirs]
    width = f"{processes} x {slots}" if processes > 1 else str(slots)

    def busy(runs: list[dict]) -> float:
        return sum(sum(e - b for b, e in r["spans"]) for r in runs) / sum(r["wall_s"] for r in runs)

    def rounds(runs: list[dict]) -> float:
        # The wall in runs of the job's usual length: the rounds a tuning waits for, which slots cut.
        return statistics.mean(r["wall_s"] / statistics.median(e - b for b, e in r["spans"]) for r in runs if r["spans"])

    print(f"  wall with {versus} slot(s) / with {width}: {sum(t['wall_s'] for t in theirs) / sum(r['wall_s'] for _, _, r in rows):.2f}x "
          f"(median per job {statistics.median(ratios):.2f}x); with {versus}: mean {statistics.mean(shares):.4f} "
          f"p5 {_percentile(shares, 0.05):.4f} within 1% {sum(s >= 0.99 for s in shares) / len(shares):.1%}, "
          f"launches {statistics.mean(t['launches'] for t in theirs):.1f}/job; mean busy slots {busy([r for _, _, r in rows]):.1f} "
          f"of {slots * max(processes, 1)}, {busy(theirs):.1f} of {versus}; rounds {rounds([r for _, _, r in rows]):.1f} "
          f"against {rounds(theirs):.1f}"
          + (f"; claims stood down {statistics.mean(r['stood_down'] for _, _, r in rows):.1f}/job" if processes > 1 else ""))


def _summary(label: str, rows: list[tuple[str, float, dict]], ds: dict, slots: int) -> None:
    shares = [s for _, s, _ in rows]
    both = [(n, s, r) for n, s, r in rows if n in ds and ds[n].get("chosen")]
    versus = ""
    if both:
        # Quality beside launches on the same jobs: those with DeepSpeed's current figures.
        launches = sum(r["launches"] for _, _, r in both) / sum(ds[n]["launches"] for n, _, _ in both)
        hours = sum(r["gpu_hours"] for _, _, r in both) / sum(ds[n]["gpu_hours"] for n, _, _ in both)
        ours = [s for _, s, _ in both]
        theirs = [ds[n]["true"] / r["optimum"] for n, _, r in both]
        versus = (f" = {launches:.2f}x, GPU-h {hours:.2f}x of DeepSpeed on its {len(both)} jobs, where mean {statistics.mean(ours):.4f} "
                  f"within 1% {sum(s >= 0.99 for s in ours) / len(ours):.1%} against DeepSpeed's mean {statistics.mean(theirs):.4f} "
                  f"within 1% {sum(s >= 0.99 for s in theirs) / len(theirs):.1%}")
    times = [t for _, _, r in rows for t in r["decision_s"]]
    print(f"{label} jobs {len(rows)} slots {slots}: mean {statistics.mean(shares):.4f} p5 {_percentile(shares, 0.05):.4f} "
          f"worst {min(shares):.4f} within 1% {sum(s >= 0.99 for s in shares) / len(shares):.1%}; "
          f"launches {statistics.mean(r['launches'] for _, _, r in rows):.1f}/job "
          f"({statistics.mean(r['knob_launches'] for _, _, r in rows):.1f} of knob settings){versus}; "
          f"wall {statistics.mean(r['wall_s'] for _, _, r in rows) / 60:.1f} min/job; "
          f"decision p50 {1e3 * _percentile(times, 0.5):.0f} ms p95 {1e3 * _percentile(times, 0.95):.0f} ms")
    # The noise the planner reports, against the job's true noise.
    ratios = [r["noise"] / r["true_noise"] for _, _, r in rows if r["noise"] is not None]
    print(f"  noise reported within 0.5x-2x of the true noise: {sum(0.5 <= q <= 2.0 for q in ratios) / len(rows):.1%} of jobs "
          f"(measured on {len(ratios) / len(rows):.0%}; reported / true p10 {_percentile(ratios, 0.1) if ratios else 0:.2f} "
          f"median {_percentile(ratios, 0.5) if ratios else 0:.2f} p90 {_percentile(ratios, 0.9) if ratios else 0:.2f}); "
          f"the ceiling of the runs it rests on: {statistics.mean(_within_half_to_twice(r['noise_dof']) for _, _, r in rows):.1%} "
          f"(an unbiased estimate from k repeat degrees of freedom, Gaussian noise; k median "
          f"{_percentile([r['noise_dof'] for _, _, r in rows], 0.5):.0f}; 90% needs k >= 4)")
    # What no search could beat: the noise, not the planner, bounds the share within 1%.
    ceiling = statistics.mean(r["ceiling"] for _, _, r in rows)
    print(f"  ceiling within 1% (a genie that knows every curve's shape and which two arms to compare): "
          f"{ceiling:.1%} with these launches", end="")
    capped = [r["ceiling_ds"] for _, _, r in rows if "ceiling_ds" in r]
    if capped:
        print("; " + ", ".join(f"{statistics.mean(c[k] for c in capped):.1%} with {k:g}x DeepSpeed's" for k in (0.35, 0.5, 1.0))
              + f" ({len(capped)} jobs)", end="")
    print()
    # A target on every job (the worst share) asks for all of them at once.
    print(f"  the genie's chance to have every one of these {len(rows)} jobs within 1%: "
          f"{surfaces.every_job_within_1pc([r['ceiling'] for _, _, r in rows]):.2g} with these launches", end="")
    if capped:
        print(", " + ", ".join(f"{surfaces.every_job_within_1pc([c[k] for c in capped]):.2g} with {k:g}x DeepSpeed's"
                               for k in (0.35, 0.5, 1.0)) + f" ({len(capped)} jobs)", end="")
    print()

if __name__ == "__main__":
    main()
