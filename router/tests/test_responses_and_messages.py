"""The Responses and Anthropic Messages APIs through the router's P/D turn, against fake engines
that serve them as vLLM 0.32 with Boomerang's plugin does (`fake_apis.py`): verified reuse on
every follow-up (by conversation id and by fingerprint), tool calls and tool results in the
history, streams relayed in each API's own events without the engine's fields, refusals in
each API's own error shape, and the official clients reading what the router answers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

RESPONSES, MESSAGES = "/v1/responses", "/v1/messages"
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
A_TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}


async def call(w: Any, path: str, body: dict[str, Any], **headers: str) -> tuple[int, Any]:
    resp = await w.client.post(path, json=body, headers=headers)
    return resp.status, await resp.json()


async def events(w: Any, path: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, data) of each event of a streamed answer, as the client got it."""
    resp = await w.client.post(path, json={**body, "stream": True})
    assert resp.status == 200, await resp.text()
    out = []
    for block in (await resp.read()).decode().split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines.get("event", ""), json.loads(lines["data"])))
    return out


def responses_body(items: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "fake", "input": items, "max_output_tokens": 50, **extra}


def messages_body(messages: list[Any], **extra: Any) -> dict[str, Any]:
    return {"model": "fake", "max_tokens": 50, "messages": messages, **extra}


INTERNAL = ("kv_transfer_params", "prompt_token_ids", "token_ids")


def assert_clean(obj: dict[str, Any]) -> None:
    assert not set(INTERNAL) & set(obj), obj


# -- the turn ----------------------------------------------------------------------------------


async def test_responses_follow_up_pulls_the_history_back_from_decode(world: Any) -> None:
    w = await world()
    items: list[Any] = [{"role": "user", "content": "hello there"}]
    status, first = await call(w, RESPONSES, responses_body(items, conversation_id="c1"))
    assert status == 200, first
    assert_clean(first)
    items += [*first["output"], {"role": "user", "content": "and then?"}]
    status, second = await call(w, RESPONSES, responses_body(items, conversation_id="c1"))
    assert status == 200 and second["output"][0]["content"][0]["text"]
    assert await w.reuse("hit") == 1 and await w.reuse("miss") == 1
    assert [who for who, _ in w.fabric.pulls] == ["decode", "prefill", "decode"]
    assert w.fabric.violations == []
    p_body, d_body = w.prefill[0].calls[-1], w.decode[0].calls[-1]
    assert p_body["max_output_tokens"] == 1 and p_body["stream"] is False
    assert p_body["store"] is False and d_body["store"] is False
    assert d_body["kv_transfer_params"]["do_remote_prefill"] is True
    assert d_body["max_output_tokens"] == 50


async def test_messages_follow_up_by_fingerprint_is_a_verified_hit(world: Any) -> None:
    w = await world()
    msgs: list[Any] = [{"role": "user", "content": "hello there"}]
    status, first = await call(w, MESSAGES, messages_body(msgs, system="be brief"))
    assert status == 200, first
    assert_clean(first)
    msgs += [{"role": "assistant", "content": first["content"]}, {"role": "user", "content": "ok"}]
    status, second = await call(w, MESSAGES, messages_body(msgs, system="be brief"))
    assert status == 200 and second["content"][0]["type"] == "text"
    assert await w.reuse("hit") == 1
    assert w.prefill[0].calls[-1]["max_tokens"] == 1
    assert w.fabric.violations == []


async def test_a_changed_system_prompt_finds_no_conversation(world: Any) -> None:
    w = await world()
    msgs: list[Any] = [{"role": "user", "content": "hello there"}]
    _, first = await call(w, MESSAGES, messages_body(msgs, system="be brief"))
    msgs += [{"role": "assistant", "content": first["content"]}, {"role": "user", "content": "ok"}]
    await call(w, MESSAGES, messages_body(msgs, system="be long"))
    assert await w.reuse("miss") == 2


async def test_an_agent_loop_with_tool_calls_in_the_history_hits_every_turn(world: Any) -> None:
    w = await world()
    items: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    for turn in range(3):
        body = responses_body(items, tools=[TOOL], conversation_id="agent")
        status, out = await call(w, RESPONSES, body)
        assert status == 200, out
        arguments = json.dumps({"city": "Paris", "turn": turn})
        tool_call = {"type": "function_call", "call_id": f"c{turn}", "name": "get_weather"}
        items += [*out["output"], {**tool_call, "arguments": arguments}]
        items.append({"type": "function_call_output", "call_id": f"c{turn}", "output": "sunny"})
    assert await w.reuse("hit") == 2 and await w.reuse("miss") == 1
    assert w.fabric.violations == []


async def test_a_history_ending_with_a_call_the_model_did_not_make_has_no_fingerprint_match(
    world: Any,
) -> None:
    # The fingerprint files the model's own answer; a history whose last model item the
    # client wrote itself is found by a conversation id only (above).
    w = await world()
    items: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    _, out = await call(w, RESPONSES, responses_body(items, tools=[TOOL]))
    tool_call = {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"}
    items += [*out["output"], tool_call, {"type": "function_call_output", "call_id": "c"}]
    await call(w, RESPONSES, responses_body(items, tools=[TOOL]))
    assert await w.reuse("miss") == 2


async def test_tool_use_and_tool_results_in_messages_hit(world: Any) -> None:
    w = await world()
    msgs: list[Any] = [{"role": "user", "content": "weather?"}]
    for turn in range(3):
        body = messages_body(msgs, tools=[A_TOOL], conversation_id="agent")
        status, out = await call(w, MESSAGES, body)
        assert status == 200, out
        use = {"type": "tool_use", "id": f"t{turn}", "name": "get_weather", "input": {"n": turn}}
        msgs.append({"role": "assistant", "content": [*out["content"], use]})
        result = {"type": "tool_result", "tool_use_id": f"t{turn}", "content": "sunny"}
        msgs.append({"role": "user", "content": [result]})
    assert await w.reuse("hit") == 2 and await w.reuse("miss") == 1
    assert w.fabric.violations == []


async def test_verification_renders_on_prefill_with_the_api_s_own_endpoint(world: Any) -> None:
    w = await world()
    msgs: list[Any] = [{"role": "user", "content": "hello there"}]
    _, first = await call(w, MESSAGES, messages_body(msgs, conversation_id="r"))
    msgs += [{"role": "assistant", "content": first["content"]}, {"role": "user", "content": "x"}]
    await call(w, MESSAGES, messages_body(msgs, conversation_id="r"))
    assert w.prefill[0].tokenize_calls == 1
    assert await w.metric("boomerang_router_verification_prompt_mismatch_total") == 0
    # A request whose rendering the engine may probe (thinking disabled) is not verified.
    msgs += [{"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}]
    body = messages_body(msgs, conversation_id="r", thinking={"type": "disabled"})
    await call(w, MESSAGES, body)
    assert w.prefill[0].tokenize_calls == 1
    assert await w.reuse("fallback") == 1


async def test_without_the_plugin_s_ids_no_handle_is_filed(world: Any) -> None:
    w = await world(prefill_spec={"api_ids": False}, decode_spec={"api_ids": False})
    items: list[Any] = [{"role": "user", "content": "hello"}]
    _, first = await call(w, RESPONSES, responses_body(items, conversation_id="c"))
    items += [*first["output"], {"role": "user", "content": "more"}]
    await call(w, RESPONSES, responses_body(items, conversation_id="c"))
    assert await w.reuse("miss") == 2
    labels = {"reason": "no_ids"}
    assert await w.metric("boomerang_router_handles_skipped_total", **labels) == 2


# -- streams -----------------------------------------------------------------------------------


async def test_a_streamed_response_keeps_its_events_and_files_d_s_handle(world: Any) -> None:
    w = await world()
    items: list[Any] = [{"role": "user", "content": "hello there"}]
    got = await events(w, RESPONSES, responses_body(items, conversation_id="s"))
    names = [name for name, _ in got]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    assert all(name == data["type"] for name, data in got)
    for _, data in got:
        assert_clean(data.get("response") or {})
    final = got[-1][1]["response"]
    items += [*final["output"], {"role": "user", "content": "go on"}]
    got = await events(w, RESPONSES, responses_body(items, conversation_id="s"))
    assert await w.reuse("hit") == 1
    assert w.fabric.violations == []


async def test_a_streamed_message_loses_the_engine_fields_and_its_reply_is_filed(
    world: Any,
) -> None:
    w = await world()
    msgs: list[Any] = [{"role": "user", "content": "hello there"}]
    got = await events(w, MESSAGES, messages_body(msgs))
    names = [name for name, _ in got]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-2:] == ["message_delta", "message_stop"]
    delta = got[-2][1]
    assert_clean(delta) and delta["delta"]["stop_reason"]
    text = "".join(d["delta"]["text"] for n, d in got if n == "content_block_delta")
    # The client echoes the streamed text as its assistant message: found by fingerprint.
    msgs += [{"role": "assistant", "content": [{"type": "text", "text": text}]}]
    msgs.append({"role": "user", "content": "more"})
    _, second = await call(w, MESSAGES, messages_body(msgs))
    assert await w.reuse("hit") == 1, second


# -- refusals, in each API's error shape -------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"background": True, "store": False}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": []}, "input"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
    ],
)
async def test_responses_state_and_server_tools_are_refused_naming_the_field(
    world: Any, extra: dict[str, Any], param: str
) -> None:
    w = await world()
    status, body = await call(w, RESPONSES, responses_body("hi", **extra))
    assert status == 400, body
    assert body["error"]["param"] == param and param.split("[")[0] in body["error"]["message"]
    assert w.prefill[0].calls == [] and w.decode[0].calls == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "fake", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        (messages_body([]), "messages"),
        (messages_body([{"role": "tool", "content": "x"}]), "messages[0].role"),
        (messages_body([{"role": "user", "content": "x"}], container="c1"), "container"),
        (messages_body([{"role": "user", "content": "x"}], mcp_servers=[{}]), "mcp_servers"),
        (
            messages_body([{"role": "user", "content": "x"}], tools=[{"type": "web_search_x"}]),
            "tools[0].type",
        ),
    ],
)
async def test_messages_refusals_have_anthropic_s_error_shape(
    world: Any, body: dict[str, Any], field: str
) -> None:
    w = await world()
    status, answer = await call(w, MESSAGES, body)
    assert status == 400
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert field in answer["error"]["message"]
    assert w.prefill[0].calls == []


async def test_messages_authentication_errors_have_anthropic_s_shape(
    world: Any, tmp_path: Any
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("good-key\n")
    w = await world(api_keys_file=str(keys))
    body = messages_body([{"role": "user", "content": "x"}])
    status, answer = await call(w, MESSAGES, body, Authorization="Bearer wrong")
    assert status == 401 and answer["error"]["type"] == "authentication_error"
    status, answer = await call(w, RESPONSES, responses_body("x"), Authorization="Bearer wrong")
    assert status == 401 and answer["error"]["type"] == "authentication_error"


async def test_client_kv_transfer_params_never_reach_an_engine(world: Any) -> None:
    w = await world()
    forged = {"do_remote_decode": True, "remote_block_ids": [[1]], "remote_engine_id": "d0"}
    body = messages_body([{"role": "user", "content": "x"}], kv_transfer_params=forged)
    status, _ = await call(w, MESSAGES, body)
    assert status == 200
    assert w.prefill[0].calls[0]["kv_transfer_params"]["remote_block_ids"] is None
    assert w.fabric.violations == []


async def test_stored_response_endpoints_are_not_served(world: Any) -> None:
    w = await world()
    for method in ("GET", "DELETE"):
        resp = await w.client.request(method, "/v1/responses/resp_123")
        assert resp.status == 404
        assert "keeps no responses" in (await resp.json())["error"]["message"]


async def test_count_tokens_is_answered_by_an_engine(world: Any) -> None:
    w = await world()
    body = {"model": "fake", "messages": [{"role": "user", "content": "four"}]}
    status, answer = await call(w, "/v1/messages/count_tokens", body)
    assert status == 200 and answer["input_tokens"] > 4


# -- the official clients ----------------------------------------------------------------------


async def test_the_openai_sdk_reads_responses_streamed_and_not(world: Any) -> None:
    from openai import OpenAI

    w = await world()
    client = OpenAI(base_url=str(w.client.make_url("/v1")), api_key="x", max_retries=0)

    def run() -> tuple[str, str]:
        items: list[Any] = [{"role": "user", "content": "hello"}]
        first = client.responses.create(model="fake", input=items, store=False)
        items += [o.model_dump(exclude_none=True) for o in first.output]
        items.append({"role": "user", "content": "more"})
        with client.responses.stream(model="fake", input=items, store=False) as stream:
            for _ in stream:
                pass
            second = stream.get_final_response()
        return first.output_text, second.output_text

    first, second = await asyncio.to_thread(run)
    assert first and second
    assert await w.reuse("hit") == 1


async def test_the_anthropic_sdk_reads_messages_streamed_and_not(world: Any) -> None:
    import anthropic

    w = await world()
    client = anthropic.Anthropic(base_url=str(w.client.make_url("")), api_key="x", max_retries=0)

    def run() -> tuple[str, str]:
        msgs: list[Any] = [{"role": "user", "content": "hello"}]
        first = client.messages.create(model="fake", max_tokens=50, messages=msgs)
        msgs += [{"role": "assistant", "content": [b.model_dump() for b in first.content]}]
        msgs.append({"role": "user", "content": "more"})
        with client.messages.stream(model="fake", max_tokens=50, messages=msgs) as stream:
            second = stream.get_final_message()
        return first.content[0].text, second.content[0].text  # type: ignore[union-attr]

    first, second = await asyncio.to_thread(run)
    assert first and second
    assert await w.reuse("hit") == 1
    with pytest.raises(anthropic.BadRequestError):
        await asyncio.to_thread(client.messages.create, model="fake", max_tokens=0, messages=[])


# -- adaptive mode: the continue path ----------------------------------------------------------


async def test_an_adaptive_router_continues_both_apis_on_the_decoder_holding_them(
    world: Any,
) -> None:
    from test_paths import ADAPTIVE, SLOW_P, router_of, until

    from boomerang.router.apis.protocol import CONTINUE_PARAMS

    w = await world(**ADAPTIVE)
    router_of(w, SLOW_P)
    items: list[Any] = [{"role": "user", "content": "hello there"}]
    msgs: list[Any] = [{"role": "user", "content": "hello there"}]
    for _ in range(3):
        _, out = await call(w, RESPONSES, responses_body(items, conversation_id="r"))
        items += [*out["output"], {"role": "user", "content": "go"}]
        got = await events(w, MESSAGES, messages_body(msgs, conversation_id="m"))
        text = "".join(d["delta"]["text"] for n, d in got if n == "content_block_delta")
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "go"}]
    d_calls = w.decode[0].calls
    assert len(w.prefill[0].calls) == 2  # only each conversation's first turn went through P
    assert [c["kv_transfer_params"] for c in d_calls[2:]] == [CONTINUE_PARAMS] * 4
    await until(lambda: _count(w, "continue", 4))
    assert await w.reuse("hit") == 4
    assert w.fabric.violations == []


async def _count(w: Any, path: str, n: float) -> bool:
    return await w.metric("boomerang_router_path_total", path=path) == n
