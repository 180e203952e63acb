"""A decoder whose leases yield to memory pressure (`pressure` capability): the router claims
a taken handle's lease before offering it to P, offers it only when D confirmed, and treats one
D did not confirm as released. Through the router and the fake engines, whose fabric counts a
read of freed blocks as a violation (wrong KV on a real engine)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fake_leases import yield_lease
from router_testing import chat, d_caches, filed, held_tokens, post
from test_paths import ADAPTIVE, SLOW_P, router_of

from boomerang.facts.engine import CONTINUE_CAPABILITY, PRESSURE_CAPABILITY
from boomerang.router.apis.protocol import CONTINUE_PARAMS

TOKEN = "lease-token"
YIELDING = {
    "lease_token": TOKEN,
    "capabilities": (CONTINUE_CAPABILITY, PRESSURE_CAPABILITY),
}


@pytest.fixture
def token_file(tmp_path: Any) -> str:
    path = tmp_path / "lease-token"
    path.write_text(TOKEN)
    return str(path)


async def two_turns(w: Any) -> list[dict[str, Any]]:
    """Turn 1 of conversation "c"; the messages of turn 2."""
    messages = [{"role": "user", "content": "hello there " * 8}]
    status, body = await post(w, chat(messages, conversation_id="c"))
    assert status == 200, body
    await filed(w, 1)
    return [*messages, body["choices"][0]["message"], {"role": "user", "content": "go on"}]


def attached(p_call: dict[str, Any]) -> bool:
    return bool((p_call.get("kv_transfer_params") or {}).get("remote_block_ids"))


async def test_a_confirmed_lease_is_pulled_as_before(world: Any, token_file: str) -> None:
    w = await world(recompute_threshold=0, lease_token_file=token_file, decode_spec=YIELDING)
    messages = await two_turns(w)
    status, body = await post(w, chat(messages, conversation_id="c"))
    assert status == 200, body
    assert attached(w.prefill[0].calls[-1]) and await w.reuse("hit") == 1
    assert len(w.decode[0].claimed) == 1
    assert await w.metric("boomerang_router_claims_total", result="held") == 1
    assert w.fabric.violations == []


async def test_a_lease_that_yielded_is_never_offered_to_p(world: Any, token_file: str) -> None:
    w = await world(recompute_threshold=0, lease_token_file=token_file, decode_spec=YIELDING)
    messages = await two_turns(w)
    assert yield_lease(w.decode[0])  # D ran out of blocks: the unclaimed lease yielded
    status, body = await post(w, chat(messages, conversation_id="c"))
    assert status == 200, body
    assert not attached(w.prefill[0].calls[-1])  # P computed; it read nothing freed
    assert await w.metric("boomerang_router_claims_total", result="gone") == 1
    assert await w.reuse("hit") == 0
    assert w.fabric.violations == []


async def test_adaptive_continues_where_d_still_caches_it(world: Any, token_file: str) -> None:
    w = await world(lease_token_file=token_file, decode_spec=YIELDING, **ADAPTIVE)
    router_of(w, SLOW_P)
    messages = await two_turns(w)
    d_caches(w, held_tokens(w))  # D's events: the freed blocks are still in its cache
    yield_lease(w.decode[0])
    status, body = await post(w, chat(messages, conversation_id="c"))
    assert status == 200, body
    assert w.decode[0].calls[-1]["kv_transfer_params"] == CONTINUE_PARAMS
    assert len(w.prefill[0].calls) == 1  # continued: D's claim was never waited for
    assert w.fabric.violations == []


async def test_adaptive_goes_to_p_when_d_no_longer_caches_it(world: Any, token_file: str) -> None:
    w = await world(lease_token_file=token_file, decode_spec=YIELDING, **ADAPTIVE)
    router_of(w, SLOW_P)
    messages = await two_turns(w)
    yield_lease(w.decode[0])  # and nothing says D still has the blocks: P computes
    status, body = await post(w, chat(messages, conversation_id="c"))
    assert status == 200, body
    assert w.decode[0].calls[-1]["kv_transfer_params"] != CONTINUE_PARAMS
    assert len(w.prefill[0].calls) == 2 and await w.reuse("cached") == 0
    assert w.fabric.violations == []


async def test_no_answer_means_no_offer(world: Any, token_file: str) -> None:
    spec = {**YIELDING, "lease_status": 500}
    w = await world(recompute_threshold=0, lease_token_file=token_file, decode_spec=spec)
    messages = await two_turns(w)
    status, body = await post(w, chat(messages, conversation_id="c"))
    assert status == 200, body
    assert not attached(w.prefill[0].calls[-1])
    assert await w.metric("boomerang_router_claims_total", result="failed") == 1


async def test_a_decoder_whose_leases_never_yield_is_not_asked(world: Any) -> None:
    w = await world(recompute_threshold=0, decode_spec={"lease_token": TOKEN})
    messages = await two_turns(w)
    status, body = await post(w, chat(messages, conversation_id="c"))
    assert status == 200, body
    assert attached(w.prefill[0].calls[-1])
    assert "claim" not in w.decode[0].lease_calls
    assert await w.metric("boomerang_router_claims_total", result="unneeded") == 1


async def test_a_claimed_handle_no_prefill_received_is_unclaimed(
    world: Any, token_file: str
) -> None:
    w = await world(lease_token_file=token_file, decode_spec=YIELDING)
    prompt = [5, 6, 7, 8]  # token ids: verified without tokenize
    body = {"prompt": prompt, "conversation_id": "t", "return_token_ids": True}
    first = await (await w.client.post("/v1/completions", json=body)).json()
    await filed(w, 1)
    await w.servers[0].close()  # P refuses connections: it never sees the handle
    nxt = prompt + first["choices"][0]["token_ids"] + [9, 10]
    r2 = await w.client.post("/v1/completions", json={"prompt": nxt, "conversation_id": "t"})
    assert r2.status == 200  # served by D alone; the handle went back to the store
    for _ in range(100):
        if w.decode[0].unclaimed:
            break
        await asyncio.sleep(0.01)
    assert w.decode[0].unclaimed == w.decode[0].claimed and len(w.decode[0].claimed) == 1
    assert w.fabric.violations == []


async def test_a_claim_the_turn_stopped_waiting_for_is_unclaimed(
    world: Any, token_file: str
) -> None:
    """D claims a lease before it answers (between two engine steps): a turn that ended while
    it waited for that answer (its client left) cancels the wait, and the handle it put back
    is unclaimed all the same, or the lease could never yield to pressure again."""
    slow = {**YIELDING, "claim_answer_s": 30.0}
    w = await world(recompute_threshold=0, lease_token_file=token_file, decode_spec=slow)
    messages = await two_turns(w)
    turn = asyncio.ensure_future(post(w, chat(messages, conversation_id="c")))
    for _ in range(200):  # the pull waits for D's answer to the claim
        if w.decode[0].claimed:
            break
        await asyncio.sleep(0.01)
    turn.cancel()  # the client leaves
    await asyncio.gather(turn, return_exceptions=True)
    for _ in range(200):
        if w.decode[0].unclaimed:
            break
        await asyncio.sleep(0.01)
    assert len(w.decode[0].claimed) == 1 and w.decode[0].unclaimed == w.decode[0].claimed
    assert w.prefill[0].calls and not attached(w.prefill[0].calls[-1])  # P never got it
