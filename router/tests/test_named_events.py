"""Streams with named events (Responses, Messages) through the relay: cut into events however
the bytes arrive, each passed on with its name as D sent it unless the router strips something
from it (then written again, name included), the final event yielding D's params and ids, no
[DONE] added, and a failure mid-stream ending it with the API's own error event."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest
from test_stream_relay import relay

from boomerang.router.apis import sse
from boomerang.router.apis.messages import MessagesEvents
from boomerang.router.apis.responses import ResponsesEvents
from boomerang.router.engines.upstream import UpstreamError
from boomerang.router.turn.decode import NamedStreamRelay

PARAMS = {"do_remote_decode": True, "remote_block_ids": [[4, 5]], "remote_num_tokens": 9}


def named(name: str, payload: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **payload})}\n\n".encode()


def message_stream(*, params: bool = True) -> list[bytes]:
    """A Messages stream as vLLM sends it, with the plugin's fields on `message_delta`."""
    use = {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}
    delta: dict[str, Any] = {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 4}}
    if params:
        delta |= {"kv_transfer_params": PARAMS, "prompt_token_ids": [1, 2], "token_ids": [7, 8]}
    return [
        named("message_start", {"message": {"id": "m", "content": [], "usage": {}}}),
        named("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        named("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hé"}}),
        named("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "llo"}}),
        named("content_block_stop", {"index": 0}),
        named("content_block_start", {"index": 1, "content_block": use}),
        named(
            "content_block_delta",
            {"index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"city": '}},
        ),
        named(
            "content_block_delta",
            {"index": 1, "delta": {"type": "input_json_delta", "partial_json": '"Paris"}'}},
        ),
        named("content_block_stop", {"index": 1}),
        named("message_delta", delta),
        named("message_stop", {}),
    ]


def response_stream() -> list[bytes]:
    """A Responses stream as vLLM 0.32 sends it (its params in `response.completed`)."""
    start = {"id": "r", "status": "in_progress", "output": [], "kv_transfer_params": None}
    item = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "hi"}],
    }
    done = {**start, "status": "completed", "output": [item], "kv_transfer_params": PARAMS}
    done |= {"prompt_token_ids": [1, 2], "token_ids": [5]}
    return [
        named("response.created", {"response": start, "sequence_number": 0}),
        named("response.in_progress", {"response": start, "sequence_number": 1}),
        named("response.output_text.delta", {"delta": "hi", "sequence_number": 2}),
        named("response.completed", {"response": done, "sequence_number": 3}),
    ]


def cut(raw: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    points = sorted(rng.sample(range(1, len(raw)), min(12, len(raw) - 1)))
    return [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]


def client_blocks(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    splitter = sse.BlockSplitter()
    blocks = splitter.feed(raw) + splitter.close()
    out = []
    for block in blocks:
        name, data = sse.parse_block(block)
        out.append((name, orjson.loads(data)))
    return out


async def test_a_message_stream_keeps_its_names_and_yields_params_ids_and_reply() -> None:
    original = message_stream()
    for seed in range(5):
        events = MessagesEvents()
        got, result = await relay(
            cut(b"".join(original), seed), make=lambda ev=events: NamedStreamRelay(ev, lambda: None)
        )
        assert isinstance(got, bytes) and result is not None
        blocks = client_blocks(got)
        assert [n for n, _ in blocks] == [n for n, _ in client_blocks(b"".join(original))]
        assert all(name == data["type"] for name, data in blocks)
        delta = dict(blocks)["message_delta"]
        assert set(delta) == {"type", "delta", "usage"}
        assert b"[DONE]" not in got
        # Every other event is D's own bytes.
        assert got.replace(sse.named_event("message_delta", delta), b"") == b"".join(
            e for e in original if not e.startswith(b"event: message_delta")
        )
        assert result.params == PARAMS and result.held_ids == [1, 2, 7, 8]
        assert result.finished
        assert result.reply == [
            {"type": "text", "text": "Héllo"},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
        ]


async def test_a_response_stream_loses_the_engine_fields_of_every_response_object() -> None:
    events = ResponsesEvents()
    got, result = await relay(
        cut(b"".join(response_stream()), 1), make=lambda: NamedStreamRelay(events, lambda: None)
    )
    assert isinstance(got, bytes) and result is not None
    blocks = client_blocks(got)
    assert [n for n, _ in blocks][-1] == "response.completed"
    for _, data in blocks:
        if "response" in data:
            assert not {"kv_transfer_params", "prompt_token_ids", "token_ids"} & set(
                data["response"]
            )
    assert result.params == PARAMS and result.held_ids == [1, 2, 5] and result.finished
    assert result.reply[0]["content"][0]["text"] == "hi"


async def test_a_stream_without_its_final_event_gets_nothing_added_and_files_nothing() -> None:
    events = MessagesEvents()
    pieces = message_stream()[:5]
    got, result = await relay(pieces, make=lambda: NamedStreamRelay(events, lambda: None))
    assert got == b"".join(pieces)
    assert result is not None and not result.finished and result.params is None


async def test_a_failure_mid_stream_ends_with_the_api_s_error_event() -> None:
    for events, name in ((MessagesEvents(), "error"), (ResponsesEvents(), "error")):
        stream = message_stream() if isinstance(events, MessagesEvents) else response_stream()
        pieces: list[Any] = [*stream[:3], UpstreamError("protocol", "connection lost")]
        got, result = await relay(pieces, make=lambda ev=events: NamedStreamRelay(ev, lambda: None))
        assert isinstance(got, bytes) and result is not None and not result.finished
        last_name, last = client_blocks(got)[-1]
        assert last_name == name and last["type"] == "error"
        if isinstance(events, MessagesEvents):
            assert last["error"]["type"] == "api_error"
        else:
            assert last["sequence_number"] == 3 and "connection lost" in last["message"]


@pytest.mark.parametrize("api", ["messages", "responses"])
async def test_a_failure_before_any_output_is_an_upstream_error_not_an_empty_200(api: str) -> None:
    """The events before the first delta are held: a stream that fails, or reports an error
    in-band, before D generated anything never reaches the client (the flow retries it)."""
    stream = message_stream() if api == "messages" else response_stream()
    error = {"type": "error", "error": {"type": "api_error", "message": "KV load failed"}}
    for tail in ([UpstreamError("protocol", "connection lost")], [named("error", error)]):
        events = MessagesEvents() if api == "messages" else ResponsesEvents()
        got, _ = await relay(
            [*stream[:2], *tail], make=lambda ev=events: NamedStreamRelay(ev, lambda: None)
        )
        assert isinstance(got, UpstreamError), got


async def test_an_answer_that_is_only_its_end_is_served() -> None:
    """A message whose only generated token ended it (no content delta) is a whole answer:
    its closing usage counts the token."""
    start = named("message_start", {"message": {"id": "m", "content": [], "usage": {}}})
    end = {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}}
    pieces = [start, named("message_delta", end), named("message_stop", {})]
    got, result = await relay(pieces, make=lambda: NamedStreamRelay(MessagesEvents(), lambda: None))
    assert isinstance(got, bytes) and result is not None and result.finished
    assert result.finish_reason == "end_turn"
    end["usage"] = {"output_tokens": 0}
    got, _ = await relay(
        [start, named("message_delta", end), named("message_stop", {})],
        make=lambda: NamedStreamRelay(MessagesEvents(), lambda: None),
    )
    assert isinstance(got, UpstreamError) and "before any token" in str(got)


async def test_a_stream_failing_before_its_first_event_is_an_upstream_error() -> None:
    got, _ = await relay(
        [UpstreamError("status", "503")],
        make=lambda: NamedStreamRelay(MessagesEvents(), lambda: None),
    )
    assert isinstance(got, UpstreamError)


def test_blocks_keep_names_across_crlf_comments_and_reads() -> None:
    raw = b': keepalive\r\n\r\nevent: a\r\ndata: {"x": 1}\r\n\r\nevent: b\ndata: {}\n\n'
    for pieces in ([raw], [raw[:7], raw[7:30], raw[30:]], [bytes([c]) for c in raw]):
        splitter = sse.BlockSplitter()
        blocks = [b for p in pieces for b in splitter.feed(p)] + splitter.close()
        assert [sse.parse_block(b) for b in blocks] == [("a", b'{"x": 1}'), ("b", b"{}")]
