"""Calling D and answering the client: plain JSON, a buffered response re-emitted as SSE, or a
passed-through stream (also for one engine serving a turn alone, when a role has none).

Whatever the mode, the router collects from D's answer what the next turn needs (D's retained
params, D's prompt and output token ids, the assistant reply as the client will echo it) and
removes from what the client sees the engine-internal params and the token ids it added itself.
A failure before the client received a byte is raised as UpstreamError, so the flow can retry
on another D; after that, a stream is ended with an in-band error event. Kept apart from the
flow because it is the only code that writes an answer to the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from boomerang.router import protocol, sse
from boomerang.router.config import Timeouts
from boomerang.router.upstream import (
    EngineClient,
    EngineStream,
    UpstreamError,
    open_stream,
    post_json,
    timeout,
)
from boomerang.router.validation import ClientRequest

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


class ClientGone(Exception):
    """The client disconnected while the answer was being written."""


@dataclass
class DecodeResult:
    """What D told the router about the sequence it generated."""

    params: dict[str, Any] | None = None
    prompt_ids: list[int] | None = None
    output_ids: list[int] = field(default_factory=list)
    reply: dict[str, Any] | None = None
    finished: bool = False
    response: web.StreamResponse | None = None

    @property
    def held_ids(self) -> list[int] | None:
        """Prompt + output ids, of which D holds the first `remote_num_tokens`."""
        if self.prompt_ids is None:
            return None
        return self.prompt_ids + self.output_ids


def result_from_response(payload: dict[str, Any]) -> DecodeResult:
    """Collect D's params, ids and reply from a complete response (before stripping)."""
    result = DecodeResult(params=protocol.kv_params_of(payload))
    result.prompt_ids = protocol.prompt_ids_of(payload)
    result.output_ids = protocol.output_ids_of(payload) or []
    choices = payload.get("choices") or []
    if choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict):
            result.reply = message
        result.finished = choices[0].get("finish_reason") is not None
    return result


async def call_and_answer(
    request: web.Request,
    engines: EngineClient,
    call: tuple[str, dict[str, Any], str],
    req: ClientRequest,
    mode: str,
    t: Timeouts,
    on_first: Callable[[], None],
) -> DecodeResult:
    """POST `call` (url, body, request id) to an engine and answer the client in `mode`
    (json, buffer, stream); raises UpstreamError while the client has not got a byte."""
    url, body, request_id = call
    limit = timeout(t.decode_total_s, t.connect_s)
    if mode == "stream":
        resp = await open_stream(engines, url, body, limit, t.decode_first_byte_s, request_id)
        relay = StreamRelay(req.wants_token_ids, on_first)
        try:
            return await relay.run(request, resp, t.decode_first_byte_s)
        except (ClientGone, asyncio.CancelledError):
            resp.close()  # aborts the upstream request: vLLM stops generating
            raise
        finally:
            resp.release()
    data = await post_json(engines, url, body, limit, request_id)
    result = result_from_response(data)
    keep = req.wants_token_ids
    if mode == "buffer":
        result.response = await answer_buffered(request, data, keep, req.include_usage, on_first)
    else:
        result.response = await answer_json(request, data, keep, on_first)
    return result


async def answer_json(
    request: web.Request, payload: dict[str, Any], keep_ids: bool, on_first: Callable[[], None]
) -> web.StreamResponse:
    """Send a complete response as JSON."""
    body = protocol.client_payload(payload, keep_token_ids=keep_ids)
    response = web.Response(body=orjson.dumps(body), content_type="application/json")
    on_first()
    await _send(request, response)
    return response


async def answer_buffered(
    request: web.Request,
    payload: dict[str, Any],
    keep_ids: bool,
    include_usage: bool,
    on_first: Callable[[], None],
) -> web.StreamResponse:
    """Re-emit a complete response as a stream for a streaming client."""
    body = protocol.client_payload(payload, keep_token_ids=keep_ids)
    response = web.StreamResponse(headers=SSE_HEADERS)
    try:
        await response.prepare(request)
        on_first()
        for chunk in sse.chunks_from_response(body, include_usage):
            await response.write(sse.event(chunk))
        await response.write(sse.DONE_EVENT)
        await response.write_eof()
    except ConnectionResetError:
        raise ClientGone() from None
    return response


async def _send(request: web.Request, response: web.StreamResponse) -> None:
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionResetError:
        raise ClientGone() from None


class StreamRelay:
    """Passes D's stream through to the client, collecting what the next turn needs.

    Every event is decoded (the ids and the reply are in each), but one that has nothing to
    strip is passed on as D's own bytes, and what one read from D completes goes to the client
    in one write, the end of the stream with it: each write is a system call and a pass
    through aiohttp's writer, so a read that brought several events (D got ahead of a busy
    router) costs one, and nothing is held back waiting for more.
    """

    def __init__(self, keep_ids: bool, on_first: Callable[[], None]) -> None:
        self.keep_ids = keep_ids
        self.on_first = on_first
        self.result = DecodeResult()
        self._parts: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._events = sse.EventSplitter()
        self._out: list[bytes] = []
        """What the client gets next, not yet written."""

    async def run(
        self, request: web.Request, resp: EngineStream, first_byte_s: float
    ) -> DecodeResult:
        """Relay until [DONE]; raises UpstreamError if D fails before the first event."""
        pieces = resp.iter_any()
        try:
            async with asyncio.timeout(first_byte_s):
                events = await self._first_events(pieces)
            first = sse.decode(events[0]) if events else None
        except TimeoutError:
            raise UpstreamError("timeout", "no first event in time") from None
        except ValueError as exc:
            raise UpstreamError("protocol", f"stream failed: {exc!r}") from None
        if not events:
            raise UpstreamError("protocol", "empty stream")
        out = web.StreamResponse(headers=SSE_HEADERS)
        self.result.response = out
        try:
            await out.prepare(request)
            self.on_first()
            await self._relay(out, events, first, pieces)
        except ConnectionResetError:
            raise ClientGone() from None
        self._finish_reply()
        return self.result

    async def _first_events(self, pieces: AsyncIterator[bytes]) -> list[bytes]:
        """The events that the first read completing one completes (none: an empty stream)."""
        async for piece in pieces:
            if events := self._events.feed(piece):
                return events
        return self._events.close()

    async def _relay(
        self, out: web.StreamResponse, events: list[bytes], first: Any, pieces: AsyncIterator[bytes]
    ) -> None:
        try:
            done = self._emit(events[0], first) or self._emit_all(events[1:])
            if not done:
                await out.write(self._take())
                async for piece in pieces:  # one write per read: what it completed
                    if self._emit_all(self._events.feed(piece)):
                        break
                    if self._out:
                        await out.write(self._take())
                else:
                    self._emit_all(self._events.close())  # ended without [DONE]
        except (UpstreamError, ValueError) as exc:
            self._out.append(sse.error_event(f"decode engine failed mid-stream: {exc!r}", 502))
            await out.write_eof(self._take())
            self.result.finished = False
            return
        self._out.append(sse.DONE_EVENT)
        await out.write_eof(self._take())

    def _take(self) -> bytes:
        """What is queued for the client, dequeued."""
        data = b"".join(self._out)
        self._out.clear()
        return data

    def _emit_all(self, events: list[bytes]) -> bool:
        """`_emit` each event in order, up to [DONE]; whether it came."""
        return any(self._emit(data, sse.decode(data)) for data in events)

    def _emit(self, data: bytes, chunk: Any) -> bool:
        """Collect from one event (`data`, decoded as `chunk`) and queue what the client sees
        of it; whether it was [DONE]."""
        if chunk is sse.DONE:
            return True
        edited = self._process(chunk)
        if edited is None:
            return False
        if edited or b"\n" in data or b"\r" in data:  # edited, or more than one line for SSE
            self._out.append(sse.event(chunk))
        else:
            self._out += (b"data: ", data, b"\n\n")
        return False

    def _process(self, chunk: Any) -> bool | None:
        """Collect from one chunk and strip what the client may not see; whether anything
        was stripped (None: nothing of it is for the client)."""
        if not isinstance(chunk, dict):
            return None
        params = protocol.kv_params_of(chunk)
        if params is not None:
            self.result.params = params
        if self.result.prompt_ids is None:
            self.result.prompt_ids = protocol.prompt_ids_of(chunk)
        choices = chunk.get("choices") or []
        for choice in choices:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._collect_choice(choice)
        edited = protocol.strip_for_client(chunk, keep_token_ids=self.keep_ids)
        if params is not None and not choices and chunk.get("usage") is None:
            return None
        return edited

    def _collect_choice(self, choice: dict[str, Any]) -> None:
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self.result.output_ids.extend(ids)
        if choice.get("finish_reason") is not None:
            self.result.finished = True
        text = choice.get("text")
        delta = choice.get("delta")
        if isinstance(text, str):
            self._parts.append(text)
        if not isinstance(delta, dict):
            return
        if isinstance(delta.get("content"), str):
            self._parts.append(delta["content"])
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                self._merge_call(call)

    def _merge_call(self, call: dict[str, Any]) -> None:
        slot = self._calls.setdefault(
            int(call.get("index", 0)), {"type": "function", "function": {"arguments": ""}}
        )
        if call.get("id"):
            slot["id"] = call["id"]
        function = call.get("function") or {}
        if function.get("name"):
            slot["function"]["name"] = function["name"]
        if isinstance(function.get("arguments"), str):
            slot["function"]["arguments"] += function["arguments"]

    def _finish_reply(self) -> None:
        calls = [self._calls[i] for i in sorted(self._calls)]
        self.result.reply = {
            "role": "assistant",
            "content": "".join(self._parts) if self._parts or not calls else None,
            "tool_calls": calls or None,
        }
