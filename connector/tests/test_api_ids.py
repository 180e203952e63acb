"""The plugin's Responses and Messages part, without vLLM: which answers get D's params and ids,
and how (the engine test in e2e/dataplane/test_agent_apis.py runs it in vLLM)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from boomerang.connector.plugin.api_ids import (
    ChatStreamTap,
    asks_for_transfer,
    cached_of,
    message_delta,
    responses_ids,
)

PARAMS = {"do_remote_decode": True, "remote_block_ids": [[1, 2]], "remote_num_tokens": 20}


def chat_event(**fields: Any) -> str:
    return f"data: {json.dumps({'id': 'c', **fields})}\n\n"


def chat_stream() -> list[str]:
    """A chat stream as vLLM sends it with `return_token_ids` and D's params on the end."""
    choice = {"index": 0, "delta": {"content": "a"}, "finish_reason": None}
    return [
        chat_event(choices=[{**choice, "delta": {"role": "assistant"}}], prompt_token_ids=[1, 2]),
        chat_event(choices=[{**choice, "token_ids": [7]}]),
        chat_event(choices=[{**choice, "token_ids": [8], "finish_reason": "stop"}])[:-2].replace(
            '"id"', f'"kv_transfer_params": {json.dumps(PARAMS)}, "id"'
        )
        + "\n\n",
        chat_event(choices=[], usage={"prompt_tokens": 2}),
        "data: [DONE]\n\n",
    ]


def tapped(events: list[str]) -> ChatStreamTap:
    tap = ChatStreamTap(_iterate([]))
    for event in events:
        tap.observe(event)
    return tap


async def _agen(items: list[str]) -> AsyncIterator[str]:
    for item in items:
        yield item


def _iterate(items: list[str]) -> AsyncIterator[str]:
    return _agen(items)


def delta_event(payload: dict[str, Any]) -> str:
    return f"event: message_delta\ndata: {json.dumps(payload)}\n\n"


STOP = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}}


def test_the_tap_collects_params_prompt_and_output_ids_from_the_chat_stream() -> None:
    tap = tapped(chat_stream())
    assert tap.params == PARAMS
    assert tap.prompt_ids == [1, 2] and tap.output_ids == [7, 8] and tap.seen_ids


def test_the_tap_passes_events_through_unchanged() -> None:
    async def run() -> list[str]:
        return [e async for e in ChatStreamTap(_iterate(chat_stream()))]

    assert asyncio.run(run()) == chat_stream()


def test_message_delta_gets_params_and_ids_and_other_events_pass() -> None:
    tap = tapped(chat_stream())
    out = message_delta(delta_event(STOP), tap)
    head, _, data = out.partition("\ndata: ")
    assert head == "event: message_delta" and out.endswith("\n\n")
    payload = json.loads(data)
    assert payload["kv_transfer_params"] == PARAMS
    assert payload["prompt_token_ids"] == [1, 2] and payload["token_ids"] == [7, 8]
    assert payload["delta"] == STOP["delta"]
    stop = 'event: message_stop\ndata: {"type": "message_stop"}\n\n'
    assert message_delta(stop, tap) == stop


def test_nothing_is_added_when_the_chat_stream_carried_nothing() -> None:
    plain = [chat_event(choices=[{"index": 0, "delta": {"content": "a"}}]), "data: [DONE]\n\n"]
    tap = tapped(plain)
    assert message_delta(delta_event(STOP), tap) == delta_event(STOP)


def test_fields_the_engine_already_sends_are_kept() -> None:
    tap = tapped(chat_stream())
    own = {**STOP, "kv_transfer_params": {"theirs": True}}
    payload = json.loads(message_delta(delta_event(own), tap).partition("\ndata: ")[2])
    assert payload["kv_transfer_params"] == {"theirs": True}
    assert payload["token_ids"] == [7, 8]


def test_only_requests_carrying_transfer_params_are_rewritten() -> None:
    assert asks_for_transfer(SimpleNamespace(kv_transfer_params={"do_remote_decode": True}))
    assert not asks_for_transfer(SimpleNamespace(kv_transfer_params=None))
    assert not asks_for_transfer(SimpleNamespace())


def test_responses_ids_come_from_the_final_output() -> None:
    output = SimpleNamespace(token_ids=(5, 6))
    context = SimpleNamespace(
        final_output=SimpleNamespace(prompt_token_ids=[1, 2], outputs=[output])
    )
    assert responses_ids(context) == ([1, 2], [5, 6])
    assert responses_ids(SimpleNamespace(final_output=None)) is None
    assert responses_ids(None) is None


def test_message_delta_reports_the_cached_prompt_tokens_of_the_chat_usage() -> None:
    events = chat_stream()
    events[-2] = chat_event(
        choices=[], usage={"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 8}}
    )
    tap = tapped(events)
    assert tap.cached == 8
    stop = {**STOP, "usage": {"input_tokens": 9, "output_tokens": 2}}
    payload = json.loads(message_delta(delta_event(stop), tap).partition("\ndata: ")[2])
    assert payload["usage"] == {"input_tokens": 9, "output_tokens": 2, "cache_read_input_tokens": 8}


def test_with_details_on_a_stream_without_them_reports_zero() -> None:
    plain = [chat_event(choices=[{"index": 0, "delta": {"content": "a"}}]), "data: [DONE]\n\n"]
    tap = tapped(plain)
    tap.cached = 0  # what the wrapper sets where the engine reports details
    stop = {**STOP, "usage": {"input_tokens": 3, "output_tokens": 1}}
    payload = json.loads(message_delta(delta_event(stop), tap).partition("\ndata: ")[2])
    assert payload["usage"]["cache_read_input_tokens"] == 0


def test_cached_tokens_are_read_from_a_dict_or_vllm_s_model() -> None:
    details = SimpleNamespace(cached_tokens=5)
    assert cached_of(SimpleNamespace(prompt_tokens_details=details)) == 5
    assert cached_of({"prompt_tokens_details": {"cached_tokens": 4}}) == 4
    assert cached_of(SimpleNamespace(prompt_tokens_details=None)) is None
    assert cached_of(None) is None


def test_a_messages_answer_gets_the_chat_answer_s_cached_tokens() -> None:
    from boomerang.connector.plugin.api_ids import _wrap_full_converter

    def original(self: Any, generator: Any) -> Any:
        return SimpleNamespace(usage=SimpleNamespace(cache_read_input_tokens=None))

    convert = _wrap_full_converter(original, None)
    details = SimpleNamespace(cached_tokens=96)
    chat = SimpleNamespace(usage=SimpleNamespace(prompt_tokens_details=details), choices=[])
    off = SimpleNamespace(enable_prompt_tokens_details=False)
    assert convert(off, chat).usage.cache_read_input_tokens == 96
    none = SimpleNamespace(usage=SimpleNamespace(prompt_tokens_details=None), choices=[])
    assert convert(off, none).usage.cache_read_input_tokens is None  # the engine did not say
    on = SimpleNamespace(enable_prompt_tokens_details=True)
    assert convert(on, none).usage.cache_read_input_tokens == 0  # vLLM leaves a zero out
