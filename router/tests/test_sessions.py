"""What names a conversation: the client's id, an agent's session header, `prompt_cache_key`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from multidict import CIMultiDict

from boomerang.router import conversation as conv
from boomerang.router.apis.sessions import (
    DEFAULT_SESSION_HEADERS,
    Session,
    conversation_root,
    identify,
)
from boomerang.router.apis.validation import validate
from boomerang.router.errors import ApiError
from boomerang.router.turn.state import Turn

NAMES = list(DEFAULT_SESSION_HEADERS)


def headers(**values: str) -> CIMultiDict[str]:
    return CIMultiDict({k.replace("__", "-"): v for k, v in values.items()})


def test_a_client_conversation_id_wins_over_every_session() -> None:
    h = headers(x__claude__code__session__id="s1")
    assert identify("c1", h, NAMES, {"prompt_cache_key": "k"}) is None


def test_headers_are_tried_in_the_configured_order_then_prompt_cache_key() -> None:
    h = headers(session_id="codex", x__session__id="bench")
    assert identify(None, h, NAMES, {"prompt_cache_key": "k"}) == Session(
        "codex", "header:session_id"
    )
    assert identify(None, h, ["x-session-id", "session_id"], {}) == Session(
        "bench", "header:x-session-id"
    )
    assert identify(None, headers(), NAMES, {"prompt_cache_key": "k"}) == Session(
        "k", "prompt_cache_key"
    )
    assert identify(None, headers(), NAMES, {}) is None


def test_header_names_match_whatever_their_case() -> None:
    h = CIMultiDict({"X-Claude-Code-Session-Id": "abc"})
    assert identify(None, h, NAMES, {}) == Session("abc", "header:x-claude-code-session-id")


def test_an_empty_or_oversized_header_is_ignored_not_refused() -> None:
    h = headers(x__claude__code__session__id=" ", session__id="x" * 257, x__session__id="ok")
    assert identify(None, h, NAMES, {}) == Session("ok", "header:x-session-id")


def test_no_configured_headers_leaves_only_prompt_cache_key() -> None:
    assert identify(None, headers(session_id="s"), [], {}) is None


@pytest.mark.parametrize("value", ["", 5, "k" * 257, ["k"]])
def test_a_malformed_prompt_cache_key_is_a_400_naming_it(value: Any) -> None:
    with pytest.raises(ApiError) as err:
        identify(None, headers(), NAMES, {"prompt_cache_key": value})
    assert err.value.status == 400 and err.value.param == "prompt_cache_key"


def turn_of(session: Session | None, conversation_id: str | None = None) -> Turn:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ],
    }
    if conversation_id is not None:
        body["conversation_id"] = conversation_id
    req = validate("chat", body, None)
    return Turn(replace(req, session=session), "tenant")


def test_a_session_is_looked_up_by_name_first_and_by_fingerprint_second() -> None:
    turn = turn_of(Session("s1", "header:session_id"))
    keys = turn.find_keys(fingerprint=True)
    root = conversation_root("chat", turn.req.body)
    assert keys[0] == conv.session_key("tenant", "s1", root)
    assert len(keys) == 2 and keys[1] != keys[0]
    assert turn.find_keys(fingerprint=False) == [keys[0]]


def test_a_session_files_where_its_next_turn_looks() -> None:
    by_session = turn_of(Session("same", "header:x-session-id"))
    assert by_session.file_key(True, {"content": "r"}) == by_session.find_keys(True)[0]
    by_id = turn_of(None, conversation_id="same")
    assert by_id.find_keys(True) == [conv.id_key("tenant", "same")]  # an id alone, as before
    assert by_id.file_key(True, {"content": "r"}) == conv.id_key("tenant", "same")
    assert by_id.session_wide_key() is None
    assert by_session.session_wide_key() == conv.session_key("tenant", "same", None)


def test_conversations_under_one_session_name_keep_their_own_keys() -> None:
    """Sub-agents under their parent's session id, or a gateway's one id per user: each
    conversation is its session's name plus its root (instructions and first user turn), which
    every later turn resends unchanged."""
    first = {"role": "system", "content": "you are a sub-agent"}
    task_a, task_b = {"role": "user", "content": "task A"}, {"role": "user", "content": "task B"}
    later = [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    a1 = conversation_root("chat", {"messages": [first, task_a]})
    assert a1 == conversation_root("chat", {"messages": [first, task_a, *later]})
    assert a1 != conversation_root("chat", {"messages": [first, task_b, *later]})
    m = {"system": "s", "messages": [task_a]}
    assert conversation_root("messages", m) == conversation_root(
        "messages", {**m, "messages": [task_a, *later]}
    )
    assert conversation_root("messages", m) != conversation_root("messages", {**m, "system": "t"})
    r = {"instructions": "i", "input": [task_a]}
    assert conversation_root("responses", r) == conversation_root(
        "responses", {**r, "input": [task_a, *later]}
    )
    assert conversation_root("completion", {"prompt": [1, 2, 3]}) != conversation_root(
        "completion", {"prompt": [1, 2, 4]}
    )


def test_sessions_are_scoped_to_the_tenant() -> None:
    a = turn_of(Session("s", "prompt_cache_key"))
    b = Turn(a.req, "other")
    assert a.find_keys(True)[0] != b.find_keys(True)[0]
