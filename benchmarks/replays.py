"""Jobs of the planner benchmark that answer from recorded real runs (benchmarks/replays/).

A :class:`Replay` has the interface of benchmarks/surfaces.py's ``Surface`` that
benchmarks/planner.py and benchmarks/simulated_deepspeed.py use. Each launch is answered with
one recorded run of its config (benchmarks/record_real.py wrote them): the k-th launch of a
config draws its k-th run in an order of the config's own, so a replicate is another run, with
the real noise, plateaus and start-up of this machine.
The truth of a config is the mean of its recorded runs.

Sizes between recorded ones are interpolated, not forbidden: the planner then searches as it
would for a user who listed no sizes (a list of sizes is a path of its own). The truth is
linear in log(size) between an arm's two nearest recorded sizes. Outside an arm's recorded
sizes (most arms are recorded at the cap alone: five runs of a config take minutes on this
machine) it is the nearest recorded size's, scaled as stage 0 changes between the two sizes:
the arms share the curve's shape over the size, not its height. A run of a size not recorded
is that truth times one run's ratio to its mean at the nearest recorded size, so its noise is
the recorded noise, not an average of two.
A config's accumulation is not a dimension of the replay: a size answers with the runs of its
recorded accumulation (the cap's, as optuna-ds and DeepSpeed's autotuner give it). A config
counts as running when its nearest recorded runs include an ok one; a tuning of the replay has
only the arms (stage, offload) that were recorded.

A job's ``noise`` is the run-to-run relative sd of one run, pooled over its configs with at
least two ok runs. A choice is *within noise* of the best when its true mean is within one
such sd of the optimum's (:meth:`Replay.within_noise`; the optimum is a recorded config but
where the scaled shape puts a size not recorded higher): one run's sd, not a standard error,
since a tuner that measures each candidate once cannot tell closer apart.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import json
import math
import statistics
from pathlib import Path
from typing import Any

from surfaces import GB
from surfaces import Config
from surfaces import Outcome

DIR = Path(__file__).resolve().parent / "replays"
PREFIX = "replay-"
# The replay files' offload labels against the benchmark's Config flags.
OFFLOADS = {"": (False, False), "optimizer": (True, False), "optimizer+param": (True, True)}


@dataclasses.dataclass(frozen=True)
class _Point:
    """The recorded runs of one config."""

    mbs: int
    runs: tuple[dict[str, Any], ...]

    @property
    def ok(self) -> tuple[dict[str, Any], ...]:
        return tuple(r for r in self.runs if r["outcome"] == "ok")

    @property
    def mean(self) -> float:
        return statistics.fmean(r["samples_per_s"] for r in self.ok) if self.ok else 0.0



class Replay:
    """One recorded job (``replay-<job>``)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.name = PREFIX + data["job"]
        self.description = f"{data['script']} {' '.join(data.get('args', []))} recorded on {data['hardware']['accelerator']}"
        hardware = data["hardware"]
        self.num_gpus = int(hardware["ranks"])
        self.device_gb = hardware["device_memory_bytes"] / GB
        self.params_b = data["model"]["params"] / GB
        self.act_gb = (data["model"]["activation_per_sample_bytes"] or 0) / GB
        self.max_mbs = data["max_train_batch_size"] // self.num_gpus
        arms: dict[tuple[int, str], dict[int, list[dict[str, Any]]]] = {}
        for run in data["runs"]:
            arms.setdefault((run["stage"], run["offload"]), {}).setdefault(run["micro_batch"], []).append(run)
        self._arms = {key: [_Point(mbs, tuple(runs)) for mbs, runs in sorted(sizes.items())] for key, sizes in arms.items()}
        self._nonces: dict[Config, list[int]] = {}
        # (stage, offload_optimizer, offload_param) of each arm recorded: a tuning of the replay has no other.
        self.recorded_arms = frozenset((stage, *OFFLOADS[label]) for stage, label in self._arms)
        ok = [p for points in self._arms.values() for p in points if len(p.ok) >= 2]
        variance = [statistics.variance([r["samples_per_s"] / p.mean for r in p.ok]) for p in ok]
        weights = [len(p.ok) - 1 for p in ok]
        self.noise = math.sqrt(sum(v * w for v, w in zip(variance, weights)) / sum(weights)) if weights else 0.0
        ran = [r for r in data["runs"] if r["outcome"] == "ok" and r["step_times_s"]]
        steps = data["profile_steps"][1] + 1
        self.startup_s = statistics.median(r["launch_s"] - steps * statistics.fmean(r["step_times_s"]) for r in ran) if ran else 0.0

    @property
    def fingerprint(self) -> str:
        """Of the recorded data: cached figures of another recording are stale."""
        return hashlib.sha256(json.dumps(self.data, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def autotuning(self) -> dict[str, Any]:
        """The user's ``autotuning`` keys of this job: its batch cap."""
        return {"max_train_batch_size": self.data["max_train_batch_size"], "max_train_micro_batch_size_per_gpu": self.max_mbs}

    # -- the recorded runs ----------------------------------------------------------------

    def _points(self, config: Config) -> list[_Point] | None:
        if config.offload_param and not config.offload_optimizer:
            return None
        offload = "optimizer+param" if config.offload_param else "optimizer" if config.offload_optimizer else ""
        return self._arms.get((config.stage, offload))

    def _nearest(self, points: list[_Point], mbs: int) -> _Point:
        return min(points, key=lambda p: (abs(math.log(p.mbs / mbs)), -p.mbs))

    def _curve(self, points: list[_Point], mbs: int) -> float | None:
        """The mean at ``mbs``, linear in log size between the recorded sizes either side;
        ``None`` outside them."""
        sizes = [p.mbs for p in points]
        i = bisect.bisect_left(sizes, mbs)
        if i < len(sizes) and sizes[i] == mbs:
            return points[i].mean
        if i == 0 or i == len(sizes):
            return None
        lo, hi = points[i - 1], points[i]
        w = math.log(mbs / lo.mbs) / math.log(hi.mbs / lo.mbs)
        return (1.0 - w) * lo.mean + w * hi.mean

    def _shape(self, mbs: int) -> float:
        """Stage 0's mean at ``mbs`` (the nearest recorded size's outside its range): the
        shape an arm recorded at fewer sizes follows."""
        points = [p for p in self._arms.get((0, ""), []) if p.ok]
        if not points:
            return 1.0
        value = self._curve(points, mbs)
        return value if value is not None else self._nearest(points, mbs).mean

    def evaluate(self, config: Config) -> Outcome:
        """The truth: the mean of the recorded runs, interpolated (or scaled, see the module)
        to sizes not recorded; a config whose nearest recorded runs all failed fails as the
        first of them did."""
        points = self._points(config)
        if not points:
            return Outcome("crash", 0.0, self.startup_s)
        nearest = self._nearest(points, config.mbs)
        seconds = statistics.fmean(r["launch_s"] for r in nearest.runs)
        ok = [p for p in points if p.ok]
        if not nearest.ok or not ok:
            return Outcome(nearest.runs[0]["outcome"], 0.0, seconds)
        value = self._curve(ok, config.mbs)
        if value is None:
            edge = self._nearest(ok, config.mbs)
            value = edge.mean * self._shape(config.mbs) / self._shape(edge.mbs)
        return Outcome("ok", value, seconds)

    def _nth(self, config: Config, k: int) -> tuple[dict[str, Any], _Point]:
        """The run the ``k``-th launch of ``config`` draws (from 0), and its recorded config:
        the nearest recorded size's ok runs in an order of their own, each drawn once before
        any twice (a replicate is another run, as it would be on the machine)."""
        points = self._points(config)
        assert points
        nearest = self._nearest([p for p in points if p.ok], config.mbs)
        order = sorted(range(len(nearest.ok)), key=lambda i: hashlib.sha256(f"{self.name}|{config}|{i}".encode()).digest())
        return nearest.ok[order[k % len(order)]], nearest

    def _launch(self, config: Config, nonce: int) -> int:
        """Which launch of ``config`` the benchmark's ``nonce`` (one a launch) is."""
        seen = self._nonces.setdefault(config, [])
        if nonce not in seen:
            seen.append(nonce)
        return seen.index(nonce)

    def measure_nth(self, config: Config, k: int) -> float:
        """What the ``k``-th launch of ``config`` measures: a recorded run, scaled to the
        config's truth where its size was not recorded."""
        run, nearest = self._nth(config, k)
        return self.evaluate(config).throughput * run["samples_per_s"] / nearest.mean

    def measure(self, config: Config, nonce: int) -> float:
        return self.measure_nth(config, self._launch(config, nonce))

    def step_times(self, config: Config, nonce: int) -> list[float]:
        return list(self._nth(config, self._launch(config, nonce))[0]["step_times_s"])

    def timers(self, config: Config, nonce: int) -> dict[str, float]:
        return dict(self._nth(config, self._launch(config, nonce))[0]["timers_ms"])

    def peak_memory_gb(self, config: Config, nonce: int) -> float:
        return self._nth(config, self._launch(config, nonce))[0]["peak_memory_bytes"] / GB

    def memory_gb(self, config: Config) -> float:
        points = self._points(config)
        assert points
        return statistics.fmean(r["peak_memory_bytes"] for r in self._nearest(points, config.mbs).runs) / GB

    # -- the best recorded configs --------------------------------------------------------

    def arm_optima(self, *, fast: bool = True, offload: bool = False, **_: Any) -> dict[tuple[int, bool, bool], tuple[Config, float]]:
        """The best config of each arm that ran, over every size up to the cap, and its truth.
        The replays record no knob settings: full mode's optimum is fast mode's."""
        best: dict[tuple[int, bool, bool], tuple[Config, float]] = {}
        for stage, label in self._arms:
            off_opt, off_param = OFFLOADS[label]
            if off_opt and not offload:
                continue
            for mbs in range(self.max_mbs, 0, -1):  # a tie goes to the larger size, the recorded one
                config = Config(stage=stage, mbs=mbs, gas=max(1, self.max_mbs // mbs), offload_optimizer=off_opt,
                                offload_param=off_param)
                value = self.evaluate(config).throughput
                key = (stage, off_opt, off_param)
                if value > 0.0 and (key not in best or value > best[key][1]):
                    best[key] = (config, value)
        return best

    def optimum(self, **kwargs: Any) -> tuple[Config | None, float]:
        return max(self.arm_optima(**kwargs).values(), key=lambda cv: cv[1], default=(None, 0.0))

    @functools.cached_property
    def best(self) -> float:
        """The optimum's truth, offload arms included."""
        return self.optimum(offload=True)[1]

    def within_noise(self, throughput: float) -> bool:
        """Whether a choice's true mean is within one run's noise of the optimum's."""
        return throughput >= self.best * (1.0 - self.noise)


@functools.cache
def replays() -> tuple[Replay, ...]:
    """Every recorded job, in name order."""
    return tuple(Replay(json.loads(p.read_text())) for p in sorted(DIR.glob("*.json")))


def by_name(name: str) -> Replay:
    for job in replays():
        if job.name == name:
            return job
    raise KeyError(name)


def main() -> None:
    """``python benchmarks/replays.py``: what was recorded, a job a paragraph."""
    for job in replays():
        runs = job.data["runs"]
        ok = [r for r in runs if r["outcome"] == "ok"]
        loads = sorted(r["load1"] for r in runs)
        best, value = job.optimum(offload=True)
        print(f"{job.name}: {len(runs)} runs ({len(ok)} ok) of {sum(len(p) for p in job._arms.values())} configs, "
              f"noise {job.noise:.1%} (one run's relative sd), start-up {job.startup_s:.0f} s, launches "
              f"{statistics.median(r['launch_s'] for r in runs):.0f} s median, load {loads[0]:.1f}-{loads[-1]:.1f}; "
              f"best z{best.stage} mbs {best.mbs} {value:.1f} samples/s" if best else f"{job.name}: nothing ran")
        for (stage, label), points in sorted(job._arms.items()):
            cells = []
            for p in points:
                values = [r["samples_per_s"] for r in p.ok]
                sd = statistics.stdev(values) / p.mean if len(values) > 1 else 0.0
                failed = {r["outcome"] for r in p.runs} - {"ok"}
                cells.append(f"{p.mbs}: {p.mean:.1f} ±{sd:.0%} ({len(values)}/{len(p.runs)}{' ' + ','.join(failed) if failed else ''})")
            print(f"  z{stage}{' ' + label if label else ''}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
