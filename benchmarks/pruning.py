"""What the pruner saves, and what it costs the choice: simulated jobs tuned by the product
(benchmarks/product.py, whose simulated launches write their step lines as the virtual clock
reaches them) twice, with the pruner and without it (its judge removed), on the same simulator.
Per job: the launches it ended early, the device-seconds they did not run, and the choice's true
throughput both ways; over the jobs, the device time saved as a share of the tuning's without
the pruner and the paired difference of the chosen configs' share of the optimum, each with its
bootstrap interval.

    python benchmarks/pruning.py --jobs random-2000 random-2001 ...   (or --random N --first SEED)

A launch the runner ends (pruned, or past the trial timeout: the simulator's runs now time out as
real ones do) counts what it did not run; the pruner's are the difference between the two runs.
"""
from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock


import catalog
import product
import stats
import surfaces


@contextlib.contextmanager
def _pruner(on: bool) -> Iterator[None]:
    """The product as it is, or with no run judged while it runs (nothing reported live, nothing pruned)."""
    if on:
        yield
        return
    from optuna_ds.studies import _experiments

    with mock.patch.object(_experiments, "live_judge", lambda *a, **k: None):
        yield


def _tuned(surface: surfaces.Surface, *, prune: bool, full: bool, tuner: str) -> dict[str, Any]:
    with _pruner(prune):
        r = product.tune(surface, fast=not full, tuner_type=tuner)
    return {"gpu_s": r["gpu_hours"] * 3600.0, "ended": r["ended_early"], "launches": r["launches"], "true": r["true"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", nargs="*", help="these jobs (catalog.by_name)")
    parser.add_argument("--random", type=int, default=8, metavar="N", help="else N generated jobs...")
    parser.add_argument("--first", type=int, default=2000, metavar="SEED", help="...from this seed")
    parser.add_argument("--full", action="store_true", help="full mode: the knobs too")
    parser.add_argument("--tuner", default="model_based", choices=["gridsearch", "random", "model_based"])
    args = parser.parse_args()
    names = args.jobs or [f"random-{i}" for i in range(args.first, args.first + args.random)]
    saved, spent, with_true, without_true = [], [], [], []
    for name in names:
        surface = catalog.by_name(name)
        on = _tuned(surface, prune=True, full=args.full, tuner=args.tuner)
        off = _tuned(surface, prune=False, full=args.full, tuner=args.tuner)
        optimum = surfaces.optimum_of(surface.arm_optima(fast=not args.full, offload=True))[1]
        if not optimum:
            continue
        saved.append(off["gpu_s"] - on["gpu_s"])
        spent.append(off["gpu_s"])
        with_true.append(on["true"] / optimum)
        without_true.append(off["true"] / optimum)
        print(f"{name}: {on['ended'] - off['ended']} of {on['launches']} launches pruned ({off['ended']} ended at the trial timeout "
              f"without the pruner); device-s {on['gpu_s']:.0f} with, {off['gpu_s']:.0f} without; choice's share of the optimum "
              f"{with_true[-1]:.4f} with, {without_true[-1]:.4f} without", flush=True)
    share = stats.ratio_of_sums(saved, spent)
    quality = stats.paired_difference(with_true, without_true)
    print(f"{len(names)} jobs ({'full' if args.full else 'fast'} mode, tuner {args.tuner}): device time saved "
          f"{stats.format_interval(share)} of the tuning's without the pruner; the choice's share of the optimum, with minus "
          f"without: {stats.format_interval(quality)}")


if __name__ == "__main__":
    main()
