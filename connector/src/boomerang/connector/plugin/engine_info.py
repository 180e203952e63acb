"""The plugin's info gauges: what an engine says about itself on its own `/metrics`.

Why apart: the revision (`revision.py`) and the capabilities (`capability.py`) are published
the same way, a gauge at 1 per label value in prometheus_client's default registry, which
vLLM's API server serves on `/metrics`, where the router's prober reads them.
"""

from __future__ import annotations

from typing import Any

_gauges: dict[str, Any] = {}


def set_info(name: str, documentation: str, label: str, value: str, level: int = 1) -> bool:
    """Set `name{label="value"} level` (1: in force, 0: not; the gauge created once per
    process); False when prometheus_client is missing (then the engine says nothing, and the
    router assumes nothing)."""
    gauge = _gauges.get(name)
    if gauge is None:
        try:
            from prometheus_client import Gauge
        except ImportError:
            return False
        gauge = _gauges[name] = Gauge(name, documentation, [label], multiprocess_mode="max")
    gauge.labels(value).set(level)
    return True
