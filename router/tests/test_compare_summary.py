"""`compare_summary`: the medians `make bench-router-compare` prints after its runs."""

from __future__ import annotations

from compare_summary import parse, summarize

ROWS = """\
| 1 | abc | 0.5 | 64 | 1200 | 0.80 | 0.50 |
| 1 | this | 0.9 | 64 | 1250 | 0.72 | 0.48 |
| 2 | this | 1.0 | 64 | 1100 | 1.00 | 0.66 |
| 2 | abc | 1.1 | 64 | 1000 | 1.00 | 0.60 |
| 3 | abc | 1.2 | 64 | 1000 | 0.90 | 0.60 |
Traceback (most recent call last): a failed run's line is not a row
| round | tree | load before | conversations | router turns/s | router CPU ms/turn | engines |
"""


def test_medians_and_per_round_ratios_of_complete_rounds() -> None:
    lines = summarize(parse(ROWS.splitlines()))
    assert lines[0].startswith("| conversations | rounds | abc router CPU ms/turn | this |")
    # round 3 has no run of this tree: left out. Ratios 0.90 and 1.00; per engine CPU
    # (0.72/0.48)/(0.80/0.50) = 0.9375 and (1.00/0.66)/(1.00/0.60) = 0.909.
    assert lines[2] == "| 64 | 2 | 0.90 | 0.86 | 0.95 | 0.92 |"


def test_no_complete_round_says_so() -> None:
    assert summarize(parse(["| 1 | abc | 0.5 | 64 | 1200 | 0.80 | 0.50 |"])) == [
        "no complete round"
    ]
