"""Sessions, retention hints and usage through the router, against the fake engines."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from router_testing import chat, post, stream

from boomerang.router import conversation as conv
from boomerang.router.apis.sessions import conversation_root
from boomerang.router.app import ROUTER

SESSION = {"x-claude-code-session-id": "agent-1"}


def reworded(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant's message as an agent that rewrites whitespace echoes it: no fingerprint
    of the history can match what the router filed."""
    return {**message, "content": str(message["content"]).replace(" ", "\n") + "\n"}


async def agent_loop(w: Any, turns: int, headers: dict[str, str]) -> None:
    history: list[dict[str, Any]] = [{"role": "user", "content": "a task in several steps"}]
    for i in range(turns):
        status, answer = await post(w, chat(history), **headers)
        assert status == 200, answer
        history += [reworded(answer["choices"][0]["message"])]
        history += [{"role": "user", "content": f"tool result {i}"}]


async def test_a_session_header_finds_the_handle_when_no_fingerprint_can(world: Any) -> None:
    w = await world()
    await agent_loop(w, 4, SESSION)
    assert await w.reuse("miss") == 1  # the first turn only
    assert await w.reuse("hit") + await w.reuse("partial") == 3
    assert await w.reuse("rejected") == 0
    assert w.fabric.violations == []


async def test_sibling_conversations_under_one_session_keep_their_own_kv(world: Any) -> None:
    """Sub-agents that carry their parent's session id, interleaved turn by turn: each finds
    its own handle (before, each turn took and released its sibling's and filed over it)."""
    w = await world()
    histories = [
        [{"role": "system", "content": "a sub-agent"}, {"role": "user", "content": task}]
        for task in ("search the code for the bug", "write the tests for it")
    ]
    for step in range(3):
        for history in histories:
            status, answer = await post(w, chat(history), **SESSION)
            assert status == 200, answer
            history += [reworded(answer["choices"][0]["message"])]
            history += [{"role": "user", "content": f"tool result {step}"}]
    assert await w.reuse("miss") == 2  # each one's first turn only
    assert await w.reuse("hit") + await w.reuse("partial") == 4
    assert await w.reuse("rejected") == 0 and w.fabric.violations == []


async def test_without_the_header_the_same_loop_misses_every_turn(world: Any) -> None:
    w = await world()
    await agent_loop(w, 3, {})
    assert await w.reuse("miss") == 3


async def test_a_session_falls_back_to_the_fingerprint_its_last_turn_was_filed_under(
    world: Any,
) -> None:
    w = await world()
    history = [{"role": "user", "content": "hello there"}]
    _, first = await post(w, chat(history))  # no session yet: filed by fingerprint
    history += [first["choices"][0]["message"], {"role": "user", "content": "go on"}]
    _, second = await post(w, chat(history), **SESSION)  # found by fingerprint
    history += [second["choices"][0]["message"], {"role": "user", "content": "more"}]
    await post(w, chat(history), **SESSION)  # found by the session
    assert await w.reuse("hit") == 2
    root = conversation_root("chat", {"messages": history})
    key = conv.session_key("anonymous", "agent-1", root)
    assert w.client.server.app[ROUTER].affinity is not None
    assert (await w.client.server.app[ROUTER].store.take(key, 0.0))[0] == "found"


async def test_a_session_is_the_tenant_s_own(world: Any, tmp_path: Any) -> None:
    keys = tmp_path / "keys"
    keys.write_text("key-a tenant-a\nkey-b tenant-b\n")
    w = await world(api_keys_file=str(keys), fingerprint_conversations=False)
    history = [{"role": "user", "content": "secret"}]
    _, first = await post(w, chat(history), Authorization="Bearer key-a", **SESSION)
    history += [first["choices"][0]["message"], {"role": "user", "content": "more"}]
    status, _ = await post(w, chat(history), Authorization="Bearer key-b", **SESSION)
    assert status == 200 and await w.reuse("hit") == 0
    assert w.prefill[0].calls[-1]["kv_transfer_params"]["remote_block_ids"] is None


async def test_prompt_cache_key_names_the_conversation_and_a_header_wins(world: Any) -> None:
    w = await world(fingerprint_conversations=False)
    history = [{"role": "user", "content": "a task in several steps"}]
    _, first = await post(w, chat(history, prompt_cache_key="k1"))
    history += [reworded(first["choices"][0]["message"]), {"role": "user", "content": "next"}]
    _, second = await post(w, chat(history, prompt_cache_key="k1"))
    assert await w.reuse("hit") + await w.reuse("partial") == 1
    history += [second["choices"][0]["message"], {"role": "user", "content": "again"}]
    await post(w, chat(history, prompt_cache_key="k1"), **SESSION)  # the header names another
    assert await w.reuse("miss") == 2
    status, body = await post(w, chat(history, prompt_cache_key=7))
    assert status == 400 and body["error"]["param"] == "prompt_cache_key"


async def test_a_configured_header_list_replaces_the_default(world: Any) -> None:
    w = await world(session_headers=["x-my-session"], fingerprint_conversations=False)
    history = [{"role": "user", "content": "hello"}]
    _, first = await post(w, chat(history), **SESSION)  # not a configured header: nothing
    history += [first["choices"][0]["message"], {"role": "user", "content": "next"}]
    await post(w, chat(history), **SESSION)
    assert await w.reuse("miss") == 2


async def test_usage_reports_what_p_pulled_not_what_d_loaded(world: Any) -> None:
    w = await world()
    history = [{"role": "user", "content": "hello there"}]
    _, first = await post(w, chat(history, conversation_id="c"))
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    history += [first["choices"][0]["message"], {"role": "user", "content": "and then?"}]
    _, second = await post(w, chat(history, conversation_id="c"))
    held = w.fabric.pulls  # (who, tokens) of every read; P's is the second turn's pull
    pulled = [n for who, n in held if who == "prefill"]
    assert await w.reuse("hit") == 1 and pulled
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == pulled[-1] < second["usage"]["prompt_tokens"]


async def test_streamed_usage_reports_p_s_count_too(world: Any) -> None:
    w = await world()
    history = [{"role": "user", "content": "hello there"}]
    _, first = await post(w, chat(history, conversation_id="c"))
    history += [first["choices"][0]["message"], {"role": "user", "content": "and then?"}]
    chunks = await stream(
        w, chat(history, conversation_id="c", stream_options={"include_usage": True})
    )
    last = chunks[-1]
    pulled = [n for who, n in w.fabric.pulls if who == "prefill"]
    assert last["choices"] == [] and last["usage"]["prompt_tokens_details"] == {
        "cached_tokens": pulled[-1]
    }


async def test_a_retention_hint_is_consumed_and_an_over_long_one_capped(world: Any) -> None:
    w = await world()
    status, _ = await post(
        w, chat([{"role": "user", "content": "x"}], prompt_cache_retention="24h")
    )
    assert status == 200
    assert all("prompt_cache_retention" not in c for c in w.prefill[0].calls + w.decode[0].calls)
    assert await w.metric("boomerang_router_retention_hints_capped_total") == 1
    assert await w.metric("boomerang_router_retention_hint_seconds_sum") == 86_400
    status, body = await post(
        w, chat([{"role": "user", "content": "x"}], prompt_cache_retention="forever")
    )
    assert status == 400 and body["error"]["param"] == "prompt_cache_retention"


async def call(w: Any, path: str, body: dict[str, Any], **headers: str) -> tuple[int, Any]:
    resp = await w.client.post(path, json=body, headers=headers)
    return resp.status, await resp.json()


def p_pulled(w: Any) -> int:
    return [n for who, n in w.fabric.pulls if who == "prefill"][-1]


async def test_messages_usage_splits_the_prompt_as_anthropic_does(world: Any) -> None:
    w = await world()
    marked = {"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}
    body: dict[str, Any] = {"model": "fake", "max_tokens": 50, "system": [marked]}
    messages: list[Any] = [{"role": "user", "content": "hello there"}]
    status, first = await call(w, "/v1/messages", {**body, "messages": messages}, **SESSION)
    assert status == 200, first
    messages += [
        {"role": "assistant", "content": first["content"]},
        {"role": "user", "content": "and then?"},
    ]
    status, second = await call(w, "/v1/messages", {**body, "messages": messages}, **SESSION)
    assert status == 200 and await w.reuse("hit") == 1
    usage = second["usage"]
    assert usage["cache_read_input_tokens"] == p_pulled(w)
    assert usage["cache_creation_input_tokens"] > 0  # this turn's new tokens, kept on D
    assert usage["input_tokens"] == 0  # D keeps the whole prompt: read + created cover it


async def test_messages_cache_control_of_the_wrong_shape_is_anthropic_s_400(world: Any) -> None:
    w = await world()
    bad = {"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": 60}}
    body = {"model": "fake", "max_tokens": 5, "messages": [{"role": "user", "content": [bad]}]}
    status, answer = await call(w, "/v1/messages", body)
    assert status == 400
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    two_hours = {**bad, "cache_control": {"type": "ephemeral", "ttl": "2h"}}  # not Anthropic's
    body["messages"] = [{"role": "user", "content": [two_hours]}]
    status, answer = await call(w, "/v1/messages", body)
    assert status == 400 and answer["error"]["type"] == "invalid_request_error"
    assert (
        "cache_control.ttl" in answer["error"]["message"]
        and sum(len(e.calls) for e in w.decode) == 0
    )
    one_hour = {**bad, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    body["messages"] = [{"role": "user", "content": [one_hour]}]
    status, _ = await call(w, "/v1/messages", body)
    assert status == 200  # over the decoder TTL: capped, served
    assert await w.metric("boomerang_router_retention_hints_capped_total") == 1


async def test_responses_usage_reports_p_s_count(world: Any) -> None:
    w = await world()
    items: list[Any] = [{"role": "user", "content": "hello there"}]
    body = {"model": "fake", "max_output_tokens": 50, "prompt_cache_key": "r1"}
    status, first = await call(w, "/v1/responses", {**body, "input": items})
    assert status == 200, first
    assert first["usage"]["input_tokens_details"]["cached_tokens"] == 0
    items += [*first["output"], {"role": "user", "content": "and then?"}]
    status, second = await call(w, "/v1/responses", {**body, "input": items})
    assert status == 200 and await w.reuse("hit") == 1
    assert second["usage"]["input_tokens_details"]["cached_tokens"] == p_pulled(w)


async def test_the_turn_s_log_line_says_where_its_name_and_retention_came_from(
    world: Any, caplog: Any
) -> None:
    w = await world(tuning={"mode": "adaptive"})
    caplog.set_level(logging.INFO, logger="boomerang.router")
    body = chat([{"role": "user", "content": "hi"}], prompt_cache_retention="24h")
    status, _ = await post(w, body, **SESSION)
    assert status == 200
    for _ in range(200):  # logged as the turn finishes, just after the answer went out
        served = [r for r in caplog.records if r.getMessage() == "Served turn"]
        if served:
            break
        await asyncio.sleep(0.01)
    (line,) = served
    assert line.session == "header:x-claude-code-session-id"
    assert line.retention_hint_s == 86_400
    assert line.retention_hint_applied_s == 480  # the decoder TTL: the default cap
    assert line.cached_tokens == 0
    assert any(r.getMessage() == "Capped retention hint" for r in caplog.records)
