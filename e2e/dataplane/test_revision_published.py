"""The real CPU engines publish the revision the operator renders, through Boomerang's plugin,
and a real router never pairs a P and a D that publish different ones.

The router pairs P and D by this revision while a rollout runs two (see
`boomerang.router.engines.endpoints.pairable`); without the plugin the page has no such gauge and
the router pairs the engine with any, as before. Both engines are started by the local runtime's
`engine_spec`, with the same environment the operator renders for pods; the second test
restarts D under another revision, as a rollout's held decoder looks beside a rolled prefill.
"""

from __future__ import annotations

import random

import pytest
from dataplane.restart import restart_decoder
from dataplane.turns import counted, reference, reuse, router_completion, same, words

from boomerang.facts.engine import CONTINUE_CAPABILITY, ENGINE_REVISION_ENV, PRESSURE_CAPABILITY
from boomerang.local.engine_client import scrape, totals
from boomerang.operator import render
from boomerang.router.engines.health import capabilities_from_metrics, revision_from_metrics

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]
RESTART_S = 600.0


def test_both_engines_publish_the_revision_their_environment_names(dataplane):
    expected = render.engine_revision(dataplane.dd)
    for url in (dataplane.p_url, dataplane.d_url):
        page = scrape(url).encode()
        assert revision_from_metrics(page) == expected, url
        # own_requests, and the memory-pressure hooks (the local stack runs the lease API)
        assert capabilities_from_metrics(page) == {CONTINUE_CAPABILITY, PRESSURE_CAPABILITY}, url


def degraded(router: str) -> float:
    return totals(scrape(router), "boomerang_router_degraded_turns_total", "missing").get(
        "decode", 0.0
    )


def test_a_router_serves_p_alone_rather_than_pair_it_with_a_decoder_of_another_revision(
    dataplane,
):
    router = dataplane.router("router-revisions", health={"probe_interval_s": 1.0})
    rng = random.Random(41)
    prompt = words(rng, 300)
    try:
        restart_decoder(dataplane, router, {ENGINE_REVISION_ENV: "another-build"})
        before, alone_before = reuse(router), degraded(router)
        d_requests = totals(scrape(dataplane.d_url), "vllm:request_success_total", "engine")
        result = router_completion(router, dataplane.model, prompt, "conv-rev", stream=False)
        assert same(result[:2], reference(dataplane, prompt))
        assert degraded(router) == alone_before + 1  # served on P alone, as a plain request
        assert totals(scrape(dataplane.d_url), "vllm:request_success_total", "engine") == (
            d_requests
        )  # D, of another revision, got nothing
        assert counted(router, before) == {"miss": 1.0}
    finally:
        restart_decoder(dataplane, router)
    # One revision again: P and D pair, and the next turn of a conversation pulls D's KV.
    tokens, _, _ = router_completion(router, dataplane.model, prompt, "conv-rev2", stream=False)
    nxt = prompt + tokens + words(rng, 60)
    before = reuse(router)
    result = router_completion(router, dataplane.model, nxt, "conv-rev2", stream=False)
    assert same(result[:2], reference(dataplane, nxt))
    assert counted(router, before) == {"hit": 1.0}
