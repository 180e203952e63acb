"""Retention through a real router and the real engines (vLLM CPU 0.32, NIXL, the lease API of
Boomerang's plugin): D's memory follows the traffic instead of the decoder TTL.

- Adaptive mode: once the router has learned that this traffic's conversations come back at
  once (a few quick turns), a conversation that does not come back has D's blocks released
  after `retention_min_s` (1 s) plus a sweep, and D's `vllm:kv_cache_usage_perc` is back to
  its baseline within seconds, not the 480 s TTL; the conversation's next turn then continues
  on D with the released handle, D's prefix cache serves the history (nothing evicted it),
  and the answer still equals one engine computing it alone.
- A client ending a conversation (`DELETE`) frees D's blocks at once, in static mode too.
- A renewed conversation's next turn still pulls its history from D and equals one engine.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from dataplane.leasing import eventually, metric
from dataplane.turns import counted, moved, reference, reuse, router_completion, same, words

from boomerang.local import pdclient
from boomerang.local.engine_client import scrape, tokens_by_source

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

USAGE = "vllm:kv_cache_usage_perc"
RELEASED = "boomerang_router_leases_released_total"


def call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def state(router: str) -> dict[str, Any]:
    status, body = call("GET", f"{router}/boomerang/v1/state")
    assert status == 200, body
    return body


def settled(plane, router: str) -> float:
    """D's usage once the router holds no lease and D's usage stopped moving."""
    assert eventually(lambda: state(router).get("leases", 0) == 0, within_s=30.0)
    last = metric(plane.d_url, USAGE)
    for _ in range(20):
        time.sleep(0.5)
        now = metric(plane.d_url, USAGE)
        if now == last:
            return now
        last = now
    return last


def warm_up(plane, router: str, turns: int = 24) -> None:
    """One conversation whose turns follow each other at once: the router learns short gaps
    (it needs 20 of them before it trusts what it learned)."""
    rng = random.Random("warm-up")
    prompt = words(rng, 40)
    for _ in range(turns):
        tokens, _, _ = router_completion(router, plane.model, prompt, "warm-up", stream=False)
        prompt = prompt + tokens + words(rng, 8)
    assert state(router)["retention_s"] <= 2.0, state(router)


RETENTION = {
    "mode": "adaptive",
    "retention_min_s": 1,
    # the late turn below continues on D: its 40 new tokens and the history's last partial
    # block (blocks of 128) are what D computes
    "continue_max_suffix_tokens": 192,
    "itl_budget_s": 10.0,  # the hard bound decides here, not the learned ITL cost
}


def test_adaptive_retention_frees_d_s_memory_long_before_the_ttl(dataplane):
    router = dataplane.router("router-retention", tuning=RETENTION)
    warm_up(dataplane, router)
    d = dataplane.d_url
    baseline = settled(dataplane, router)
    released = metric(router, RELEASED, reason="expired")

    rng = random.Random(1301)
    prompt = words(rng, 700)
    before = reuse(router)
    tokens, logprobs, _ = router_completion(router, dataplane.model, prompt, "gone", stream=False)
    assert counted(router, before) == {"miss": 1.0}
    assert same((tokens, logprobs), reference(dataplane, prompt))
    assert eventually(lambda: metric(d, USAGE) > baseline, within_s=5.0)
    started = time.monotonic()
    assert eventually(lambda: metric(d, USAGE) <= baseline, within_s=30.0)
    took = time.monotonic() - started
    print(f"retention: D's usage back at {metric(d, USAGE):.4f} after {took:.1f}s (TTL 480 s)")
    assert metric(router, RELEASED, reason="expired") > released

    # It comes back after all. D no longer pins its blocks, but its prefix cache still has
    # them (nothing needed the room): the router continues the turn on D with the released
    # handle (outcome "cached"), D serves the history from its cache, and the answer is exact.
    history = prompt + tokens
    later = history + words(rng, 40)
    before, by_source = reuse(router), tokens_by_source(scrape(d))
    out = router_completion(router, dataplane.model, later, "gone", stream=False)
    assert counted(router, before) == {"cached": 1.0}
    served = moved(by_source, tokens_by_source(scrape(d)))
    assert served.get("local_cache_hit", 0.0) >= len(history) - 128, served  # whole blocks
    assert same(out[:2], reference(dataplane, later))
    # Its fresh handle is pinned (leased) again.
    assert eventually(lambda: state(router).get("leases", 0) >= 1, within_s=5.0)


@pytest.fixture(scope="module")
def static_router(dataplane) -> str:
    return dataplane.router("router-static-leases")


def test_ending_a_conversation_frees_d_s_blocks_at_once(dataplane, static_router):
    d = dataplane.d_url
    baseline = metric(d, USAGE)
    prompt = words(random.Random(1302), 700)
    router_completion(static_router, dataplane.model, prompt, "ended", stream=False)
    assert eventually(lambda: metric(d, USAGE) > baseline, within_s=5.0)
    started = time.monotonic()
    status, _ = call("DELETE", f"{static_router}/boomerang/v1/conversations/ended")
    assert status == 204
    assert eventually(lambda: metric(d, USAGE) <= baseline, within_s=3.0)
    print(f"ended: D's usage back in {time.monotonic() - started:.2f}s")
    assert metric(static_router, RELEASED, reason="ended") == 1
    status, _ = call("DELETE", f"{static_router}/boomerang/v1/conversations/ended")
    assert status == 404


def test_a_renewed_conversation_still_pulls_and_matches_one_engine(dataplane, static_router):
    rng = random.Random(1303)
    prompt = words(rng, 500)
    first = router_completion(static_router, dataplane.model, prompt, "renewed", stream=False)
    url = f"{static_router}/boomerang/v1/conversations/renewed/renew"
    status, body = call("POST", url, {"seconds": 300})
    assert status == 200, body
    assert 250 < body["expires_in_s"] <= 480
    assert metric(static_router, "boomerang_router_leases_renewed_total") == 1

    later = prompt + first[0] + words(rng, 60)
    before = reuse(static_router)
    pulled = pdclient.external_tokens(scrape(dataplane.p_url))
    out = router_completion(static_router, dataplane.model, later, "renewed", stream=True)
    assert counted(static_router, before) == {"hit": 1.0}
    assert pdclient.external_tokens(scrape(dataplane.p_url)) - pulled >= len(prompt) - 128
    assert same(out[:2], reference(dataplane, later))
