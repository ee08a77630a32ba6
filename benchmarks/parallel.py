"""`make bench-parallel`: how a tuning scales with GPU slots, and what waiting costs.

Two scenarios, each a Markdown table (``--scenarios`` picks some):

``4``   1 slot in one process, then 4 slots: ``tune`` and one ``worker``, 2 slots each. Target
        (reported, not asserted): 4 slots >= 3.5x faster than 1.
``64``  8 slots in one process, then 64 slots: ``tune`` and 7 workers, 8 slots each.
        Target: 64 slots >= 4x faster than 8.

Every process shares one PostgreSQL storage (``--storage``; a study name of its own, deleted
afterwards) and poses as a node of its own on this machine: ``LOCAL_SIZE`` simulated GPUs (DeepSpeed's
CPU accelerator counts those), its own GPU lock folder, and a ``FAKE_DS_NODE`` label in the launch log
of the simulated launcher (benchmarks/fake_deepspeed.py, which sleeps ``--duration`` per experiment).
The tuning is a knob grid search (``"fast": false``) over a fixed micro-batch list, with enough
configs to keep every slot busy.

Per run: the wall time from starting the processes to the last one's exit (the speed-up is the
first run's over it; on this one machine the 8 processes' start-ups share its cores, as 8 nodes'
would not); the span from the first experiment's start to the last one's end, and when the first
started; experiments launched; duplicates (launches of an experiment already launched); GPU overlaps
(two experiments on one (node, GPU) at once); mean busy slots over the experiments' span; the
slot-free -> next-start gap on each (node, GPU) (it includes storing the result, the decision, and
the simulated launcher's Python start-up); the decision time (from a slot becoming free to
launching, logged by the processes' driver, ``timed_driver.py``); and CPU per wall second of each optuna-ds
process (its own threads, not the experiments it launches), over the run and while every process
only waits (the micro-batch sizes running, nothing to decide; from when the process is started up), of the PostgreSQL backends serving
them (and their peak number) and of the machine; and the trials by how they ended (a trial that
stood down lost its experiment's claim to another driver). The experiments only sleep, so an
optuna-ds process's CPU is the cost of orchestrating and waiting.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "benchmarks" / "fake_deepspeed.py"
DRIVER = ROOT / "benchmarks" / "timed_driver.py"
STORAGE = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
TICK = os.sysconf("SC_CLK_TCK")
# A micro-batch experiment's name: no knob suffix.
MICRO_BATCH_NAME = re.compile(r"z\d+_gas\d+_tmbspg\d+")
# Bucket sizes as the knob grid: n x n knob settings at each of the 2 best micro-batch sizes.
BUCKETS = [5e7, 1e8, 2e8, 3e8, 5e8, 7e8, 1e9, 2e9]


def config(grid: int) -> dict:
    """A knob grid search over a fixed micro-batch list: the same experiments however many slots."""
    return {
        "train_micro_batch_size_per_gpu": [8, 16, 24, 32],
        "zero_optimization": {"stage": 1, "reduce_bucket_size": BUCKETS[:grid], "allgather_bucket_size": BUCKETS[:grid]},
        "autotuning": {"enabled": True, "fast": False, "tuner_type": "gridsearch", "num_tuning_micro_batch_sizes": 2,
                       "tuner_early_stopping": 100000, "tuner_num_trials": 100000},
    }


def surface(duration: float) -> dict:
    """The fake launcher's surface (benchmarks/fake_deepspeed.py): ``duration`` seconds per experiment,
    throughput peaking at micro-batch 24, one bucket size 5% faster."""
    return {"duration": duration, "peak": 24, "knob_gain": {"reduce_bucket_size": {"500000000": 1.05}}}


@dataclasses.dataclass(frozen=True)
class Run:
    """One tuning: ``processes`` optuna-ds processes (the first ``tune``) of ``slots`` slots each."""

    processes: int
    slots: int

    @property
    def total(self) -> int:
        return self.processes * self.slots

    @property
    def label(self) -> str:
        return f"{self.total} ({self.processes} x {self.slots})" if self.processes > 1 else str(self.total)


class RunFailed(Exception):
    """A process of the tuning failed or it did not finish: reported in its row."""


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    runs: tuple[Run, Run]
    grid: int
    duration: float
    target: float


def scenarios(duration: float | None, quick: bool) -> dict[str, Scenario]:
    return {
        "4": Scenario("4", "1 slot vs tune + 1 worker of 2 slots", (Run(1, 1), Run(2, 2)), grid=4 if not quick else 3,
                      duration=duration or (0.5 if quick else 2.0), target=3.5),
        "64": Scenario("64", "8 slots in one process vs tune + 7 workers of 8 slots", (Run(1, 8), Run(8, 8)), grid=8,
                       duration=duration or (1.0 if quick else 10.0), target=4.0),
    }


class CpuSampler:
    """CPU seconds of given processes, of the PostgreSQL backends serving them (found by their
    ``application_name``) and of the whole machine, read from /proc four times a second."""

    def __init__(self, pids: list[int], *, storage: str, app: str) -> None:
        self._pids = pids
        self.timeline: dict[int, list[tuple[float, float]]] = {pid: [] for pid in pids}  # (time.time(), CPU s)
        self._backends: dict[int, tuple[float, float]] = {}  # pid: (first, last) CPU s read
        self.connections = 0  # the most backends serving the processes at once
        self._conn = self._connect(storage)
        self._app = app
        self._machine_start = self._machine()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @staticmethod
    def _connect(storage: str) -> Any:
        from sqlalchemy.engine import make_url

        url = make_url(storage)
        if not url.drivername.startswith("postgresql"):
            return None
        import psycopg

        return psycopg.connect(host=url.host, port=url.port, user=url.username, password=url.password, dbname=url.database,
                               autocommit=True, application_name="optuna-ds-bench-sampler")

    @staticmethod
    def _cpu(pid: int) -> float | None:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        fields = text[text.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime: this process's threads only

    @staticmethod
    def _machine() -> float:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return (sum(fields[:8]) - fields[3] - fields[4]) / TICK  # all but idle and iowait

    def _sample(self) -> None:
        now = time.time()
        for pid in self._pids:
            if (cpu := self._cpu(pid)) is not None:
                self.timeline[pid].append((now, cpu))
        if self._conn is not None:
            rows = self._conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (self._app,)).fetchall()
            self.connections = max(self.connections, len(rows))
            for (pid,) in rows:
                if (cpu := self._cpu(pid)) is not None:
                    self._backends[pid] = (self._backends.get(pid, (cpu, cpu))[0], cpu)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            self._sample()

    def finish(self) -> tuple[float | None, float]:
        """Stop; the CPU seconds the PostgreSQL backends (``None`` without PostgreSQL) and the
        machine spent meanwhile."""
        self._stop.set()
        self._thread.join()
        machine = self._machine() - self._machine_start
        if self._conn is None:
            return None, machine
        self._conn.close()
        # A backend's CPU before its first reading (its connection's start) is missed: a few ms.
        return sum(last - first for first, last in self._backends.values()), machine

    def total(self, pid: int) -> float:
        return self.timeline[pid][-1][1] if self.timeline[pid] else 0.0

    def rate(self, pid: int, start: float, end: float) -> float | None:
        """CPU s/s of ``pid`` between two times (linear between readings)."""
        points = self.timeline[pid]
        if end - start < 0.5 or not points or points[0][0] > start or points[-1][0] < end:
            return None

        def at(t: float) -> float:
            for (t0, c0), (t1, c1) in zip(points, points[1:]):
                if t0 <= t <= t1:
                    return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
            return points[-1][1]

        return (at(end) - at(start)) / (end - start)


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    if not values:
        return (float("nan"),) * 3
    values = sorted(values)
    return statistics.median(values), values[min(len(values) - 1, int(0.95 * len(values)))], values[-1]


def _delete_studies(storage: str, name: str) -> collections.Counter[str]:
    """Delete the tuning's studies; how many of their trials ended in each state, a trial that
    stood down for another's experiment counted as ``STOOD_DOWN``."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    states: collections.Counter[str] = collections.Counter()
    for study in optuna.study.get_all_study_names(storage):
        if study == name or study.startswith(name + "-"):
            for t in optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False):
                states["STOOD_DOWN" if "duplicate_of" in t.user_attrs else t.state.name] += 1
            optuna.delete_study(study_name=study, storage=storage)
    return states


def _watch_ready(proc: subprocess.Popen[str], index: int, ready: dict[int, float]) -> None:
    """Note when the process's drivers start, from the line that it prints then ("... N at once;
    metric ..."), and drain its output."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if index not in ready and " at once; metric " in line:
            ready[index] = time.time() + 0.5  # past the drivers' first steps


def run_tuning(scenario: Scenario, run: Run, *, storage: str, timeout: float) -> dict:
    """Run one tuning, every process started at once (the workers wait for the tune's plan), and
    measure it from the launch and decision logs and the CPU readings."""
    name = f"bench-par-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix=f"bench-parallel-{run.total}-") as tmp:
        work = Path(tmp)
        (work / "train.py").write_text("print('simulated')\n")
        (work / "ds_config.json").write_text(json.dumps(config(scenario.grid)))
        log, decisions = work / "launches.jsonl", work / "decisions.jsonl"
        common = ["--storage", storage, "--study-name", name]
        procs: list[subprocess.Popen[str]] = []
        errs = []
        ready: dict[int, float] = {}  # process index: when its drivers started (its start-up done)
        readers = []
        start, started_at = time.monotonic(), time.time()
        try:
            for i in range(run.processes):
                env = dict(os.environ, DS_ACCELERATOR="cpu", LOCAL_SIZE=str(run.slots), FAKE_DS_LOG=str(log), FAKE_DS_NODE=f"node{i}",
                           FAKE_DS_SURFACE=json.dumps(surface(scenario.duration)), OPTUNA_DS_LOCK_DIR=str(work / f"locks{i}"),
                           PYTHONPATH=str(ROOT), PGAPPNAME=name)
                args = (["tune", "--deepspeed-bin", str(LAUNCHER), "--num_gpus", "1", *common, "train.py", "--deepspeed_config", "ds_config.json"]
                        if i == 0 else ["worker", *common])
                err = open(work / f"stderr{i}", "w+")
                errs.append(err)
                procs.append(subprocess.Popen([sys.executable, str(DRIVER), str(decisions), *args], cwd=work, env=env, stdout=subprocess.PIPE,
                                              stderr=err, text=True, start_new_session=True))
                readers.append(threading.Thread(target=_watch_ready, args=(procs[-1], i, ready), daemon=True))
                readers[-1].start()
            sampler = CpuSampler([p.pid for p in procs], storage=storage, app=name)
            deadline = start + timeout
            for p in procs:
                try:
                    p.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise RunFailed(f"did not finish in {timeout:.0f} s") from None
            wall = time.monotonic() - start
            for reader in readers:
                reader.join()
            postgres_cpu, machine_cpu = sampler.finish()
            for i, (p, err) in enumerate(zip(procs, errs)):
                if p.returncode != 0:
                    err.seek(0)
                    lines = [line for line in err.read().splitlines() if line.strip()]
                    raise RunFailed(f"process {i} exited {p.returncode}: {lines[-1] if lines else ''}")
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            for err in errs:
                err.close()
            trials = _delete_studies(storage, name)
        launches = [json.loads(line) for line in log.read_text().splitlines()]
        decided = [json.loads(line)["seconds"] for line in decisions.read_text().splitlines()] if decisions.exists() else []
    experiments = [l for l in launches if not l.get("profile") and not l.get("training")]
    for l in experiments:
        l["name"] = Path(l["args"][l["args"].index("--deepspeed_config") + 1]).parent.name
    counts = collections.Counter(l["name"] for l in experiments)
    by_gpu: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for l in experiments:
        host, ids = l["include"].split(":")
        for gpu in ids.split(","):
            by_gpu[(l["node"], f"{host}:{gpu}")].append(l)
    overlaps, gaps = 0, []
    for runs in by_gpu.values():
        runs.sort(key=lambda l: l["start"])
        for a, b in zip(runs, runs[1:]):
            overlaps += b["start"] < a["end"]
            gaps.append(b["start"] - a["end"])
    first, last = min(l["start"] for l in experiments), max(l["end"] for l in experiments)
    busy = sum(l["end"] - l["start"] for l in experiments) / (last - first)
    per_process = [sampler.total(p.pid) / wall for p in procs]
    # While the micro-batch sizes run (all started, none ended) there is nothing to decide: every
    # process only waits, the time that should cost no CPU.
    sizes = [l for l in experiments if MICRO_BATCH_NAME.fullmatch(l["name"])]
    window = (max(l["start"] for l in sizes) + 0.1, min(l["end"] for l in sizes) - 0.05)
    waiting = [sampler.rate(p.pid, max(window[0], ready.get(i, window[1])), window[1]) for i, p in enumerate(procs)]
    launched = collections.Counter(l["node"] for l in experiments)
    return {
        "run": run, "study": name, "wall": wall, "span": last - first, "first": first - started_at,
        "experiments": len(experiments), "distinct": len(counts), "duplicates": sum(c - 1 for c in counts.values()),
        "overlaps": overlaps, "busy": busy, "gaps": _quantiles(gaps), "decisions": _quantiles(decided),
        "cpu": per_process, "waiting": waiting, "window": window[1] - window[0],
        "launched": [launched.get(f"node{i}", 0) for i in range(run.processes)],
        "postgres": None if postgres_cpu is None else postgres_cpu / wall, "machine": machine_cpu / wall,
        "connections": sampler.connections, "trials": trials,
        "timeline": sorted((l["start"] - started_at, l["end"] - started_at, l["node"], l["name"]) for l in experiments),
    }


def _rate(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def report(scenario: Scenario, rows: list[dict]) -> None:
    base = rows[0]
    print(f"\n### {scenario.title}\n")
    print(f"simulated experiment {scenario.duration:g} s; knob grid {scenario.grid} x {scenario.grid} x 2 micro-batch sizes "
          f"+ 4 micro-batch runs = {2 * scenario.grid**2 + 4} experiments; target speed-up >= {scenario.target:g}x\n")
    print("| slots | wall s | speed-up | experiments span s (from start s) | launched | duplicates | GPU overlaps | mean busy slots "
          "| gap p50 / p95 / max s | decision p50 / p95 / max ms | CPU s/s per process, run (mean / max) "
          "| CPU s/s per process, waiting (mean / max; window s) | PostgreSQL CPU s/s (connections) | machine CPU s/s (all users) "
          "| trials: complete / failed / stood down |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | --- | --- | --- | --- | ---: | --- |")
    for r in rows:
        if "failed" in r:
            print(f"| {r['run'].label} | failed: {r['failed']} |" + " |" * 13)
            continue
        g, d, t = r["gaps"], [x * 1000 for x in r["decisions"]], r["trials"]
        speedup = f"{base['wall'] / r['wall']:.2f}" if "wall" in base else "n/a"
        waiting = [w for w in r["waiting"] if w is not None]
        idle = f"{statistics.mean(waiting):.3f} / {max(waiting):.3f}; {r['window']:.1f}" if waiting else "n/a (no window)"
        postgres = "n/a" if r["postgres"] is None else f"{r['postgres']:.2f} ({r['connections']})"
        print(f"| {r['run'].label} | {r['wall']:.1f} | {speedup} | {r['span']:.1f} ({r['first']:.1f}) | {r['experiments']} | {r['duplicates']} "
              f"| {r['overlaps']} | {r['busy']:.1f} | {g[0]:.2f} / {g[1]:.2f} / {g[2]:.2f} | {d[0]:.0f} / {d[1]:.0f} / {d[2]:.0f} "
              f"| {statistics.mean(r['cpu']):.3f} / {max(r['cpu']):.3f} | {idle} | {postgres} | {r['machine']:.2f} "
              f"| {t['COMPLETE']} / {t['FAIL']} / {t['STOOD_DOWN']} |")
    widest = rows[-1]
    if widest["run"].processes > 1 and "failed" not in widest:
        print(f"\n{widest['run'].label} slots, by process:\n")
        print("| process | experiments launched | CPU s/s, run | CPU s/s, waiting |")
        print("| --- | ---: | ---: | ---: |")
        for i, (n, cpu, waiting) in enumerate(zip(widest["launched"], widest["cpu"], widest["waiting"])):
            print(f"| {'tune' if i == 0 else f'worker {i}'} | {n} | {cpu:.3f} | {_rate(waiting)} |")


def _run_or_failure(scenario: Scenario, run: Run, *, storage: str, timeout: float) -> dict:
    try:
        return run_tuning(scenario, run, storage=storage, timeout=timeout)
    except RunFailed as e:
        return {"run": run, "failed": str(e)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", nargs="+", choices=["4", "64"], default=["4", "64"])
    parser.add_argument("--duration", type=float, default=None, help="seconds per simulated experiment (default: 2 for '4', 10 for '64')")
    parser.add_argument("--quick", action="store_true", help="a smoke run: short experiments (0.5 s and 1 s), a smaller grid for '4'")
    parser.add_argument("--storage", default=os.environ.get("OPTUNA_DS_BENCH_STORAGE", STORAGE),
                        help="the shared storage (env OPTUNA_DS_BENCH_STORAGE); default the local PostgreSQL")
    args = parser.parse_args()
    from optuna_ds._redact import redact_url

    import optuna

    try:
        optuna.study.get_all_study_names(args.storage)
    except Exception as e:  # noqa: BLE001 - any failure to reach it, said in one line
        raise SystemExit(f"cannot use the storage {redact_url(args.storage)}: {str(e).splitlines()[0]}") from None
    print(f"storage {redact_url(args.storage)}; {os.cpu_count()} CPU core(s)")
    failed = False
    for key in args.scenarios:
        scenario = scenarios(args.duration, args.quick)[key]
        rounds = 1 + -(-2 * scenario.grid**2 // scenario.runs[0].total)
        timeout = 120 + 10 * rounds * scenario.duration
        rows = [_run_or_failure(scenario, run, storage=args.storage, timeout=timeout) for run in scenario.runs]
        report(scenario, rows)
        failed = failed or any("failed" in r for r in rows)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
