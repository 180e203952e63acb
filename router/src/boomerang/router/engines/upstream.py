"""Every call the router makes to an engine, and the one place where its failures are classified.

Why it exists: the flow, the decode relay, the health prober and `/v1/models` all call engines,
and the retry policy (`failover.py`) needs each failure in the same terms: whether another
engine may answer (`retryable`), and whether this one may have received the request
(`delivered`): a refused connection certainly did not (so a handle sent with it is still unused
and a prefill's params are still unread), anything later might have. Only this module turns the
HTTP client's exceptions (`engine_http`'s ConnectError, HttpError, TimeoutError) into
`UpstreamError`: every call, and every read of a streamed body, raises that and nothing else.
The client behind it is `engine_http.HttpClient` (why not aiohttp's: README, Engine calls).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import orjson

from boomerang.router.engines.engine_http import (
    ConnectError,
    HttpClient,
    HttpError,
    Limits,
    StreamedResponse,
)

FailureKind = Literal["connect", "timeout", "status", "protocol", "client"]

__all__ = [
    "EngineClient",
    "EngineStream",
    "FailureKind",
    "Limits",
    "UpstreamError",
    "get_bytes",
    "get_json",
    "open_stream",
    "post_json",
    "timeout",
]


class UpstreamError(Exception):
    """An engine call that failed."""

    def __init__(
        self,
        kind: FailureKind,
        message: str,
        *,
        status: int | None = None,
        body: bytes | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.body = body

    @property
    def delivered(self) -> bool:
        """Whether the engine may have seen the request."""
        return self.kind != "connect"

    @property
    def retryable(self) -> bool:
        """A 4xx answer is the request's fault: another engine would say the same."""
        return self.kind != "client"


def timeout(total: float | None, connect: float) -> Limits:
    """Time bounds of one engine call, connecting bounded separately."""
    return Limits(total, connect)


@contextmanager
def _transport_errors(timeout_message: str = "timed out") -> Iterator[None]:
    """The client's transport failures as UpstreamErrors (all retryable)."""
    try:
        yield
    except (HttpError, TimeoutError) as exc:
        raise _classified(exc, timeout_message) from None


def _classified(exc: BaseException, timeout_message: str) -> UpstreamError:
    """One of the client's transport failures as an UpstreamError."""
    if isinstance(exc, ConnectError):
        return UpstreamError("connect", str(exc))
    if isinstance(exc, TimeoutError):
        return UpstreamError("timeout", timeout_message)
    return UpstreamError("protocol", f"connection failed: {exc}")


class EngineStream:
    """An engine's answer whose body is read as it arrives; `release()` must follow.

    Reading raises UpstreamError (a timeout past the call's total limit, or a broken
    connection); `close()` aborts the call (vLLM stops a request whose client went away)."""

    def __init__(self, raw: StreamedResponse) -> None:
        self._raw = raw
        self.status = raw.status

    async def iter_any(self) -> AsyncIterator[bytes]:
        """Body bytes in the pieces they arrived in."""
        with _transport_errors("the engine's answer took longer than its limit"):
            async for chunk in self._raw.iter_any():
                yield chunk

    def divert(
        self, on_data: Callable[[bytes], None], on_end: Callable[[UpstreamError | None], None]
    ) -> None:
        """Read the rest of the body with callbacks run from the connection's read callback
        instead of `iter_any` (`StreamedResponse.divert`); `on_end`'s failure is classified."""
        late = "the engine's answer took longer than its limit"
        self._raw.divert(on_data, lambda e: on_end(None if e is None else _classified(e, late)))

    def pause_reading(self) -> None:
        """Stop reading the engine's answer until `resume_reading()`."""
        self._raw.pause_reading()

    def resume_reading(self) -> None:
        """Read the engine's answer again."""
        self._raw.resume_reading()

    async def read(self) -> bytes:
        """The rest of the body."""
        with _transport_errors():
            return await self._raw.read()

    def close(self) -> None:
        """Abort the call: drop its connection."""
        self._raw.close()

    def release(self) -> None:
        """Give the connection back if the answer was read to its end, else drop it."""
        self._raw.release()


class EngineClient:
    """Keep-alive connections to the engines (one per app); every failure an UpstreamError."""

    def __init__(self, headers: dict[str, str] | None = None, *, idle_s: float = 4.0) -> None:
        self._http = HttpClient(headers, idle_s=idle_s)

    async def request(
        self,
        method: str,
        url: str,
        body: bytes | None,
        limits: Limits,
        *,
        request_id: str | None = None,
    ) -> tuple[int, bytes]:
        """One call read to its end: (status, body)."""
        with _transport_errors():
            return await self._http.request(method, url, body, limits, request_id=request_id)

    async def stream(
        self,
        method: str,
        url: str,
        body: bytes | None,
        limits: Limits,
        headers_s: float,
        *,
        request_id: str | None = None,
    ) -> EngineStream:
        """Send, and return once the answer's headers are in (within `headers_s`)."""
        with _transport_errors("no response headers in time"):
            raw = await self._http.stream(
                method, url, body, limits, headers_s, request_id=request_id
            )
        return EngineStream(raw)

    async def close(self) -> None:
        """Close every connection."""
        await self._http.close()


async def _fetch(
    client: EngineClient,
    method: str,
    url: str,
    limit: Limits,
    body: Any = None,
    request_id: str | None = None,
) -> bytes:
    """One request read to its end; returns the body of a 200."""
    data = None if body is None else orjson.dumps(body)
    status, raw = await client.request(method, url, data, limit, request_id=request_id)
    check_status(status, raw)
    return raw


async def post_json(
    client: EngineClient,
    url: str,
    body: dict[str, Any],
    limit: Limits,
    request_id: str | None = None,
) -> dict[str, Any]:
    """POST a JSON body and return the JSON object answered."""
    return parse_object(await _fetch(client, "POST", url, limit, body, request_id))


async def get_bytes(client: EngineClient, url: str, limit: Limits) -> bytes:
    """GET and return the body."""
    return await _fetch(client, "GET", url, limit)


async def get_json(client: EngineClient, url: str, limit: Limits) -> Any:
    """GET and decode JSON."""
    raw = await _fetch(client, "GET", url, limit)
    try:
        return orjson.loads(raw) if raw else None
    except ValueError:
        raise UpstreamError("protocol", "response is not JSON") from None


async def open_stream(
    client: EngineClient,
    url: str,
    body: dict[str, Any],
    limit: Limits,
    first_byte_s: float,
    request_id: str | None = None,
) -> EngineStream:
    """POST and return the answer once its headers arrived (within `first_byte_s`) with
    status 200; the caller must release it."""
    resp = await client.stream(
        "POST", url, orjson.dumps(body), limit, first_byte_s, request_id=request_id
    )
    if resp.status != 200:
        try:
            answer = await asyncio.wait_for(resp.read(), first_byte_s)
        except (UpstreamError, TimeoutError):
            answer = b""
        finally:
            resp.release()
        check_status(resp.status, answer)
    return resp


def check_status(status: int, raw: bytes) -> None:
    """Raise for non-200 answers: 4xx is the client's, anything else the engine's."""
    if status == 200:
        return
    kind: FailureKind = "client" if 400 <= status < 500 and status != 429 else "status"
    raise UpstreamError(kind, f"engine answered HTTP {status}", status=status, body=raw)


def parse_object(raw: bytes) -> dict[str, Any]:
    """A JSON object or a protocol failure."""
    try:
        data = orjson.loads(raw)
    except ValueError:
        raise UpstreamError("protocol", "response is not JSON") from None
    if not isinstance(data, dict):
        raise UpstreamError("protocol", "response is not a JSON object")
    return data
