"""Clients' retention hints: Anthropic's cache_control TTLs, OpenAI's prompt_cache_retention."""

from __future__ import annotations

from typing import Any

import pytest

from boomerang.router.apis.hints import asked_s, cap, duration_s
from boomerang.router.errors import ApiError

EPHEMERAL = {"type": "ephemeral"}


def messages(*content: Any, system: Any = None, tools: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": list(content)}]}
    if system is not None:
        body["system"] = system
    if tools is not None:
        body["tools"] = tools
    return body


def text(mark: Any = None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": "t"}
    if mark is not None:
        block["cache_control"] = mark
    return block


def test_a_messages_request_without_cache_control_has_no_hint() -> None:
    assert asked_s("messages", messages(text())) is None
    assert asked_s("messages", messages(text(), system="plain")) is None


def test_cache_control_without_ttl_is_anthropic_s_five_minutes() -> None:
    assert asked_s("messages", messages(text(EPHEMERAL))) == 300


def test_the_longest_ttl_on_system_tools_or_content_counts() -> None:
    one_hour = {"type": "ephemeral", "ttl": "1h"}
    five = {"type": "ephemeral", "ttl": "5m"}
    assert asked_s("messages", messages(text(five), system=[text(one_hour)])) == 3600
    tool = {"name": "f", "input_schema": {}, "cache_control": one_hour}
    assert asked_s("messages", messages(text(five), tools=[tool])) == 3600
    result = {"type": "tool_result", "tool_use_id": "x", "content": [text(one_hour)]}
    assert asked_s("messages", messages(result)) == 3600


@pytest.mark.parametrize(
    ("mark", "param"),
    [
        ("ephemeral", "messages[0].content[0].cache_control"),
        ({"type": "persistent"}, "messages[0].content[0].cache_control"),
        ({"type": "ephemeral", "ttl": 300}, "messages[0].content[0].cache_control.ttl"),
        ({"type": "ephemeral", "ttl": "forever"}, "messages[0].content[0].cache_control.ttl"),
        ({"type": "ephemeral", "ttl": "0m"}, "messages[0].content[0].cache_control.ttl"),
        ({"type": "ephemeral", "ttl": "2h"}, "messages[0].content[0].cache_control.ttl"),
        ({"type": "ephemeral", "ttl": "300s"}, "messages[0].content[0].cache_control.ttl"),
    ],
)
def test_a_cache_control_of_the_wrong_shape_is_a_400_naming_it(mark: Any, param: str) -> None:
    with pytest.raises(ApiError) as err:
        asked_s("messages", messages(text(mark)))
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize(
    ("value", "seconds"), [("in-memory", 600), ("in_memory", 600), ("24h", 86_400), ("90s", 90)]
)
def test_prompt_cache_retention_in_openai_s_values_and_durations(value: str, seconds: int) -> None:
    for kind in ("chat", "responses"):
        assert asked_s(kind, {"prompt_cache_retention": value}) == seconds


@pytest.mark.parametrize("value", ["forever", 24, "", "24 h"])
def test_a_prompt_cache_retention_of_the_wrong_shape_is_a_400(value: Any) -> None:
    with pytest.raises(ApiError) as err:
        asked_s("chat", {"prompt_cache_retention": value})
    assert err.value.status == 400 and err.value.param == "prompt_cache_retention"


def test_completions_and_absent_fields_carry_no_hint() -> None:
    assert asked_s("completion", {"prompt_cache_retention": "24h"}) is None
    assert asked_s("chat", {"prompt_cache_retention": None}) is None


def test_an_over_long_hint_is_capped_never_refused() -> None:
    hint = cap(86_400, None, 480)
    assert hint is not None and (hint.asked_s, hint.applied_s, hint.capped) == (86_400, 480, True)
    hint = cap(300, 120, 480)
    assert hint is not None and hint.applied_s == 120 and hint.capped
    hint = cap(300, None, 480)
    assert hint is not None and hint.applied_s == 300 and not hint.capped
    assert cap(None, 120, 480) is None


def test_durations_in_seconds_minutes_and_hours() -> None:
    assert [duration_s(v, "x") for v in ("5m", "1h", "45s")] == [300, 3600, 45]
