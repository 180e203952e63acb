"""Server-sent events: reading the engine's stream and writing the client's.

Two directions. Reading: vLLM sends `data: <json>` events separated by blank lines and ends
with `data: [DONE]`. Writing: either the engine's events passed through (after the router
removed its internal fields), or, when D had to be called without streaming to keep its
retained-KV params (vLLM < 0.33 streams none), a complete response re-emitted as chunks in
OpenAI's streaming format: one chunk per choice carrying the whole delta and the finish
reason, then the usage chunk if the client asked for it, then `[DONE]`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson

DONE = object()
"""Marker yielded for `data: [DONE]`."""


async def read_events(lines: AsyncIterator[bytes]) -> AsyncIterator[Any]:
    """Yield each event's decoded JSON (or DONE); non-JSON data raises ValueError."""
    data: list[bytes] = []
    async for raw in lines:
        line = raw.rstrip(b"\r\n")
        if not line:
            if data:
                yield _decode(b"\n".join(data))
                data = []
            continue
        if line.startswith(b"data:"):
            data.append(line[5:].lstrip(b" "))
    if data:
        yield _decode(b"\n".join(data))


async def split_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Lines of any length (aiohttp's own line reader refuses lines over 64 KiB, and a first
    chunk carrying a long prompt's token ids is longer)."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        if b"\n" not in chunk:
            continue
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line
    if pending:
        yield pending


def _decode(payload: bytes) -> Any:
    if payload.strip() == b"[DONE]":
        return DONE
    return orjson.loads(payload)


def event(payload: Any) -> bytes:
    """One SSE event."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"


def error_event(message: str, status: int) -> bytes:
    """An in-band error for a stream that already started (OpenAI clients raise it)."""
    return event({"error": {"message": message, "type": "upstream_error", "code": status}})


def chunks_from_response(response: dict[str, Any], include_usage: bool) -> Iterator[dict[str, Any]]:
    """A complete chat or text completion as the equivalent streamed chunks."""
    chat = response.get("object") == "chat.completion"
    base = {
        "id": response.get("id"),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": response.get("created"),
        "model": response.get("model"),
    }
    if response.get("system_fingerprint") is not None:
        base["system_fingerprint"] = response["system_fingerprint"]
    for choice in response.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        out = _chat_choice(choice) if chat else _text_choice(choice)
        yield {**base, "choices": [out]}
    if include_usage and response.get("usage") is not None:
        yield {**base, "choices": [], "usage": response["usage"]}


def _chat_choice(choice: dict[str, Any]) -> dict[str, Any]:
    message = choice.get("message") or {}
    delta = {k: v for k, v in message.items() if v is not None and k != "tool_calls"}
    delta.setdefault("role", "assistant")
    calls = message.get("tool_calls")
    if calls:
        delta["tool_calls"] = [
            {"index": i, **c} if isinstance(c, dict) else c for i, c in enumerate(calls)
        ]
    out = {k: v for k, v in choice.items() if k != "message"}
    out["delta"] = delta
    return out


def _text_choice(choice: dict[str, Any]) -> dict[str, Any]:
    return dict(choice)
