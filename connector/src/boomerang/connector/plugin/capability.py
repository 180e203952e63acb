"""Publish on the engine's `/metrics` which of the plugin's engine-side changes are in force.

Why: the continue path (a turn sent straight to the decoder that holds its history) is only
safe on a vLLM whose D frees the blocks of requests it served alone; on vLLM 0.32 that takes
Boomerang's `own_requests` patch, without which those blocks stay pinned for good. The router
cannot see the patch, and an engine started without the plugin (or on a vLLM whose scheduler
the patch does not recognise) says nothing, so the plugin says it: a gauge
`boomerang_engine_capability_info{capability="continue"} 1` in prometheus_client's default
registry, served on `/metrics` by vLLM's API server next to the revision (`revision.py`), read
by the router's prober (`boomerang.router.engines.health`). A capability not in force is
published at 0 (the router reads only the ones at 1), so a scrape of an engine whose vLLM the
plugin refused shows `...{capability="continue"} 0`. The patch applies per process; the API
server's answer stands for the engine core's, which loads the same vLLM.
"""

from __future__ import annotations

from boomerang.connector.plugin.engine_info import set_info
from boomerang.facts.engine import CAPABILITIES, ENGINE_CAPABILITY_METRIC

_DOC = "Engine-side changes of Boomerang's plugin: 1 in force, 0 not (by capability)."


def publish(capability: str, in_force: bool = True) -> bool:
    """Set the gauge for `capability` to 1 (in force) or 0 (idempotent); False when
    prometheus_client is missing (the router then takes no path that needs it)."""
    return set_info(ENGINE_CAPABILITY_METRIC, _DOC, "capability", capability, int(in_force))


def refuse() -> bool:
    """Every capability at 0: the plugin refused this vLLM (see `plugin.register`)."""
    return all([publish(capability, in_force=False) for capability in CAPABILITIES])
