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

A streamed body is read by a task (`iter_any`) or diverted to callbacks run from the
connection's `data_received` (`divert`; see `engine_conn`).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

from boomerang.router.engines.engine_conn import ConnectError, Connection, HttpError, OnData, OnEnd

__all__ = ["ConnectError", "HttpClient", "HttpError", "Limits", "StreamedResponse"]


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


class StreamedResponse:
    """An answer whose body is read as it arrives; `release()` must follow."""

    def __init__(
        self,
        client: HttpClient,
        origin: _Origin,
        conn: Connection,
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

    def divert(self, on_data: OnData, on_end: OnEnd) -> None:
        """Read the rest of the body with callbacks instead of `iter_any`, run from the
        connection's `data_received`: `on_data` gets each read's body bytes (in one piece),
        `on_end` then gets None at the end of the body or the failure (HttpError, or
        TimeoutError past the call's limit). Neither may raise; `release()` still follows, and
        after it neither is called."""
        self._conn.divert(on_data, on_end)

    def pause_reading(self) -> None:
        """Stop reading the engine's socket until `resume_reading()` (the reader is behind)."""
        self._conn.pause_reading()

    def resume_reading(self) -> None:
        """Read the engine's socket again."""
        self._conn.resume_reading()

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
            self._conn.undivert()
            if self._timer is not None:
                self._timer.cancel()
            self._client._release(self._origin, self._conn)


class HttpClient:
    """Keep-alive connections to engines, per origin; one exchange per connection at a time."""

    def __init__(self, headers: dict[str, str] | None = None, *, idle_s: float = 4.0) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._extra_headers = extra
        self._idle_s = idle_s
        self._idle: dict[_Origin, collections.deque[Connection]] = {}
        self._busy: set[Connection] = set()
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

    async def _acquire(self, origin: _Origin, connect_s: float) -> Connection:
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

    async def _connect(self, origin: _Origin, connect_s: float) -> Connection:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if origin.tls:
            self._tls = self._tls or ssl.create_default_context()
            tls = self._tls
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(
                    Connection, origin.host, origin.port, ssl=tls
                )
        except (OSError, TimeoutError) as exc:
            raise ConnectError(f"cannot connect to {origin.netloc}: {exc!r}") from None
        return conn

    def _release(self, origin: _Origin, conn: Connection) -> None:
        self._busy.discard(conn)
        if conn.closed or not (conn.complete and conn.reusable):
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle = self._idle.setdefault(origin, collections.deque())
        idle.append(conn)
        self._prune(idle, conn.idle_since)

    def _prune(self, idle: collections.deque[Connection], now: float) -> None:
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
