from __future__ import annotations

import io

from optuna_ds.reporting import Progress


def _feed(progress: Progress) -> None:
    progress.plan(5, maximize=True)
    progress.started(stage=1, number=0, name="z1_gas1_tmbspg4", slot="localhost:0,1")
    progress.finished(stage=1, number=0, name="z1_gas1_tmbspg4", value=120.0, duration=10.0, outcome="throughput=120")
    progress.started(stage=1, number=1, name="z1_gas1_tmbspg8", slot="localhost:0,1")
    progress.finished(stage=1, number=1, name="z1_gas1_tmbspg8", value=None, duration=5.0, outcome="failed (oom: out of memory)")
    progress.started(stage=2, number=0, name="z2_gas1_tmbspg4", slot="localhost:2,3")


def test_status_line_shows_counts_running_best_and_time_left() -> None:
    progress = Progress(stream=io.StringIO(), tty=False)
    _feed(progress)
    status = progress.status()
    assert status.startswith("2/~5 experiments")
    assert "running z2_gas1_tmbspg4 on localhost:2,3" in status
    assert "best z1=120 global=120" in status
    assert "~0:00:22 left" in status  # 3 more at the mean of 7.5 s


def test_plain_lines_when_not_a_terminal_and_nothing_when_quiet() -> None:
    out = io.StringIO()
    _feed(Progress(stream=out, tty=False))
    lines = out.getvalue().splitlines()
    assert lines[0] == "[z1] trial 0: running z1_gas1_tmbspg4 on localhost:0,1"
    assert "[z1] trial 1: z1_gas1_tmbspg8 failed (oom: out of memory) in 5.0s" in lines
    quiet = io.StringIO()
    _feed(Progress(stream=quiet, tty=False, quiet=True))
    assert quiet.getvalue() == ""


def test_verbose_adds_details_and_latency_best_is_the_minimum() -> None:
    out = io.StringIO()
    progress = Progress(stream=out, tty=False, verbose=True)
    progress.plan(2, maximize=False)
    progress.detail("  cd /x && deepspeed ...")
    progress.finished(stage=0, number=0, name="a", value=5.0, duration=1.0, outcome="latency=5")
    progress.finished(stage=0, number=1, name="b", value=3.0, duration=1.0, outcome="latency=3")
    assert "  cd /x && deepspeed ..." in out.getvalue()
    assert "best z0=3" in progress.status()
