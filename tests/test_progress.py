from __future__ import annotations

import io
import re

from optuna_ds.config import Metric
from optuna_ds.reporting import Progress
from optuna_ds.reporting._progress import busy_slots
from optuna_ds.config import format_number


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
    clock.now += 10
    progress.finished(stage=1, number=1, name="z1_gas1_tmbspg8", value=None, duration=10.0, outcome="failed (oom: out of memory)")
    progress.started(stage=2, number=0, name="z2_gas1_tmbspg4", slot="localhost:2,3")


def _runs(progress: Progress, count: int, *, seconds: float, clock: Clock | None = None) -> None:
    """``count`` experiments of stage 0 on one slot, one after another, each ``seconds`` long
    (on ``clock``, where given) and finished ok."""
    for i in range(count):
        progress.started(stage=0, number=i, name=f"a{i}", slot="localhost:0")
        if clock is not None:
            clock.now += seconds
        progress.finished(stage=0, number=i, name=f"a{i}", value=1.0, duration=seconds, outcome="ok")


def test_status_shows_best_first_a_bar_over_the_estimate_and_time_left() -> None:
    clock = Clock()
    progress = Progress(stream=io.StringIO(), tty=False, clock=clock)
    _feed(progress, clock)
    clock.now += 5  # z2 under way for half the mean duration
    lines = progress.status().splitlines()
    assert lines[0].startswith("fastest run 120 samples/s z1_gas1_tmbspg4 | z1 120")
    # 2 done + 1 running + the planner's 5 to start; 2.5 of 8 done, rounded down
    assert lines[1].startswith("2/~8 (1 running) ") and " 31% " in lines[1]
    # 2.5 experiments' work in the 25 s since the first started: 5.5 left at 10 s each
    assert re.search(r" 0:00:25 elapsed, ~0:00:5[56] left$", lines[1]), lines[1]  # rich rounds up
    # one slot, busy all 25 s (the two runs back to back, then z2)
    assert lines[2] == "busy slots 1 now, 1.0 on average, 1 at most " + "█" * 24
    assert lines[3].startswith("localhost:2,3 0:00:05 z2_gas1_tmbspg4")


def test_the_time_left_counts_the_running_experiments_share_and_holds_while_one_runs() -> None:
    """One slot, 60 s experiments: while the next runs its share grows with the clock, so the
    time left falls with it instead of growing (the rate of finished experiments alone fell
    while an experiment ran, and the estimate grew)."""
    clock = Clock()
    progress = Progress(stream=io.StringIO(), tty=False, clock=clock)
    progress.plan(10, metric=Metric.named("throughput"))
    _runs(progress, 2, seconds=60.0, clock=clock)
    progress.started(stage=0, number=2, name="a2", slot="localhost:0")
    lefts = []
    for _ in range(5):
        clock.now += 10
        lefts.append(progress.remaining())
    assert all(9 <= a - b <= 11 for a, b in zip(lefts, lefts[1:])), lefts  # falls with the clock
    assert abs(lefts[-1] - (13 - 2 - 50 / 60) * 60) <= 1, lefts  # one a minute: what is left of 2 + 1 + 10


def test_the_time_left_follows_the_rate_of_all_slots() -> None:
    """Two slots running 10 s experiments side by side: one experiment every 5 s, not 10."""
    clock = Clock()
    progress = Progress(stream=io.StringIO(), tty=False, clock=clock)
    progress.plan(10, metric=Metric.named("throughput"))
    number = 0
    for _ in range(2):
        for slot in range(2):
            progress.started(stage=0, number=number, name=f"a{number}", slot=f"localhost:{slot}")
            number += 1
        clock.now += 10
        for n in range(number - 2, number):
            progress.finished(stage=0, number=n, name=f"a{n}", value=1.0, duration=10.0, outcome="ok")
    assert abs(progress.remaining() - 50) <= 1  # 10 left at 2 per 10 s (rich rounds up)


def test_never_100_percent_while_one_runs_or_the_planner_has_not_stopped() -> None:
    """The users' ``7/~7 100%`` for seven minutes: the planner's estimate ran out while it went on."""
    clock = Clock()
    progress = Progress(stream=io.StringIO(), tty=False, clock=clock)
    progress.plan(1, metric=Metric.named("throughput"))
    for i in range(3):  # the planner keeps going past its estimate and says nothing new
        progress.started(stage=0, number=i, name=f"a{i}", slot="localhost:0")
        clock.now += 100  # far past the mean: still not counted as done
        assert " 100% " not in progress.status() and "/~" in progress.status()
        progress.finished(stage=0, number=i, name=f"a{i}", value=1.0, duration=1.0, outcome="ok")
        assert " 100% " not in progress.status()
    progress.started(stage=0, number=3, name="a3", slot="localhost:0")
    progress.plan(0, metric=Metric.named("throughput"))  # the planner stopped; one still runs
    bar = progress.status().splitlines()[1]
    assert bar.startswith("3/4 (1 running) ") and " 100% " not in bar
    progress.finished(stage=0, number=3, name="a3", value=1.0, duration=1.0, outcome="ok")
    bar = progress.status().splitlines()[1]
    assert bar.startswith("4/4 ") and " 100% " in bar and "left" not in bar


def test_a_bar_that_reached_its_estimate_is_not_finished_when_the_estimate_rises() -> None:
    """`make example` on a fresh clone: `2/2 100%`, then the planner measured the pair alike and
    the bar read `4/~8 (1 running) ... 100%`, with no time left, for the rest of the tuning."""
    clock = Clock()
    progress = Progress(stream=io.StringIO(), tty=False, clock=clock)
    progress.plan(2, metric=Metric.named("throughput"))
    _runs(progress, 2, seconds=10.0, clock=clock)
    progress.plan(0, metric=Metric.named("throughput"))
    assert progress.status().splitlines()[1].startswith("2/2 ") and " 100% " in progress.status()
    progress.plan(4, metric=Metric.named("throughput"))  # the planner went on after all
    progress.started(stage=0, number=2, name="a2", slot="localhost:0")
    clock.now += 5
    bar = progress.status().splitlines()[1]
    assert bar.startswith("2/~7 (1 running) ") and " 35% " in bar and "left" in bar, bar


def test_the_essentials_fit_80_columns_with_two_busy_slots() -> None:
    clock = Clock()
    progress = Progress(stream=io.StringIO(), tty=False, clock=clock)
    progress.plan(38, metric=Metric.named("throughput"))
    long = "z3_gas16_tmbspg128_offload-opt-param_ocT_rbs5e8_agbs5e8_pbs5e7_mlp1e9_pt1e6"
    for i, slot in enumerate(("localhost:0,1,2,3", "localhost:4,5,6,7")):
        progress.started(stage=3, number=i, name=long + str(i), slot=slot)
    clock.now += 61
    progress.finished(stage=3, number=0, name=long + "0", value=15970.4, duration=61.0, outcome="ok")
    progress.started(stage=3, number=2, name=long + "2", slot="localhost:0,1,2,3")
    clock.now += 3600
    lines = progress.render(width=80).splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert len(lines) == 5  # best, bar, busy slots, one line per busy slot
    assert lines[0].startswith("fastest run 15,970 samples/s z3_gas16")
    assert lines[1].startswith("1/~41 (2 running) ") and "elapsed" in lines[1] and lines[1].endswith(" left")
    assert lines[2].startswith("busy slots 2 now, 2.0 on average, 2 at most")
    assert lines[3].startswith("localhost:0,1,2,3 1:00:00 z3_gas16") and lines[4].startswith("localhost:4,5,6,7 1:01:01 z3_gas16")


def test_busy_slots_show_width_over_time() -> None:
    """Four slots busy for the first half, one for the second: the line shows the drop."""
    line, mean, peak = busy_slots([(0.0, 4), (50.0, 1)], 100.0, width=4)
    assert (line, mean, peak) == ("██▂▂", 2.5, 4)
    assert busy_slots([], 10.0) == ("", 0.0, 0)
    clock = Clock()
    progress = Progress(stream=io.StringIO(), tty=False, clock=clock)
    assert progress.busy_line() == "busy slots: none yet"
    for i in range(3):
        progress.started(stage=0, number=i, name=f"a{i}", slot=f"localhost:{i}")
    clock.now += 30
    progress.finished(stage=0, number=0, name="a0", value=1.0, duration=30.0, outcome="ok")
    clock.now += 30
    assert progress.busy_line().startswith("busy slots 2 now, 2.5 on average, 3 at most ")


def test_numbers_are_written_for_people() -> None:
    assert [format_number(v) for v in (15970.3, 160.44, 0.01234, 312.5e12, 2.5e6, 999.96)] == [
        "15,970", "160.4", "0.01234", "312T", "2.5M", "1,000"]
    out = io.StringIO()
    progress = Progress(stream=out, tty=False)
    progress.plan(2, metric=Metric.named("throughput"))
    progress.finished(stage=1, number=0, name="a", value=15970.4, duration=1.0, outcome="throughput=1.597e+04")
    assert "[z1] trial 0: a throughput 15,970 samples/s in 1.0s" in out.getvalue()
    assert "e+0" not in out.getvalue() + progress.status()


def test_a_changed_estimate_is_said() -> None:
    out = io.StringIO()
    progress = Progress(stream=out, tty=False)
    progress.plan(37, metric=Metric.named("throughput"))
    progress.finished(stage=0, number=0, name="a", value=1.0, duration=1.0, outcome="ok")
    progress.plan(41, metric=Metric.named("throughput"))
    assert "estimate: ~42 experiments in all (was ~38)" in out.getvalue()  # without a ceiling, no first line
    progress.plan(41, metric=Metric.named("throughput"))
    assert out.getvalue().count("estimate:") == 1


def test_the_estimate_is_given_with_its_ceiling_and_every_rise_is_said() -> None:
    """The planner guesses the experiments left; a total that grew in silence from ~7 to 33 read
    as a promise broken: each rise is said, and the first line says it is a guess."""
    out = io.StringIO()
    progress = Progress(stream=out, tty=False)
    progress.plan(5, metric=Metric.named("throughput"), ceiling=40)
    assert out.getvalue() == ""  # said with the first experiment, which it counts
    _runs(progress, 3, seconds=1.0)  # the planner still expects 5 more after each: the total rises with each start
    lines = [line for line in out.getvalue().splitlines() if line.startswith("estimate:")]
    assert lines[0].startswith("estimate: ~6 experiments in all, at most 40: a guess the planner revises")
    assert lines[1:] == [f"estimate: ~{n} experiments in all (was ~{n - 1}), from what the results so far showed" for n in (7, 8)]
    progress.plan(0, metric=Metric.named("throughput"), ceiling=40)  # the planner stopped: nothing more to say
    assert out.getvalue().count("estimate:") == 3


def test_a_terminal_gets_the_live_block_and_the_log_lines_above_it() -> None:
    out = io.StringIO()
    progress = Progress(stream=out, tty=True)
    _feed(progress)
    progress.close()
    text = out.getvalue()
    assert "[z1] trial 1: z1_gas1_tmbspg8 failed (oom: out of memory) in 10.0s" in text
    assert "━" in text  # the bar was drawn
    assert "\x1b[" in text  # and redrawn in place


def test_plain_lines_when_not_a_terminal_and_nothing_when_quiet() -> None:
    out = io.StringIO()
    _feed(Progress(stream=out, tty=False))
    lines = out.getvalue().splitlines()
    assert lines[0] == "[z1] trial 0: running z1_gas1_tmbspg4 on localhost:0,1"
    assert "[z1] trial 1: z1_gas1_tmbspg8 failed (oom: out of memory) in 10.0s" in lines
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
    assert progress.best_line().startswith("fastest run 3 ms b")


def test_a_resumed_tuning_starts_from_the_best_it_has() -> None:
    progress = Progress(stream=io.StringIO(), tty=False)
    progress.resumed(stage=1, name="z1_gas1_tmbspg8", value=15970.4, metric=Metric.named("throughput"))
    progress.resumed(stage=1, name="z1_gas1_tmbspg4", value=9000.0, metric=Metric.named("throughput"))
    assert progress.best_line().startswith("fastest run 15,970 samples/s z1_gas1_tmbspg8")
    latency = Progress(stream=io.StringIO(), tty=False)
    for name, value in (("a", 3.0), ("b", 2.0)):
        latency.resumed(stage=0, name=name, value=value, metric=Metric.named("latency"))
    assert " b " in latency.best_line() + " "


def test_a_resumed_tunings_estimate_counts_what_ran_before() -> None:
    out = io.StringIO()
    progress = Progress(stream=out, tty=False)
    for i in range(9):
        progress.resumed(stage=0, name=f"a{i}", value=1.0, metric=Metric.named("throughput"))
    progress.plan(3, metric=Metric.named("throughput"), ceiling=40)
    progress.started(stage=0, number=9, name="a9", slot="localhost:0")
    assert out.getvalue().splitlines()[-1].startswith("estimate: ~13 experiments in all, 9 of them measured before this run, at most 40")
