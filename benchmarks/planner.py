"""`make bench-planner`: optuna-ds's own tuning on hundreds of simulated jobs, in minutes.

Each job of benchmarks/surfaces.py and the four generators (jobs.py, physical_jobs.py,
blind_jobs.py, and blind4_jobs.py, held out: never tuned against) is tuned by the product itself
(benchmarks/product.py: the CLI's ``tune`` in this process, the simulated launcher answering
each experiment, a virtual clock charging every wait), and nothing here decides anything the
tuning decides: the choice is what ``ds_config_optimal.json`` says, the launches what the
launcher's ledger counts. It prints the share of the optimum the chosen config reaches (mean,
5th percentile, worst, share of jobs within 1%), each with its bootstrap interval over the jobs
(``--seed``), launches and GPU-hours against DeepSpeed's autotuner (its cached figures in
benchmarks/deepspeed_figures.json, those whose fingerprint still matches the job: the ratio over
every job and over those where it chose a config), and the decision time measured here.
``--replays`` adds the jobs of recorded real runs (benchmarks/replays.py): each is judged by
whether its choice is within the measured noise of the best recorded config. ``--agree N``
checks the instrument: N jobs tuned by the CLI as a process and in this process must choose alike.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import math
import os
import statistics
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

# The planner's matrices have tens of rows: BLAS threads only contend for the cores, and on a
# loaded machine they multiply a decision's time 5-30x. One thread each, unless set.
for _threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")

HERE = Path(__file__).resolve().parent

import catalog  # noqa: E402
import physical_jobs  # noqa: E402
import product  # noqa: E402
import replays  # noqa: E402
import search  # noqa: E402
import stats  # noqa: E402
import surfaces  # noqa: E402

from optuna_ds.config import AutotuningConfig  # noqa: E402
from optuna_ds.planner import PlannerSettings  # noqa: E402
from optuna_ds.planner import Priors  # noqa: E402
from optuna_ds.planner import plan  # noqa: E402
from optuna_ds.studies import _coordinator  # noqa: E402

AUTOTUNING = AutotuningConfig()  # optuna-ds's defaults: tuner_type
# A decision's simulated seconds: fixed, so that a job's figures are the same on any machine and
# load (benchmarks/product.py --calibrate measures the real ones).
DECISION_S = 0.05
COSTS = product.Costs(decision_s=DECISION_S)


@contextlib.contextmanager
def _planner_settings(settings: PlannerSettings) -> Iterator[None]:
    """The product's coordinator planning with ``settings`` (a what-if of ``--set``)."""
    if settings == PlannerSettings():
        yield
        return
    with mock.patch.object(_coordinator, "plan", functools.partial(plan, settings=settings)):
        yield


def tune(surface: surfaces.Surface, *, slots: int = 1, processes: int = 1, settings: PlannerSettings = PlannerSettings(),
         full: bool = False, tuner: str = AUTOTUNING.tuner_type, trace: bool = False, costs: product.Costs = COSTS,
         train_samples: int | None = None) -> dict:
    """optuna-ds's own tuning of ``surface`` (benchmarks/product.py: the CLI's ``tune`` in this
    process, simulated launcher and clock) by ``processes`` processes (tune and workers, a node
    each) of ``slots`` experiments at once; in full mode the knobs too. The figures of each launch come from the simulated launcher's ledger and the
    reason the product gave for it."""
    with _planner_settings(settings):
        r = product.tune(surface, fast=not full, tuner_type=tuner, slots=slots, processes=processes, costs=costs,
                         train_samples=train_samples)
    entries = [e for e in r["ledger"] if not e.get("profile")]
    whys = r["whys"] if len(r["whys"]) == len(entries) else [""] * len(entries)
    kinds, configs = [], []
    for i, (why, e) in enumerate(zip(whys, entries)):
        kinds.append((launch_kind(why, e, entries[:i]), {"ok": "ok", "oom": "oom", "crash": "failed"}[e["outcome"]]))
        configs.append(_config_of(e))
        if trace:
            print(f"  {e['stage']}{_offload(e):>18} mbs {e['mbs']:5d} gas {e['gas']} {_knobs(tuple(e['knobs'].items()))} -> "
                  f"{e['outcome']:6} {e.get('measured', 0):9.3f} true {e.get('true', 0):9.3f}  ({why})")
    noise = r["noise"]
    return {"launches": r["launches"], "knob_launches": sum(k == "knobs" for k, _ in kinds), "oom": r["oom"],
            "gpu_hours": r["gpu_hours"], "wall_s": r["wall_s"], "true": r["true"], "chosen": r["chosen"],
            "noise": noise.value, "noise_runs": noise.runs, "decision_s": r["decision_s"], "curve": r["curve"], "kinds": kinds,
            "configs": configs, "entries": entries,
            "best_ran": max((e["true"] for e in entries if e["outcome"] == "ok"), default=0.0), "spans": r["spans"]}


def _offload(entry: dict) -> str:
    optimizer, param = entry["offload"]
    return "offload-opt-param" if param else "offload-opt" if optimizer else ""


def _config_of(entry: dict) -> surfaces.Config:
    optimizer, param = entry["offload"]
    return surfaces.Config(stage=entry["stage"], mbs=entry["mbs"], gas=entry["gas"], knobs=tuple(sorted(entry["knobs"].items())),
                           offload_optimizer=optimizer, offload_param=param)


KINDS = ("first run", "size", "knobs", "noise replicate", "re-measure", "alike", "fallback", "listed", "pending", "batch")


def launch_kind(why: str, entry: dict, before: list[dict]) -> str:
    """What a launch is, by the reason the product gave for it and what ran before it: an arm's
    first run, another size of an arm, a knob setting, the noise replicate, a re-measurement of a
    finalist, a run measured alike for the headline, the user's config or a size or stage the user
    listed, a fallback (a first run again while nothing ran), one while the first results are
    pending, a batch member."""
    if why.startswith("a slot free"):
        return "batch"
    if why.startswith("measure again: the run-to-run noise"):
        return "noise replicate"
    if why.startswith("measure again"):
        return "re-measure"
    if "measured alike" in why:
        return "alike"
    if why.startswith(("a stage you listed", "a size you listed", "your micro-batch")):
        return "listed"
    if why.startswith("while the first"):
        return "pending"
    if why.startswith("the size expected to run fastest") and before:
        return "fallback"
    if entry["knobs"]:
        return "knobs"
    arm = (entry["stage"], tuple(entry["offload"]))
    return "size" if any((b["stage"], tuple(b["offload"])) == arm for b in before) else "first run"


def _knobs(knobs: tuple) -> str:
    return ",".join(f"{''.join(w[0] for w in k.split('_'))}={v:g}" if type(v) in (int, float) else f"{''.join(w[0] for w in k.split('_'))}={v}"
                    for k, v in knobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--random", type=int, default=200, metavar="N")
    parser.add_argument("--first", type=int, default=0, metavar="SEED", help="the first generated job's seed")
    parser.add_argument("--physical", type=int, default=0, metavar="N",
                        help="also N jobs of the second, independent generator (benchmarks/physical_jobs.py), and its hand-made ones")
    parser.add_argument("--replays", action="store_true", help="also the jobs of recorded real runs (benchmarks/replays.py)")
    parser.add_argument("--blind", type=int, default=0, metavar="N",
                        help="also N jobs of the third, blind generator (benchmarks/blind_jobs.py)")
    parser.add_argument("--blind4", type=int, default=0, metavar="N",
                        help="also N jobs of the fourth, blind generator (benchmarks/blind4_jobs.py): the held-out set")
    parser.add_argument("--slots", type=int, default=1, help="experiments at once on the job's node (its GPUs times this)")
    parser.add_argument("--processes", type=int, default=1, metavar="N",
                        help="N processes of --slots slots each on one storage (tune and N-1 workers, a node each)")
    parser.add_argument("--calibration", type=Path, default=HERE / "product_calibration.json",
                        help="the real runs --versus checks the simulation against first (fresh ones where the file is missing)")
    parser.add_argument("--save", type=Path, default=None, metavar="FILE", help="each job's share, launches and wall, as JSON")
    parser.add_argument("--paired", nargs=2, type=Path, default=None, metavar=("A", "B"),
                        help="only compare two --save files job by job: B's mean share and launches less A's, per generator, "
                             "with their bootstrap intervals (a change is kept only where it is better beyond its interval)")
    parser.add_argument("--versus", type=int, default=0, metavar="SLOTS",
                        help="also tune each job with SLOTS slots: the simulated wall time to the stop with them over --slots' "
                             "(the speed-up), their share of the optimum and launches")
    parser.add_argument("--agree", type=int, default=0, metavar="N",
                        help="only the instrument's check: tune the first N of the jobs both through the CLI as a process "
                             "(benchmarks/search.py) and in this process, and say on how many they chose the same config")
    parser.add_argument("--jobs", nargs="*", help="only these jobs")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--trace", action="store_true", help="every launch of every job, with the product's reason")
    parser.add_argument("--full", action="store_true", help="full mode: the knobs too")
    parser.add_argument("--tuner", default=AUTOTUNING.tuner_type, choices=["gridsearch", "random", "model_based"],
                        help="full mode's tuner_type: where the knob settings come from")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a field of optuna_ds.planner.PlannerSettings (min_gain, noise_after, max_remeasures, ...) "
                             "or of its priors (priors.knob_cause, priors.pressure_losses=0.1,0.3, ...) for a what-if")
    parser.add_argument("--train-hours", type=float, default=None, metavar="H",
                        help="tune as for a training of H hours at the job's optimum (--train-samples: H hours of its "
                             "samples/s): the training prices each launch")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="jobs tuned at once, each in a process of its own (virtual time: the figures do not depend on it)")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (the intervals over jobs)")
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
    names = args.jobs or ([s.name for s in surfaces.SURFACES] + [f"random-{i}" for i in range(args.first, args.first + args.random)]
                          + ([j.name for j in physical_jobs.PHYSICAL_JOBS] if args.physical else [])
                          + [f"phys-{i}" for i in range(args.first, args.first + args.physical)]
                          + [f"blind-{i}" for i in range(args.first, args.first + args.blind)]
                          + [f"blind4-{i}" for i in range(args.first, args.first + args.blind4)]
                          + ([job.name for job in replays.replays()] if args.replays else []))
    if args.paired:
        _paired(*args.paired, seed=args.seed)
        return
    print(f"jobs: {_seeds(names)}; bootstrap seed {args.seed}; {'full' if args.full else 'fast'} mode, tuner {args.tuner}, "
          f"slots {args.slots}, processes {args.processes}; settings {'default' if settings == PlannerSettings() else args.set}"
          + (f"; a training of {args.train_hours:g} h at each job's optimum" if args.train_hours else ""))
    if args.agree:
        _agree(names[:args.agree], full=args.full, tuner=args.tuner)
        return
    mode = "full" if args.full else "fast"
    ds = deepspeed_figures(names, fast=not args.full)
    costs = COSTS
    if args.versus:
        # Width figures only from a simulation that reproduces real processes (benchmarks/product.py).
        calibration = product.calibrate(product.saved_real_runs(args.calibration) if args.calibration.exists() else product.real_runs())
        print(calibration.table())
        if not calibration.ok:
            print("width figures withheld: the simulation does not reproduce the real runs within "
                  f"{product.TOLERANCE:.0%} (`python benchmarks/product.py --calibrate --fit`)")
            args.versus = 0
        costs = calibration.costs
    job = functools.partial(_tune_job, slots=args.slots, processes=args.processes, versus=args.versus, settings=settings,
                            full=args.full, tuner=args.tuner, trace=args.trace, audit=args.audit, costs=costs,
                            train_hours=args.train_hours)
    workers = 1 if args.trace else max(1, args.workers)
    rows = []
    with concurrent.futures.ProcessPoolExecutor(workers) if workers > 1 else contextlib.nullcontext() as pool:
        for row in (pool.map(job, names) if pool is not None else map(job, names)):
            if row is None:
                continue
            name, share, r = row
            rows.append(row)
            if args.verbose or share < 0.99:
                print(f"{name}: {share:.3f} launches {r['launches']} (ds {ds.get(name, {}).get('launches', '?')}) "
                      f"chose {search.describe(r['chosen'])} optimum {search.describe(r['best'])}", flush=True)
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
            _summary(label, group, ds, args.slots, seed=args.seed, costs=costs)
            if args.versus:
                _speedup(group, ds, slots=args.slots, processes=args.processes, versus=args.versus)
    if args.save is not None:
        args.save.write_text(json.dumps({name: {"share": share, "launches": r["launches"], "wall_s": r["wall_s"]}
                                         for name, share, r in rows}, indent=1))
        print(f"saved: {args.save}")


def _tune_job(name: str, *, slots: int, processes: int, versus: int, settings: PlannerSettings, full: bool, tuner: str, trace: bool,
              audit: bool, costs: product.Costs, train_hours: float | None = None) -> tuple[str, float, dict] | None:
    """One job's row: its name, the share of the optimum of the config chosen, and :func:`tune`'s
    figures with the job's optimum and noise (and ``versus`` slots' run); ``None`` where nothing runs."""
    surface = catalog.by_name(name)
    arms = surface.arm_optima(fast=not full, offload=True)
    best, optimum = surfaces.optimum_of(arms)
    if not optimum:
        return None
    if trace:
        print(f"{name}:")
    train = max(1, round(train_hours * 3600 * optimum)) if train_hours else None
    r = tune(surface, slots=slots, processes=processes, trace=trace, settings=settings, full=full, tuner=tuner, costs=costs,
             train_samples=train)
    r["optimum"], r["best"], r["true_noise"] = optimum, best, surface.noise
    if audit and full:
        r["arm_optima"], r["default_optima"] = arms, surface.arm_optima(fast=True, offload=True)
        r["num_gpus"] = surface.num_gpus
    if versus:
        other = tune(surface, slots=versus, settings=settings, full=full, tuner=tuner, costs=costs)
        r["versus"] = {"wall_s": other["wall_s"], "share": other["true"] / optimum, "launches": other["launches"],
                       "spans": other["spans"]}
    return name, r["true"] / optimum, r


def _seeds(names: list[str]) -> str:
    """The jobs as ranges of their generators' seeds (``random-0..59``), the rest by name."""
    groups: dict[str, list[int]] = {}
    others = []
    for name in names:
        prefix, _, seed = name.rpartition("-")
        if seed.isdigit() and prefix in ("random", "phys", "blind", "blind4"):
            groups.setdefault(prefix, []).append(int(seed))
        else:
            others.append(name)
    parts = [f"{p}-{min(v)}..{max(v)}" if len(v) == max(v) - min(v) + 1 else f"{p}-{','.join(map(str, v))}" for p, v in groups.items()]
    return ", ".join(parts + ([f"{len(others)} named"] if others else [])) or "none"


def _agree(names: list[str], *, full: bool, tuner: str) -> None:
    """The instrument's check: each job tuned by ``optuna-ds tune`` as a process (simulated
    launcher, benchmarks/search.py) and in this process (benchmarks/product.py); the configs
    each wrote to ds_config_optimal.json and the launches each made, compared."""
    same, ours, theirs = 0, 0, 0
    for name in names:
        surface = catalog.by_name(name)
        cli = search.run_tool("optuna-ds", surface, fast=not full, tuner_type=tuner)
        here = product.tune(surface, fast=not full, tuner_type=tuner, costs=COSTS)
        chosen = surfaces.Config(**cli["chosen"]) if cli["chosen"] else None
        agree = chosen == here["chosen"]
        same += agree
        theirs += cli["launches"]
        ours += here["launches"]
        print(f"  {name}: CLI {search.describe(chosen)} in {cli['launches']} launches; in-process "
              f"{search.describe(here['chosen'])} in {here['launches']}{'' if agree else '  <- differ'}", flush=True)
    print(f"agreement: {same} of {len(names)} jobs chose the same config; launches {theirs} vs {ours} (CLI vs in-process)")


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
        current = cached[name].get(search.fingerprint(catalog.by_name(name), fast=fast))
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
                at = [e for e in r["entries"] if (e["stage"], *e["offload"]) == best]
                ran += bool(at)
                tried += any(e["knobs"] for e in at)
                chosen += bool(r["chosen"]) and _arm_key(r["chosen"]) == best
                knob_runs.append(sum(bool(e["knobs"]) for e in at))
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
        print(f"after {k:2d} launches: mean {statistics.mean(shares):.4f} p5 {stats.quantile(shares, 0.05):.4f} "
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
                  f"p5 {stats.quantile(shares, 0.05):.4f} within 1% {sum(s >= 0.99 for s in shares) / len(shares):.1%}")


def _speedup(rows: list[tuple[str, float, dict]], ds: dict, *, slots: int, processes: int, versus: int) -> None:
    """The simulated wall time to the stop with ``versus`` slots in one process over that with
    ``processes`` x ``slots``: of the group's total (its mean per job) and the median of the
    jobs' own; the quality and the launches of each, and each one's launches against
    DeepSpeed's (over the jobs it has figures for); the mean busy slots of each
    (experiment-seconds over the wall); the rounds of each (the wall in runs of the job's median
    length: a speed-up of k needs a k-th of the rounds)."""
    ours = [r for _, _, r in rows]
    theirs = [r["versus"] for r in ours]
    ratios = [t["wall_s"] / r["wall_s"] for r, t in zip(ours, theirs) if r["wall_s"] > 0]
    shares = [t["share"] for t in theirs]
    width = f"{processes} x {slots}" if processes > 1 else str(slots)
    figured = [(n, r) for n, _, r in rows if ds.get(n, {}).get("launches")]
    deepspeed = sum(ds[n]["launches"] for n, _ in figured)

    def busy(runs: list[dict]) -> float:
        return sum(sum(e - b for b, e in r["spans"]) for r in runs) / sum(r["wall_s"] for r in runs)

    def rounds(runs: list[dict]) -> float:
        # The wall in runs of the job's usual length: the rounds a tuning waits for, which slots cut.
        return statistics.mean(r["wall_s"] / statistics.median(e - b for b, e in r["spans"]) for r in runs if r["spans"])

    against = (f"; launches vs DeepSpeed {sum(r['launches'] for _, r in figured) / deepspeed:.2f}x with {width}, "
               f"{sum(r['versus']['launches'] for _, r in figured) / deepspeed:.2f}x with {versus}" if deepspeed else "")
    speedup = stats.format_interval(stats.ratio_of_sums([t["wall_s"] for t in theirs], [r["wall_s"] for r in ours]), digits=2)
    print(f"  wall with {versus} slot(s) / with {width}: {speedup}x "
          f"(median per job {statistics.median(ratios):.2f}x); with {versus}: mean {statistics.mean(shares):.4f} "
          f"p5 {stats.quantile(shares, 0.05):.4f} within 1% {sum(s >= 0.99 for s in shares) / len(shares):.1%}, "
          f"launches {statistics.mean(t['launches'] for t in theirs):.1f}/job against {statistics.mean(r['launches'] for r in ours):.1f} "
          f"with {width}{against}; mean busy slots {busy(ours):.1f} of {slots * processes}, {busy(theirs):.1f} of {versus}; "
          f"rounds {rounds(ours):.1f} against {rounds(theirs):.1f}")


def _paired(a: Path, b: Path, *, seed: int) -> None:
    """B against A on the jobs both tuned, per generator: the mean difference of the share of the
    optimum and of launches, each with its bootstrap interval (``stats.paired_difference``)."""
    first, second = json.loads(a.read_text()), json.loads(b.read_text())
    both = [n for n in first if n in second]
    groups: dict[str, list[str]] = {}
    for name in both:
        prefix, _, number = name.rpartition("-")
        groups.setdefault(prefix if number.isdigit() and prefix in ("random", "phys", "blind", "blind4") else "named", []).append(name)
    print(f"{b} against {a}, {len(both)} jobs both tuned; bootstrap seed {seed}")
    for label, names in groups.items():
        share = stats.paired_difference([second[n]["share"] for n in names], [first[n]["share"] for n in names], seed=seed)
        launches = stats.paired_difference([second[n]["launches"] for n in names], [first[n]["launches"] for n in names], seed=seed)
        within = stats.paired_difference([float(second[n]["share"] >= 0.99) for n in names], [float(first[n]["share"] >= 0.99) for n in names],
                                         seed=seed)
        verdict = "better" if share.above(0.0) else "worse" if share.below(0.0) else "no difference beyond the interval"
        print(f"  {label} ({len(names)} jobs): share {stats.format_interval(share)} ({verdict}); within 1% "
              f"{within.estimate:+.1%} [{within.low:+.1%}, {within.high:+.1%}]; launches {stats.format_interval(launches, digits=2)}")


def _summary(label: str, rows: list[tuple[str, float, dict]], ds: dict, slots: int, *, seed: int, costs: product.Costs) -> None:
    """The group's figures, each with its bootstrap interval over the jobs (``seed``): the share of
    the optimum the choice reaches (mean, 5th percentile, worst, within 1%), launches per job, and
    beside DeepSpeed's autotuner on the same jobs: the launch ratio over every job it has figures
    for and over those where it chose a config, its own shares there; the reported noise against
    the job's; decision times (and what a decision was charged, ``costs``)."""
    shares = [s for _, s, _ in rows]
    print(f"{label} jobs {len(rows)} slots {slots}: mean {_ci(shares, statistics.mean, seed)} "
          f"p5 {_ci(shares, lambda v: stats.quantile(v, 0.05), seed)} worst {min(shares):.4f} "
          f"within 1% {_ci(shares, _within_1pc, seed, percent=True)}; launches {statistics.mean(r['launches'] for _, _, r in rows):.1f}/job "
          f"({statistics.mean(r['knob_launches'] for _, _, r in rows):.1f} of knob settings); "
          f"wall {statistics.mean(r['wall_s'] for _, _, r in rows) / 60:.1f} min/job")
    figured = [(n, s, r) for n, s, r in rows if ds.get(n, {}).get("launches")]
    if figured:
        chose = [(n, s, r) for n, s, r in figured if ds[n].get("chosen")]
        ours = [r["launches"] for _, _, r in figured]
        theirs = [ds[n]["launches"] for n, _, _ in figured]
        line = (f"  beside DeepSpeed: launches {_ci_ratio(ours, theirs, seed)}x of its over the {len(figured)} jobs it has figures for"
                f" ({len(figured) - len(chose)} where it chose nothing)")
        if chose:
            line += (f", {_ci_ratio([r['launches'] for _, _, r in chose], [ds[n]['launches'] for n, _, _ in chose], seed)}x over the "
                     f"{len(chose)} where it chose a config; there ours mean {_ci([s for _, s, _ in chose], statistics.mean, seed)} within 1% "
                     f"{_ci([s for _, s, _ in chose], _within_1pc, seed, percent=True)}, DeepSpeed's mean "
                     f"{_ci([ds[n]['true'] / r['optimum'] for n, _, r in chose], statistics.mean, seed)} within 1% "
                     f"{_ci([ds[n]['true'] / r['optimum'] for n, _, r in chose], _within_1pc, seed, percent=True)}")
        hours = sum(r["gpu_hours"] for _, _, r in figured) / max(1e-12, sum(ds[n]["gpu_hours"] for n, _, _ in figured))
        print(line + f"; GPU-h {hours:.2f}x")
    ratios = [r["noise"] / r["true_noise"] for _, _, r in rows if r["noise"] is not None and r["true_noise"]]
    times = [t for _, _, r in rows for t in r["decision_s"]]
    print(f"  noise reported within 0.5x-2x of the job's: {sum(0.5 <= q <= 2.0 for q in ratios) / len(rows):.1%} of jobs "
          f"(reported on {len(ratios) / len(rows):.0%}; reported / true median {stats.quantile(ratios, 0.5) if ratios else 0:.2f}); "
          f"decisions measured here p50 {1e3 * stats.quantile(times, 0.5):.0f} ms p95 {1e3 * stats.quantile(times, 0.95):.0f} ms "
          f"(charged {f'{1e3 * costs.decision_s:.0f} ms each' if costs.decision_s is not None else f'as measured x {costs.decision_factor:g}'})")


def _within_1pc(shares: list[float]) -> float:
    return sum(s >= 0.99 for s in shares) / len(shares)


def _ci(values: list[float], statistic: Callable[[list[float]], float], seed: int, *, percent: bool = False) -> str:
    """``statistic`` of ``values`` with its 95% bootstrap interval over them."""
    interval = stats.bootstrap(values, statistic, seed=seed)
    if percent:
        return f"{interval.estimate:.1%} [{interval.low:.1%}, {interval.high:.1%}]"
    return stats.format_interval(interval)


def _ci_ratio(ours: list[float], theirs: list[float], seed: int) -> str:
    """The ratio of sums, ours over theirs, with its 95% bootstrap interval over the jobs."""
    return stats.format_interval(stats.ratio_of_sums(ours, theirs, seed=seed), digits=2)


if __name__ == "__main__":
    main()
