"""One keep-alive HTTP/1.1 connection to an engine: the asyncio protocol under `engine_http`.

Kept apart from the pool and the calls (`engine_http.HttpClient`) because this is where the
bytes arrive, and the one place that decides how a body reaches its reader. An answer's
status line and headers are awaited; its body is read either by a task (`next_chunk`: each
read wakes it, and what arrived together is read together) or, once the caller `divert`s it,
by callbacks run from `data_received` itself: each read's bytes in one piece, then the end,
with no task woken per read. The router relays D's stream that way (`decode.StreamRelay`),
sparing a streamed turn a task wake-up, a future and two async generators per read.

`httptools` (the llhttp parser uvicorn uses) parses the answers.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import cast

import httptools

_READ_HIGH_WATER = 1 << 20
"""Buffered stream bytes above which the socket stops being read (the client is slow)."""

OnData = Callable[[bytes], None]
"""Takes the body bytes one read of the socket brought (a diverted body)."""
OnEnd = Callable[[BaseException | None], None]
"""Told once that a diverted body ended: None at its end, else why it failed (HttpError or
TimeoutError)."""


class HttpError(Exception):
    """The connection failed or the answer was not HTTP after the request was sent."""


class ConnectError(HttpError):
    """No connection was made: the engine never saw the request."""


class Connection(asyncio.Protocol):
    """One keep-alive connection; carries one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._headers: asyncio.Future[None] | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._wakeup: asyncio.Future[None] | None = None
        self._on_data: OnData | None = None
        self._on_end: OnEnd | None = None
        self._reset()

    def _reset(self) -> None:
        """The per-exchange state, as before an answer's first byte."""
        self.status = 0
        self.complete = False
        self.reusable = False
        self._framed = False
        """Whether the answer's length is known (Content-Length or chunked), not up to EOF."""
        self._error: BaseException | None = None
        self._chunks.clear()
        self._buffered = 0
        self._on_data = self._on_end = None

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HttpError(f"malformed HTTP answer: {exc}"))
            self.close()
        if self._on_data is not None:
            self._deliver()  # what this read brought, in one piece

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.complete:
            return
        if exc is None and self.status and not self._framed and self._error is None:
            self.on_message_complete()  # a body without length or chunks ends at EOF
            return
        self._fail(HttpError(f"connection closed by the engine: {exc!r}"))

    # -- httptools callbacks -------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self._headers is not None and not self._headers.done():
            self._headers.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        if self._on_data is not None:
            return  # delivered when the read is parsed
        self._buffered += len(body)
        if self._buffered > _READ_HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.reusable = self._framed and self.parser.should_keep_alive()
        self._wake()

    # -- exchange ------------------------------------------------------------------------

    def send(self, request: bytes) -> None:
        """Start an exchange: write the request and arm the waiters."""
        assert self.transport is not None
        self._reset()
        self._headers = asyncio.get_running_loop().create_future()
        self.transport.write(request)

    async def headers(self) -> None:
        """Wait for the status line and headers."""
        assert self._headers is not None
        await self._headers

    async def next_chunk(self) -> bytes | None:
        """The next body bytes, or None at the end of the answer."""
        while not self._chunks:
            if self.complete:
                return None
            if self._error is not None:
                raise self._error
            self._wakeup = asyncio.get_running_loop().create_future()
            await self._wakeup
        if len(self._chunks) == 1:
            chunk = self._chunks.popleft()
        else:  # what arrived together is read together (a stream's events: one relay write)
            chunk = b"".join(self._chunks)
            self._chunks.clear()
        self._buffered -= len(chunk)
        if self._buffered <= _READ_HIGH_WATER // 4 and self.transport is not None:
            self.transport.resume_reading()
        return chunk

    def divert(self, on_data: OnData, on_end: OnEnd) -> None:
        """Hand the rest of the body to callbacks, from `data_received`: each read's bytes to
        `on_data`, then the end to `on_end`; what is buffered already goes right away."""
        self._on_data, self._on_end = on_data, on_end
        self._buffered = 0
        if self.transport is not None:
            self.transport.resume_reading()  # nothing is buffered here from now on
        self._deliver()

    def undivert(self) -> None:
        """No more callbacks, and the socket read again (the exchange was released)."""
        self._on_data = self._on_end = None
        self.resume_reading()

    def _deliver(self) -> None:
        """Give a diverted body's buffered bytes to `on_data`, and its end to `on_end`."""
        on_data = self._on_data
        if on_data is None:
            return
        if self._chunks:
            chunks = self._chunks
            chunk = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            on_data(chunk)
        on_end = self._on_end
        if on_end is not None and (self.complete or self._error is not None):
            self._on_data = self._on_end = None
            on_end(None if self.complete else self._error)

    def pause_reading(self) -> None:
        """Stop reading the socket (a diverted body's reader is behind)."""
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        """Read the socket again."""
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    async def body(self) -> bytes:
        """The whole remaining body."""
        parts = []
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    def expire(self) -> None:
        """The exchange ran out of time: fail its readers and drop the connection."""
        self._fail(TimeoutError("the engine call took longer than its limit"))
        self.close()

    def close(self) -> None:
        """Drop the connection (aborting whatever exchange is in flight)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: BaseException) -> None:
        if self._error is not None:
            return  # the first failure is the one to report
        self._error = exc
        if self._headers is not None and not self._headers.done():
            self._headers.set_exception(exc)
            self._headers.exception()  # retrieved: nobody may be waiting
        self._wake()

    def _wake(self) -> None:
        if self._on_data is not None:
            self._deliver()
        elif self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)
