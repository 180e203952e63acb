"""A lean HTTP/1.1 client for the router's calls to its engines.

Why not aiohttp's ClientSession here: a routed turn makes three engine calls (tokenize,
prefill, decode), and on the benchmark's loopback engines aiohttp's client machinery (cookie
jar, tracing, URL objects, payload registry, per-request timer objects) was about a third of
the router's CPU per turn. Engine calls need far less: plain HTTP/1.1 to pod IPs, a JSON body
out, a JSON body or an SSE stream back, keep-alive, and bounded time. This module does only
that, on asyncio protocols with `httptools` (the llhttp parser uvicorn uses) parsing answers.
The Kubernetes API (TLS, watches) still goes through aiohttp.

What the flow relies on:
- `ConnectError` means the engine certainly never saw the request (no connection, or a
  connect timeout); anything later may have reached it.
- Idle connections are dropped after `idle_s` (default 4 s, below uvicorn's 5 s keep-alive),
  so a request is rarely written into a connection the server is closing.
- A cancelled or timed-out call closes its connection, which makes vLLM abort the request.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import lru_cache
from typing import cast
from urllib.parse import urlsplit

import httptools

_READ_HIGH_WATER = 1 << 20
"""Buffered stream bytes above which the socket stops being read (the client is slow)."""


class HttpError(Exception):
    """The connection failed or the answer was not HTTP after the request was sent."""


class ConnectError(HttpError):
    """No connection was made: the engine never saw the request."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Time bounds of one call: connecting, and the whole call (None: unbounded)."""

    total: float | None
    connect: float


@dataclass(frozen=True, slots=True)
class _Origin:
    host: str
    port: int
    tls: bool
    netloc: str


@lru_cache(maxsize=4096)
def _split(url: str) -> tuple[_Origin, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpError(f"not an http(s) URL: {url!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return _Origin(parts.hostname, port, tls, parts.netloc), path


class _Connection(asyncio.Protocol):
    """One keep-alive connection; carries one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._headers: asyncio.Future[None] | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._wakeup: asyncio.Future[None] | None = None
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

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HttpError(f"malformed HTTP answer: {exc}"))
            self.close()

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
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)


class StreamedResponse:
    """An answer whose body is read as it arrives; `release()` must follow."""

    def __init__(
        self,
        client: HttpClient,
        origin: _Origin,
        conn: _Connection,
        timer: asyncio.TimerHandle | None,
    ) -> None:
        self._client, self._origin, self._conn = client, origin, conn
        self.status = conn.status
        self._released = False
        self._timer = timer

    def expire_after(self, seconds: float | None) -> None:
        """Fail the body's reads with TimeoutError `seconds` from now (None: never), dropping
        the connection; replaces the current limit."""
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = None if seconds is None else loop.call_later(seconds, self._conn.expire)

    async def iter_any(self) -> AsyncIterator[bytes]:
        """Body bytes in the pieces they arrived in."""
        while (chunk := await self._conn.next_chunk()) is not None:
            yield chunk

    async def read(self) -> bytes:
        """The rest of the body."""
        return await self._conn.body()

    def close(self) -> None:
        """Abort: drop the connection (vLLM aborts a request whose client went away)."""
        self._conn.close()
        self.release()

    def release(self) -> None:
        """Give the connection back if the answer was read to its end, else drop it."""
        if not self._released:
            self._released = True
            if self._timer is not None:
                self._timer.cancel()
            self._client._release(self._origin, self._conn)


class HttpClient:
    """Keep-alive connections to engines, per origin; one exchange per connection at a time."""

    def __init__(self, headers: dict[str, str] | None = None, *, idle_s: float = 4.0) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._extra_headers = extra
        self._idle_s = idle_s
        self._idle: dict[_Origin, collections.deque[_Connection]] = {}
        self._busy: set[_Connection] = set()
        self._tls: ssl.SSLContext | None = None

    async def request(
        self,
        method: str,
        url: str,
        body: bytes | None,
        limits: Limits,
        *,
        request_id: str | None = None,
    ) -> tuple[int, bytes]:
        """One call, read to the end: (status, body). Raises HttpError or TimeoutError."""
        resp = await self._start(method, url, body, limits, limits.total, request_id)
        try:
            return resp.status, await resp.read()
        except BaseException:
            resp.close()
            raise
        finally:
            resp.release()

    async def stream(
        self,
        method: str,
        url: str,
        body: bytes | None,
        limits: Limits,
        headers_s: float,
        *,
        request_id: str | None = None,
    ) -> StreamedResponse:
        """Send and return once the answer's headers are in (within `headers_s`).

        The body is read with `iter_any()`; past `limits.total` from now, reading it raises
        TimeoutError and the connection is dropped.
        """
        total = limits.total
        within = headers_s if total is None else min(headers_s, total)
        resp = await self._start(method, url, body, limits, within, request_id)
        resp.expire_after(total)
        return resp

    async def _start(
        self,
        method: str,
        url: str,
        body: bytes | None,
        limits: Limits,
        within: float | None,
        request_id: str | None,
    ) -> StreamedResponse:
        """Send, and return once the headers are in; the call fails `within` seconds from now
        (a timer on the connection, cheaper per call than `asyncio.timeout`).

        `request_id` goes out as `X-Request-Id`, which vLLM takes as its own request id (its
        logs and the response's `id` then name the router's request). The caller keeps it to
        header-safe characters."""
        origin, path = _split(url)
        loop = asyncio.get_running_loop()
        started = loop.time()
        connect_s = limits.connect if within is None else min(limits.connect, within)
        conn = await self._acquire(origin, connect_s)
        head = f"{method} {path} HTTP/1.1\r\nHost: {origin.netloc}\r\n{self._extra_headers}"
        if request_id is not None:
            head += f"X-Request-Id: {request_id}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        request = head.encode("latin-1") + b"\r\n" + (body or b"")
        timer = None if within is None else loop.call_at(started + within, conn.expire)
        try:
            conn.send(request)
            await conn.headers()
        except BaseException:
            if timer is not None:
                timer.cancel()
            self._busy.discard(conn)
            conn.close()
            raise
        return StreamedResponse(self, origin, conn, timer)

    async def _acquire(self, origin: _Origin, connect_s: float) -> _Connection:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: least likely to be closing
            if not conn.closed and now - conn.idle_since < self._idle_s:
                self._busy.add(conn)
                return conn
            conn.close()
        conn = await self._connect(origin, connect_s)
        self._busy.add(conn)
        return conn

    async def _connect(self, origin: _Origin, connect_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if origin.tls:
            self._tls = self._tls or ssl.create_default_context()
            tls = self._tls
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(
                    _Connection, origin.host, origin.port, ssl=tls
                )
        except (OSError, TimeoutError) as exc:
            raise ConnectError(f"cannot connect to {origin.netloc}: {exc!r}") from None
        return conn

    def _release(self, origin: _Origin, conn: _Connection) -> None:
        self._busy.discard(conn)
        if conn.closed or not (conn.complete and conn.reusable):
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle = self._idle.setdefault(origin, collections.deque())
        idle.append(conn)
        self._prune(idle, conn.idle_since)

    def _prune(self, idle: collections.deque[_Connection], now: float) -> None:
        """Close the connections idle for longer than `idle_s` (the oldest are at the left)."""
        while idle and (idle[0].closed or now - idle[0].idle_since >= self._idle_s):
            idle.popleft().close()

    async def close(self) -> None:
        """Close every connection, idle or busy."""
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        for conn in list(self._busy):
            conn.close()
        self._busy.clear()
        await asyncio.sleep(0)  # let the transports finish closing
