"""The decoder's lease API on the real engine (vLLM CPU 0.32, NIXL): release and renew D's
retained blocks (`boomerang.connector.plugin.leases`, loaded by the engine arguments every engine
gets).

What must hold for the router to rely on it: a released handle's blocks are back in D's free
pool within about a second (D's `vllm:kv_cache_usage_perc` returns to where it was before the
turn) without being counted as an expiry (vLLM's `nixl_num_kv_expired_reqs` stays put); a
renewed handle gets a later deadline, P still pulls it with that deadline, and the turn's output
is still a single engine's; ids D does not hold are listed as unknown; a wrong token is refused.
"""

from __future__ import annotations

import random
import time

import pytest
from dataplane.leasing import eventually, held, metric
from dataplane.turns import MAX_TOKENS, same, words

from boomerang.connector.plugin.lease_api import RELEASED_METRIC, RENEWED_METRIC
from boomerang.local import pdclient
from boomerang.local.engine_client import lease_status, samples, scrape

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"
USAGE = "vllm:kv_cache_usage_perc"


def retained_turn(plane, rng: random.Random, before: int):
    """A P/D turn whose handle D now holds (D's worker records it one engine step after D
    answered)."""
    history = words(rng, 700)
    turn = pdclient.pd_turn(plane.p_url, plane.d_url, plane.model, history, None, MAX_TOKENS)
    assert turn.handle is not None and turn.handle["remote_request_id"]
    assert eventually(lambda: held(plane) == before + 1, within_s=5.0)
    return history, turn


def test_the_api_describes_itself_and_refuses_a_wrong_token(dataplane):
    status, body = lease_status(dataplane.d_url, dataplane.lease_token)
    assert status == 200
    assert body["ceiling_s"] == 480 and body["vllm"].startswith("0.32")
    for op, payload in (("", None), ("release", {"request_ids": []}), ("renew", {})):
        status, body = lease_status(dataplane.d_url, "wrong", op, payload)
        assert status == 401 and body["error"]["type"] == "unauthorized"
    status, body = lease_status(dataplane.d_url, dataplane.lease_token, "renew", {"request_ids": 1})
    assert status == 400 and body["error"]["message"]


def test_a_released_handle_frees_its_blocks_at_once_without_an_expiry(dataplane):
    d = dataplane.d_url
    baseline, before, expired = metric(d, USAGE), held(dataplane), metric(d, EXPIRED)
    released_before = metric(d, RELEASED_METRIC)
    assert samples(scrape(d), EXPIRED), "D exports no expired counter"
    _history, turn = retained_turn(dataplane, random.Random(1201), before)
    holding = metric(d, USAGE)
    assert holding > baseline
    rid = turn.handle["remote_request_id"]

    started = time.monotonic()
    ids = [rid, "no-such-request"]
    status, body = lease_status(d, dataplane.lease_token, "release", {"request_ids": ids})
    assert (status, body) == (200, {"released": [rid], "unknown": ["no-such-request"]})
    assert eventually(lambda: metric(d, USAGE) <= baseline, within_s=2.0)
    took = time.monotonic() - started
    print(f"usage {baseline:.6f} -> {holding:.6f} held -> {metric(d, USAGE):.6f} in {took:.2f}s")
    assert held(dataplane) == before
    assert metric(d, EXPIRED) == expired
    assert metric(d, RELEASED_METRIC) == released_before + 1
    log = dataplane.specs["decode"].log.read_text()
    assert f"Releasing expired KV blocks for request {rid}" not in log

    status, body = lease_status(d, dataplane.lease_token, "release", {"request_ids": [rid]})
    assert (status, body) == (200, {"released": [], "unknown": [rid]})


def test_a_renewed_handle_is_pulled_with_its_new_deadline_and_matches(dataplane):
    p, d, model, token = dataplane.p_url, dataplane.d_url, dataplane.model, dataplane.lease_token
    rng = random.Random(1202)
    renewed_before = metric(d, RENEWED_METRIC)
    history, turn = retained_turn(dataplane, rng, held(dataplane))
    rid, old = turn.handle["remote_request_id"], turn.handle["remote_blocks_expiry_time"]

    body = {"request_ids": [rid, "no-such-request"], "seconds": 1e6}
    status, answer = lease_status(d, token, "renew", body)
    assert status == 200 and answer["unknown"] == ["no-such-request"]
    assert answer["ceiling_s"] == 480
    deadline = answer["renewed"][rid]
    assert old < deadline <= old + 60  # clamped to the ceiling: now + 480 s
    status, shorter = lease_status(d, token, "renew", {"request_ids": [rid], "seconds": 5})
    assert status == 200 and shorter["renewed"] == {rid: deadline}  # never shortened
    assert metric(d, RENEWED_METRIC) == renewed_before + 2

    prompt = history + turn.tokens + words(rng, 40)
    handle = {**turn.handle, "remote_blocks_expiry_time": deadline}
    pulled_before = pdclient.external_tokens(scrape(p))
    second = pdclient.pd_turn(p, d, model, prompt, handle, max_tokens=MAX_TOKENS)
    assert pdclient.external_tokens(scrape(p)) - pulled_before >= len(history) - 128
    reference = pdclient.single_turn(p, model, prompt, max_tokens=MAX_TOKENS)
    assert same((second.tokens, second.logprobs), (reference.tokens, reference.logprobs))

    status, answer = lease_status(d, token, "release", {"request_ids": [rid]})
    assert answer == {"released": [], "unknown": [rid]}  # P's read ended the lease
    if second.handle:
        lease_status(d, token, "release", {"request_ids": [second.handle["remote_request_id"]]})
