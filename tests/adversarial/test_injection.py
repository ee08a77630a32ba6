"""No text of the user's config reaches a file a shell reads, or the terminal, able to drive it."""

from __future__ import annotations

from invariants import Hostile
from invariants import assert_no_traceback
from invariants import base_config
from invariants import hws  # noqa: F401

_DRIVERS = "\x1b\x07\r\x00"


def test_an_optimizer_type_holding_a_command_and_escapes_stays_a_comment(hws: Hostile) -> None:
    """Row 5 of issue 34: with --scale-lr the learning-rate note quoted the optimizer's type raw
    into cmd_optimal.txt, so its second line was a command (`sh cmd_optimal.txt` ran it), and the
    same text reached the terminal with its escape sequences."""
    kind = "SGD\ntouch PWNED\n\x1b]0;owned\x07\x1b[2J\rtouch PWNED2"
    hws.config(base_config(optimizer={"type": kind, "params": {"lr": 0.1}}))
    proc = hws.hostile("ds_config.json", "--scale-lr", "-v")
    assert proc.returncode == 0, proc.stderr
    assert_no_traceback(proc)
    lines = (hws.results / "cmd_optimal.txt").read_text().splitlines()
    assert len(lines) == 2 and lines[0].startswith("# learning rate scaled") and "touch PWNED" in lines[0], lines
    assert not lines[1].startswith("#") and "touch" not in lines[1], lines
    for text in ("\n".join(lines), (hws.results / "optuna_ds_summary.txt").read_text(), proc.stdout, proc.stderr):
        assert not any(c in text for c in _DRIVERS), repr(text[-800:])
        # The type is quoted inside a sentence: no line of its own, where it could pose as ours.
        assert not any(line.startswith("touch") for line in text.splitlines()), repr(text[-800:])
    assert not (hws.root / "PWNED").exists()
    hws.assert_untouched()
