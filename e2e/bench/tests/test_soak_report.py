"""The soak's own arithmetic (`e2e/bench/soak/run.py`): which requests a fault touched, what
the client said went wrong, the per-fault table and its place in `docs/reliability.md`. The
soak itself runs the real stack (`make soak`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import run as soak


def test_a_fault_touches_the_requests_in_flight_during_it() -> None:
    records = [
        {"start_time_ms": 1_000, "latency_ms": 500},  # 1.0-1.5 s: ends inside the window
        {"start_time_ms": 1_900, "latency_ms": 5_000},  # starts inside
        {"start_time_ms": 0, "latency_ms": 10_000},  # spans it
        {"start_time_ms": 5_000, "latency_ms": 10},  # after it
        {"start_time_ms": 0, "latency_ms": 100},  # before it
    ]
    assert soak.touched(records, 1.2, 2.0) == 3


def test_the_client_errors_are_its_own_distinct_lines() -> None:
    log = "\n".join(
        [
            "2026-12-07 01:00:00,1 INFO started",
            "2026-12-07 01:00:01,2 ERROR request failed: status 502",
            "2026-12-07 01:00:02,3 ERROR request failed: status 502",
            "2026-12-07 01:00:03,4 INFO num_successes=10, num_failures=0",
            "2026-12-07 01:00:04,5 INFO num_successes=9, num_failures=1",
        ]
    )
    assert soak.client_errors(log) == ["ERROR request failed: status 502"]


RES = {
    "minutes": 2,
    "revision": "abc1234",
    "runs": [
        {
            "fault": "kill-d",
            "expected": 40,
            "lost": 0,
            "touched": 6,
            "recovery_s": 80.5,
            "errors": [],
        },
        {
            "fault": "restart-router",
            "expected": 40,
            "lost": 2,
            "touched": 5,
            "recovery_s": 3.0,
            "errors": ["ERROR connection reset"],
        },
        {
            "fault": "kill-d",
            "expected": 38,
            "lost": 1,
            "touched": 4,
            "recovery_s": 75.0,
            "errors": ["ERROR x"],
        },
    ],
    "drain_s": 12.0,
    "retained_after": 0,
    "router_a": {
        "before": {"rss_mib": 100.0, "sockets": 8},
        "after": {"rss_mib": 105.0, "sockets": 9},
    },
}


def test_the_table_sums_each_fault_over_its_runs() -> None:
    text = soak.table(RES)
    assert "| kill-d | 2 | 10 | 1 of 78 | 80.5, 75.0 | `ERROR x` |" in text
    assert "| restart-router | 1 | 5 | 2 of 40 | 3.0 | `ERROR connection reset` |" in text
    assert "D retained 0 blocks 12 s later" in text
    assert "RSS 100 -> 105 MiB (+5 %), sockets 8 -> 9" in text


def test_publish_replaces_only_the_marked_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "reliability.md"
    doc.write_text(f"# R\n\nbefore\n{soak.PUBLISH_START}\nold\n{soak.PUBLISH_END}\nafter\n")
    monkeypatch.setattr(soak, "REPO", tmp_path)
    soak.publish(RES)
    text = doc.read_text()
    assert text.startswith("# R\n\nbefore\n") and text.endswith("\nafter\n")
    assert "old" not in text and "| kill-d | 2 |" in text


def test_the_published_page_has_the_markers() -> None:
    text = (soak.REPO / "docs" / "reliability.md").read_text()
    assert text.index(soak.PUBLISH_START) < text.index(soak.PUBLISH_END)
