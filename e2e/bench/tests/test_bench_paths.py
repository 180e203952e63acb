"""The path benchmark's arithmetic and verdicts (pure; the runs themselves need engines)."""

from __future__ import annotations

import pytest

from bench.engine import paths as bench_paths


def row(
    suffix: int, pull: float, recompute: float, cont: float, adaptive: float
) -> bench_paths.Row:
    r = bench_paths.Row(suffix)
    for path, ms in (("pull", pull), ("recompute", recompute), ("continue", cont)):
        r.ttft[path] = [ms / 1000, ms / 1000 * 1.5, ms / 1000 * 0.5]  # median = ms
    r.ttft["adaptive"] = [adaptive / 1000]
    r.paths = {"continue": 1}
    r.itl_extra_s = [0.01, 0.03, 0.02]
    return r


def test_ratios_are_of_medians_against_pull_and_the_better_of_pull_and_recompute() -> None:
    (got,) = bench_paths.summarize([row(64, 200.0, 100.0, 50.0, 60.0)])
    assert got["adaptive_vs_pull"] == pytest.approx(0.3)
    assert got["adaptive_vs_best"] == pytest.approx(0.6)  # recompute was the better one
    assert got["itl_extra_ms"] == pytest.approx(20.0)


@pytest.mark.parametrize(
    ("suffix", "adaptive", "verdict"),
    [
        (256, 100.0, "met"),  # <= 0.5 of pull and <= 1.1 of the best
        (256, 120.0, "NOT met"),  # short suffix: more than half of pull
        (1024, 210.0, "met"),  # long suffix: only the 10 % rule
        (1024, 230.0, "NOT met"),
    ],
)
def test_the_targets_of_the_issue(suffix: int, adaptive: float, verdict: str) -> None:
    (got,) = bench_paths.summarize([row(suffix, 200.0, 400.0, 90.0, adaptive)])
    assert bench_paths.verdict(got) == verdict


def test_a_wrong_output_fails_the_row_whatever_the_speed() -> None:
    r = row(16, 200.0, 400.0, 50.0, 50.0)
    r.mismatches = 1
    (got,) = bench_paths.summarize([r])
    assert bench_paths.verdict(got) == "NOT met"
    assert "| 16 | 200 | 400 | 50 | 50 | continue 1 |" in bench_paths.format_table([got])
