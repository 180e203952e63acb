"""Partial reuse through the router and the fake engines: a history that diverges from what D
holds reuses D's whole blocks before the divergence, exactly those, and the fabric (which knows
the tokens of every block) sees every read hold the reader's prompt."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from fake_tokenizer import render_chat
from router_testing import chat, filed, post

from boomerang.router.app import ROUTER

OPENING = "tell me how the printing press changed the way news travelled across europe, " * 2
"""A first message long enough that its blocks pass the default threshold of 64 tokens."""


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def decoder_blocks(w: Any) -> list[int]:
    """The block ids D holds for the conversation's last turn (its retained handle)."""
    (held,) = [h for (engine, _), h in w.fabric.held.items() if engine == "d0"]
    return list(held.block_ids)


async def turn(w: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    status, body = await post(w, chat(messages, conversation_id="c"))
    assert status == 200, body
    return dict(body["choices"][0]["message"])


async def assert_partial(w: Any, prompt: list[int], shared: int, blocks: list[int]) -> int:
    """The last turn reused exactly the whole blocks inside the `shared` common prefix."""
    size = w.decode[0].block_size
    k = shared // size
    assert shared % size, "the divergence should fall inside a block"
    p_params = w.prefill[-1].calls[-1]["kv_transfer_params"]
    assert p_params["remote_block_ids"] == [blocks[:k]]
    assert p_params["remote_num_tokens"] == k * size
    assert ("prefill", k * size) in w.fabric.pulls
    for _ in range(200):  # the turn is counted just after its answer went out
        if await w.reuse("partial"):
            break
        await asyncio.sleep(0.01)
    assert await w.reuse("partial") == 1
    assert await w.reuse("rejected") == 0
    assert await w.metric("boomerang_router_reused_tokens_total", outcome="partial") == k * size
    assert await w.metric("boomerang_router_reused_fraction_count") == 1
    fraction = await w.metric("boomerang_router_reused_fraction_sum")
    assert fraction == pytest.approx(k * size / len(prompt))
    assert w.fabric.violations == []
    return k * size


async def test_thinking_model_reuses_the_blocks_before_the_dropped_reasoning(
    world: Any, caplog: Any
) -> None:
    """The template drops the previous turn's reasoning: D's blocks after it are wrong for the
    new prompt, the ones before it are not."""
    caplog.set_level(logging.INFO, logger="boomerang.router")
    w = await world(decode_spec={"reasoning": True}, affinity=False)
    history = [{"role": "user", "content": OPENING}]
    reply = await turn(w, history)
    assert reply["reasoning"]
    await filed(w, 1)
    blocks = decoder_blocks(w)
    nxt = [*history, reply, {"role": "user", "content": "and then?"}]
    await turn(w, nxt)
    prompt = render_chat(nxt)
    shared = common_prefix(render_chat(history), prompt)
    reused = await assert_partial(w, prompt, shared, blocks)
    assert reused >= 64
    lines = [r for r in caplog.records if r.getMessage() == "Served turn"]
    assert [(r.reuse, r.reused_tokens) for r in lines] == [("miss", 0), ("partial", reused)]  # type: ignore[attr-defined]


async def test_an_edited_last_user_message_reuses_the_blocks_before_the_edit(world: Any) -> None:
    w = await world(affinity=False)
    history = [{"role": "user", "content": OPENING}]
    reply = await turn(w, history)
    asked = [*history, reply, {"role": "user", "content": "summarise that in three words"}]
    await turn(w, asked)
    await filed(w, 2)
    blocks = decoder_blocks(w)
    edited = [*history, reply, {"role": "user", "content": "summarise that in five words"}]
    await turn(w, edited)
    prompt = render_chat(edited)
    await assert_partial(w, prompt, common_prefix(render_chat(asked), prompt), blocks)
    assert await w.reuse("hit") == 1  # the turn before the edit extended D's tokens


async def test_a_regenerated_turn_reuses_the_blocks_of_its_own_prompt(world: Any) -> None:
    """The same prompt again: it is a prefix of what D holds; P must still compute at least
    its last token, so the block holding it is not reused."""
    w = await world(affinity=False)
    history = [{"role": "user", "content": OPENING}]
    await turn(w, history)
    await filed(w, 1)
    blocks = decoder_blocks(w)
    await turn(w, history)
    prompt = render_chat(history)
    await assert_partial(w, prompt, len(prompt) - 1, blocks)


async def test_a_divergence_below_the_threshold_is_rejected(world: Any) -> None:
    w = await world(decode_spec={"reasoning": True}, recompute_threshold=1000, affinity=False)
    history = [{"role": "user", "content": OPENING}]
    reply = await turn(w, history)
    await filed(w, 1)
    await turn(w, [*history, reply, {"role": "user", "content": "and then?"}])
    assert await w.reuse("rejected") == 1
    assert await w.reuse("partial") == 0
    assert w.prefill[0].calls[-1]["kv_transfer_params"]["remote_block_ids"] is None
    assert [who for who, _ in w.fabric.pulls] == ["decode", "decode"]
    assert w.fabric.violations == []


async def test_partial_reuse_off_is_all_or_nothing(world: Any) -> None:
    w = await world(decode_spec={"reasoning": True}, partial_reuse=False, affinity=False)
    history = [{"role": "user", "content": OPENING}]
    reply = await turn(w, history)
    await filed(w, 1)
    await turn(w, [*history, reply, {"role": "user", "content": "and then?"}])
    assert await w.reuse("rejected") == 1
    assert w.prefill[0].calls[-1]["kv_transfer_params"]["remote_block_ids"] is None
    assert w.fabric.violations == []


async def test_the_block_size_is_the_decoders_own(world: Any) -> None:
    w = await world(decode_spec={"reasoning": True, "block_size": 32}, affinity=False)
    d_url = next(iter(w.client.server.app[ROUTER].decode.endpoints))
    assert w.client.server.app[ROUTER].decode.endpoints[d_url].block_size == 32
    history = [{"role": "user", "content": OPENING}]
    reply = await turn(w, history)
    await filed(w, 1)
    blocks = decoder_blocks(w)
    nxt = [*history, reply, {"role": "user", "content": "and then?"}]
    await turn(w, nxt)
    prompt = render_chat(nxt)
    await assert_partial(w, prompt, common_prefix(render_chat(history), prompt), blocks)


async def test_a_decoder_that_does_not_report_its_block_size_gets_full_hits_only(
    world: Any,
) -> None:
    w = await world(decode_spec={"reasoning": True, "block_size_metric": False}, affinity=False)
    history = [{"role": "user", "content": OPENING}]
    reply = await turn(w, history)
    await filed(w, 1)
    await turn(w, [*history, reply, {"role": "user", "content": "and then?"}])
    assert await w.reuse("rejected") == 1
    reason = {"reason": "unknown_block_size"}
    assert await w.metric("boomerang_router_handles_without_blocks_total", **reason) == 2
    assert w.fabric.violations == []


async def test_a_partial_handle_p_may_have_seen_is_spent_like_a_hit(world: Any) -> None:
    w = await world(n_prefill=2, decode_spec={"reasoning": True}, affinity=False)
    history = [{"role": "user", "content": OPENING}]
    reply = await turn(w, history)
    await filed(w, 1)
    w.prefill[1].fail_status = 500  # ties rotate: the next turn goes to prefill 1 first
    await turn(w, [*history, reply, {"role": "user", "content": "and then?"}])
    assert w.prefill[1].calls[-1]["kv_transfer_params"]["remote_block_ids"]  # got it, failed
    assert w.prefill[0].calls[-1]["kv_transfer_params"]["remote_block_ids"] is None
    assert await w.reuse("fallback") == 1
    assert await w.reuse("partial") == 0
    assert await w.metric("boomerang_router_reused_tokens_total", outcome="partial") == 0
    assert w.fabric.violations == []
