"""`make bench-parallel`: wall time of one tuning with 1, 2 and 4 GPU slots.

The simulated launcher (tests/fake_deepspeed.py, which speaks the ``deepspeed`` command line
and writes the engine's metrics) sleeps a fixed time per experiment. The tuning is a knob
search (``"fast": false``, grid) over a fixed micro-batch list, so there is parallel work to
do; the speed-up is the 1-slot wall time over the k-slot one. The orchestration gap is the time
from one experiment ending on a slot to the next one starting on it (it includes the simulated
launcher's Python start-up, ~50 ms).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "tests" / "fake_deepspeed.py"
CONFIG = {
    "train_micro_batch_size_per_gpu": [8, 16, 24, 32],
    "zero_optimization": {"stage": 1},
    "autotuning": {"enabled": True, "fast": False, "tuner_type": "gridsearch", "num_tuning_micro_batch_sizes": 2,
                   "tuner_early_stopping": 1000, "tuner_num_trials": 1000},
}


def run(slots: int, duration: float) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench-parallel-{slots}-") as tmp:
        work = Path(tmp)
        (work / "train.py").write_text("print('simulated')\n")
        (work / "ds_config.json").write_text(json.dumps(CONFIG))
        log = work / "launches.jsonl"
        surface = {"duration": duration, "peak": 24, "knob_gain": {"reduce_bucket_size": {"500000000": 1.05}}}
        env = dict(os.environ, DS_ACCELERATOR="cpu", LOCAL_SIZE=str(slots), FAKE_DS_LOG=str(log),
                   FAKE_DS_SURFACE=json.dumps(surface), OPTUNA_DS_LOCK_DIR=str(work / "locks"))
        start = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "optuna_ds", "tune", "-q", "--deepspeed-bin", str(LAUNCHER), "--num_gpus", "1",
                            "train.py", "--deepspeed_config", "ds_config.json"], cwd=work, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        if p.returncode != 0:
            raise SystemExit(f"tuning with {slots} slot(s) failed:\n{p.stderr}")
        launches = [json.loads(line) for line in log.read_text().splitlines()]
        experiments = [l for l in launches if not l.get("profile")]
        gaps = []
        by_slot: dict[str, list[dict]] = {}
        for l in experiments:
            by_slot.setdefault(l["include"], []).append(l)
        for runs in by_slot.values():
            runs.sort(key=lambda l: l["start"])
            gaps += [b["start"] - a["end"] for a, b in zip(runs, runs[1:])]
        first = min(l["start"] for l in experiments)
        last = max(l["end"] for l in experiments)
        return {"slots": slots, "wall": wall, "span": last - first, "experiments": len(experiments), "gaps": sorted(gaps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per simulated experiment")
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    rows = [run(k, args.duration) for k in args.slots]
    base = rows[0]
    print(f"simulated experiment: {args.duration:.1f} s; tuning: {base['experiments']} experiments (knob grid over 2 micro-batch sizes + 4 sizes)")
    print("| slots | experiments | wall s | experiments span s | speed-up | speed-up / slots | gap p50 s | gap p90 s | gap max s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        speedup = base["span"] / r["span"]
        g = r["gaps"] or [0.0]
        p90 = g[min(len(g) - 1, int(0.9 * len(g)))]
        print(f"| {r['slots']} | {r['experiments']} | {r['wall']:.1f} | {r['span']:.1f} | {speedup:.2f} | {speedup / r['slots'] * base['slots']:.2f} "
              f"| {statistics.median(g):.3f} | {p90:.3f} | {max(g):.3f} |")


if __name__ == "__main__":
    main()
