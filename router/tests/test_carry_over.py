"""A stream carried over when its decoder dies mid-stream (`migration.py`, issue 47): what may
be carried (a table), the continuation request (pure), and through the router with the fake
engines: one stream in the client's framing with a usage that adds up, the rest asked of
another engine as the prompt plus the streamed ids, the next engine tried when one fails,
and the error event kept where nothing can take it over. Token-for-token equality with an
uninterrupted answer needs a real model: `e2e/dataplane/test_stream_carried_over.py`."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from router_testing import chat, stream
from test_lost_turns import turn_lines

from boomerang.router.apis.validation import ClientRequest
from boomerang.router.turn.migration import Translator, continuation, refusal

D_BREAKS = {"in_band_errors": 1, "in_band_after": 3, "chunk_per_token": True, "reply_words": 8}
"""D streams three tokens, then vLLM's in-band error (an engine failing under its 200)."""
HELLO = [{"role": "user", "content": "tell me about the harbour at dawn"}]


def req(kind: str = "chat", stream: bool = True, **body: Any) -> ClientRequest:
    return ClientRequest(kind, body, stream, None, False, False, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "stream_", "body", "why"),
    [
        ("chat", True, {}, None),
        ("completion", True, {"logprobs": 2}, None),  # the text endpoint's own shape
        ("chat", True, {"tools": [{"type": "function"}], "tool_choice": "none"}, None),
        ("chat", True, {"presence_penalty": 0.0, "repetition_penalty": 1.0}, None),  # no-ops
        ("responses", True, {}, "its API's events are not text deltas"),
        ("messages", True, {}, "its API's events are not text deltas"),
        ("chat", False, {}, "not streamed"),
        ("chat", True, {"n": 2}, "several choices"),
        ("completion", True, {"echo": True}, "echo"),
        ("chat", True, {"tools": [{"type": "function"}]}, "tools"),
        ("chat", True, {"logprobs": True}, "log probabilities"),
        ("chat", True, {"response_format": {"type": "json_object"}}, "a response format"),
        ("chat", True, {"frequency_penalty": 0.5}, "penalties"),
    ],
)
def test_what_may_be_carried_over(
    kind: str, stream_: bool, body: dict[str, Any], why: str | None
) -> None:
    assert refusal(req(kind, stream_, **body)) == why


def test_the_continuation_asks_for_the_rest_from_the_prompt_and_the_streamed_ids() -> None:
    r = req(
        model="m",
        messages=HELLO,
        max_tokens=10,
        min_tokens=5,
        temperature=0.0,
        stop=["\n"],
        cache_salt="s",
        kv_transfer_params={"do_remote_decode": True},
    )
    body = continuation(r, [1, 2, 3], [7, 8])
    assert body == {
        "model": "m",
        "prompt": [1, 2, 3, 7, 8],
        "max_tokens": 8,
        "min_tokens": 3,
        "temperature": 0.0,
        "stop": ["\n"],
        "cache_salt": "s",
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }  # no kv_transfer_params: a plain request, the engine keeps nothing for later
    assert continuation(req(max_completion_tokens=2), [1], [7, 8]) is None  # nothing left
    assert "max_tokens" not in (continuation(req(), [1], [7]) or {})  # no limit: none set


def test_the_continuations_chunks_in_the_clients_framing() -> None:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 5, "model": "m"}
    chat_tr = Translator("chat", base, prompt=10, streamed=3, include_usage=True)
    chunk = {
        "id": "cmpl-9",
        "object": "text_completion",
        "created": 9,
        "model": "m",
        "choices": [{"index": 0, "text": " dawn", "token_ids": [42], "finish_reason": None}],
    }
    out = chat_tr(chunk)
    assert out is not None
    assert {k: out[k] for k in base} == base
    assert out["choices"] == [
        {
            "index": 0,
            "delta": {"content": " dawn"},
            "logprobs": None,
            "finish_reason": None,
            "token_ids": [42],
        }
    ]
    usage = {
        **chunk,
        "choices": [],
        "usage": {"prompt_tokens": 13, "completion_tokens": 4, "total_tokens": 17},
    }
    assert (chat_tr(usage) or {})["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 7,
        "total_tokens": 17,
    }
    assert Translator("chat", base, 10, 3, include_usage=False)(usage) is None
    text_tr = Translator("completion", {"id": "cmpl-1"}, 10, 3, include_usage=True)
    first = {
        **chunk,
        "prompt_token_ids": [1],
        "choices": [{**chunk["choices"][0], "prompt_token_ids": [1]}],
    }
    out = text_tr(first) or {}
    assert out["id"] == "cmpl-1" and "prompt_token_ids" not in out
    assert out["choices"][0]["text"] == " dawn" and "prompt_token_ids" not in out["choices"][0]


def _continuations(w: Any, role: str = "prefill") -> list[dict[str, Any]]:
    engines = w.prefill if role == "prefill" else w.decode
    return [c for e in engines for c in e.calls if isinstance(c.get("prompt"), list)]


async def test_a_stream_whose_decoder_dies_goes_on_on_p_as_one_answer(
    world: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="boomerang.router")
    w = await world(decode_spec=D_BREAKS)
    body = {**chat(HELLO, max_tokens=40), "stream_options": {"include_usage": True}}
    events = await stream(w, body)
    assert not [e for e in events if "error" in e]  # no error event: one answer
    chunks = [e for e in events if e.get("choices")]
    assert {e["id"] for e in events} == {chunks[0]["id"]}  # one stream's id throughout
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    (cont,) = _continuations(w)  # the rest, asked of P as a plain text request
    d_call = w.decode[0].calls[0]
    streamed = 3
    assert len(cont["prompt"]) > streamed and "kv_transfer_params" not in cont
    assert cont["max_tokens"] == 40 - streamed
    assert cont["cache_salt"] == d_call["cache_salt"]
    (usage,) = [e["usage"] for e in events if e.get("usage")]
    prompt = len(cont["prompt"]) - streamed
    assert usage["prompt_tokens"] == prompt  # the client's prompt, not the continuation's
    assert usage["completion_tokens"] > streamed
    assert usage["total_tokens"] == prompt + usage["completion_tokens"]
    assert await w.metric("boomerang_router_streams_carried_over_total", outcome="carried") == 1
    (line,) = turn_lines(caplog)
    assert line.getMessage() == "Served turn" and line.carried_over == 1  # type: ignore[attr-defined]


async def test_another_decoder_is_tried_before_p_and_none_that_died_twice(world: Any) -> None:
    w = await world(n_decode=2, decode_spec=[D_BREAKS, D_BREAKS])
    events = await stream(w, chat(HELLO, max_tokens=40))
    assert not [e for e in events if "error" in e]
    # the other decoder took the rest and broke in turn; P, not the first decoder, took it then
    assert len(_continuations(w, "decode")) == 1
    assert len(_continuations(w, "prefill")) == 1
    assert await w.metric("boomerang_router_streams_carried_over_total", outcome="carried") == 2


async def test_the_next_engine_is_tried_when_one_cannot_take_it(world: Any) -> None:
    w = await world(n_decode=2, decode_spec=[D_BREAKS, {"fail_status": 503}])
    # the turn lands on the breaking decoder (at once, or after the other refused it); the
    # other decoder refuses the rest too, and P takes it
    events = await stream(w, chat(HELLO, max_tokens=40))
    assert not [e for e in events if "error" in e]
    assert len(_continuations(w, "decode")) == 1  # the refusing decoder was asked first
    assert len(_continuations(w, "prefill")) == 1
    assert await w.metric("boomerang_router_streams_carried_over_total", outcome="carried") == 1


async def test_the_error_event_stays_where_nothing_can_take_it_over(world: Any) -> None:
    w = await world(prefill_spec={"fail_status": 503}, decode_spec=D_BREAKS)
    resp = await w.client.post("/v1/chat/completions", json={**chat(HELLO), "stream": True})
    raw = (await resp.read()).decode()
    assert resp.status == 503 or "error" in raw  # P fails the turn itself, or the carry-over
    if resp.status == 200:
        assert await w.metric("boomerang_router_streams_carried_over_total", outcome="failed") == 1


async def test_a_request_that_cannot_be_carried_ends_with_the_error(world: Any) -> None:
    w = await world(decode_spec=D_BREAKS)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    resp = await w.client.post(
        "/v1/chat/completions", json={**chat(HELLO, tools=tools), "stream": True}
    )
    assert resp.status == 200
    assert "error" in (await resp.read()).decode()
    assert _continuations(w) == []
    assert await w.metric("boomerang_router_streams_carried_over_total", outcome="carried") == 0
