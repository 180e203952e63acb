"""Without Boomerang's vLLM plugin on D, the continue path is refused, not silently leaking.

On vLLM 0.32 a request D serves alone keeps its blocks pinned for good unless the plugin's
`own_requests` change is in force; the plugin says so on D's `/metrics`
(`boomerang_engine_capability_info{capability="continue"}`) and the adaptive router continues
turns only on a decoder that says it. Here the session's D is restarted with vLLM told to load
no plugin (`VLLM_PLUGINS`), a turn with a short suffix, which the first test of
`test_adaptive_paths.py` shows continuing on a D with the plugin, goes through P and D
instead, and its answer equals one engine's; then D is restarted as it was.
"""

from __future__ import annotations

import random

import pytest
from dataplane.restart import restart_decoder
from dataplane.turns import counted, moved, reference, reuse, router_completion, same, words

from boomerang.facts.engine import CAPABILITIES
from boomerang.local import pdclient
from boomerang.local.engine_client import scrape, totals
from boomerang.router.engines.health import capabilities_from_metrics

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

TUNING = {"mode": "adaptive", "continue_max_suffix_tokens": 192, "itl_budget_s": 10.0}
"""Bounds under which a 30-token suffix (plus the history's last partial block) continues."""
NO_PLUGIN = {"VLLM_PLUGINS": "none-of-them"}
"""vLLM loads only the general plugins this lists: none."""


def paths(router: str) -> dict[str, float]:
    return totals(pdclient.scrape(router), "boomerang_router_path_total", "path")


def test_a_decoder_without_the_plugin_never_gets_a_continue(dataplane):
    router = dataplane.router("router-no-plugin", tuning=TUNING, health={"probe_interval_s": 1.0})
    rng = random.Random(1414)
    try:
        restart_decoder(dataplane, router, NO_PLUGIN)
        assert capabilities_from_metrics(scrape(dataplane.d_url).encode()) == frozenset()
        prompt = words(rng, 700)
        tokens, _, _ = router_completion(router, dataplane.model, prompt, "bare", stream=False)
        later = prompt + tokens + words(rng, 30)  # short: would continue on a D with it
        before_reuse, before_paths = reuse(router), paths(router)
        out = router_completion(router, dataplane.model, later, "bare", stream=False)
        assert moved(before_paths, paths(router)) == {"pull": 1.0}  # P and D, not D alone
        assert counted(router, before_reuse) == {"hit": 1.0}
        assert same(out[:2], reference(dataplane, later))
    finally:
        restart_decoder(dataplane, router)
    # With the plugin back: the continue path, and the memory-pressure hooks (its lease API is on).
    assert capabilities_from_metrics(scrape(dataplane.d_url).encode()) == set(CAPABILITIES)
