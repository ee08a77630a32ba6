"""`make bench`: search quality of optuna-ds beside DeepSpeed's autotuner on simulated jobs.

The jobs are the six hand-made surfaces of benchmarks/surfaces.py (regression cases) and
``--random N`` generated ones (benchmarks/jobs.py): a search is judged on the distribution --
mean, 5th percentile and worst share of the optimum -- not on a handful of cases.

Both tools tune the same config on the same simulated surfaces (benchmarks/surfaces.py), with
the simulated launcher (benchmarks/simulated_deepspeed.py) first on PATH as ``deepspeed`` and a
no-op ``pdsh`` (DeepSpeed's autotuner ends each experiment with ``pdsh ... pkill``). Every
launch is counted from the launcher's ledger: launches, out-of-memory launches, simulated
GPU-hours; the config each tool writes to ``ds_config_optimal.json`` is scored by its true
(noise-free) throughput as a share of the surface's exhaustive optimum.

DeepSpeed's autotuner is run as ``python -m deepspeed.launcher.runner --autotuning tune``; its
scheduler's 5-second polling sleep is shortened to keep the benchmark short (it changes no
decision and no simulated time), and its knob experiments get the ``hostfile`` key that 0.19.8
forgets (``KeyError: 'hostfile'``), so its full mode runs them. A job of more GPUs than its
resource manager takes on one node (100) is given to it as a cluster would be, nodes of 8 in a
hostfile (``_deepspeed_layout``); the simulated launcher counts the ranks of every node its
``--include`` names. Its figures are deterministic
for a job, so they are cached in ``benchmarks/deepspeed_figures.json`` (keyed by the job, the
mode and DeepSpeed's version); ``--refresh-deepspeed`` runs it again.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import catalog
import stats
import surfaces

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIMULATOR = HERE / "simulated_deepspeed.py"
DS_CACHE = HERE / "deepspeed_figures.json"
_DS_RUNNER = (
    "import sys, runpy, deepspeed.autotuning.scheduler as s; s.TIMEOUT = 0.02; "
    "run = s.run_experiment; "
    "hostfile = sys.argv[sys.argv.index('--hostfile') + 1] if '--hostfile' in sys.argv else '/job/hostfile'; "
    "s.run_experiment = lambda exp, *a: (exp.setdefault('hostfile', hostfile), run(exp, *a))[1]; "
    "sys.argv = ['deepspeed'] + sys.argv[1:]; runpy.run_module('deepspeed.launcher.runner', run_name='__main__')"
)
# DeepSpeed 0.19.8's autotuner counts a node's GPUs as min(slots, 100)
# (autotuner.Autotuner._get_resource_manager) and asserts that an experiment's --num_gpus fits on
# one node: on one node of 128 slots it stops before its first launch.
_DS_MAX_NODE_SLOTS = 100
_DS_CLUSTER_NODE_SLOTS = 8


def user_config(*, fast: bool, tuner_type: str, surface: surfaces.Surface | None = None) -> dict:
    """The user's config both tools tune; a replayed job (benchmarks/replays.py) adds its batch cap."""
    return {
        "fp16": {"enabled": True},
        "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": "all"},
        "autotuning": {"enabled": True, "fast": fast, "tuner_type": tuner_type, "max_train_micro_batch_size_per_gpu": 1024,
                       **getattr(surface, "autotuning", {})},
    }


def _environment(work: Path, surface: surfaces.Surface) -> tuple[dict[str, str], Path]:
    bin_dir = work / "bin"
    bin_dir.mkdir()
    (bin_dir / "deepspeed").write_text(f"#!/bin/sh\nexec {sys.executable} {SIMULATOR} \"$@\"\n")
    (bin_dir / "pdsh").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    ledger = work / "ledger.jsonl"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", DS_ACCELERATOR="cpu", LOCAL_SIZE=str(surface.num_gpus),
               SIM_SURFACE=surface.name, SIM_LEDGER=str(ledger), OPTUNA_DS_LOCK_DIR=str(work / "locks"),
               PYTHONPATH=str(ROOT))
    return env, ledger


def _deepspeed_layout(num_gpus: int) -> tuple[int, int]:
    """The nodes and GPUs per node DeepSpeed's autotuner gets for a job of ``num_gpus`` ranks:
    one node where its resource manager takes them all, else the fewest nodes of at most 8
    GPUs, as equal as the count divides (a 128-GPU job: 16 nodes of 8)."""
    if num_gpus <= _DS_MAX_NODE_SLOTS:
        return 1, num_gpus
    per_node = max(g for g in range(1, _DS_CLUSTER_NODE_SLOTS + 1) if num_gpus % g == 0)
    return num_gpus // per_node, per_node


def _deepspeed_resources(work: Path, num_gpus: int) -> list[str]:
    """The launcher flags that give DeepSpeed's autotuner ``num_gpus`` ranks: ``--num_gpus`` on
    this node, or a hostfile of simulated nodes (written in ``work``) with the ssh check off and
    the master's address given, as nothing answers ssh here."""
    nodes, per_node = _deepspeed_layout(num_gpus)
    if nodes == 1:
        return ["--num_gpus", str(num_gpus)]
    hostfile = work / "hostfile"
    hostfile.write_text("".join(f"node{i} slots={per_node}\n" for i in range(nodes)))
    return ["--hostfile", str(hostfile), "--no_ssh_check", "--master_addr", "127.0.0.1",
            "--num_nodes", str(nodes), "--num_gpus", str(per_node)]


def run_tool(tool: str, surface: surfaces.Surface, *, fast: bool, tuner_type: str, keep: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench-{surface.name}-") as tmp:
        work = Path(tmp)
        env, ledger = _environment(work, surface)
        (work / "train.py").write_text("print('a simulated training script')\n")
        (work / "ds_config.json").write_text(json.dumps(user_config(fast=fast, tuner_type=tuner_type, surface=surface)))
        script = ["train.py", "--deepspeed_config", "ds_config.json"]
        if tool == "optuna-ds":
            # The knob samplers are seeded by the tuning's study (every process alike): they draw the
            # same on every run of the benchmark, so two versions compare job by job.
            cmd = [sys.executable, "-m", "optuna_ds", "tune", "-q", "--deepspeed-bin", str(SIMULATOR),
                   "--num_gpus", str(surface.num_gpus), *script]
        else:
            cmd = [sys.executable, "-c", _DS_RUNNER, "--autotuning", "tune", *_deepspeed_resources(work, surface.num_gpus), *script]
        start = time.monotonic()
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        launches = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
        optimal = work / "autotuning_results" / "ds_config_optimal.json"
        chosen = None
        if optimal.exists():
            chosen = surfaces.Config.from_ds_config(json.loads(optimal.read_text()), keys=surfaces.spaces_of(surface)[1])
        if keep is not None:
            shutil.copytree(work, keep / f"{surface.name}-{'fast' if fast else 'full'}-{tool}-{tuner_type}", dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("bin", "locks"))
        if p.returncode != 0 and chosen is None and tool == "optuna-ds":
            print(f"  {tool} on {surface.name} failed (rc {p.returncode}):\n{p.stderr[-2000:]}", file=sys.stderr)
        return {
            "launches": len(launches),
            "oom": sum(1 for l in launches if l["outcome"] == "oom"),
            "gpu_hours": sum(l["seconds"] * l["gpus"] for l in launches) / 3600.0,
            "chosen": dataclasses.asdict(chosen) if chosen else None,
            "true": surface.evaluate(chosen).throughput if chosen else 0.0,
            "wall": wall,
            "rc": p.returncode,
            **({"error": _error_of(p.stderr)} if p.returncode != 0 else {}),
        }


def _error_of(stderr: str) -> str:
    """Why a tool exited non-zero: the last line of its stderr that names an error (a
    traceback's exception), else its last line; empty for no output."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b", line)]
    return (named or lines or [""])[-1][:500]


def describe(c: surfaces.Config | dict | None) -> str:
    if c is None:
        return "none"
    if isinstance(c, dict):
        c = surfaces.Config(**{**c, "knobs": tuple(tuple(kv) for kv in c["knobs"])})
    text = f"z{c.stage} mbs {c.mbs}"
    if c.offload_optimizer or c.offload_param:
        text += " offload " + "+".join(k for k, on in (("opt", c.offload_optimizer), ("param", c.offload_param)) if on)
    knobs = {k: v for k, v in c.knobs}
    if knobs:
        text += " " + ",".join(_describe_knob(k, v) for k, v in sorted(knobs.items()))
    return text


def _describe_knob(key: str, value: object) -> str:
    words = key.split("_")
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # sizes, written as ints or floats
        return f"{words[0]}{'_' + words[1][0] if len(words) > 1 else ''}={value:g}"
    return f"{words[0]}={value}"




@dataclasses.dataclass
class Run:
    job: str
    mode: str
    label: str
    share: float | None  # true throughput of the chosen config over the optimum; None: nothing fits
    figures: dict


def fingerprint(surface: surfaces.Surface, *, fast: bool) -> str:
    """What DeepSpeed's cached figures of ``surface`` depend on: the job (a replayed one's
    recorded runs), the user's config and DeepSpeed's version. A cached entry under another
    fingerprint is stale."""
    import deepspeed

    # A generated job's runs carry the launcher's slow outliers (surfaces.slow_outlier) too.
    job = getattr(surface, "fingerprint", None) or f"{_identity(surface)} slow {surfaces.SLOW_SHARE} {surfaces.SLOW_BY}"
    text = job + json.dumps(user_config(fast=fast, tuner_type="gridsearch", surface=surface), sort_keys=True) + deepspeed.__version__
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _identity(surface: surfaces.Surface) -> str:
    """What a job's figures follow from, per generator: a dataclass job's fields; a blind job's
    name and its generator's source (benchmarks/blind_jobs.py, a plain class)."""
    if dataclasses.is_dataclass(surface):
        # Floats to 12 digits: a drawn job's derived figures (exp, log, pow) differ in the last
        # bits between machines' maths libraries, which made 31 of 200 current entries stale.
        return re.sub(r"-?\d+\.\d+(?:e[-+]?\d+)?", lambda m: f"{float(m.group()):.12g}", repr(surface))
    return surface.name + Path(sys.modules[type(surface).__module__].__file__ or "").read_text()


def _summarise(runs: list[Run], title: str) -> None:
    by: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        by.setdefault((r.mode, r.label), []).append(r)
    ds_ok = {(r.job, r.mode) for r in runs if r.label == "deepspeed" and r.figures["chosen"] is not None}
    print()
    print(f"{title}: share of the optimum over the jobs that have one; 'vs DeepSpeed' totals only the jobs where "
          "DeepSpeed's autotuner found a config.")
    print("| mode | tool | jobs | mean | p5 | worst | >= 0.99 | launches | OOM | GPU-h | launches vs DeepSpeed "
          "| GPU-h vs DeepSpeed | worst where DeepSpeed found one |")
    print("| :-- | :-- | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |")
    for (mode, label), group in by.items():
        shares = [r.share for r in group if r.share is not None]
        if not shares:
            continue
        theirs = {r.job: r for r in by.get((mode, "deepspeed"), [])}
        both = [r for r in group if (r.job, mode) in ds_ok and r.job in theirs]
        vs = "- | - | -"
        if both and label != "deepspeed":
            ds_launches = sum(theirs[r.job].figures["launches"] for r in both)
            ds_hours = sum(theirs[r.job].figures["gpu_hours"] for r in both)
            worst = min(r.share for r in both if r.share is not None)
            vs = (f"{sum(r.figures['launches'] for r in both) / ds_launches:.2f} | "
                  f"{sum(r.figures['gpu_hours'] for r in both) / ds_hours:.2f} | {worst:.3f}")
        print(f"| {mode} | {label} | {len(shares)} | {sum(shares) / len(shares):.3f} | {stats.quantile(shares, 0.05):.3f} "
              f"| {min(shares):.3f} | {sum(s >= 0.99 for s in shares) / len(shares):.0%} "
              f"| {sum(r.figures['launches'] for r in group)} | {sum(r.figures['oom'] for r in group)} "
              f"| {sum(r.figures['gpu_hours'] for r in group):.2f} | {vs} |")


def _count(runs: list[Run]) -> int:
    """The jobs ``runs`` cover (named by ``--surfaces`` or counted by ``--random`` and the like)."""
    return len({r.job for r in runs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--surfaces", nargs="*", default=[s.name for s in surfaces.SURFACES],
                        help="hand-made surfaces (default: all six)")
    parser.add_argument("--random", type=int, default=0, metavar="N", help="also N generated jobs (random-0 .. random-N-1)")
    parser.add_argument("--physical", type=int, default=0, metavar="N",
                        help="also N jobs of the second generator (phys-0 .. phys-N-1, benchmarks/physical_jobs.py)")
    parser.add_argument("--replays", action="store_true", help="also the jobs of recorded real runs (benchmarks/replays.py)")
    parser.add_argument("--blind", type=int, default=0, metavar="N",
                        help="also N jobs of the third, blind generator (blind-0 .. blind-N-1, benchmarks/blind_jobs.py)")
    parser.add_argument("--blind4", type=int, default=0, metavar="N",
                        help="also N jobs of the fourth, blind generator, held out (blind4-0 .. blind4-N-1, benchmarks/blind4_jobs.py)")
    parser.add_argument("--only-deepspeed", action="store_true", help="run DeepSpeed's autotuner alone (to fill its cache)")
    parser.add_argument("--modes", nargs="+", default=["fast", "full"], choices=["fast", "full"])
    parser.add_argument("--samplers", nargs="+", default=["model_based"], help="knob samplers of full mode")
    parser.add_argument("--no-deepspeed", action="store_true", help="skip DeepSpeed's autotuner")
    parser.add_argument("--refresh-deepspeed", action="store_true", help="run DeepSpeed's autotuner even where cached")
    parser.add_argument("--deepspeed-cache", type=Path, default=DS_CACHE)
    parser.add_argument("--workers", type=int, default=2, help="tunings run at once")
    parser.add_argument("--keep", type=Path, help="copy each run's folder here")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    try:
        import deepspeed.autotuning  # noqa: F401
        with_ds = not args.no_deepspeed
    except ImportError:
        with_ds = False
    cache = json.loads(args.deepspeed_cache.read_text()) if with_ds and args.deepspeed_cache.exists() else {}
    names = (list(args.surfaces) + [f"random-{i}" for i in range(args.random)] + [f"phys-{i}" for i in range(args.physical)]
             + [f"blind-{i}" for i in range(args.blind)] + [f"blind4-{i}" for i in range(args.blind4)])
    if args.replays:
        import replays

        names += [job.name for job in replays.replays()]

    tasks = []
    for name in names:
        for mode in args.modes:
            fast = mode == "fast"
            if with_ds:
                tasks.append((name, mode, "deepspeed", "gridsearch"))
            for sampler in [] if args.only_deepspeed else args.samplers[:1] if fast else args.samplers:
                tasks.append((name, mode, "optuna-ds" if fast else f"optuna-ds {sampler}", sampler))

    written = threading.Lock()

    def execute(task: tuple[str, str, str, str]) -> dict:
        name, mode, label, sampler = task
        surface = catalog.by_name(name)
        fast = mode == "fast"
        if label == "deepspeed":
            key = f"{name}|{mode}|{fingerprint(surface, fast=fast)}"
            if key in cache and not args.refresh_deepspeed:
                return cache[key]
            figures = run_tool("deepspeed", surface, fast=fast, tuner_type=sampler, keep=args.keep)
            with written:  # as each comes, whole: a long run stopped half-way keeps what it computed
                cache[key] = figures
                partial = args.deepspeed_cache.with_name(args.deepspeed_cache.name + ".partial")
                partial.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
                partial.replace(args.deepspeed_cache)
            return figures
        return run_tool("optuna-ds", surface, fast=fast, tuner_type=sampler, keep=args.keep)

    arms = {(name, mode): catalog.by_name(name).arm_optima(fast=mode == "fast", offload=True)
            for name in names for mode in args.modes}
    optima = {key: surfaces.optimum_of(a) for key, a in arms.items()}
    print("simulated jobs; GPU-hours are simulated experiment time x GPUs")
    print("| surface | mode | tool | launches | OOM | GPU-h | chosen | true throughput / optimum |")
    print("| :-- | :-- | :-- | --: | --: | --: | :-- | --: |")
    runs: list[Run] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = [pool.submit(execute, t) for t in tasks]
        for (name, mode, label, _), future in zip(tasks, futures):
            figures = future.result()
            best, optimum = optima[(name, mode)]
            share = figures["true"] / optimum if optimum else None
            runs.append(Run(job=name, mode=mode, label=label, share=share, figures=figures))
            print(f"| {name} | {mode} | {label} | {figures['launches']} | {figures['oom']} | {figures['gpu_hours']:.2f} "
                  f"| {describe(figures['chosen'])} | {'-' if share is None else f'{share:.3f}'} |", flush=True)
            if label != "deepspeed" and (label == "optuna-ds" or label.endswith(args.samplers[-1])):
                print(f"| {name} | {mode} | optimum | | | | {describe(best)} | 1.000 |", flush=True)
    if with_ds:
        args.deepspeed_cache.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    hand = [r for r in runs if not r.job.startswith(("random-", "phys-", "blind-", "blind4-", "replay-"))]
    replayed = [r for r in runs if r.job.startswith("replay-")]
    generated = [r for r in runs if r.job.startswith("random-")]
    physical = [r for r in runs if r.job.startswith("phys-")]
    blind = [r for r in runs if r.job.startswith("blind-")]
    blind4 = [r for r in runs if r.job.startswith("blind4-")]
    if hand:
        _summarise(hand, "Hand-made surfaces")
    if generated:
        _summarise(generated, f"{_count(generated)} generated jobs")
    if physical:
        _summarise(physical, f"{_count(physical)} jobs of the second generator")
    if replayed:
        _summarise(replayed, f"{_count(replayed)} jobs of recorded real runs")
    if blind:
        _summarise(blind, f"{_count(blind)} jobs of the third, blind generator")
    if blind4:
        _summarise(blind4, f"{_count(blind4)} jobs of the fourth, blind generator (held out)")
    if hand and generated:
        _summarise(runs, "All jobs")


if __name__ == "__main__":
    main()
