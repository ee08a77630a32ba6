from __future__ import annotations

import io

from optuna_ds.config import Metric
from optuna_ds.reporting import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _feed(progress: Progress, clock: Clock | None = None) -> None:
    clock = clock or Clock()
    progress.plan(5, metric=Metric.named("throughput"))
    progress.started(stage=1, number=0, name="z1_gas1_tmbspg4", slot="localhost:0,1")
    clock.now += 10
    progress.finished(stage=1, number=0, name="z1_gas1_tmbspg4", value=120.0, duration=10.0, outcome="throughput=120")
    progress.started(stage=1, number=1, name="z1_gas1_tmbspg8", slot="localhost:0,1")
    clock.now += 5
    progress.finished(stage=1, number=1, name="z1_gas1_tmbspg8", value=None, duration=5.0, outcome="failed (oom: out of memory)")
    progress.started(stage=2, number=0, name="z2_gas1_tmbspg4", slot="localhost:2,3")


def test_status_shows_best_first_a_bar_over_the_estimate_and_time_left() -> None:
    clock = Clock()
    progress = Progress(stream=io.StringIO(), tty=False, clock=clock)
    _feed(progress, clock)
    lines = progress.status().splitlines()
    assert lines[0].startswith("best 120 z1_gas1_tmbspg4 | z1 120")
    assert lines[1].startswith("2/~5 ") and " 40% " in lines[1]
    assert "~0:00:22 left" in lines[1]  # 3 more at 2 finished in 15 s
    assert lines[2].startswith("localhost:2,3 0:00:00 z2_gas1_tmbspg4")


def test_remaining_time_follows_the_rate_of_all_slots() -> None:
    """Two slots finishing 10 s experiments side by side: one experiment every 5 s, not 10."""
    clock = Clock()
    progress = Progress(stream=io.StringIO(), tty=False, clock=clock)
    progress.plan(10, metric=Metric.named("throughput"))
    for i in range(2):
        progress.started(stage=0, number=i, name=f"a{i}", slot=f"localhost:{i}")
    clock.now += 10
    for i in range(2):
        progress.finished(stage=0, number=i, name=f"a{i}", value=1.0 + i, duration=10.0, outcome="ok")
    assert progress.remaining() == 40.0  # 8 left at 2 per 10 s


def test_the_essentials_fit_80_columns_with_two_busy_slots() -> None:
    clock = Clock()
    progress = Progress(stream=io.StringIO(), tty=False, clock=clock)
    progress.plan(38, metric=Metric.named("throughput"))
    long = "z3_gas16_tmbspg128_offload-opt-param_ocT_rbs5e8_agbs5e8_pbs5e7_mlp1e9_pt1e6"
    for i, slot in enumerate(("localhost:0,1,2,3", "localhost:4,5,6,7")):
        progress.started(stage=3, number=i, name=long + str(i), slot=slot)
    clock.now += 61
    progress.finished(stage=3, number=0, name=long + "0", value=160.4, duration=61.0, outcome="ok")
    progress.started(stage=3, number=2, name=long + "2", slot="localhost:0,1,2,3")
    clock.now += 3600
    lines = progress.render(width=80).splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert len(lines) == 4  # best, bar, one line per busy slot
    assert lines[0].startswith("best 160.4 z3_gas16")
    assert lines[1].startswith("1/~38 ") and "elapsed" in lines[1] and "left" in lines[1]
    assert lines[2].startswith("localhost:0,1,2,3 1:00:00 z3_gas16") and lines[3].startswith("localhost:4,5,6,7 1:01:01 z3_gas16")


def test_a_changed_estimate_is_said() -> None:
    out = io.StringIO()
    progress = Progress(stream=out, tty=False)
    progress.plan(37, metric=Metric.named("throughput"))
    progress.finished(stage=0, number=0, name="a", value=1.0, duration=1.0, outcome="ok")
    progress.plan(41, metric=Metric.named("throughput"))
    assert "estimate: ~42 experiments in all (was ~37)" in out.getvalue()
    progress.plan(41, metric=Metric.named("throughput"))
    assert out.getvalue().count("estimate:") == 1


def test_a_terminal_gets_the_live_block_and_the_log_lines_above_it() -> None:
    out = io.StringIO()
    progress = Progress(stream=out, tty=True)
    _feed(progress)
    progress.close()
    text = out.getvalue()
    assert "[z1] trial 1: z1_gas1_tmbspg8 failed (oom: out of memory) in 5.0s" in text
    assert "━" in text  # the bar was drawn
    assert "\x1b[" in text  # and redrawn in place


def test_plain_lines_when_not_a_terminal_and_nothing_when_quiet() -> None:
    out = io.StringIO()
    _feed(Progress(stream=out, tty=False))
    lines = out.getvalue().splitlines()
    assert lines[0] == "[z1] trial 0: running z1_gas1_tmbspg4 on localhost:0,1"
    assert "[z1] trial 1: z1_gas1_tmbspg8 failed (oom: out of memory) in 5.0s" in lines
    assert "━" not in out.getvalue()
    quiet = io.StringIO()
    _feed(Progress(stream=quiet, tty=False, quiet=True))
    assert quiet.getvalue() == ""


def test_verbose_adds_details_and_latency_best_is_the_minimum() -> None:
    out = io.StringIO()
    progress = Progress(stream=out, tty=False, verbose=True)
    progress.plan(2, metric=Metric.named("latency"))
    progress.detail("  cd /x && deepspeed ...")
    progress.finished(stage=0, number=0, name="a", value=5.0, duration=1.0, outcome="latency=5")
    progress.finished(stage=0, number=1, name="b", value=3.0, duration=1.0, outcome="latency=3")
    assert "  cd /x && deepspeed ..." in out.getvalue()
    assert progress.best_line().startswith("best 3 b")
