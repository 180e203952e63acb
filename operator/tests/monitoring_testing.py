"""What the monitoring tests share: the chart's alerts and dashboard, and the queries in them.

Alerts follow one shape (alerts.yaml says so): clauses joined by a line `and`, each a measure
whose last line is its threshold. `measures()` takes the thresholds off, so a test can ask a
real Prometheus whether every measure has data, whatever the thresholds would decide.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "charts" / "boomerang" / "files"
ALERTS = FILES / "alerts.yaml"
ALERTS_TEST = FILES / "alerts_test.yaml"
DASHBOARD = FILES / "dashboard.json"
_THRESHOLD = re.compile(r"^(<|>|<=|>=|==|!=)\s*-?[0-9.]+(e[+-]?[0-9]+)?$")


def promtool(name: str = "promtool") -> str:
    """A Prometheus binary (promtool or prometheus); missing fails under CI, else skips."""
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} missing under CI (make prometheus)")
        pytest.skip(f"{name} not installed (make prometheus)")
    return found


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(ALERTS.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def measures(expr: str) -> list[str]:
    """The alert's clauses without their threshold lines."""
    clauses: list[list[str]] = [[]]
    for line in expr.strip().splitlines():
        if line.strip() == "and":
            clauses.append([])
        else:
            clauses[-1].append(line)
    out = []
    for clause in clauses:
        threshold = clause[-1].strip() if clause else ""
        assert _THRESHOLD.match(threshold), f"clause does not end in a threshold: {clause}"
        out.append("\n".join(clause[:-1]).strip())
    return out


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panel_queries(window: str = "5m") -> dict[str, list[str]]:
    """Every query panel's expressions, as Grafana sends them with every namespace and
    deployment selected and `window` as the rate interval."""
    out: dict[str, list[str]] = {}
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            continue
        out[panel["title"]] = [
            t["expr"]
            .replace("$__rate_interval", window)
            .replace("$namespace", ".*")
            .replace("$deployment", ".*")
            for t in panel["targets"]
        ]
    return out
