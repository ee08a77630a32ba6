"""The README's first screen, as a newcomer reads it (issue 49)."""
from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).parents[1] / "README.md").read_text()
FIRST_SCREEN = "\n".join(README.splitlines()[:50])


def test_the_first_screen_says_what_it_does_the_two_commands_and_what_the_output_means() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, flags=re.S)
    assert first_block is not None
    # CI runs the README's test command (.ci/run): the two commands come first, as they are.
    assert [line.split("#")[0].strip() for line in first_block[1].splitlines()] == ["make example", "make test"]
    assert README.index(first_block[0]) < 1000
    for said in ("fastest DeepSpeed configuration", "drop-in for DeepSpeed's autotuner", "summary.txt",
                 "optuna_ds_summary.txt", "ds_config_optimal.json", "report.html", "Your config", "Optimum"):
        assert said in FIRST_SCREEN, said
    # The planner's internals, the benchmarks' history and the headline's every clause are in docs/.
    for inside in ("knowledge gradient", "pressure", "bench-planner", "give or take twice"):
        assert inside not in FIRST_SCREEN, inside
    assert "knowledge gradient" in (Path(__file__).parents[1] / "docs" / "planner.md").read_text()
    assert "give or take twice" in (Path(__file__).parents[1] / "docs" / "headline.md").read_text()
