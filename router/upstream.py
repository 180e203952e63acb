"""Calls to engines with bounded time and failures classified for the retry policy.

The one distinction the flow needs besides "retryable or not" is whether the engine may have
received the request: a refused connection certainly did not (so a handle sent with it is still
unused and a prefill's params are still unread), anything later might have.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import aiohttp

from boomerang.router.errors import ApiError

FailureKind = Literal["connect", "timeout", "status", "protocol", "client"]


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


def timeout(total: float | None, connect: float, sock_read: float | None = None) -> Any:
    """An aiohttp timeout where connecting is bounded separately."""
    return aiohttp.ClientTimeout(total=total, sock_connect=connect, sock_read=sock_read)


@contextmanager
def _transport_errors(timeout_message: str = "timed out") -> Iterator[None]:
    """Turn aiohttp's transport failures into UpstreamErrors (retryable kinds)."""
    try:
        yield
    except aiohttp.ClientConnectorError as exc:
        raise UpstreamError("connect", f"cannot connect: {exc}") from None
    except TimeoutError:
        raise UpstreamError("timeout", timeout_message) from None
    except aiohttp.ClientError as exc:
        raise UpstreamError("protocol", f"connection failed: {exc!r}") from None


async def _fetch(
    session: aiohttp.ClientSession, method: str, url: str, limit: Any, body: Any = None
) -> bytes:
    """One request whose transport failures become UpstreamErrors; returns the body."""
    with _transport_errors():
        async with session.request(method, url, json=body, timeout=limit) as resp:
            raw = await resp.read()
            check_status(resp.status, raw)
    return raw


async def post_json(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], limit: Any
) -> dict[str, Any]:
    """POST a JSON body and return the JSON object answered; raises UpstreamError."""
    return parse_object(await _fetch(session, "POST", url, limit, body))


async def get_json(session: aiohttp.ClientSession, url: str, limit: Any) -> Any:
    """GET and decode JSON; raises UpstreamError."""
    raw = await _fetch(session, "GET", url, limit)
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        raise UpstreamError("protocol", "response is not JSON") from None


async def open_stream(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    limit: Any,
    first_byte_s: float,
) -> aiohttp.ClientResponse:
    """POST and return the response once its headers arrived with status 200.

    The caller must release the response. Raises UpstreamError.
    """
    with _transport_errors("no response headers in time"):
        resp = await asyncio.wait_for(session.post(url, json=body, timeout=limit), first_byte_s)
    if resp.status != 200:
        try:
            raw = await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            raw = b""
        finally:
            resp.release()
        check_status(resp.status, raw)
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
        data = json.loads(raw)
    except ValueError:
        raise UpstreamError("protocol", "response is not JSON") from None
    if not isinstance(data, dict):
        raise UpstreamError("protocol", "response is not a JSON object")
    return data


def client_error(exc: UpstreamError) -> ApiError:
    """An engine's 4xx, passed on with its own message when it has one."""
    message = "the engine rejected the request"
    try:
        data = _error_message(exc.body)
        message = data or message
    except ValueError:
        pass
    return ApiError(exc.status or 400, message)


def _error_message(body: bytes | None) -> str | None:
    """The `message` of an OpenAI-style error body, if there is one."""
    if not body:
        return None
    data = json.loads(body)
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(data.get("message"), str):
            return str(data["message"])
    return None


def unavailable(stage: str, last: UpstreamError | None) -> ApiError:
    """No engine of a role could serve: 503 with none tried, 504 on timeouts, else 502."""
    detail = f": {last.kind}" if last is not None else ""
    status = 504 if last is not None and last.kind == "timeout" else 502
    if last is None:
        status = 503
    return ApiError(status, f"no {stage} engine could serve the request{detail}")
