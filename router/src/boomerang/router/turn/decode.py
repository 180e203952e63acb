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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson
from aiohttp import HttpVersion11, web

from boomerang.router import apis
from boomerang.router.apis import DecodeResult, EventStream, protocol, sse, usage
from boomerang.router.apis.validation import ClientRequest, Kind
from boomerang.router.config import Timeouts
from boomerang.router.engines.upstream import (
    EngineClient,
    EngineStream,
    FailureKind,
    UpstreamError,
    open_stream,
    post_json,
    timeout,
)
from boomerang.router.turn.migration import MAX_MIGRATIONS, Translator, chunk_base


class ClientGone(Exception):
    """The client disconnected while the answer was being written."""


@dataclass
class Carried:
    """The rest of a stream on another engine (`migration.py`): its stream, and what to call
    once it is over (the engine's in-flight count)."""

    stream: EngineStream
    done: Callable[[], None]


Carry = Callable[[DecodeResult, Exception], Awaitable[Carried | None]]
"""Open the rest of a stream whose engine died on another engine (None: none took it)."""


def in_band_error(error: Any) -> UpstreamError:
    """An error an engine sent inside its 200 stream (vLLM: `{"error": {"message", "code"}}`),
    as the failure it is: the request's fault for a 4xx code, else the engine's."""
    body = error if isinstance(error, dict) else {"message": str(error)}
    code = body.get("code")
    status = code if isinstance(code, int) and 400 <= code < 600 else 500
    message = f"in-band error: {body.get('message') or body.get('type') or 'unknown'}"
    kind: FailureKind = "client" if status < 500 else "status"
    return UpstreamError(kind, message, status=status, body=orjson.dumps({"error": body}))


def result_from_response(payload: dict[str, Any]) -> DecodeResult:
    """Collect D's params, ids and reply from a complete chat or text completion."""
    return apis.of("chat").result_from_response(payload)


async def call_and_answer(
    request: web.Request,
    engines: EngineClient,
    call: tuple[str, dict[str, Any], str],
    req: ClientRequest,
    mode: str,
    t: Timeouts,
    on_first: Callable[[], None],
    cached: usage.Cached = "own",
    carry: Carry | None = None,
) -> DecodeResult:
    """POST `call` (url, body, request id) to an engine and answer the client in `mode`
    (json, buffer, stream); raises UpstreamError while the client has not got a byte. The
    client's usage says `cached` prompt tokens were not computed for the turn (`usage.py`).
    A stream whose engine dies after the first byte goes on through `carry`, if given."""
    url, body, request_id = call
    limit = timeout(t.decode_total_s, t.connect_s)
    api = apis.of(req.kind)
    if mode == "stream":
        resp = await open_stream(engines, url, body, limit, t.decode_first_byte_s, request_id)
        events = api.event_stream()
        relay = (
            StreamRelay(req.wants_token_ids, on_first)
            if events is None
            else NamedStreamRelay(events, on_first)
        )
        relay.reported = (req.kind, cached)
        relay.carry, relay.include_usage = carry, req.include_usage
        try:
            return await relay.run(request, resp, t.decode_first_byte_s)
        except (ClientGone, asyncio.CancelledError):
            resp.close()  # aborts the upstream request: vLLM stops generating
            relay.end_carried(abort=True)
            raise
        finally:
            resp.release()
            relay.end_carried()
    data = await post_json(engines, url, body, limit, request_id)
    result = api.result_from_response(data)
    usage.rewrite(req.kind, data, cached, result.params)
    keep = req.wants_token_ids
    if mode == "buffer":
        result.response = await answer_buffered(request, data, keep, req.include_usage, on_first)
    else:
        body = api.client_payload(data, keep_token_ids=keep)
        result.response = await answer_json(request, body, on_first)
    return result


async def answer_json(
    request: web.Request, body: dict[str, Any], on_first: Callable[[], None]
) -> web.StreamResponse:
    """Send a complete response (already as the client may see it) as JSON."""
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
    response = sse.Response()
    events = [sse.event(chunk) for chunk in sse.chunks_from_response(body, include_usage)]
    try:
        await response.prepare(request)
        on_first()
        await response.write_eof(b"".join([*events, sse.DONE_EVENT]))  # all is here: one write
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

    The work is done in the engine connection's read callback (`EngineStream.divert`): what
    one read from D brought is cut into events, each is decoded (the ids and the reply are in
    each), and what the client sees of them goes to the client's socket in one write, there
    and then: no task wakes per read (a future, two async generators and aiohttp's writer
    each time, before). An event with nothing to strip goes on as D's own bytes. The
    handler's task waits for the first event (a failure before it is an UpstreamError the
    flow may retry elsewhere), writes it with the response's headers, then only wakes while
    the client's buffer is full (D is not read meanwhile) and at the end, which it writes
    with the last read's events and [DONE] in one write.
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
        self._started = False
        """The first event came (the client may be answered)."""
        self._tail: bytes | None = None
        """D's stream is over: [DONE] or an error event, to write last."""
        self._failure: BaseException | None = None
        """What the task raises: D failed before its first event, or the client left."""
        self._stream: EngineStream | None = None
        self._client: sse.ChunkWriter | None = None
        """Set once the response's headers went out: callbacks write from then on."""
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._ids_tracked = False
        """D's chunks carry their token ids (the router asked for them)."""
        self._reasoned = False
        """A chunk carried reasoning text (generated, though not the answer's content)."""
        self.reported: tuple[Kind, usage.Cached] = ("chat", "own")
        """The API, and the cached tokens its usage reports (`usage.rewrite`)."""
        self.carry: Carry | None = None
        """How to go on on another engine when D dies mid-stream (None: end with an error)."""
        self.include_usage = False
        """The client asked for the usage chunk (a carried-over stream always gets one)."""
        self._carrying: Exception | None = None
        """D died mid-stream: the task carries the stream over."""
        self._carried: Carried | None = None
        self._translate: Translator | None = None
        """The carried-over stream's chunks as the client's API writes them."""
        self._base: dict[str, Any] = {}
        """The first engine's chunk id, object, creation time and model."""
        self._generation = 0
        """Which engine stream the callbacks serve: one more per carry-over."""

    def _callbacks(self) -> tuple[Callable[[bytes], None], Callable[[UpstreamError | None], None]]:
        """The read callbacks for the engine stream of this generation: a stream left behind
        by a carry-over (an engine that reported an error and then [DONE]) feeds nothing."""
        generation = self._generation

        def on_data(data: bytes) -> None:
            if generation == self._generation:
                self._on_data(data)

        def on_end(error: UpstreamError | None) -> None:
            if generation == self._generation:
                self._on_end(error)

        return on_data, on_end

    def end_carried(self, abort: bool = False) -> None:
        """Release (or, `abort`, close) the carried-over stream, if any (idempotent)."""
        carried, self._carried = self._carried, None
        if carried is not None:
            (carried.stream.close if abort else carried.stream.release)()
            carried.done()

    async def run(
        self, request: web.Request, resp: EngineStream, first_byte_s: float
    ) -> DecodeResult:
        """Relay until [DONE]; raises UpstreamError if D fails before the first event."""
        self._stream = resp
        resp.divert(*self._callbacks())
        try:
            async with asyncio.timeout(first_byte_s):
                while not (self._started or self._failure):
                    await self._wait()
        except TimeoutError:
            raise UpstreamError("timeout", "no first event in time") from None
        if self._failure is not None:
            raise self._failure
        out = sse.Response()
        chunked = request.version >= HttpVersion11
        if chunked:
            out.enable_chunked_encoding()  # framed here too: callbacks write the chunks
        self.result.response = out
        try:
            await out.prepare(request)
            self.on_first()
            await self._answer(request, out, chunked)
        except ConnectionResetError:
            raise ClientGone() from None
        self._finish_reply()
        return self.result

    async def _answer(self, request: web.Request, out: web.StreamResponse, chunked: bool) -> None:
        """Write the first events (with the headers), hand the writing to the callbacks, and
        wait for the end; meanwhile, wait for the client whenever its buffer is full."""
        if self._tail is None:
            await out.write(self._take())  # through aiohttp: the headers go with it
            if self._tail is None and self._failure is None:
                self._client = sse.ChunkWriter(request, chunked)
                self._write_out()
        while self._tail is None and self._failure is None:
            if self._carrying is not None:
                await self._carry_over()
            elif self._paused:
                await request.writer.drain()
                self._paused = False
                assert self._stream is not None
                self._stream.resume_reading()
            else:
                await self._wait()
        if self._paused:  # D's body ended while the client was behind
            assert self._stream is not None
            self._stream.resume_reading()  # its connection may be reused
        if self._failure is not None:
            raise self._failure
        await out.write_eof(self._take() + (self._tail or b""))

    async def _carry_over(self) -> None:
        """D died after the client's first byte: go on on another engine (`carry`), or end
        the client's stream with the error event."""
        exc, self._carrying = self._carrying, None
        assert exc is not None and self.carry is not None
        if self._paused and self._stream is not None:
            self._stream.resume_reading()  # the dead one's connection is dropped anyway
        self._paused = False
        self.end_carried(abort=True)  # a carried-over stream that died in turn
        self.result.carried_over += 1
        prompt = self.result.prompt_ids
        carried = await self.carry(self.result, exc) if prompt is not None else None
        if carried is None or prompt is None:
            self._end_failed(exc)
            return
        self._carried, self._stream = carried, carried.stream
        kind = self.reported[0]
        streamed = len(self.result.output_ids)
        self._translate = Translator(kind, self._base, len(prompt), streamed, self.include_usage)
        self._events = sse.EventSplitter()
        self._generation += 1  # what the dead stream still delivers is ignored from now on
        carried.stream.divert(*self._callbacks())

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- from the engine connection's read callback -----------------------------------------

    def _on_data(self, data: bytes) -> None:
        """One read of D's stream: collect, queue what the client sees, write it if live."""
        if self._tail is not None or self._failure is not None or self._carrying is not None:
            return  # after [DONE] (or D's death): ignored
        try:
            if events := self._events.feed(data):
                self._take_events(events)
            if self._client is not None and self._tail is None:
                self._write_out()
        except Exception as exc:  # a bug: raised in the handler's task, not the event loop
            self._failure = exc
        if self._client is None or self._paused or self._tail is not None or self._failure:
            self._wake()  # only for what the task waits for: no wake-up per read
        elif self._carrying is not None:
            self._wake()

    def _on_end(self, error: UpstreamError | None) -> None:
        """D's stream ended (a failure, or the body's end with or without [DONE])."""
        if self._tail is not None or self._failure is not None or self._carrying is not None:
            return
        try:
            if error is None and (events := self._events.close()):
                self._take_events(events)
            if self._tail is not None or self._failure is not None:
                pass
            elif not self._started:
                self._failure = error or UpstreamError("protocol", "empty stream")
            elif error is not None and (self.carry is None or not self.result.finished):
                self._fail_mid(error)
            elif self.carry is not None and not self.result.finished:
                self._fail_mid(UpstreamError("protocol", "the stream ended before its end"))
            else:
                self._tail = self.END  # ended without its last event
        except Exception as exc:
            self._failure = exc
        self._wake()

    def _take_events(self, events: list[bytes]) -> None:
        """Collect from events and queue what the client sees of them, up to [DONE]."""
        if not self._started:
            events = self._hold(events)
            if not self._started:
                return
        try:
            ended = self._emit_checked(events) if self.carry else self._emit_all(events)
            if ended:
                self._tail = self.END
        except ValueError as exc:
            self._fail_mid(exc)

    def _emit_checked(self, events: list[bytes]) -> bool:
        """`_emit` each event up to [DONE], for a stream that may be carried over: an in-band
        error is the engine failing (`_fail_mid`), and a carried-over stream's events are
        written as the client's API writes them."""
        for data in events:
            chunk = sse.decode(data)
            if chunk is sse.DONE:
                return True
            if (refused := self._refusal(chunk)) is not None:
                self._fail_mid(refused)
                return False
            if self._translate is None:
                self._emit(data, chunk)
            elif isinstance(chunk, dict) and (out := self._translate(chunk)) is not None:
                self._emit(orjson.dumps(out), out)
        return False

    def _hold(self, events: list[bytes]) -> list[bytes]:
        """Before D generated anything, events are queued, not committed: vLLM reports a
        failure in-band under its 200 (an error event, or a finish reason `error`, then
        [DONE]), so a 200 alone says nothing. The first event that carries a generated token
        (or its text) starts the answer; an error, or an end, before it is an UpstreamError
        the flow retries elsewhere, and the client never saw a byte. Returns the events after
        the one that started the answer."""
        for i, data in enumerate(events):
            try:
                chunk = self._decode(data)
            except ValueError as exc:
                self._failure = UpstreamError("protocol", f"stream failed: {exc!r}")
                return []
            if (refused := self._refusal(chunk)) is not None:
                self._failure = refused
                return []
            ended = self._emit(data, chunk)
            if self._generated():
                self._started = True
                if ended:
                    self._tail = self.END
                return [] if ended else events[i + 1 :]
            if ended:
                self._failure = UpstreamError("protocol", "stream ended before any token")
                return []
        return []

    def _refusal(self, chunk: Any) -> UpstreamError | None:
        """An in-band failure in a chunk (`{"error": ...}`, or a choice that finished with
        reason `error`), as the UpstreamError it is; None for any other chunk."""
        if not isinstance(chunk, dict):
            return None
        error = chunk.get("error")
        if error is not None and not chunk.get("choices"):
            return in_band_error(error)
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and choice.get("finish_reason") == "error":
                return UpstreamError("status", "the engine finished the request with an error")
        return None

    def _generated(self) -> bool:
        """Whether D's events so far carried a generated token, text, reasoning or tool call;
        or D finished (not with an error) and its chunks carry no token ids to count: a
        finish reason other than `error` means it generated at least one token."""
        if self.result.output_ids or any(self._parts) or self._calls or self._reasoned:
            return True
        return self.result.finished and not self._ids_tracked

    END = sse.DONE_EVENT
    """What ends the client's stream after D's last event (OpenAI's chunks: [DONE])."""

    @staticmethod
    def _decode(data: bytes) -> Any:
        """One event as the splitter cut it, decoded (ValueError: not JSON)."""
        return sse.decode(data)

    def _error_event(self, message: str, status: int) -> bytes:
        """The in-band error that ends a stream D broke off."""
        return sse.error_event(message, status)

    def _fail_mid(self, exc: Exception) -> None:
        """D failed after its first event: the task carries the stream over to another engine
        (`carry`, up to `MAX_MIGRATIONS` times), else the client's stream ends with an error
        event."""
        if self.carry is not None and self.result.carried_over < MAX_MIGRATIONS:
            self._carrying = exc
            self.result.finished = False
            return
        self._end_failed(exc)

    def _end_failed(self, exc: Exception) -> None:
        self._tail = self._error_event(f"decode engine failed mid-stream: {exc!r}", 502)
        self.result.finished = False

    def _write_out(self) -> None:
        """Write what is queued to the client's socket; pause D while the client is behind."""
        assert self._client is not None and self._stream is not None
        if not self._out:
            return
        if not self._client.write(self._take()):
            self._failure = ClientGone()
        elif self._client.full() and not self._paused:
            self._paused = True
            self._stream.pause_reading()

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
        if not self._base:
            self._base = chunk_base(chunk)
        params: dict[str, Any] | None = None
        if "kv_transfer_params" in chunk and (params := protocol.kv_params_of(chunk)):
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
        if "usage" in chunk:
            edited |= usage.rewrite(self.reported[0], chunk, self.reported[1], None)
        return edited

    def _collect_choice(self, choice: dict[str, Any]) -> None:
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self._ids_tracked = True
            self.result.output_ids.extend(ids)
        if (reason := choice.get("finish_reason")) is not None:
            self.result.finish_reason = str(reason)
            self.result.finished = reason != "error"
        text = choice.get("text")
        delta = choice.get("delta")
        if isinstance(text, str):
            self._parts.append(text)
        if not isinstance(delta, dict):
            return
        self._reasoned = self._reasoned or any(
            isinstance(delta.get(k), str) and delta[k] for k in ("reasoning_content", "reasoning")
        )
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


class NamedStreamRelay(StreamRelay):
    """Passes D's stream of named events (Responses, Messages) through to the client, the same
    way as `StreamRelay` (same flow control, same failures), event by event: the API's
    `EventStream` collects what the next turn needs and strips what the client may not see;
    an event with nothing stripped goes on as D's own bytes, name included, and a stripped one
    is written again with its name. The stream ends with the API's last event (no [DONE])."""

    END = b""

    ENDS: Final = frozenset({"message_delta", "response.completed", "response.incomplete"})
    """Events that close the answer, with its usage (a count of generated tokens)."""

    def __init__(self, events: EventStream, on_first: Callable[[], None]) -> None:
        super().__init__(False, on_first)
        self._named = events
        self.result = events.result
        self._events = sse.BlockSplitter()
        self._tokens = False
        """An event carried generated output (a delta, or a closing usage that counts some)."""

    def _refusal(self, chunk: Any) -> UpstreamError | None:
        name, event = chunk
        if not isinstance(event, dict):
            return None
        kind = name or event.get("type")
        if kind == "error":
            return in_band_error(event.get("error"))
        if kind == "response.failed":
            return UpstreamError("status", "the engine's stream ended with response.failed")
        return None

    def _generated(self) -> bool:
        return self._tokens or bool(self.result.output_ids)

    @staticmethod
    def _decode(data: bytes) -> Any:
        name, payload = sse.parse_block(data)
        return name, orjson.loads(payload)

    def _error_event(self, message: str, status: int) -> bytes:
        return self._named.error_event(message, status)

    def _emit_all(self, events: list[bytes]) -> bool:
        return any(self._emit(data, self._decode(data)) for data in events)

    def _emit(self, data: bytes, chunk: Any) -> bool:
        name, event = chunk
        if not isinstance(event, dict):
            self._out += (data, b"\n\n")
            return False
        if not self._tokens:
            self._tokens = _carries_output(name or str(event.get("type")), event)
        edited = self._named.process(name, event)
        edited |= usage.rewrite(self.reported[0], event, self.reported[1], self.result.params)
        if edited:
            self._out.append(sse.named_event(name, event) if name else sse.event(event))
        else:
            self._out += (data, b"\n\n")
        return self._named.terminal(name or str(event.get("type")))

    def _finish_reply(self) -> None:
        self._named.finish()


def _carries_output(name: str, event: dict[str, Any]) -> bool:
    """Whether a named event carries generated output: a content delta (Messages'
    `content_block_delta`, Responses' `*.delta`), or a closing event whose usage counts
    generated tokens (an answer that is only its end-of-sequence token)."""
    if name == "content_block_delta" or (name.startswith("response.") and name.endswith(".delta")):
        return True
    if name not in NamedStreamRelay.ENDS:
        return False
    usage_of = event.get("usage") or (event.get("response") or {}).get("usage") or {}
    tokens = usage_of.get("output_tokens") if isinstance(usage_of, dict) else None
    return isinstance(tokens, int) and tokens > 0
