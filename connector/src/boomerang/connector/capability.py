"""Publish on the engine's `/metrics` which of the plugin's engine-side changes are in force.

Why: the continue path (a turn sent straight to the decoder that holds its history) is only
safe on a vLLM whose D frees the blocks of requests it served alone; on vLLM 0.32 that takes
Boomerang's `own_requests` patch, without which those blocks stay pinned for good. The router
cannot see the patch, and an engine started without the plugin (or on a vLLM whose scheduler
the patch does not recognise) says nothing, so the plugin says it: a gauge
`boomerang_engine_capability_info{capability="continue"} 1` in prometheus_client's default
registry, served on `/metrics` by vLLM's API server next to the revision (`revision.py`), read
by the router's prober (`boomerang.router.health`). The patch applies per process; the API
server's answer stands for the engine core's, which loads the same vLLM.
"""

from __future__ import annotations

from boomerang.connector.config import ENGINE_CAPABILITY_METRIC
from boomerang.connector.engine_info import set_info


def publish(capability: str) -> bool:
    """Set the gauge for `capability` (idempotent); False when prometheus_client is missing
    (the router then takes no path that needs it)."""
    return set_info(
        ENGINE_CAPABILITY_METRIC,
        "Engine-side changes of Boomerang's plugin in force (by capability).",
        "capability",
        capability,
    )
