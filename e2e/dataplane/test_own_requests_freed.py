"""A request D served alone (the continue path) frees its blocks when its handle is released.

vLLM 0.32 never announced such a request to its NIXL worker, so its retained blocks were never
freed (`boomerang.connector.plugin.own_requests`); with the plugin's fix the lease API releases them
at once, and P's read of such a handle frees them as for any other handle.
"""

from __future__ import annotations

import random
import time

import pytest
from dataplane.turns import MAX_TOKENS, words

from boomerang.local import pdclient
from boomerang.local.engine_client import completion_body, lease_call, post, samples, scrape

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

ON_DECODE = {"do_remote_prefill": False, "do_remote_decode": False}
USAGE = "vllm:kv_cache_usage_perc"


def usage(url: str) -> float:
    return sum(s.value for s in samples(scrape(url), USAGE))


def settle(url: str, target: float, seconds: float = 10.0) -> float:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = usage(url)
        if now <= target + 1e-9:
            return now
        time.sleep(0.05)
    return usage(url)


def test_a_continued_turns_blocks_are_freed_by_a_release_and_by_ps_read(dataplane):
    p, d, model = dataplane.p_url, dataplane.d_url, dataplane.model
    rng = random.Random(7)
    baseline = settle(d, usage(d), 2.0)
    history = words(rng, 600)
    first = pdclient.pd_turn(p, d, model, history, None, max_tokens=MAX_TOKENS)
    assert first.handle is not None

    def continued(prompt: list[int]) -> dict:
        body = {**completion_body(model, prompt, MAX_TOKENS), "stream": False}
        resp = post(f"{d}/v1/completions", {**body, "kv_transfer_params": dict(ON_DECODE)})
        handle = pdclient.next_handle(resp.get("kv_transfer_params"))
        assert handle is not None
        return {"handle": handle, "tokens": resp["choices"][0]["token_ids"], "prompt": prompt}

    second = continued(history + first.tokens + words(rng, 20))
    token = dataplane.lease_token
    released = lease_call(d, token, "release", {"request_ids": [first.handle["remote_request_id"]]})
    assert released["released"] == [first.handle["remote_request_id"]]
    # The continued request is known to D's worker: its release frees what it held.
    rid = second["handle"]["remote_request_id"]
    assert lease_call(d, token, "release", {"request_ids": [rid]})["released"] == [rid]
    assert settle(d, baseline) == pytest.approx(baseline, abs=1e-9)

    # And P's read of a continued request's handle frees it too (no "unrecognized request").
    third = continued(history + first.tokens + words(rng, 25))
    prompt = third["prompt"] + third["tokens"] + words(rng, 30)
    pdclient.pd_turn(p, d, model, prompt, third["handle"], max_tokens=MAX_TOKENS)
    after_pull = usage(d)
    assert lease_call(d, token, "release", {"request_ids": [third["handle"]["remote_request_id"]]})[
        "unknown"
    ] == [third["handle"]["remote_request_id"]]
    assert after_pull > baseline  # the P/D turn's own handle is retained, nothing else
