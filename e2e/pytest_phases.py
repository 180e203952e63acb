"""A pytest plugin that sums each suite's time (setup, call and teardown: fixtures that start a
control plane, a node or engines count where they run) and writes it as JSON to the file named
by BOOMERANG_PHASES, for `e2e/make_test.py`'s closing table. A suite is a test folder, or a
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


def suite_of(nodeid: str) -> str:
    path = Path(nodeid.split("::", 1)[0])
    if path.parent.as_posix() == "e2e":
        return path.as_posix()
    return path.parent.as_posix()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    TOTALS[suite_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("BOOMERANG_PHASES")
    if target:
        Path(target).write_text(json.dumps(dict(TOTALS), indent=1))
