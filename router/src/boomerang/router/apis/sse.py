"""Server-sent events: reading the engine's stream and writing the client's.

Two directions. Reading: vLLM sends `data: <json>` events separated by blank lines and ends
with `data: [DONE]`; `EventSplitter` cuts the bytes as they arrive into each event's data,
still as bytes, so that the relay can pass an event the client may see unchanged through
without encoding it again (a streamed turn is one event per token). Writing: either the
engine's events passed through (after the router removed its internal fields; `ChunkWriter`
puts them on the client's socket from the engine connection's read callback), or, when D
had to be called without streaming to keep its retained-KV params (vLLM < 0.33 streams
none), a complete response re-emitted as chunks in OpenAI's streaming format: one chunk per
choice carrying the whole delta and the finish reason, then the usage chunk if the client
asked for it, then `[DONE]`.

The Responses and Messages APIs name their events (`event: response.completed`, `event:
message_delta`), and the Anthropic client dispatches on that name: `BlockSplitter` cuts such a
stream into whole events (name and data lines), so that the relay passes each on with its name.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
from aiohttp import web

DONE = object()
"""Marker yielded for `data: [DONE]`."""


def _data_of(block: bytes) -> bytes | None:
    """The data of one event's lines (None: it has no `data:` line)."""
    if block.startswith(b"data:") and b"\n" not in block:  # vLLM's: one line
        return block[5:].lstrip(b" ")
    lines = [line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def _block_of(block: bytes) -> bytes | None:
    """The block itself when it has a `data:` line (None: a comment or keep-alive)."""
    return block if _data_of(block) is not None else None


class EventSplitter:
    """Cuts a byte stream into its events' data as it arrives (an event may span reads and a
    read may end many): each event's `data:` lines joined by newlines, as the SSE spec joins
    them; lines end with LF or CRLF. Events without data (comments, keep-alives) yield none."""

    __slots__ = ("_cr", "_pending")
    _item = staticmethod(_data_of)
    """What an event block yields: its data (None: none; `BlockSplitter`: the block). The
    function itself, not a method wrapping it: no extra call per event."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        """Bytes after the last blank line, CRLFs already made LFs."""
        self._cr = False
        """The last read ended with CR (the first half of a CRLF, maybe)."""

    def feed(self, data: bytes) -> list[bytes]:
        """The data of every event that `data` completes, in order."""
        if (  # the common read: one whole one-line event (vLLM streams a token per event)
            data.startswith(b"data:")
            and data.find(b"\n") == len(data) - 2
            and data.endswith(b"\n\n")
            and not self._pending
            and not self._cr
            and b"\r" not in data
        ):
            return [data[5:-2].lstrip(b" ")]
        return self._feed(data)

    def _feed(self, data: bytes) -> list[bytes]:
        """`feed` for any read (the general path)."""
        if self._cr:
            data = b"\r" + data
        self._cr = data.endswith(b"\r")
        if self._cr:
            data = data[:-1]
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        pending = self._pending
        if b"\n\n" not in data and not (
            pending and data[:1] == b"\n" and pending[-1].endswith(b"\n")
        ):
            if data:
                pending.append(data)
            return []
        if pending:  # joined only when an event ends: linear in the bytes, whatever the reads
            pending.append(data)
            data = b"".join(pending)
            pending.clear()
        *blocks, rest = data.split(b"\n\n")
        if rest:
            pending.append(rest)
        item = self._item
        return [d for block in blocks if (d := item(block)) is not None]

    def close(self) -> list[bytes]:
        """The data of an event the stream ended without closing (no blank line after it)."""
        rest = b"".join(self._pending) + (b"\r" if self._cr else b"")
        self._pending.clear()
        self._cr = False
        item = self._item
        return [d for block in rest.split(b"\n\n") if (d := item(block)) is not None]


class BlockSplitter(EventSplitter):
    """Cuts a stream of named events into whole event blocks (their lines, LF-separated,
    without the blank line that ends them): what `parse_block` reads. Blocks without a data
    line (comments, keep-alives) yield none."""

    __slots__ = ()
    _item = staticmethod(_block_of)

    def feed(self, data: bytes) -> list[bytes]:
        return self._feed(data)


def parse_block(block: bytes) -> tuple[str, bytes]:
    """An event block's name (its last `event:` line; "" when it has none) and data."""
    name = ""
    for line in block.split(b"\n"):
        if line.startswith(b"event:"):
            name = line[6:].strip().decode("utf-8", "replace")
    return name, _data_of(block) or b""


def named_event(name: str, payload: Any) -> bytes:
    """One SSE event with an event name."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


async def read_events(lines: AsyncIterator[bytes]) -> AsyncIterator[Any]:
    """Yield each event's decoded JSON (or DONE); non-JSON data raises ValueError."""
    data: list[bytes] = []
    async for raw in lines:
        line = raw.rstrip(b"\r\n")
        if not line:
            if data:
                yield decode(b"\n".join(data))
                data = []
            continue
        if line.startswith(b"data:"):
            data.append(line[5:].lstrip(b" "))
    if data:
        yield decode(b"\n".join(data))


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


def decode(payload: bytes) -> Any:
    """An event's data as JSON, or DONE; raises ValueError if it is neither."""
    if payload[:1] != b"{" and payload.strip() == b"[DONE]":  # chunks: no strip to test
        return DONE
    return orjson.loads(payload)


def event(payload: Any) -> bytes:
    """One SSE event."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"
HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


class Response(web.StreamResponse):
    """A streamed answer whose headers leave with its first event, in one write.

    aiohttp's `StreamResponse` sends its headers on their own when prepared; its `Response`
    holds them for the body, by the class attribute below (in the aiohttp releases that hold
    headers at all, as the 3.14 the tests run on does; older ones ignore the attribute and
    send them at once, as before). The router prepares a stream only once D's first
    event is in and writes that event right away, so holding the headers costs no latency and
    saves a send and a TCP segment per streamed turn. Any first write, even an empty one,
    sends them: `ChunkWriter` writes to the socket only after it.
    """

    _send_headers_immediately = False

    def __init__(self) -> None:
        super().__init__(headers=HEADERS)


class ChunkWriter:
    """Writes a stream's events straight to the client's socket once aiohttp sent the
    response's headers, from a callback where aiohttp's awaitable writer cannot be used: as
    HTTP/1.1 chunks (HTTP/1.0: as they are, the body ends with the connection); aiohttp's
    `write_eof` writes the end of the body."""

    __slots__ = ("_chunked", "_high", "_transport", "_writer")

    def __init__(self, request: web.Request, chunked: bool) -> None:
        self._transport = request.transport
        self._writer = request.writer
        self._chunked = chunked
        self._high = 0 if self._transport is None else self._transport.get_write_buffer_limits()[1]

    def write(self, data: bytes) -> bool:
        """Write `data` (not empty); False if the client is gone."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return False
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        transport.write(data)
        self._writer.output_size += len(data)  # as aiohttp counts what it writes
        return True

    def full(self) -> bool:
        """Whether the socket's buffer is past its high-water mark (aiohttp's writer waits)."""
        return self._transport is not None and self._transport.get_write_buffer_size() > self._high


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
