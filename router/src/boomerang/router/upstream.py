"""Calls to engines with bounded time and failures classified for the retry policy.

The one distinction the flow needs besides "retryable or not" is whether the engine may have
received the request: a refused connection certainly did not (so a handle sent with it is still
unused and a prefill's params are still unread), anything later might have.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import orjson

from boomerang.router.endpoints import Role
from boomerang.router.engine_http import (
    ConnectError,
    EngineClient,
    HttpError,
    Limits,
    StreamedResponse,
)
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


def timeout(total: float | None, connect: float) -> Limits:
    """Time bounds of one engine call, connecting bounded separately."""
    return Limits(total, connect)


@contextmanager
def _transport_errors(timeout_message: str = "timed out") -> Iterator[None]:
    """Turn the client's transport failures into UpstreamErrors (retryable kinds)."""
    try:
        yield
    except ConnectError as exc:
        raise UpstreamError("connect", str(exc)) from None
    except TimeoutError:
        raise UpstreamError("timeout", timeout_message) from None
    except HttpError as exc:
        raise UpstreamError("protocol", f"connection failed: {exc}") from None


async def _fetch(
    client: EngineClient,
    method: str,
    url: str,
    limit: Limits,
    body: Any = None,
    request_id: str | None = None,
) -> bytes:
    """One request whose transport failures become UpstreamErrors; returns the body."""
    data = None if body is None else orjson.dumps(body)
    with _transport_errors():
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
    """POST a JSON body and return the JSON object answered; raises UpstreamError."""
    return parse_object(await _fetch(client, "POST", url, limit, body, request_id))


async def get_bytes(client: EngineClient, url: str, limit: Limits) -> bytes:
    """GET and return the body; raises UpstreamError."""
    return await _fetch(client, "GET", url, limit)


async def get_json(client: EngineClient, url: str, limit: Limits) -> Any:
    """GET and decode JSON; raises UpstreamError."""
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
) -> StreamedResponse:
    """POST and return the response once its headers arrived with status 200.

    The caller must release the response. Raises UpstreamError.
    """
    data = orjson.dumps(body)
    with _transport_errors("no response headers in time"):
        resp = await client.stream("POST", url, data, limit, first_byte_s, request_id=request_id)
    if resp.status != 200:
        try:
            with _transport_errors():
                raw = await asyncio.wait_for(resp.read(), first_byte_s)
        except UpstreamError:
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
        data = orjson.loads(raw)
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
    data = orjson.loads(body)
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(data.get("message"), str):
            return str(data["message"])
    return None


class Unavailable(ApiError):
    """No engine of `role` could serve this turn: none was there, or every one tried failed
    (the flow may then serve the turn on the other role alone, see `degraded.py`)."""

    def __init__(self, role: Role, status: int, message: str, *, type_: str | None = None) -> None:
        super().__init__(status, message, type_=type_)
        self.role: Role = role


def unavailable(stage: Role, last: UpstreamError | None) -> Unavailable:
    """No engine of a role could serve: 503 with none tried, 504 on timeouts, else 502."""
    detail = f": {last.kind}" if last is not None else ""
    status = 504 if last is not None and last.kind == "timeout" else 502
    if last is None:
        status = 503
    return Unavailable(stage, status, f"no {stage} engine could serve the request{detail}")
