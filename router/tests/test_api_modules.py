"""The Responses and Messages modules' pure parts: the fingerprint a next turn finds its
conversation by (what the client echoes back, whatever the optional fields), what the engines
get, what the router refuses, and the errors' shapes."""

from __future__ import annotations

from typing import Any

import pytest

from boomerang.router import apis
from boomerang.router.apis import messages, responses
from boomerang.router.errors import ApiError

T, M = "tenant", "model"


# -- Responses ---------------------------------------------------------------------------------


OUTPUT = [
    {"type": "reasoning", "id": "rs_1", "content": [{"type": "reasoning_text", "text": "hmm"}]},
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}],
    },
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
        "status": "completed",
    },
]


def echoed(output: list[Any], *, reasoning: bool, ids: bool) -> list[Any]:
    """The output as a client may send it back: with or without reasoning and item ids."""
    out = []
    for item in output:
        if item["type"] == "reasoning" and not reasoning:
            continue
        out.append(item if ids else {k: v for k, v in item.items() if k not in ("id", "status")})
    return out


@pytest.mark.parametrize("reasoning", [True, False])
@pytest.mark.parametrize("ids", [True, False])
def test_a_responses_follow_up_finds_the_filed_history(reasoning: bool, ids: bool) -> None:
    body = {"instructions": "be brief", "input": "weather?"}
    filed = responses.file_key(T, M, body, OUTPUT)
    result = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
    items = [{"role": "user", "content": "weather?"}, *echoed(OUTPUT, reasoning=reasoning, ids=ids)]
    follow_up = {"instructions": "be brief", "input": [*items, result]}
    assert responses.lookup_key(T, M, follow_up) == filed


def test_an_easy_assistant_message_matches_the_output_item() -> None:
    body = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}
    filed = responses.file_key(T, M, body, [OUTPUT[1]])
    easy = {"role": "assistant", "content": "It is sunny."}
    follow_up = {
        "input": [{"role": "user", "content": "hi"}, easy, {"role": "user", "content": "?"}]
    }
    assert responses.lookup_key(T, M, follow_up) == filed


def test_what_changes_the_conversation_changes_the_key() -> None:
    body = {"instructions": "a", "input": [{"role": "user", "content": "x"}, OUTPUT[1]]}
    key = responses.lookup_key(T, M, body)
    assert key is not None
    assert responses.lookup_key(T, M, {**body, "instructions": "b"}) != key
    assert responses.lookup_key("other", M, body) != key
    assert responses.lookup_key(T, "other", body) != key
    assert responses.lookup_key(T, M, {"input": "no history"}) is None
    assert responses.file_key(T, M, body, []) is None


def test_the_engines_get_one_prefill_token_and_the_client_s_decode_request() -> None:
    req = apis.validate("responses", {"input": "hi", "max_output_tokens": 9, "stream": True}, None)
    assert req.body["store"] is False and req.stream
    api = apis.of("responses")
    p = api.prefill_request(req.body, None)
    assert p["max_output_tokens"] == 1 and p["stream"] is False
    assert p["kv_transfer_params"]["do_remote_decode"] is True
    handle = {"remote_block_ids": [[1]], "do_remote_prefill": True}
    p = api.prefill_request(req.body, handle)
    assert p["kv_transfer_params"]["do_remote_prefill"] is False
    d = api.decode_request(req.body, {"x": 1}, stream=True)
    assert d["max_output_tokens"] == 9 and d["kv_transfer_params"] == {"x": 1}
    assert apis.of("responses").prompt_ids_request(req) == (
        "/v1/responses/render",
        {**req.body, "stream": False},
    )


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({"input": "x", "previous_response_id": "r"}, "previous_response_id"),
        ({"input": "x", "store": True}, "store"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "tools": [{"type": "file_search"}]}, "tools[0].type"),
        ({"input": [1]}, "input[0]"),
        ({"input": "x", "stream": "yes"}, "stream"),
    ],
)
def test_responses_refusals_name_the_field(data: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as refused:
        apis.validate("responses", data, None)
    assert refused.value.status == 400 and refused.value.param == param


def test_responses_client_fields_are_stripped_and_the_conversation_id_read() -> None:
    data = {"input": "x", "conversation_id": "c", "kv_transfer_params": {"forged": True}}
    req = apis.validate("responses", data, None)
    assert req.conversation_id == "c" and "kv_transfer_params" not in req.body
    assert (
        apis.validate("responses", {"input": "x"}, "from-header").conversation_id == "from-header"
    )


# -- Messages ----------------------------------------------------------------------------------


CONTENT = [
    {"type": "thinking", "thinking": "hmm", "signature": "s1"},
    {"type": "text", "text": "Let me check."},
    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris", "n": 1}},
]


def test_a_messages_follow_up_finds_the_filed_history() -> None:
    body: dict[str, Any] = {"system": "be brief", "messages": [{"role": "user", "content": "x"}]}
    filed = messages.file_key(T, M, body, CONTENT)
    # Echoed without thinking, with cache markers and reordered input keys: the same history.
    echo = [
        {"type": "text", "text": "Let me check.", "cache_control": {"type": "ephemeral"}},
        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"n": 1, "city": "Paris"}},
    ]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}
    follow_up = {
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "x"}]},
            {"role": "assistant", "content": echo},
            result,
        ],
    }
    assert messages.lookup_key(T, M, follow_up) == filed
    assert messages.lookup_key(T, M, {**follow_up, "system": "other"}) != filed
    assert messages.lookup_key(T, M, {"messages": [{"role": "user", "content": "x"}]}) is None


def test_a_streamed_message_is_put_together_as_the_json_answer_has_it() -> None:
    events = messages.MessagesEvents()
    script = [
        (
            "content_block_start",
            {"index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        ),
        (
            "content_block_delta",
            {"index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}},
        ),
        (
            "content_block_start",
            {
                "index": 1,
                "content_block": {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
            },
        ),
        (
            "content_block_delta",
            {"index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"a"'}},
        ),
        (
            "content_block_delta",
            {"index": 1, "delta": {"type": "input_json_delta", "partial_json": ": [1]}"}},
        ),
        (
            "message_delta",
            {
                "delta": {"stop_reason": "tool_use"},
                "kv_transfer_params": {"p": 1},
                "prompt_token_ids": [1],
                "token_ids": [2],
            },
        ),
    ]
    stripped = [events.process(name, dict(event)) for name, event in script]
    assert stripped == [False] * 5 + [True]
    events.finish()
    assert events.result.reply == [
        {"type": "thinking", "thinking": "hmm"},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": [1]}},
    ]
    assert events.result.finished and events.result.held_ids == [1, 2]
    assert events.terminal("message_stop") and not events.terminal("message_delta")


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 1, "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "system": 3}, "system"),
        (
            {
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "f"}],
            },
            "tools[0].input_schema",
        ),
        (
            {
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "x"}],
                "context_management": {},
            },
            "context_management",
        ),
    ],
)
def test_messages_refusals_name_the_field(data: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as refused:
        apis.validate("messages", data, None)
    assert refused.value.status == 400 and refused.value.param == param


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (502, "api_error"),
        (503, "api_error"),
    ],
)
def test_messages_errors_have_anthropic_s_shape(status: int, kind: str) -> None:
    body = apis.of("messages").error_body(ApiError(status, "why"))
    assert body == {"type": "error", "error": {"type": kind, "message": "why"}}
    assert apis.of("responses").error_body(ApiError(status, "why"))["error"]["message"] == "why"


def test_unverifiable_renderings_ask_for_no_prompt_ids() -> None:
    data = {"max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
    req = apis.validate("messages", {**data, "thinking": {"type": "disabled"}}, None)
    assert apis.of("messages").prompt_ids_request(req) is None
    req = apis.validate("messages", data, None)
    assert apis.of("messages").prompt_ids_request(req) == (
        "/v1/messages/render",
        {**req.body, "stream": False},
    )
