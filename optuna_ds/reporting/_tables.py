"""The summary's tables: DeepSpeed's (``summary.txt``) and ours, each config by the mean of its
runs, in tabulate's ``pipe`` format."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from optuna_ds.config import format_number
from optuna_ds.studies import Optimum
from optuna_ds.studies import TuningResult

# DeepSpeed's summary table: its columns, in its order (its autotuner's print_tuning_results).
SUMMARY_HEAD = ("tuning_space", "num_experiments", "best_metric_val", "best_exp_name")
# Ours, in our own summary: each row's best config by the mean of its runs.
RUNS_HEAD = ("tuning_space", "num_experiments", "best_config_mean", "runs", "best_exp_name")


def _spaces(result: TuningResult) -> list[tuple[str, int, Optimum | None]]:
    """Each tuned space with its experiments and its best (:func:`~optuna_ds.studies.leader`:
    the chosen stage's is the optimum), then ``global``."""
    rows = [(s.name, s.num_experiments, s.best) for s in result.stages if s.status == "tuned"]
    return [*rows, ("global", result.num_experiments, result.best)]


def summary_rows(result: TuningResult) -> list[tuple[str, ...]]:
    """DeepSpeed's summary table, without its header: a row per space with a best, as DeepSpeed
    writes one, ``best_metric_val`` the best single run of the config the row names and
    ``best_exp_name`` that run's experiment; ``global`` the optimum's."""
    rows: list[tuple[str, ...]] = []
    for space, experiments, best in _spaces(result):
        if best is not None:
            name, value = best.best_run(result.metric)
            rows.append((space, str(experiments), format(value, "g"), name))
    return rows


def runs_rows(result: TuningResult) -> list[tuple[str, ...]]:
    """Our table's rows: each space's best config by the mean of its runs, and how many."""
    return [
        (
            space,
            str(experiments),
            *((format_number(b.mean), str(len(b.runs)), b.name) if b else ("-", "-", "-")),
        )
        for space, experiments, b in _spaces(result)
    ]


def _after_point(cell: str) -> int:
    """The characters after a number's point (its exponent's where it has none), -1 for an
    integer: how tabulate aligns a column of numbers on their points."""
    if cell.lstrip("-").isdigit():
        return -1
    point = cell.rfind(".") if "." in cell else cell.lower().rfind("e")
    return len(cell) - point - 1


def pipe_table(
    head: Sequence[str], rows: Sequence[Sequence[str]], *, numeric: Sequence[bool]
) -> str:
    """``rows`` under ``head`` as tabulate's ``pipe`` format writes them, which DeepSpeed's
    summary uses: a ``numeric`` column aligned right (on the numbers' points where every cell
    is a number), the others left."""
    columns = []
    for i, (title, right) in enumerate(zip(head, numeric)):
        cells = [r[i] for r in rows]
        if right and all(_is_numeral(c) for c in cells):
            points = [_after_point(c) for c in cells]
            cells = [c + " " * (max(points, default=0) - p) for c, p in zip(cells, points)]
        width = max([len(title) + 2, *(len(c) for c in cells)])
        pad = str.rjust if right else str.ljust
        rule = ("-" * (width + 1) + ":") if right else (":" + "-" * (width + 1))
        columns.append([pad(title, width), rule, *(pad(c, width) for c in cells)])
    lines = [
        "|" + "|".join(line) + "|" if j == 1 else "| " + " | ".join(line) + " |"
        for j, line in enumerate(zip(*columns))
    ]
    return "\n".join(lines)


def _is_numeral(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def summary_table(result: TuningResult) -> str:
    """DeepSpeed's summary table (:func:`summary_rows`) as DeepSpeed writes it; ``""`` where no
    space has a best (DeepSpeed then writes none)."""
    rows = summary_rows(result)
    return pipe_table(SUMMARY_HEAD, rows, numeric=(False, True, True, False)) if rows else ""


def deepspeed_summary(result: TuningResult) -> str:
    """``summary.txt`` as DeepSpeed's autotuner writes it: its table, then the time and the count
    of experiments; nothing of ours (that is :func:`summary_text`'s)."""
    duration = datetime.timedelta(seconds=result.duration)
    return (
        summary_table(result)
        + f"\n\nTuning completed in {duration}. "
        + f"Total number of experiments: {result.num_experiments}."
    )


def runs_table(result: TuningResult) -> str:
    """Our table (:func:`runs_rows`), in the same form: the text summary and the dashboard's
    note."""
    return pipe_table(RUNS_HEAD, runs_rows(result), numeric=(False, True, True, True, False))
