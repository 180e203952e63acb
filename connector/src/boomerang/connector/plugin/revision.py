"""Publish the engine's revision on its own `/metrics`, where the router reads it.

Why: during a rollout P and D pods of two engine revisions run side by side (the operator rolls
prefill before decode), and two engines of different builds or connector settings must not be
paired: their NIXL handshake can fail, or worse, disagree about the KV layout. An EndpointSlice
names pods but not their revision, so the engine says it itself: the operator and the local
runtime set `BOOMERANG_ENGINE_REVISION`, and this module, called from the vLLM plugin in each
engine process, sets a gauge `boomerang_engine_revision_info{revision="..."} 1` in
prometheus_client's default registry, which vLLM's API server serves on `/metrics`. The router
reads it with the block size it already reads there (`boomerang.router.engines.health`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from boomerang.connector.plugin.engine_info import set_info
from boomerang.facts.engine import ENGINE_REVISION_ENV, ENGINE_REVISION_METRIC

_published: set[str] = set()


def publish(env: Mapping[str, str] | None = None) -> str | None:
    """Set the revision gauge once per process; returns the revision, None when unset or when
    prometheus_client is missing (the router then pairs this engine with any)."""
    revision = (env if env is not None else os.environ).get(ENGINE_REVISION_ENV, "").strip()
    if not revision:
        return None
    if revision in _published:
        return revision
    doc = "What this engine must share with its P/D peer to hand KV over (build and connector)."
    if not set_info(ENGINE_REVISION_METRIC, doc, "revision", revision):
        return None
    _published.add(revision)
    return revision
