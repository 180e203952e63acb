"""A pull P took is a hit, by P's own count (issue 47), on the vLLM CPU P/D pair: the router
judges a pull failed when P's count of cached prompt tokens falls short of what it was sent to
pull by more than a block (`usage.pull_failed`), so a real pull must never read as failed.

A failed pull itself cannot be made here on purpose: a read of blocks D released succeeds at
the transport (which is why P reads only after D confirms the lease, `claims.py`), and a D
killed under P's read leaves P's request waiting on the transfer (vLLM defers the failure
until its outstanding transfers finish; observed for 9 minutes), until the router's prefill
timeout ends it. The rule's failing side is tested with a fake P
(`router/tests/test_failed_pull.py`)."""

from __future__ import annotations

import random

import pytest
from dataplane.turns import counted, reuse, router_completion, words

from boomerang.local import pdclient
from boomerang.local.engine_client import samples

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]


def test_a_pull_p_took_is_a_hit_never_a_failed_pull(dataplane) -> None:
    router = dataplane.router("router-pulls", tuning={"mode": "static"})  # pulls, never continues
    rng = random.Random(4711)
    prompt = words(rng, 700)
    for turn in range(3):
        before = reuse(router)
        tokens, _, answer = router_completion(
            router, dataplane.model, prompt, "pulls", stream=False
        )
        outcome = counted(router, before)
        if turn:
            assert outcome == {"hit": 1.0}, outcome
            cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached >= len(prompt) - 40 - 128  # the history, by P's count
        prompt = prompt + tokens + words(rng, 40)
    failed = samples(pdclient.scrape(router), "boomerang_router_failed_pulls_total")
    assert [s.value for s in failed] == [0.0]  # exported, and never counted
