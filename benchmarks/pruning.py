"""What the pruner saves: simulated jobs tuned by the product (benchmarks/product.py, its
simulated launches writing their step lines as the virtual clock reaches them), the runs the
pruner ended and the device-seconds they did not run, against the tuning's whole device time,
with its bootstrap interval over the jobs.

    python benchmarks/pruning.py --jobs random-2000 random-2001 ...   (or --random N --first SEED)

The quality side (the choice) is benchmarks/planner.py's, run with and without the change
(``--save`` then ``--paired``); docs/steps.md has both.
"""
from __future__ import annotations

import argparse

import catalog
import product
import stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", nargs="*", help="these jobs (catalog.by_name)")
    parser.add_argument("--random", type=int, default=8, metavar="N", help="else N generated jobs...")
    parser.add_argument("--first", type=int, default=2000, metavar="SEED", help="...from this seed")
    parser.add_argument("--full", action="store_true", help="full mode: the knobs too")
    parser.add_argument("--tuner", default="model_based", choices=["gridsearch", "random", "model_based"])
    args = parser.parse_args()
    names = args.jobs or [f"random-{i}" for i in range(args.first, args.first + args.random)]
    saved, spent, pruned, launches = [], [], [], []
    for name in names:
        r = product.tune(catalog.by_name(name), fast=not args.full, tuner_type=args.tuner)
        gpu_s = r["gpu_hours"] * 3600.0
        saved.append(sum(e.get("saved_s", 0.0) * e["gpus"] for e in r["experiments"]))
        spent.append(gpu_s + saved[-1])  # what the tuning would have spent without the pruner
        pruned.append(r["pruned"])
        launches.append(r["launches"])
        print(f"{name}: {r['pruned']} of {r['launches']} launches pruned, {saved[-1]:.0f} device-s saved of {spent[-1]:.0f}",
              flush=True)
    share = stats.ratio_of_sums(saved, spent)
    print(f"{len(names)} jobs ({'full' if args.full else 'fast'} mode, tuner {args.tuner}): {sum(pruned)} of {sum(launches)} launches "
          f"pruned; device time saved {stats.format_interval(share)} of the tuning's")


if __name__ == "__main__":
    main()
