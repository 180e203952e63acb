"""A pytest plugin that sums each suite's time (setup, call and teardown: fixtures that start a
control plane, a node or engines count where they run) and counts the tests' outcomes, and
writes both as JSON to the file named by BOOMERANG_PHASES, for `e2e/make_test.py`'s closing
table and its last line. A suite is a test folder, or a
module directly under `e2e/` (each of those is its own suite: the image, node and admission
tests differ by minutes).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

TOTALS: defaultdict[str, float] = defaultdict(float)
OUTCOMES: defaultdict[str, int] = defaultdict(int)
"""Tests by outcome, as pytest's summary counts them (a failed setup or teardown is an error)."""


def suite_of(nodeid: str) -> str:
    path = Path(nodeid.split("::", 1)[0])
    if path.parent.as_posix() == "e2e":
        return path.as_posix()
    return path.parent.as_posix()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    TOTALS[suite_of(report.nodeid)] += report.duration
    if report.when == "call":
        OUTCOMES[report.outcome] += 1
    elif report.failed:
        OUTCOMES["error"] += 1
    elif report.skipped:
        OUTCOMES["skipped"] += 1


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("BOOMERANG_PHASES")
    if target:
        report = {"suites": dict(TOTALS), "outcomes": dict(OUTCOMES)}
        Path(target).write_text(json.dumps(report, indent=1))
