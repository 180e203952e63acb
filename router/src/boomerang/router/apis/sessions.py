"""Which conversation a turn belongs to when the client names it: its id, or an agent's session.

Why it exists: coding agents already say which session a request belongs to (Claude Code sends
`x-claude-code-session-id`, Codex `session_id` or `session-id`, opencode `x-session-affinity`,
vLLM's benchmark clients `X-Session-ID`), and OpenAI clients may send `prompt_cache_key`. A
fingerprint of the history stops matching as soon as a client rewrites anything it echoes (a
trimmed assistant message, a reformatted tool call); a session name does not. So a session
names the conversation, in the caller's tenant, together with the conversation's root
(`conversation_root`): many conversations may share one session name (sub-agents under their
parent's id, a gateway's id per user, a shared `prompt_cache_key`), and each keeps its own
handle and placement.

Precedence, first present wins: the body's `conversation_id`, the `X-Conversation-Id` header,
the session headers in their configured order, the body's `prompt_cache_key`. A client id
keeps its old meaning exactly (its conversation is found by that id alone); a session is looked
up by its name first and by the history's fingerprint second, so a conversation whose earlier
turns carried no session header (or a fork that started under another name) still finds the
handle its last turn filed. Neither ever bypasses verification: a name only finds a handle, and
the handle is reused only for the blocks whose token ids the new prompt reproduces.

A session header that is empty or too long is ignored (the client did not choose to send it, so
it never fails the request); a `prompt_cache_key` the client did choose must be a string of at
most 256 characters, like `conversation_id`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from boomerang.router.config import DEFAULT_SESSION_HEADERS
from boomerang.router.errors import bad_request

__all__ = ["DEFAULT_SESSION_HEADERS", "MAX_NAME", "Session", "conversation_root", "identify"]

MAX_NAME: Final = 256


@dataclass(frozen=True, slots=True)
class Session:
    """A session name and where it came from (`header:<name>` or `prompt_cache_key`)."""

    name: str
    source: str


def from_headers(headers: Mapping[str, str], names: Sequence[str]) -> Session | None:
    """The first configured session header with a usable value (headers are looked up as the
    mapping does: aiohttp's are case-insensitive)."""
    for header in names:
        value = headers.get(header)
        if value is not None and 0 < len(value.strip()) <= MAX_NAME:
            return Session(value.strip(), f"header:{header.lower()}")
    return None


def from_body(data: Mapping[str, Any]) -> Session | None:
    """The body's `prompt_cache_key`; a 400 naming it when it is not a usable string."""
    value = data.get("prompt_cache_key")
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise bad_request(
            f"`prompt_cache_key` must be a non-empty string of at most {MAX_NAME} characters",
            "prompt_cache_key",
        )
    return Session(value, "prompt_cache_key")


def identify(
    conversation_id: str | None,
    headers: Mapping[str, str],
    names: Sequence[str],
    data: Mapping[str, Any],
) -> Session | None:
    """The turn's session, or None when a client id names the conversation (it wins) or
    nothing does. `prompt_cache_key` is checked even when a header wins (a malformed field is
    the client's error whatever else names the turn)."""
    body = from_body(data)
    if conversation_id is not None:
        return None
    return from_headers(headers, names) or body


ROOT_PROMPT_ITEMS: Final = 1024
"""How much of a completion prompt (characters or token ids) names its conversation's root."""


def conversation_root(kind: str, body: Mapping[str, Any]) -> str:
    """What starts the conversation, as a digest: its instructions and first user turn (chat:
    the messages up to the first user message; Messages: `system` and the first message;
    Responses: `instructions` and the first input item; a completion: the prompt's head).
    Every turn of a conversation resends them unchanged, and conversations that share a
    session name (sub-agents, a gateway's id per user) differ there: their tasks. Two that
    start alike share a key, as before: verification still keeps each one's KV exact."""
    head: Any
    if kind == "chat":
        messages = list(body.get("messages") or ())
        first_user = next(
            (i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"),
            len(messages) - 1,
        )
        head = messages[: first_user + 1]
    elif kind == "messages":
        head = [body.get("system"), (body.get("messages") or [None])[0]]
    elif kind == "responses":
        items = body.get("input")
        first = items[0] if isinstance(items, list) and items else items
        head = [body.get("instructions"), first]
    else:
        prompt = body.get("prompt")
        head = prompt[:ROOT_PROMPT_ITEMS] if isinstance(prompt, str | list) else prompt
    try:
        raw = orjson.dumps(head, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not JSON (it passed validation, but never fail a turn for a key)
        raw = repr(head).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(raw, digest_size=16).hexdigest()
