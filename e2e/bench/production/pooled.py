"""Reading a pooled mode of the production benchmark's results (their `pooled`): its median of
a figure and its lost turns. Apart from `report.py` so that `equal.py`, which the report
prints, reads them without importing the report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def median_of(m: Mapping[str, Any] | None, figure: str) -> float | None:
    """A pooled mode's median of `figure` (a `FIGURES` name, or "SLO goodput"); None when
    the mode or the figure is missing."""
    if m is None:
        return None
    f = m.get("goodput") if figure == "SLO goodput" else m["figures"].get(figure)
    return f["median"] if f else None


def lost_total(pooled_mode: Mapping[str, Any]) -> int | None:
    """A mode's lost turns over all its runs: a total, never a median (one run that lost a
    conversation is a loss, however many did not); None for results pooled before totals."""
    total = pooled_mode.get("lost_total")
    return int(total) if total is not None else None
