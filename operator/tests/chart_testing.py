"""The chart as tests render it: `helm template` with the real helm (the `helm` fixture is in
conftest.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml
from dd_testing import ROOT

CHART = ROOT / "charts" / "boomerang"


def run_helm(helm: Path, *args: str) -> str:
    result = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def render_chart(helm: Path, *sets: str, release: str = "boomerang") -> list[dict[str, Any]]:
    """The chart's objects with these `--set` arguments, in namespace boomerang-system."""
    out = run_helm(helm, "template", release, str(CHART), "-n", "boomerang-system", *sets)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def refused(helm: Path, *sets: str) -> str:
    """`helm template` with these `--set` arguments must fail; returns helm's error output."""
    result = subprocess.run(
        [str(helm), "template", "x", str(CHART), *sets], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0, "helm rendered what it should refuse"
    return result.stderr
